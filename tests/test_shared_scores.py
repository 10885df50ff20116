"""Sharing what one exact prefill gives every budget: a policy's scores, and the continuation's reserved cache.

Inside :func:`approxlab.cache._shared_scores.shared_scores` a score function that does not take the budget is
computed once for every budget, and the budget-free cores of CAP, expected attention and Compactor (whose budget
only fits their sinks) once for every budget that leaves their sinks; the results are the same, bit for bit, as
computing them again, and a generator is left where the unshared call leaves it. A sweep gives the same rows with
and without sharing. The continuation's cache writes into buffers reserved up front (grown when a continuation is
longer), so a step copies only its own tokens.
"""

from __future__ import annotations

import torch
from _helpers import tiny_llama

from approxlab.cache._scores import scores_of
from approxlab.cache._shared_scores import _SHARED, shared_scores
from approxlab.methods import get
from approxlab.patching import sweep_policies
from approxlab.patching._continuation import _reserved_layer

FREQUENCIES = 1 / 10000 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)


def _qkv(seed: int = 0, n: int = 48):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 4, n, 16, generator=generator, dtype=torch.float64) for _ in range(3))


def test_a_score_without_the_budget_is_computed_once_for_every_budget():
    calls = []

    def norms(q, k, v, *, generator=None, key_mask=None):
        calls.append(1)
        return k.norm(dim=-1)

    q, k, v = _qkv()
    alone = [scores_of("norms", norms, q, k, v, budget=b) for b in (8, 16)]
    assert len(calls) == 2
    with shared_scores():
        together = [scores_of("norms", norms, q, k, v, budget=b) for b in (8, 16)]
        again = scores_of("norms", norms, q.clone(), k.clone(), v.clone(), budget=4)  # equal inputs, new tensors
        changed = scores_of("norms", norms, q, k + 1, v, budget=8)  # other keys: computed again
    assert len(calls) == 2 + 1 + 1
    for a, b in zip(alone, together):
        assert torch.equal(a, b)
    assert torch.equal(again, alone[0]) and torch.equal(changed, (k + 1).norm(dim=-1))
    assert _SHARED.get() is None  # nothing kept after the block


def test_sink_fitting_scores_share_their_core_across_budgets_that_leave_the_sinks():
    q, k, v = _qkv(1)
    for name in ("cap", "expected-attention", "compactor"):
        score = get(name).score
        options = {"rope_frequencies": FREQUENCIES}
        budgets = (40, 20, 2)  # 2 < the policy's sinks: they are cut, a different core
        alone, after = [], []
        for budget in budgets:
            generator = torch.Generator().manual_seed(3)
            alone.append(scores_of(name, score, q, k, v, budget=budget, generator=generator, **options))
            after.append(generator.get_state())
        with shared_scores():
            memo = _SHARED.get()
            for index, budget in enumerate(budgets):
                generator = torch.Generator().manual_seed(3)
                found = scores_of(name, score, q, k, v, budget=budget, generator=generator, **options)
                assert torch.equal(found, alone[index]), (name, budget)
                assert torch.equal(generator.get_state(), after[index]), (name, budget)  # as the unshared call left it
            assert len(memo.found) == 2, name  # one core for 40 and 20, another for 2


def test_a_sweep_gives_the_same_rows_with_and_without_sharing():
    model = tiny_llama(128, 2)
    ids = torch.randint(5, 128, (1, 60), generator=torch.Generator().manual_seed(2))
    methods = ["cap", "compactor", "expected-attention", "leverage-score", "random", "h2o", "knorm"]
    runs = [sweep_policies(model, ids[:, :48], ids[:, 48:], methods=methods, ratios=[0.5, 0.75, 0.95], answer_length=3,
                           short_context=16, share=share)  # the model supplies its RoPE to the policies
            for share in (True, False)]
    columns = ("correct", "answer_logprob", "delta_all", "clean_spectral_mean", "patched_spectral_mean")
    (shared_rows, shared_layers), (rows, layers) = runs
    assert len(shared_rows) == len(rows) == 1 + 3 * len(methods)
    for a, b in zip(shared_rows[1:], rows[1:]):
        assert a["status"] == b["status"] == "ok"
        assert all(a[c] == b[c] for c in columns), (a["method"], a["compression_ratio"])
    assert shared_layers == layers


def test_the_reserved_cache_writes_in_place_and_grows():
    keys, values = (torch.arange(24.0).reshape(1, 2, 3, 4) + shift for shift in (0, 100))
    layer = _reserved_layer()(keys, values, 5)
    assert torch.equal(layer.keys, keys) and layer.get_seq_length() == 3
    new = torch.full((1, 2, 2, 4), -1.0)
    out_keys, out_values = layer.update(new, new - 1)
    assert out_keys.shape[-2] == 5 and torch.equal(out_keys[..., 3:, :], new)
    assert out_keys.data_ptr() == layer._buffers[0].data_ptr()  # a view of the buffer: no copy of the cache
    layer.crop(-2)
    assert torch.equal(layer.keys, keys)
    longer = torch.full((1, 2, 6, 4), 7.0)  # past the 5 reserved: moved to larger buffers, the first tokens kept
    out_keys, out_values = layer.update(longer, longer)
    assert out_keys.shape[-2] == 9 and torch.equal(out_keys[..., :3, :], keys) and torch.equal(out_values[..., 3:, :],
                                                                                                 longer)
