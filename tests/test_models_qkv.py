"""Q/K/V of any supported transformers model equal what its own attention computes.

For each architecture a tiny random model is saved with the BERT uncased tokenizer to a
temporary folder (no hub) and read back as a ``"pretrained"`` checkpoint. approxlab's Q/K/V of
a layer, put through ``approxlab.exact_attention`` (``causal=True`` for a decoder), must equal
the model's own attention output, captured at the input of the layer's output projection while
transformers runs the model separately on the same token ids, to 1e-4 relative (measured:
about 1e-7). The definition checks, not the approximations: grouped-query heads, rotary
positions, per-head norms, a scaling other than 1/sqrt(p), sliding windows, positions beyond a
learned table and the embedding shortcut.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import (
    AutoModel,
    AutoTokenizer,
    BertConfig,
    DistilBertConfig,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    Qwen2Config,
    Qwen3Config,
    RobertaConfig,
)

import approxlab
from approxlab.data import describe_model, extract_qkv, get_qkv, load_model, minilm_path

VOCAB = 30_528  # >= the 30,522 tokens of the BERT uncased tokenizer (some tokenizer classes add one)
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
CONFIGS = {
    "bert": lambda: BertConfig(**_COMMON, max_position_embeddings=32),
    "roberta": lambda: RobertaConfig(**_COMMON, max_position_embeddings=34),  # 32 positions after pad_token_id + 1
    "distilbert": lambda: DistilBertConfig(vocab_size=VOCAB, dim=32, hidden_dim=64, n_layers=2, n_heads=4,
                                           max_position_embeddings=32),
    "gpt2": lambda: GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                               bos_token_id=0, eos_token_id=0),
    "llama": lambda: LlamaConfig(**_COMMON, num_key_value_heads=2, max_position_embeddings=128),
    "qwen2": lambda: Qwen2Config(**_COMMON, num_key_value_heads=2, max_position_embeddings=128),
    "qwen3": lambda: Qwen3Config(**_COMMON, num_key_value_heads=2, head_dim=16, max_position_embeddings=128),
    "gemma3": lambda: Gemma3TextConfig(**_COMMON, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=24,
                                       sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                       max_position_embeddings=128),
}
CAUSAL = {"bert": False, "roberta": False, "distilbert": False, "gpt2": True, "llama": True, "qwen2": True,
          "qwen3": True, "gemma3": True}
OUTPUT_PROJECTION = {"bert": "encoder.layer.{}.attention.output.dense",
                     "roberta": "encoder.layer.{}.attention.output.dense",
                     "distilbert": "transformer.layer.{}.attention.out_lin", "gpt2": "h.{}.attn.c_proj"}


def save_tiny_checkpoint(name: str, folder, **overrides):
    """A tiny random model of architecture ``name`` and the BERT uncased tokenizer, saved to ``folder``."""
    config = CONFIGS[name]()
    for key, value in overrides.items():
        setattr(config, key, value)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        AutoModel.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-models")
    return {name: save_tiny_checkpoint(name, root / name) for name in CONFIGS}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def model_attention_output(folder, name: str, input_ids: torch.Tensor, layer: int, model=None) -> torch.Tensor:
    """The model's own attention output of ``layer`` (input of its output projection), ``(S, H, n, p)``,
    with transformers loading and running the model by itself (its default attention)."""
    model = AutoModel.from_pretrained(folder).eval() if model is None else model
    projection = model.get_submodule(OUTPUT_PROJECTION.get(name, "layers.{}.self_attn.o_proj").format(layer))
    seen = {}
    hook = projection.register_forward_pre_hook(lambda module, args: seen.__setitem__("x", args[0]))
    try:
        with torch.no_grad():
            model(input_ids=input_ids)
    finally:
        hook.remove()
    heads = model.config.num_attention_heads
    return seen["x"].reshape(*input_ids.shape, heads, -1).transpose(1, 2)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_exact_attention_of_the_qkv_is_the_models_attention(name, checkpoints, cache):
    """Done means of the issue for the tiny models: every supported architecture, its last layer."""
    n = 32 if name in OUTPUT_PROJECTION else 64  # within the learned tables; rotary models go further
    qkv = get_qkv("pretrained", n, [0, 1], layer=1, checkpoint=str(checkpoints[name]), cache_dir=cache,
                  dtype=torch.float64)
    assert qkv.causal is CAUSAL[name] and qkv.mode == "hidden" and qkv.q.shape[:3] == (2, 4, n)
    assert qkv.rotary is (name not in OUTPUT_PROJECTION)
    want = model_attention_output(checkpoints[name], name, qkv.input_ids, layer=1)
    got = approxlab.exact_attention(qkv.q, qkv.k, qkv.v, causal=qkv.causal)
    print(f"{name}: relative error {relative_error(got, want):.2e}")
    assert relative_error(got, want) <= 1e-4, relative_error(got, want)
    if qkv.causal:  # the mask matters: the bidirectional attention of the same Q/K/V is far off
        assert relative_error(approxlab.exact_attention(qkv.q, qkv.k, qkv.v), want) > 1e-2


def test_grouped_query_heads_are_repeated_and_mapped(checkpoints, cache):
    qkv = get_qkv("pretrained", 64, [0], layer=0, checkpoint=str(checkpoints["llama"]), cache_dir=cache)
    assert (qkv.kv_heads, qkv.num_heads) == (2, 4) and [qkv.kv_head(h) for h in range(4)] == [0, 0, 1, 1]
    assert torch.equal(qkv.k[:, 0], qkv.k[:, 1]) and torch.equal(qkv.v[:, 2], qkv.v[:, 3])
    assert not torch.equal(qkv.k[:, 1], qkv.k[:, 2])
    with pytest.raises(ValueError, match=r"`head` must be an integer with 0 <= head <= 3; got 4"):
        qkv.kv_head(4)
    info = describe_model("pretrained", checkpoint=str(checkpoints["llama"]))
    assert (info.num_heads, info.num_kv_heads, info.causal, info.rotary, info.max_positions) == (4, 2, True, True, 128)
    # The cache stores the key/value heads once: a second call reads them back and repeats them.
    again = get_qkv("pretrained", 64, [0], layer=0, checkpoint=str(checkpoints["llama"]), cache_dir=cache)
    assert again.from_cache == (True,) and torch.equal(again.k, qkv.k)


def test_grouped_qkv_keeps_the_kv_heads_and_a_cache_policy_keeps_b_per_kv_head(checkpoints, cache):
    """``get_qkv(..., grouped=True)`` gives the layer's 2 key/value heads; passed to a cache policy they keep one
    set of b per KV head, while the repeated K/V of the default keep one per query head and warn."""
    folder = str(checkpoints["llama"])
    repeated = get_qkv("pretrained", 64, [0], layer=0, checkpoint=folder, cache_dir=cache, dtype=torch.float64)
    grouped = get_qkv("pretrained", 64, [0], layer=0, checkpoint=folder, cache_dir=cache, dtype=torch.float64,
                      grouped=True)
    assert grouped.grouped and not repeated.grouped and grouped.group_size == repeated.group_size == 2
    assert grouped.k.shape == (1, 2, 64, 8) and grouped.q.shape == repeated.q.shape == (1, 4, 64, 8)
    assert torch.equal(grouped.k.repeat_interleave(2, dim=1), repeated.k)
    assert torch.equal(grouped.v.repeat_interleave(2, dim=1), repeated.v)
    per_kv_head = approxlab.kv_cache_attention("h2o", grouped.q, grouped.k, grouped.v, context_length=48,
                                               num_features=8)
    assert per_kv_head.info["kept"].shape == (1, 2, 8)
    with pytest.warns(approxlab.errors.RepeatedKVWarning, match=r"repeat each of their heads 2 times .* keeps 8 "
                      r"tokens per query head, up to 16 per KV head"):
        per_query_head = approxlab.kv_cache_attention("h2o", repeated.q, repeated.k, repeated.v, context_length=48,
                                                      num_features=8)
    assert per_query_head.info["kept"].shape == (1, 4, 8)
    with pytest.raises(TypeError, match=r"`grouped` must be a bool \(True or False\); got 1 \(int\)"):
        get_qkv("pretrained", 64, [0], layer=0, checkpoint=folder, cache_dir=cache, grouped=1)


def test_gemma3_scaling_and_sliding_window(checkpoints, cache):
    """Gemma 3 scales logits by query_pre_attn_scalar**-0.5 (24 here, head_dim 16): q carries the
    ratio. Its sliding layer (0) masks keys 16 or more positions back: QKV says so, and the
    banded causal softmax of the same Q/K/V is the model's output."""
    folder = str(checkpoints["gemma3"])
    qkv = get_qkv("pretrained", 64, [0], layer=0, checkpoint=folder, cache_dir=cache, dtype=torch.float64)
    assert qkv.sliding_window == 16 and qkv.scaling == pytest.approx(24**-0.5) and qkv.kv_heads == 1
    logits = qkv.q @ qkv.k.transpose(-1, -2) / math.sqrt(16)
    i, j = torch.arange(64).unsqueeze(-1), torch.arange(64)
    banded = torch.softmax(logits.masked_fill(~((j <= i) & (j > i - 16)), -math.inf), dim=-1) @ qkv.v
    want = model_attention_output(folder, "gemma3", qkv.input_ids, layer=0)
    assert relative_error(banded, want) <= 1e-4
    assert relative_error(approxlab.exact_attention(qkv.q, qkv.k, qkv.v, causal=True), want) > 1e-3
    full = get_qkv("pretrained", 64, [0], layer=1, checkpoint=folder, cache_dir=cache)
    assert full.sliding_window is None


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_hidden_states_beyond_the_position_table(name, checkpoints, cache):
    """n = 48 > 32 learned positions: the model runs on the table resampled to 48 rows (as in
    embedding mode), so the Q/K/V of layer 1 are those of a copy of the model that has this
    48-row table -- its own attention output, computed by transformers, is reproduced."""
    from approxlab.data.positions import position_embeddings

    folder = checkpoints[name]
    qkv = get_qkv("pretrained", 48, [0], layer=1, checkpoint=str(folder), cache_dir=cache, dtype=torch.float64)
    model = AutoModel.from_pretrained(folder).eval()
    table = model.get_submodule("embeddings.position_embeddings" if name == "bert" else "wpe")
    with torch.no_grad():
        wide = torch.nn.Embedding.from_pretrained(position_embeddings(table.weight, 48, "interpolate"))
    parent = model.embeddings if name == "bert" else model
    setattr(parent, "position_embeddings" if name == "bert" else "wpe", wide)
    model.config.max_position_embeddings = 48
    if name == "bert":
        model.embeddings.register_buffer("position_ids", torch.arange(48).unsqueeze(0), persistent=False)
        model.embeddings.register_buffer("token_type_ids", torch.zeros(1, 48, dtype=torch.long), persistent=False)
    want = model_attention_output(folder, name, qkv.input_ids, layer=1, model=model)
    got = approxlab.exact_attention(qkv.q, qkv.k, qkv.v, causal=qkv.causal)
    assert relative_error(got, want) <= 1e-4


