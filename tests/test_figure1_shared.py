"""Work the Figure-1 cell shares between its methods and budgets gives the numbers of the unshared path.

The oracles ``topk`` and ``topp`` read one ranking of each query's logits per window
(:func:`approxlab.methods.rank_keys`) at every budget instead of forming the logits once per method and budget.
"""

import pytest
import torch

import approxlab
from approxlab.methods import rank_keys
from approxlab.studies.figure1 import cells as figure1_cells
from approxlab.synthetic import synthetic_qkv

BUDGETS = (3, 40, 300)


def _with_ties(seed: int):
    """Q/K/V of 700 + 50 keys whose last 50 repeat the first 50: every logit of those keys is tied."""
    q, k, v = synthetic_qkv((3,), 700, 16, generator=torch.Generator().manual_seed(seed))
    return q, torch.cat([k, k[:, :50]], dim=1), torch.cat([v, v[:, :50]], dim=1)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("method", ["topk", "topp"])
def test_the_oracles_given_a_ranking_give_their_own_numbers_at_every_budget(method, seed):
    q, k, v = _with_ties(seed)
    ranking = rank_keys(q, k, BUDGETS)
    for budget in BUDGETS:
        alone = approxlab.approximate(method, q, k, v, num_features=budget)
        shared = approxlab.approximate(method, q, k, v, num_features=budget, ranking=ranking)
        assert torch.equal(shared.output, alone.output), (method, budget)
        assert torch.equal(shared.info["indices"], alone.info["indices"]), (method, budget)
        assert torch.equal(shared.info["dropped_mass"], alone.info["dropped_mass"]), (method, budget)


def test_a_smaller_budget_is_torch_topk_of_its_own_even_where_logits_tie_at_its_boundary():
    """Where the budget's last kept logit ties with the next one, the prefix of the larger budget's ranking may keep
    another of the tied keys than ``torch.topk`` at that budget: the ranking takes that budget again there."""
    q, k, _ = _with_ties(0)
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    reference = logits.topk(BUDGETS[0], dim=-1)
    top = logits.topk(BUDGETS[-1], dim=-1).values
    assert bool((top[..., BUDGETS[0] - 1] == top[..., BUDGETS[0]]).any())  # a tie at the boundary (the data's)
    values, indices = rank_keys(q, k, BUDGETS).ranked[BUDGETS[0]]
    assert torch.equal(indices, reference.indices) and torch.equal(values, reference.values)


@pytest.mark.parametrize("options, match", [
    ({"num_features": 7}, "budget 7 among its budgets"),
    ({"num_features": 3, "key_mask": torch.ones(3, 750, dtype=torch.bool)}, "without a key mask; got causal=False"),
])
def test_a_ranking_that_does_not_fit_the_call_is_refused(options, match):
    q, k, v = _with_ties(0)
    with pytest.raises(ValueError, match=match):
        approxlab.approximate("topk", q, k, v, ranking=rank_keys(q, k, BUDGETS), **options)
    with pytest.raises(ValueError, match="`budgets` must be"):
        rank_keys(q, k, [0])


@pytest.mark.parametrize("method", ["topk", "topp", "performer"])
def test_a_figure1_cell_gives_the_same_rows_with_and_without_the_shared_ranking(method, monkeypatch):
    q, k, v = synthetic_qkv((2,), 256, 16, generator=torch.Generator().manual_seed(1))
    output = approxlab.exact_attention(q, k, v)
    ref = {"q": q, "k": k, "v": v, "output": output, "checkpoint": "synthetic",
           "output_norm": torch.linalg.matrix_norm(output, ord=2)}
    monkeypatch.setattr(figure1_cells, "_reference", lambda cell: ref)
    cell = {"condition": "initialized", "n": 256, "window": 0, "method": method, "num_features": [16, 64],
            "seeds": [0], "dtype": "float64", "base_seed": 0, "mode": "embedding", "layer": 0, "model_seed": 0,
            "data_dir": None, "cache_dir": None, "device": "cpu"}
    figure1_cells._RANKINGS.clear()
    shared = figure1_cells.compute_cell(cell)
    assert bool(figure1_cells._RANKINGS) == (method != "performer")  # only the oracles take a ranking
    monkeypatch.setattr(figure1_cells, "_shared_options", lambda cell, ref: {})
    alone = figure1_cells.compute_cell(cell)
    for a, b in zip(shared, alone):
        assert (a["num_features"], a["error_heads"], a["status"]) == (b["num_features"], b["error_heads"], "ok")


