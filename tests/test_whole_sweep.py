"""The whole-sequence setting on one sequence (:func:`approxlab.patching.sweep_methods`): its rows equal the
per-method path (a patched forward pass over the whole sequence, as the perplexity study's ``long-whole`` cells run
it), its clean-input errors equal a replay on a whole-sequence prefill, and exact attention loses nothing."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import tiny_llama

import approxlab
from approxlab.methods import register
from approxlab.patching import exact_prefill, replay, sweep_methods, sweep_policies, token_nll

METHODS = ["topk", "performer", "quest"]


@pytest.fixture(scope="module")
def swept():
    model = tiny_llama(128, 3)
    ids = torch.randint(5, 128, (1, 72), generator=torch.Generator().manual_seed(1))
    rows, layers = sweep_methods(model, ids[:, :60], ids[:, 60:], methods=["exact", *METHODS], ratios=[0.75, 0.9],
                                 answer_length=3, short_context=8, seed=5)
    return model, ids, rows, layers


def test_each_row_equals_a_patched_forward_pass_over_the_whole_sequence(swept):
    model, ids, rows, layers = swept
    reference = token_nll(model, ids, hits=True)
    assert [row["method"] for row in rows] == ["unpatched"] + [m for m in ["exact", *METHODS] for _ in range(2)]
    assert len(layers) == (len(rows) - 1) * 3
    for row in rows[1:]:
        with approxlab.patch_attention(model, row["method"], num_features=row["num_features"],
                                       generator=torch.Generator().manual_seed(5)) as patch:
            nll, hits = token_nll(model, ids, hits=True)
        assert tuple(patch.layers) == (0, 1, 2)
        continuation = nll[0, 59:] - reference[0][0, 59:]
        assert row["num_features"] == int(60 * (1 - row["compression_ratio"]))
        assert row["delta_all"] == pytest.approx(float(continuation.mean()), abs=1e-10)
        assert row["answer_logprob"] == pytest.approx(-float(nll[0, -3:].sum()), abs=1e-10)
        assert row["correct"] == bool(hits[0, -3:].all())
        assert row["delta_logprob"] == pytest.approx(float(nll[0, -3:].sum() - reference[0][0, -3:].sum()),
                                                     abs=1e-10)


def test_the_clean_errors_equal_a_replay_on_the_whole_sequences_prefill(swept):
    model, ids, rows, layers = swept
    whole = exact_prefill(model, ids)  # an independent capture of the unpatched q, k, v over all 72 tokens
    for row in rows[1:]:
        patch = approxlab.patch_attention(model, row["method"], num_features=row["num_features"],
                                          record_inputs=True, generator=torch.Generator().manual_seed(5))
        errors = replay(patch, whole.queries, whole.keys, whole.values).errors()
        for layer in range(3):
            heads = torch.tensor([e["spectral"] for e in errors if e["layer"] == layer], dtype=torch.float64)
            found = [entry for entry in layers if entry["method"] == row["method"] and
                     entry["compression_ratio"] == row["compression_ratio"] and entry["layer"] == layer]
            assert found[0]["clean_spectral"] == pytest.approx(float(heads.median()), rel=1e-6, abs=1e-12)
            assert found[0]["clean_spectral_worst_head"] == pytest.approx(float(heads.max()), rel=1e-6, abs=1e-12)
        per_layer = [entry["clean_spectral_worst_head"] for entry in layers if entry["method"] == row["method"] and
                     entry["compression_ratio"] == row["compression_ratio"]]
        assert row["clean_spectral_worst_head"] == pytest.approx(sum(per_layer) / 3, rel=1e-12)


def test_exact_attention_loses_nothing_and_approximations_do(swept):
    _, _, rows, _ = swept
    exact = [row for row in rows if row["method"] == "exact"]
    assert all(abs(row["delta_all"]) < 1e-10 and row["clean_spectral_max"] < 1e-10 and
               row["patched_spectral_max"] < 1e-10 and row["correct"] == rows[0]["correct"] for row in exact)
    performer = [row for row in rows if row["method"] == "performer"]
    assert all(row["clean_spectral_mean"] > 1e-3 and row["patched_spectral_mean"] > 1e-3 for row in performer)
    assert all(row["status"] == "ok" and math.isfinite(row["delta_all"]) for row in rows)


def test_a_failing_method_is_recorded_in_its_row_and_the_sweep_goes_on(fresh_registry):
    def broken(q, k, v, *, num_features, generator=None, causal=True):
        raise FloatingPointError("no attention today")

    register("broken-method", broken, target="softmax", features="features", randomized=False, causal=True)
    model = tiny_llama(128, 2)
    ids = torch.randint(5, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    rows, layers = sweep_methods(model, ids[:, :32], ids[:, 32:], methods=["broken-method", "topk"], ratios=[0.5],
                                 answer_length=2)
    assert rows[1]["status"] == "FloatingPointError: no attention today" and rows[1]["delta_all"] == math.inf
    assert rows[2]["status"] == "ok" and {entry["method"] for entry in layers} == {"topk"}


@pytest.mark.parametrize("sweep", [sweep_methods, sweep_policies])
def test_a_ratio_outside_0_1_is_refused_before_the_prefill(sweep, monkeypatch):
    from approxlab.patching import sweep as sweep_module

    monkeypatch.setattr(sweep_module, "exact_prefill", lambda *a, **k: pytest.fail("the prefill ran"))
    ids = torch.randint(5, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="compression_ratio"):
        sweep(tiny_llama(128, 1), ids[:, :32], ids[:, 32:], methods=["topk" if sweep is sweep_methods else "h2o"],
              ratios=[0.5, 1.0], answer_length=2)