def test_rotary_models_refuse_positions_beyond_their_context(checkpoints, cache):
    folder = str(checkpoints["qwen2"])
    with pytest.raises(ValueError, match=r"`n` must be <= 128 \(the context of this 'qwen2' model"):
        get_qkv("pretrained", 256, [0], checkpoint=folder, cache_dir=cache)
    with pytest.raises(ValueError, match=r"`positions` must be 'interpolate' \(the model's own positions\) for "
                                         r"'qwen2'.*; got 'copy'"):
        get_qkv("pretrained", 64, [0], checkpoint=folder, cache_dir=cache, positions="copy")


@pytest.mark.parametrize("name", ["bert", "llama", "gpt2"])
def test_embedding_mode_is_the_layer_applied_to_the_input_embeddings(name, checkpoints):
    """mode="embedding", layer 1 = hidden mode at layer 0 of a copy whose layer 0 holds layer 1's weights;
    the default at layer 1 is the real hidden state, which differs."""
    pretrained = load_model("pretrained", checkpoint=str(checkpoints[name]))
    swapped = load_model("pretrained", checkpoint=str(checkpoints[name]))
    layers = swapped.model.get_submodule({"bert": "encoder.layer", "gpt2": "h"}.get(name, "layers"))
    layers[0].load_state_dict(layers[1].state_dict())
    ids = torch.randint(0, 30_522, (2, 24), generator=torch.Generator().manual_seed(0))
    shortcut = extract_qkv(pretrained, ids, mode="embedding", layer=1)
    for a, b in zip(shortcut, extract_qkv(swapped, ids, mode="hidden", layer=0)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(shortcut[0], extract_qkv(pretrained, ids, layer=1)[0], atol=1e-3)


def test_initialized_decoders_from_a_config_and_the_model_left_as_it_was(checkpoints, cache):
    """A seeded random Llama from a config (BERT tokenizer); the model's attention setting and
    position table are restored after extraction, and the global RNG is untouched."""
    state = torch.get_rng_state()
    config = CONFIGS["llama"]()
    first = get_qkv("initialized", 64, [3], layer=1, config=config, seed=5, cache_dir=cache)
    assert torch.equal(torch.get_rng_state(), state)
    assert first.causal and first.checkpoint.startswith("init:llama-") and first.kv_heads == 2
    assert "seed 5" in first.weights
    loaded = load_model("initialized", config=config, seed=5)
    implementation = loaded.model.config._attn_implementation
    q, _, _ = extract_qkv(loaded, first.input_ids, layer=1)
    assert torch.equal(q, first.q) and loaded.model.config._attn_implementation == implementation
    bert = load_model("pretrained", checkpoint=str(checkpoints["bert"]))
    table = bert.model.embeddings.position_embeddings
    extract_qkv(bert, torch.zeros(1, 40, dtype=torch.long))
    assert bert.model.embeddings.position_embeddings is table and table.num_embeddings == 32