def test_the_panel_statistical_dimension_on_the_formed_completion_is_the_fused_one_to_rounding(monkeypatch):
    """Up to ``dense_max_n`` the panel's d_stat estimate multiplies the completion formed once; above it the products
    go through the fused kernel: the same estimate to float32 rounding (the same generator, the same draws)."""
    q, k, v = synthetic_qkv((3,), 512, 16, scale=0.7, generator=torch.Generator().manual_seed(2))
    ref = {"q": q, "k": k, "v": v, "checkpoint": "synthetic"}
    monkeypatch.setattr(figure1_cells, "_reference", lambda cell: ref)
    monkeypatch.setattr(figure1_cells, "ESTIMATE_DSTAT_FROM_N", 512)
    cell = {"condition": "initialized", "n": 512, "window": 0, "num_features": [16], "stat_heads": [0, 2],
            "lambda_scale": 0.1, "core_method": None, "dtype": "float64", "base_seed": 0, "mode": "embedding",
            "layer": 0, "model_seed": 0, "data_dir": None, "cache_dir": None, "device": "cpu"}
    formed, = figure1_cells.compute_panel({**cell, "dense_max_n": 512})
    fused, = figure1_cells.compute_panel({**cell, "dense_max_n": 256})
    assert formed["statistical_dimension_method"] == fused["statistical_dimension_method"] == "estimate"
    for column in ("statistical_dimension_mean", "statistical_dimension_min", "statistical_dimension_max",
                   "lambda_mean"):
        assert formed[column] == pytest.approx(fused[column], rel=1e-5, abs=0.0), column


def test_the_panel_statistical_dimension_at_its_stopping_tolerance_is_the_tight_one_to_far_below_its_accuracy(
        monkeypatch):
    """The panel's conjugate gradients stop at ``ESTIMATE_DSTAT_TOL`` (float32 products): the estimate is the one at
    the estimator's default 1e-8 to within 1e-6 relative, far inside its stated 1 %."""
    q, k, v = synthetic_qkv((3,), 512, 16, scale=0.7, generator=torch.Generator().manual_seed(3))
    monkeypatch.setattr(figure1_cells, "_reference", lambda cell: {"q": q, "k": k, "v": v, "checkpoint": "synthetic"})
    monkeypatch.setattr(figure1_cells, "ESTIMATE_DSTAT_FROM_N", 512)
    cell = {"condition": "initialized", "n": 512, "window": 0, "num_features": [16], "stat_heads": [0, 1, 2],
            "lambda_scale": 0.1, "core_method": None, "dtype": "float64", "base_seed": 0, "mode": "embedding",
            "layer": 0, "model_seed": 0, "data_dir": None, "cache_dir": None, "device": "cpu", "dense_max_n": 512}
    stopped, = figure1_cells.compute_panel(cell)
    monkeypatch.setattr(figure1_cells, "ESTIMATE_DSTAT_TOL", 1e-8)
    tight, = figure1_cells.compute_panel(cell)
    for column in ("statistical_dimension_mean", "statistical_dimension_min", "statistical_dimension_max"):
        assert stopped[column] == pytest.approx(tight[column], rel=1e-6, abs=0.0), column
    assert stopped["lambda_mean"] == tight["lambda_mean"]  # the Krylov part is untouched


def test_the_ranking_given_v_gives_the_exact_output_to_rounding_and_the_same_ranking():
    q, k, v = _with_ties(1)
    alone = rank_keys(q, k, BUDGETS)
    shared = rank_keys(q, k, BUDGETS, v=v)
    assert alone.output is None
    torch.testing.assert_close(shared.output, approxlab.exact_attention(q, k, v), rtol=1e-13, atol=1e-15)
    assert torch.equal(shared.log_normaliser, alone.log_normaliser)
    for budget in BUDGETS:
        assert all(torch.equal(a, b) for a, b in zip(shared.ranked[budget], alone.ranked[budget])), budget


def _figure1_window(monkeypatch, heads=2, n=256, p=16):
    """A synthetic window behind figure1's loaders: ``wikitext.qkv`` gives its record, ``wikitext.reference`` the
    fused kernel's reference (the path without a shared ranking)."""
    from types import SimpleNamespace

    q, k, v = synthetic_qkv((heads,), n, p, generator=torch.Generator().manual_seed(4))
    record = SimpleNamespace(q=q[None], k=k[None], v=v[None], checkpoint="synthetic")
    output = approxlab.exact_attention(q, k, v)
    fused = {"q": q, "k": k, "v": v, "output": output, "checkpoint": "synthetic",
             "output_norm": approxlab.metrics.spectral_norm(output)}
    monkeypatch.setattr(figure1_cells.wikitext, "qkv", lambda window: record)
    monkeypatch.setattr(figure1_cells.wikitext, "reference", lambda window, **options: fused)
    return fused


