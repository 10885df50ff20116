"""approxlab.methods.from_press: a kvpress-style press (written here, kvpress not installed) as a registered method,
against approxlab's own policies on the same inputs: in the causal form, the KV-cache setting and a patched model."""

from __future__ import annotations

import textwrap

import pytest
import torch
import approxlab
from approxlab.methods import available, from_press, get, load_plugin
from approxlab.synthetic import synthetic_qkv
from _helpers import gen, tiny_grouped_llama


class KnormLikePress:
    """kvpress's KnormPress: the keys of smallest norm kept."""

    compression_ratio = 0.5

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return -keys.norm(dim=-1)


class ObservedAttentionLikePress:
    """kvpress's ObservedAttentionPress: the mean attention each key received, pooled over a KV head's group."""

    compression_ratio = 0.5

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        n = attentions.shape[-1]
        scores = attentions.sum(2) / torch.arange(n, 0, -1, dtype=attentions.dtype)
        bsz = keys.shape[0]
        return scores.view(bsz, module.config.num_key_value_heads, -1, n).mean(2)


class NeedsHiddenStatesPress:
    """A press that recomputes queries from the layer's input (as kvpress's SnapKV does)."""

    compression_ratio = 0.5

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return module.q_proj(hidden_states[:, -4:]).sum(-1)


