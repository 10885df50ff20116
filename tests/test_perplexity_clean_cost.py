"""The perplexity study's clean cells made cheaper give the same numbers: each layer's exact reference kept per
window, the spectral norm of a difference from its Gram matrix, and a replay that skips the KV-cache setting's exact
context rows -- against the patch's own errors (:meth:`approxlab.patching.AttentionPatch.errors`) on a tiny saved
Llama, every column of the rows."""

from __future__ import annotations

import math

import pytest
import torch

import approxlab
from approxlab.patching import exact_prefill, replay
from approxlab.studies.perplexity import cells, clean, grid


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from test_models_qkv import save_tiny_checkpoint

    folder = save_tiny_checkpoint("llama", tmp_path_factory.mktemp("llama"), tie_word_embeddings=True)
    config = grid.build_config(num_layers=2, checkpoint=str(folder), n=[32], context=24, continuation=8,
                               num_features=[4, 8], methods=["performer", "streaming-llm", "snapkv"],
                               encoder_methods=["nystromformer"], windows=2)
    return clean.clean_cells(config, {"cache_dir": str(tmp_path_factory.mktemp("cache"))})


def _former_row(cell) -> dict:
    """A clean row as the code before the kept references computed it: the patch's own errors."""
    key = tuple(cell[c] for c in clean.CLEAN_KEY)
    queries, keys, values = clean.clean_inputs(cell)
    _, patch, status, caught = cells.run_patch(cell, key, lambda patch: replay(patch, queries, keys, values),
                                               **cells.patch_options(cell, cells.decoder_model(cell)))
    return {"error_inputs": clean.CLEAN_INPUTS, **cells.measured([] if patch is None else patch.errors(), patch),
            "status": status, **cells.warning_columns(caught)}


def test_the_clean_rows_equal_those_of_the_patch_s_own_errors_in_every_column(tiny):
    """Every cell of two windows, both settings, the control and three methods at two budgets, in the order the
    study runs them (each window's references computed by its first cell and kept): every column equal to
    rtol 1e-10."""
    clean._REFERENCES.clear()
    timing = ("seconds", "cpu_seconds")
    assert {c["setting"] for c in tiny} == {"whole", "kv-cache"} and len({c["window"] for c in tiny}) == 2
    for cell in tiny:
        found = {k: v for k, v in clean.compute_clean(cell)[0].items() if k not in timing}
        expected = _former_row(cell)
        assert found.keys() == expected.keys() and found["status"] == "ok"
        assert found == pytest.approx(expected, rel=1e-10, abs=0, nan_ok=True), (cell["setting"], cell["method"])
        assert all(math.isfinite(found[f"{m}_median"]) for m in cells.MEASURES)


def test_a_window_s_exact_references_are_computed_once_and_serve_its_cells(tiny, monkeypatch):
    """The first cell of a window and setting computes each layer's exact output; the other cells compute none."""
    from approxlab.patching import LayerCall

    clean._REFERENCES.clear()
    computed = []
    original = LayerCall.exact_output
    monkeypatch.setattr(LayerCall, "exact_output", lambda call: computed.append(call.layer) or original(call))
    window = [c for c in tiny if c["window"] == tiny[0]["window"] and c["setting"] == "whole"]
    for cell in window:
        clean.compute_clean(cell)
    assert len(window) == 7 and computed == [0, 1]  # the control, 3 methods at 2 budgets


@pytest.mark.parametrize("shape", [(3, 2, 40, 8), (2, 8, 40), (5, 5), (1, 64, 64)])
def test_spectral_norms_from_the_gram_matrix_equal_the_svd_s(shape):
    """Tall, wide and square, with singular values spread over 12 decades (which squaring would lose for the small
    ones), scaled far from 1, and the zero matrix."""
    generator = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    u, _, vh = torch.linalg.svd(x, full_matrices=False)
    spread = torch.logspace(0, -12, u.shape[-1], dtype=torch.float64)
    for scale in (1.0, 1e-150, 1e150):
        y = (u * (scale * spread)) @ vh
        torch.testing.assert_close(clean.spectral_norms(y), torch.linalg.matrix_norm(y, ord=2), rtol=1e-13, atol=0)
    assert torch.equal(clean.spectral_norms(torch.zeros(shape)), torch.zeros(shape[:-2], dtype=torch.float64))


def test_a_kv_cache_replay_computes_no_exact_context_rows(monkeypatch):
    """A replay reads only the records: the context's exact rows, which a forward pass returns, are not computed
    (and the records are those of a replay that computes them)."""
    from transformers import LlamaConfig

    from approxlab.data import load_model
    from approxlab.patching import _layer

    model = load_model("initialized", seed=0, config=LlamaConfig(
        vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True))
    ids = torch.randint(30522, (1, 32), generator=torch.Generator().manual_seed(0))
    prefill = exact_prefill(model, ids)

    def replayed():
        patch = approxlab.patch_attention(model, "snapkv", num_features=4, context_length=24, record_inputs=True,
                                          generator=torch.Generator().manual_seed(0))
        return replay(patch, prefill.queries, prefill.keys, prefill.values)

    counted = []
    original = _layer.exact_attention
    monkeypatch.setattr(_layer, "exact_attention", lambda *a, **k: counted.append(1) or original(*a, **k))
    found = replayed()
    assert counted == []
    monkeypatch.setattr(_layer.PatchedLayer, "_kv_cache", _with_context_rows(_layer.PatchedLayer._kv_cache))
    expected = replayed()
    assert len(counted) == 2 and len(found.calls) == 2
    for a, b in zip(found.calls, expected.calls):
        assert a.rows == b.rows == (24, 32) and torch.equal(a.output, b.output)


def _with_context_rows(kv_cache):
    return lambda self, q, k, v, context_rows=True: kv_cache(self, q, k, v)