@pytest.mark.parametrize("method", ["topk", "topp", "performer"])
def test_a_figure1_cell_on_the_ranking_reference_gives_the_rows_of_the_fused_reference(method, monkeypatch):
    """With an oracle in the grid the window's exact output is its ranking's (one pass over the logits): every cell
    of the window gives the rows of the fused kernel's reference, to rounding."""
    fused = _figure1_window(monkeypatch)
    cell = {"condition": "initialized", "n": 256, "window": 0, "method": method, "num_features": [16, 64],
            "seeds": [0], "dtype": "float64", "base_seed": 0, "mode": "embedding", "layer": 0, "model_seed": 0,
            "data_dir": None, "cache_dir": None, "device": "cpu"}
    figure1_cells._REFERENCES.clear()
    figure1_cells._RANKINGS.clear()
    shared = figure1_cells.compute_cell({**cell, "ranking_budgets": [16, 64]})
    assert not figure1_cells._RANKINGS  # the oracles read the reference's ranking
    ref = figure1_cells._reference(cell)  # the window's entry, for any cell of it
    assert ref["ranking"] is not None and ref["output"] is not fused["output"]
    torch.testing.assert_close(ref["output"], fused["output"], rtol=1e-13, atol=1e-15)
    figure1_cells._REFERENCES.clear()
    alone = figure1_cells.compute_cell(cell)  # no ranking budgets: the fused reference
    assert not figure1_cells._REFERENCES
    for a, b in zip(shared, alone):
        assert (a["num_features"], a["status"]) == (b["num_features"], "ok")
        for column in ("error_mean", "error_max", "relative_error_mean"):
            assert a[column] == pytest.approx(b[column], rel=1e-9, abs=0.0), (method, column)


def test_the_figure1_cells_carry_the_budgets_of_the_oracles():
    from approxlab.studies.registry import get as study

    figure1 = study("figure1")
    settings = {"data_dir": None, "cache_dir": None, "device": "cpu"}
    for methods, budgets in ((["performer", "topk"], [16, 64]), (["performer"], [])):
        grid = figure1.configure(figure1.arguments(conditions=["initialized"], n=[256], num_features=[16, 64],
                                                   windows=1, seeds=1, dtypes=["float64"], methods=methods))
        cells = figure1_cells.approximation_cells(grid, settings)
        assert [cell["ranking_budgets"] for cell in cells] == [budgets] * len(methods)


@pytest.mark.parametrize("p, shared", [(0.9999, True), (0.5, False)])
def test_topp_keeping_every_ranked_key_reads_topk_s_result_and_its_own_numbers_otherwise(p, shared):
    """topp whose cap binds on every row (every ranked key kept) after topk at the same budget and ``v``: topk's
    result, handed back; where some row keeps fewer, its own. Both equal topp without a ranking."""
    q, k, v = _with_ties(2)
    ranking = rank_keys(q, k, BUDGETS)
    budget = BUDGETS[0] if shared else BUDGETS[-1]
    first = approxlab.approximate("topk", q, k, v, num_features=budget, ranking=ranking)
    second = approxlab.approximate("topp", q, k, v, num_features=budget, ranking=ranking, p=p)
    alone = approxlab.approximate("topp", q, k, v, num_features=budget, p=p)
    assert (second.output is first.output) == shared
    assert bool((alone.info["kept"] == budget).all()) == shared  # the cap binds on every row, or not
    for name in ("indices", "kept", "kept_mass", "dropped_mass"):
        assert torch.equal(second.info[name], alone.info[name]), name
    assert torch.equal(second.output, alone.output)
    other_v = v.clone()  # another v: not handed back
    assert approxlab.approximate("topp", q, k, other_v, num_features=budget, ranking=ranking,
                                 p=p).output is not first.output


def test_the_ranking_reference_is_kept_while_its_window_s_record_is_the_loader_s(monkeypatch):
    from types import SimpleNamespace

    _figure1_window(monkeypatch)
    cell = {"condition": "initialized", "n": 256, "window": 0, "method": "topk", "num_features": [16],
            "ranking_budgets": [16], "seeds": [0], "dtype": "float64", "base_seed": 0, "mode": "embedding",
            "layer": 0, "model_seed": 0, "data_dir": None, "cache_dir": None, "device": "cpu"}
    figure1_cells._REFERENCES.clear()
    first = figure1_cells._reference(cell)
    assert figure1_cells._reference({**cell, "ranking_budgets": []}) is first  # any cell of the window
    record = figure1_cells.wikitext.qkv(None)
    again = SimpleNamespace(**vars(record))  # the loader's caches emptied: a new record of the same window
    monkeypatch.setattr(figure1_cells.wikitext, "qkv", lambda window: again)
    second = figure1_cells._reference(cell)
    assert second is not first and torch.equal(second["output"], first["output"])