def _grouped(n=48, seed=4):
    g = gen(seed)
    q = torch.randn(1, 4, n, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, n, 8, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v


def test_a_knorm_like_press_is_knorm_everywhere(fresh_registry):
    spec = from_press(KnormLikePress(), name="press-knorm")
    assert "press-knorm" in available() and spec is get("press-knorm") and spec.causal == "only"
    q, k, v = synthetic_qkv((2, 3), 40, 8, generator=gen(1))
    ours = approxlab.approximate("press-knorm", q, k, v, num_features=6, causal=True)
    knorm = approxlab.approximate("knorm", q, k, v, num_features=6, causal=True)
    assert torch.equal(ours.info["kept"], knorm.info["kept"]) and torch.equal(ours.output, knorm.output)
    q, k, v = _grouped()
    for grouping in ("kv-head", "query-head"):
        for allocation in ("uniform", "adakv"):
            ours = approxlab.kv_cache_attention("press-knorm", q, k, v, context_length=32, compression_ratio=0.75,
                                                grouping=grouping, allocation=allocation)
            knorm = approxlab.kv_cache_attention("knorm", q, k, v, context_length=32, num_features=8,
                                                 grouping=grouping, allocation=allocation)
            assert torch.equal(ours.info["kept"], knorm.info["kept"]) and torch.equal(ours.output, knorm.output)
    model, ids = tiny_grouped_llama()
    outputs = {}
    for name in ("press-knorm", "knorm"):
        with torch.no_grad(), approxlab.patch_attention(model, name, compression_ratio=0.75,
                                                        context_length=24) as patch:
            outputs[name] = model(input_ids=ids).last_hidden_state
        assert patch.num_features == 6 and len(patch.calls) == 2
    assert torch.equal(outputs["press-knorm"], outputs["knorm"])


def test_a_press_reading_attentions_is_observed_attention(fresh_registry):
    from_press(ObservedAttentionLikePress(), name="press-observed", attentions=True)
    q, k, v = _grouped(seed=6)
    ours = approxlab.kv_cache_attention("press-observed", q, k, v, context_length=32, num_features=8)
    builtin = approxlab.kv_cache_attention("observed-attention", q, k, v, context_length=32, num_features=8)
    assert torch.equal(ours.info["kept"].sort(-1).values, builtin.info["kept"].sort(-1).values)
    torch.testing.assert_close(ours.output, builtin.output, rtol=1e-12, atol=1e-12)
    key_mask = torch.ones(1, 1, 48, dtype=torch.bool)
    key_mask[..., :5] = False  # padding: those keys are never kept
    padded = approxlab.kv_cache_attention("press-observed", q, k, v, context_length=32, num_features=8,
                                          key_mask=key_mask)
    assert int(padded.info["kept"].min()) >= 5


def test_what_a_press_cannot_have_is_refused_with_what_approxlab_passes(fresh_registry):
    with pytest.raises(TypeError, match=r"`press` must have kvpress's scorer interface, a method score.*got int without a callable"):
        from_press(3, name="three")
    with pytest.raises(TypeError, match=r"`attentions` must be a bool; got 1"):
        from_press(KnormLikePress(), name="x", attentions=1)
    from_press(NeedsHiddenStatesPress(), name="needs-hidden")
    q, k, v = synthetic_qkv((2,), 40, 8, generator=gen(2))
    with pytest.raises(ValueError, match=r"the press NeedsHiddenStatesPress of method 'needs-hidden' failed in score"
                                         r".* hidden_states=None.* cannot run here \(AttributeError"):
        approxlab.kv_cache_attention("needs-hidden", q, k, v, context_length=32, num_features=8)

    class WrongShape:
        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            return keys.norm(dim=-1)[..., :3]

    from_press(WrongShape(), name="wrong-shape")
    with pytest.raises(ValueError, match=r"the press WrongShape of method 'wrong-shape' must return scores \(batch, "
                                         r"kv_heads, n\) = \(1, 2, 32\); got \(1, 2, 3\)"):
        approxlab.kv_cache_attention("wrong-shape", q, k, v, context_length=32, num_features=8)
    with pytest.raises(ValueError, match=r"`name` 'knorm' is already registered"):
        from_press(KnormLikePress(), name="knorm")


PRESS_PLUGIN = textwrap.dedent('''
    """A user's press, kvpress-style, registered when imported (no kvpress needed)."""
    from approxlab.methods import from_press


    class KnormLikePress:
        compression_ratio = 0.5

        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            return -keys.norm(dim=-1)


    from_press(KnormLikePress(), name="plugin-knorm")
''')


def test_a_press_in_a_plugin_module(tmp_path, monkeypatch, fresh_registry):
    (tmp_path / "my_press_plugin.py").write_text(PRESS_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        load_plugin("my_press_plugin")
        q, k, v = synthetic_qkv((2,), 40, 8, generator=gen(2))
        ours = approxlab.kv_cache_attention("plugin-knorm", q, k, v, context_length=32, num_features=8)
        knorm = approxlab.kv_cache_attention("knorm", q, k, v, context_length=32, num_features=8)
        assert torch.equal(ours.output, knorm.output)
    finally:
        import sys

        sys.modules.pop("my_press_plugin", None)


def test_a_press_plugin_runs_through_every_setting_of_perplexity(tmp_path, monkeypatch, fresh_registry):
    """`approxlab perplexity --plugin MODULE`: the press's rows in the whole-window, KV-cache, cost, long-whole and
    long-KV tables, all ok (a tiny random Llama)."""
    import pandas as pd

    from approxlab.cli import main
    from test_models_qkv import save_tiny_checkpoint

    (tmp_path / "my_press_plugin.py").write_text(PRESS_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    llama = save_tiny_checkpoint("llama", tmp_path / "llama", tie_word_embeddings=True)
    out = tmp_path / "out"
    try:
        assert main(["perplexity", "--checkpoint", str(llama), "--cache-dir", str(tmp_path / "cache"), "--out",
                     str(out), "--plugin", "my_press_plugin", "--n", "32", "--context", "24", "--continuation", "8",
                     "--num-features", "8", "--methods", "plugin-knorm", "--encoder-methods", "nystromformer",
                     "--layer-settings", "last", "--windows", "3", "--long-n", "96", "--long-features", "4",
                     "--long-windows", "1", "--long-methods", "plugin-knorm", "--no-progress"]) == 0
    finally:
        import sys

        sys.modules.pop("my_press_plugin", None)
    rows = pd.concat([pd.read_csv(out / name) for name in ("perplexity.csv.gz", "cost.csv", "long.csv")])
    rows = rows[rows["method"] == "plugin-knorm"]
    assert set(rows["setting"].dropna()) >= {"whole", "kv-cache", "long-whole", "long-kv"}
    assert len(pd.read_csv(out / "cost.csv").query("method == 'plugin-knorm'")) == 1
    assert (rows["status"] == "ok").all()
