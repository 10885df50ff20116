"""Configs and GGUF files approxlab cannot read: one :class:`~approxlab.errors.CheckpointError` naming
``checkpoint`` (or ``config``) and what is wrong, raised before transformers builds or parses anything.

Each case edits one field of a tiny random checkpoint's ``config.json`` (or passes a config), or cuts
a tiny GGUF file short, and asserts the exact message.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from test_checkpoint_errors import originals  # noqa: F401  (a fixture: the tiny BERT and GPT-2 folders)
from transformers import BertConfig, LlamaConfig, RobertaConfig

from approxlab.data import CheckpointError, describe_model, get_qkv, load_model


def _edited(originals, tmp_path, name, **fields):  # noqa: F811
    folder = tmp_path / f"{name}-edited"
    shutil.copytree(originals[name], folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _tiny_gguf(path, cut=None):
    """A GGUF file of one 8 x 4 float32 tensor (352 bytes), cut to its first ``cut`` bytes."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(16)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if cut is not None:
        path.write_bytes(path.read_bytes()[:cut])
    return str(path)


GOT = r"; got '.*{}' \({}\)\.$"
LAYER = r"^`checkpoint` must be a model with at least one layer \(num_hidden_layers >= 1\)"
POSITION = r"^`checkpoint` must be a model with at least one position \(max_position_embeddings >= 1, past any " \
           r"reserved rows\)"
HEADS = r"^`checkpoint` must be a model whose attention heads divide its hidden size \(hidden_size % " \
        r"num_attention_heads == 0\)"
ACTIVATION = r"^`checkpoint` must be a model whose activation transformers knows \({} one of \['gelu', .*\]\)"
COMPLETE = r"^`checkpoint` must be a complete GGUF file"

# (id, call(originals, tmp_path), message regex): every call fails before any model is built
CASES = [
    ("zero-layers", lambda o, t: describe_model("pretrained", checkpoint=_edited(o, t, "bert", num_hidden_layers=0)),
     LAYER + GOT.format("bert-edited", "num_hidden_layers 0")),
    ("zero-layers-gpt2-initialized", lambda o, t: get_qkv("initialized", 8, [0], cache_dir=t / "cache",
                                                          checkpoint=_edited(o, t, "gpt2", n_layer=0)),
     LAYER + GOT.format("gpt2-edited", "num_hidden_layers 0")),
    ("no-positions", lambda o, t: get_qkv("pretrained", 8, [0], cache_dir=t / "cache",
                                          checkpoint=_edited(o, t, "bert", max_position_embeddings=0)),
     POSITION + GOT.format("bert-edited", "max_position_embeddings 0")),
    ("no-positions-gpt2", lambda o, t: load_model("initialized", checkpoint=_edited(o, t, "gpt2", n_positions=0)),
     POSITION + GOT.format("gpt2-edited", "max_position_embeddings 0")),
    ("roberta-only-reserved-positions", lambda o, t: load_model("initialized", config=RobertaConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, max_position_embeddings=2)),
     POSITION.replace("checkpoint", "config") + GOT.format("RobertaConfig", "max_position_embeddings 2")),
    ("heads-do-not-divide", lambda o, t: describe_model("pretrained",
                                                        checkpoint=_edited(o, t, "bert", num_attention_heads=3)),
     HEADS + GOT.format("bert-edited", "hidden_size 32, num_attention_heads 3")),
    ("heads-do-not-divide-gpt2", lambda o, t: load_model("pretrained", checkpoint=_edited(o, t, "gpt2", n_head=5)),
     HEADS + GOT.format("gpt2-edited", "hidden_size 32, num_attention_heads 5")),
    ("kv-heads-do-not-divide", lambda o, t: load_model("initialized", config=LlamaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=3, intermediate_size=64)),
     r"^`config` must be a model whose key/value heads divide its attention heads \(num_attention_heads % "
     r"num_key_value_heads == 0\); got 'LlamaConfig' \(num_attention_heads 4, num_key_value_heads 3\)\.$"),
    ("bogus-activation", lambda o, t: describe_model("initialized",
                                                     checkpoint=_edited(o, t, "bert", hidden_act="bogus")),
     ACTIVATION.format("hidden_act") + GOT.format("bert-edited", "hidden_act 'bogus'")),
    ("bogus-activation-gpt2", lambda o, t: get_qkv("pretrained", 8, [0], cache_dir=t / "cache", checkpoint=_edited(
        o, t, "gpt2", activation_function="bogus")),
     ACTIVATION.format("activation_function") + GOT.format("gpt2-edited", "activation_function 'bogus'")),
    ("bogus-activation-config", lambda o, t: load_model("initialized", config=BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, hidden_act="bogus")),
     ACTIVATION.replace("checkpoint", "config").format("hidden_act") + GOT.format("BertConfig", "hidden_act 'bogus'")),
    ("gguf-header-only", lambda o, t: describe_model("pretrained", cache_dir=t / "cache",
                                                     checkpoint=_tiny_gguf(t / "model.gguf", cut=24)),
     COMPLETE + GOT.format(r"model\.gguf", "cut short: it ends after 24 bytes, inside the 3 metadata entries and 1 "
                                           "tensor descriptions its header announces")),
    ("gguf-cut-in-metadata", lambda o, t: load_model("pretrained", cache_dir=t / "cache",
                                                     checkpoint=_tiny_gguf(t / "model.gguf", cut=100)),
     COMPLETE + GOT.format(r"model\.gguf", "cut short: it ends after 100 bytes, inside the 3 metadata entries and 1 "
                                           "tensor descriptions its header announces")),
    ("gguf-cut-in-tensor-data", lambda o, t: get_qkv("pretrained", 8, [0], cache_dir=t / "cache",
                                                     checkpoint=_tiny_gguf(t / "model.gguf", cut=300)),
     COMPLETE + GOT.format(r"model\.gguf", "cut short: 300 bytes, where the data of its 1 tensors ends at byte 352")),
    ("gguf-shorter-than-header", lambda o, t: describe_model("pretrained", cache_dir=t / "cache",
                                                             checkpoint=_tiny_gguf(t / "model.gguf", cut=10)),
     COMPLETE + GOT.format(r"model\.gguf", "cut short: 10 bytes, less than the 24-byte GGUF header")),
    ("gguf-empty", lambda o, t: describe_model("pretrained", cache_dir=t / "cache",
                                               checkpoint=_tiny_gguf(t / "model.gguf", cut=0)),
     r"^`checkpoint` must be a GGUF file transformers can read \(.*\)" + GOT.format(r"model\.gguf",
                                                                                 "not a GGUF file: it is empty")),
]


@pytest.mark.parametrize(("call", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_config_or_gguf_file_approxlab_cannot_read_is_one_message(call, message, originals, tmp_path,  # noqa: F811
                                                                    monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match=message) as caught:
        call(originals, tmp_path)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "cache" / "qkv").exists()  # no Q/K/V was computed
    assert not (tmp_path / "cache" / "gguf").exists()  # no GGUF was converted


def test_the_tiny_gguf_file_is_complete(tmp_path):
    from approxlab.data.gguf import check_gguf_file

    path = _tiny_gguf(tmp_path / "model.gguf")
    check_gguf_file(tmp_path / "model.gguf", path)  # refuses nothing: the cases above are the cuts
