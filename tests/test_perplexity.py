"""``approxlab perplexity`` end to end on a tiny random Llama (tied embeddings, so it scores tokens) and the packaged
all-MiniLM-L6-v2 encoder, offline: its tables, claims, figures and summary; the change in log-perplexity against
a hand-made computation; the statistics of its claims; the rankings read from saved figure1 and decoder runs; its
one-line errors. ``approxlab perplexity --quick`` on the packaged SmolLM2 runs in tests/test_perplexity_quick.py,
the kill test in tests/test_perplexity_kill.py."""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from test_models_qkv import save_tiny_checkpoint

import approxlab
from approxlab.cli import main
from approxlab.errors import UsageError
from approxlab.patching import token_nll
from approxlab.studies import perplexity
from approxlab.studies.engine import read_results
from approxlab.studies.perplexity import (cells, claims, gating, grid, judging, prediction, premise_claims, references,
                                         resampling, stats)
from approxlab.studies.perplexity.agreement import agreement

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIGURE1 = ROOT / "figures" / "figure1"
GRID = ["--n", "32", "--context", "24", "--continuation", "8", "--num-features", "8,16", "--methods",
        "performer,informer,nystromformer,streaming-llm", "--encoder-methods", "nystromformer", "--layer-settings",
        "last,all", "--depths", "first", "--config-methods", "streaming-llm", "--windows", "3", "--long-n", "96",
        "--long-features", "4", "--long-windows", "1", "--no-progress",
        *(["--compare-with", str(FIGURE1)] if (FIGURE1 / "results.csv.bz2").is_file() else [])]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny random decoder whose output embedding is its input embedding (token_nll can score it)."""
    return save_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny-llama") / "llama", tie_word_embeddings=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("perplexity-cache")


@pytest.fixture(scope="module", autouse=True)
def fewer_resamples():
    """200 bootstrap resamples instead of 2,000, a coverage of 5 draws (the intervals' code is the same; the tests
    check it, not coverage)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(claims.RESAMPLING, "resamples", 200)
        patch.setitem(prediction.COVERAGE_TRIALS, "trials", 5)
        patch.setitem(prediction.COVERAGE_TRIALS, "resamples", 20)
        patch.setitem(prediction.COVERAGE_TRIALS, "subsets", 2)
        patch.setitem(premise_claims.INNER, "resamples", 50)
        patch.setitem(premise_claims.INNER, "final", 200)
        yield


@pytest.fixture(scope="module")
def run(llama, cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("perplexity-run")
    assert main(["perplexity", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(out), *GRID]) == 0
    return out


def test_tables_figures_claims_and_summary(run):
    for name in ("baseline.csv", "perplexity.csv.gz", "layer_errors.csv", "encoder.csv", "cost.csv", "long.csv",
                 "delta.csv", "observations.csv", "correlations.csv", "verdicts.csv", "prediction.csv",
                 "calibration.csv", "encoder_stats.csv", "long_stats.csv", "premise.csv", "premise_rho.csv",
                 "premise_loss.csv", "former_verdicts.csv", "premise_former_rule.csv", "summary.md", "perplexity-d.png",
                 "perplexity-error.pdf", "perplexity-kv.png", "perplexity-within.png", "perplexity-long.png",
                 "config.json", "timing.json"):
        assert (run / name).is_file(), name
    runs = read_results(run / "perplexity.csv.gz")
    assert (runs["status"] == "ok").all(), runs.loc[runs["status"] != "ok", "status"]
    # settings: layer 1 (last), all, KV cache, layer 0 (--depths); methods: the control once, four methods at two
    # d; 3 windows
    assert len(runs) == 4 * (1 + 4 * 2) * 3
    assert set(runs["layers"]) == {"layer 0", "layer 1", "all"} and set(runs["setting"]) == {"whole", "kv-cache"}
    # clean-input errors of the two multi-layer settings; the configurations at the middle budget, 16
    clean = read_results(run / "clean_errors.csv")
    assert len(clean) == 2 * (1 + 4 * 2) * 3 and set(clean["layers"]) == {"all"}
    assert (clean["error_inputs"] == "the unpatched model's").all() and (clean["status"] == "ok").all()
    assert (clean.loc[clean["method"] == "exact", "spectral_median"] < 1e-5).all()
    designed = read_results(run / "configs.csv")
    assert len(designed) == 5 * 3 and set(designed["num_features"]) == {16}
    assert set(designed["config"]) == {f"sinks={s}" for s in (0, 1, 4, 16, 32)}
    assert set(runs.loc[runs["method"] == "nystromformer", "causal"]) == {"mask-renormalise"}
    # the attention measures: a sparse cache policy's kept mass, every matrix method's total variation
    assert runs.loc[runs["method"] == "performer", "total_variation_median"].gt(0).all()
    layers = read_results(run / "layer_errors.csv")
    assert len(layers) == 3 * 9 * (1 + 2 + 2 + 1)  # per replaced layer: 1, 2, 2 (the KV cache), 1 (layer 0)
    control = runs[runs["method"] == "exact"]
    assert (control["spectral_median"] < 1e-5).all()
    observed = read_results(run / "observations.csv")
    assert (observed["mask_renormalise"] == 1).all() and (observed["methods"] == 3).all()
    verdicts = read_results(run / "verdicts.csv")
    # 3 methods: below the 5 a claim across methods needs, so every verdict across methods is withheld
    across = verdicts[verdicts["claim"].isin(["p1", "p1d", "p2", "p3"])]
    assert len(across) and (across["former_verdict"] == "no verdict (too few units)").all()
    assert not (verdicts["method"] == "nystromformer").any()
    # long context: 2 settings x (the unpatched model, the control, 3 decoder-valid methods) x 1 window x 2 depths
    long = read_results(run / "long.csv")
    assert len(long) == 2 * 5 * 2 and "nystromformer" not in set(long["method"])
    assert set(long["correct"]) <= {0.0, 1.0} and (long["answer_logprob"] <= 0).all()
    # the unpatched model replaces no layer: its errors are not measured (NaN), not failed (inf)
    unpatched = long[long["method"] == "unpatched"]
    errors = [f"{m}_{s}" for m in ("spectral", "frobenius", "worst_query") for s in ("median", "max")]
    assert len(unpatched) and unpatched[errors].isna().all().all()
    assert np.isfinite(long.loc[long["method"] != "unpatched", "spectral_median"]).all()
    summary = (run / "summary.md").read_text()
    premise = read_results(run / "premise.csv")
    depths = set(runs.loc[runs["layers"].str.startswith("layer"), "layers"])
    for layers in premise.loc[premise["kind"] == "clean", "layers"]:  # one depth, or every depth when pooled
        assert layers in ("all", "-") or set(layers.split(", ")) <= depths, layers
    assert premise["verdict"].str.startswith(("no verdict", "not run")).all()  # a quick run decides nothing
    assert summary_starts_with_in_short(run)
    for text in ("## The premise's claims", "## The committed design's claims", "(p1)", "(p1w)", "(p1d)", "(p2)", "(p3)", "## Deviations", "Weights of the decoder",
                 "What entered the claims", "Not decoder attention", "## Long context", "## The encoder",
                 "## Cost of a patched forward pass", "## Against the papers", "KV cache (budget d)",
                 "(p3) and (p4) draw methods and windows (sequences) crossed",
                 "### Changes of verdict", "| coverage (own units) | verdict |", "| former verdict (90% gate) |"):
        assert text in summary, text
    assert not re.search(r"\bnan\b", summary.lower())
    timed = [read_results(run / name)["seconds"]
             for name in ("baseline.csv", "perplexity.csv.gz", "encoder.csv", "long.csv")]
    assert f"over {sum(int(seconds.map(math.isfinite).sum()) for seconds in timed):,} cells" in summary


def test_the_change_in_log_perplexity_is_the_patched_minus_the_unpatched_nll(run, llama, cache):
    """One cell recomputed by hand: the window's first n tokens, the unpatched and the patched model's mean NLL."""
    runs, baseline = read_results(run / "perplexity.csv.gz"), read_results(run / "baseline.csv")
    row = runs[(runs["method"] == "performer") & (runs["layers"] == "all") & (runs["setting"] == "whole")].iloc[0]
    config = perplexity.build_config(num_layers=2, checkpoint=str(llama), n=[32], context=24, continuation=8,
                                     num_features=[8, 16], methods=["performer"],
                                     encoder_methods=["nystromformer"], layer_settings=["last", "all"], windows=3)
    cell = next(c for c in grid.decoder_cells(config, {"cache_dir": str(cache)})
                if c["setting"] == "whole" and c["layers"] == "all" and c["method"] == "performer"
                and c["window"] == row["window"] and c["num_features"] == row["num_features"])
    model = cells.decoder_model(cell)
    ids = cells.window_tokens(cell)[:, :32]
    before = token_nll(model, ids)
    key = tuple(cell[c] for c in cells.DECODER_KEY)
    generator = torch.Generator().manual_seed(cells.cell_seed(*key, base_seed=0))
    with approxlab.patch_attention(model, "performer", num_features=int(row["num_features"]), generator=generator):
        after = token_nll(model, ids)
    unpatched = baseline[(baseline["setting"] == "whole") & (baseline["window"] == row["window"])]["nll"].iloc[0]
    assert math.isclose(float(before.mean()), unpatched, rel_tol=1e-12)
    assert math.isclose(float(after.mean()), row["nll"], rel_tol=1e-12)


def test_resume_computes_nothing_and_plot_only_redraws(run, llama, cache, monkeypatch):
    before = {name: read_results(run / name) for name in ("perplexity.csv.gz", "layer_errors.csv", "encoder.csv")}
    monkeypatch.setattr(perplexity, "STUDY", dataclasses.replace(perplexity.STUDY, figures=()))
    assert main(["perplexity", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(run), *GRID]) == 0
    for name, table in before.items():
        pd.testing.assert_frame_equal(read_results(run / name), table)
    summary = (run / "summary.md").read_text()
    assert main(["perplexity", "--out", str(run), "--plot-only", "--no-progress"]) == 0
    assert (run / "summary.md").read_text() == summary
    if "--compare-with" in GRID:  # dropping --compare-with keeps the saved comparison, recomputes nothing
        references = read_results(run / "references.csv")
        without = GRID[:GRID.index("--compare-with")] + GRID[GRID.index("--compare-with") + 2:]
        assert main(["perplexity", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(run),
                     *without]) == 0
        pd.testing.assert_frame_equal(read_results(run / "references.csv"), references)
        assert "(p3)" in (run / "summary.md").read_text() and "not decided" not in (run / "summary.md").read_text()


def _cells(rho_sign=1.0, methods=6, budgets=(8, 16, 32, 64, 128), windows=4, within_sign=1.0) -> pd.DataFrame:
    """Observations of one setting: method i's loss grows with its error across methods (``rho_sign``); within a
    method the loss follows its error over budgets with ``within_sign``."""
    rows = []
    for i in range(methods):
        for j, d in enumerate(budgets):
            for w in range(windows):
                error = (i + 1) * 0.1 + 0.001 * j
                delta = rho_sign * (i + 1) + within_sign * 0.01 * j + 1e-4 * w
                rows.append({"method": f"m{i}", "window": w, "budget": float(d), "delta": delta, "spectral": error,
                             "frobenius": error, "worst_query": -error, "missed_mass": np.nan,
                             "total_variation": error, "inverse_budget": 1.0 / d})
    return pd.DataFrame(rows)


def test_p1_across_and_within_methods_are_told_apart():
    """Across methods the error ranks the losses; within each method, over its budgets, it ranks them backwards:
    p1 holds (over 10 methods: with 6, resampling the methods leaves the interval wide), p1w and every p1m are
    rejected, each at a fixed budget holds."""
    cells_ = _cells(within_sign=-1.0, methods=10)
    verdicts, correlations = judging.judge_setting(cells_, "whole", "all")
    table = pd.DataFrame(verdicts)  # the verdicts by the intervals (before the coverage gate: former_verdict)
    assert table.set_index("claim").loc["p1", "former_verdict"] == "ranks the losses"
    assert table.set_index("claim").loc["p1w", "estimate"] == pytest.approx(-1.0)
    assert table.set_index("claim").loc["p1w", "former_verdict"] == "does not rank the losses"
    assert set(table.loc[table["claim"] == "p1d", "former_verdict"]) == {"ranks the losses"}
    per = pd.DataFrame(judging.per_method(cells_, "whole", "all"))
    assert len(per) == 10 and (per["former_verdict"] == "does not rank the losses").all()
    p2 = table[table["claim"] == "p2"].set_index("measure")
    assert p2.loc["worst_query", "former_verdict"] == "worse than spectral"
    assert "missed_mass" not in p2.index  # a measure no method recorded is not compared
    assert set(pd.DataFrame(correlations)["measure"]) == set(claims.MEASURES)


def summary_starts_with_in_short(run) -> bool:
    """The first section after the title and its note is "In short"."""
    return (run / "summary.md").read_text().split("\n## ")[1].startswith("In short")


def test_the_former_premise_claims_are_superseded_and_p3_is_calibrated():
    """(p1), (p1w), (p1d), (p2) and (p1m) are replaced by premise.csv's claims: their rows keep the reading of their
    percentile interval as ``former_verdict``, name the claims that replace them, and measure no coverage; (p3) is
    read from its calibrated interval, the former 90% coverage gate's verdict beside (here it withheld the
    verdict)."""
    cells_ = _cells(within_sign=-1.0, methods=10)
    verdicts, _ = judging.judge_setting(cells_, "whole", "all")
    table = pd.DataFrame(verdicts)
    assert (table["verdict"] == [f"superseded by premise.csv ({gating.SUPERSEDED_BY[c]})" for c in table["claim"]]).all()
    assert table["coverage"].isna().all() and table.set_index("claim").loc["p1", "former_verdict"] == "ranks the losses"
    per = pd.DataFrame(judging.per_method(cells_, "whole", "all"))
    assert (per["verdict"] == "superseded by premise.csv (pw, pp)").all()
    noisy = _cells(budgets=(8,), methods=20, windows=6)  # windows disagree: the method means vary with the draw
    noisy["delta"] += np.random.default_rng(0).normal(0.0, 3.0, len(noisy))
    rows, _ = agreement({("whole", "layer 0"): (noisy, {})}, pd.DataFrame(
        {"reference": "r", "study": "decoder", "layer": 0, "checkpoint": "c", "reference_n": 512,
         "method": [f"m{i}" for i in range(20)], "num_features": 8, "error": range(1, 21)}), {"checkpoint": "c"})
    p3 = rows[0]  # judged on its calibrated interval; the 90% gate's reading (first 100 draws) beside
    assert p3["verdict"] == "same places" and p3["ci_low"] <= p3["nominal_low"] and p3["calibrated_level"] >= 0.95
    assert 0 <= p3["coverage"] <= 1 and p3["coverage_draws"] >= 200 and p3["calibration"] == ""
    assert re.fullmatch(r"no verdict: coverage \d+\.\d% < 90%", p3["former_verdict"])  # the gate withheld it


def test_the_interval_across_methods_resamples_methods():
    """Four windows that agree perfectly: an interval over windows alone would be a point; the two-level interval
    still has width from the methods (two of the six reversed)."""
    cells_ = _cells()
    cells_.loc[cells_["method"].isin(["m0", "m5"]), "spectral"] *= -1  # two methods out of order
    found = resampling.two_level(cells_, {"p1": resampling.across("spectral")}, columns=claims.MEASURES,
                                 resamples=200, seed=0)["p1"]
    low, high = resampling.percentile(found[0], found[1])
    assert high - low > 0.2 and found[2] == 6


def test_the_report_does_without_the_per_layer_table(run, tmp_path):
    """``layer_errors.csv`` (one row per replaced layer: 20 MB for the full grid, kept out of the repository) is
    read by no claim, table or figure: without it, ``--plot-only`` writes the same summary."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    for name in ("layer_errors.csv", "layer_errors.csv.cells"):
        (copy / name).unlink()
    assert main(["perplexity", "--out", str(copy), "--plot-only", "--no-progress"]) == 0
    assert (copy / "summary.md").read_text() == (run / "summary.md").read_text()


def test_a_measure_some_methods_lack_is_ranked_where_it_exists():
    """The kept attention mass exists for sparse methods only: its rho is over the cells where it is finite (as its
    paired difference is), not NaN because one method lacks it; a measure no method recorded stays NaN."""
    cells_ = _cells()
    cells_.loc[cells_["method"] != "m0", "missed_mass"] = cells_["spectral"]  # m0 is not sparse
    data = {c: cells_[c].to_numpy(float) for c in ("missed_mass", "delta", "spectral")}
    assert resampling.across("missed_mass")(data) == pytest.approx(resampling.spearman(
        data["spectral"][1 * 5 * 4:], data["delta"][1 * 5 * 4:]))
    assert math.isfinite(resampling.across("missed_mass")(data))
    assert math.isnan(resampling.across("missed_mass")({**data, "missed_mass": np.full(len(cells_), np.nan)}))


def test_long_settings_are_named_apart_in_the_summary():
    from approxlab.studies.perplexity.claims_summary import setting_text
    assert setting_text("long-whole", "all, 2048 tokens") != setting_text("long-kv", "all, 2048 tokens")
    assert setting_text("kv-cache", "all") == "KV cache, all layers" and setting_text("whole", "0") == "0 replaced"


def test_floor_ties_degenerate_points_and_mask_renormalise_leave_the_claims():
    frame = pd.DataFrame([
        {"setting": "kv-cache", "layers": "all", "method": m, "num_features": d, "window": w, "ok": True,
         "delta": delta + 1e-7 * w, "spectral_median": error, "frobenius_median": error, "worst_query_median": error,
         "causal": causal}
        for w in range(3)
        for m, d, delta, error, causal in [("exact", 8, 1e-6, 1e-9, "True"), ("a", 8, 0.5, 0.3, "True"),
                                           ("a", 32, 1e-7, 0.01, "True"), ("b", 8, 0.2, 1e-8, "True"),
                                           ("c", 8, 0.1, 0.2, "mask-renormalise"), ("d", 64, 0.3, 0.3, "only")]])
    cells_, counts = judging.observations(frame, {"control": "exact", "context": 64, "n": 128})
    assert counts["mask_renormalise"] == 1 and "c" not in set(cells_["method"])
    # b returned exact attention, d's budget covers the context: both dropped and counted
    assert counts["degenerate"] == 2 and set(cells_["method"]) == {"a"}
    assert counts["floor"] == pytest.approx(1.2e-6 + 2 * np.std([1e-6, 1.1e-6, 1.2e-6], ddof=1))
    assert counts["tied"] == 3 and (cells_.loc[cells_["budget"] == 32, "delta"] == 0).all()


def test_a_method_exact_in_some_heads_only_is_not_dropped_as_exact_attention():
    """The degenerate rule reads the largest error over heads: b is exact in most heads (its median at the kernel's
    floor, as DuoAttention's retrieval heads) but not in all, and stays; e is exact in every head and is dropped. The
    median over heads (the rule as first declared, still read where a table lacks ``spectral_max``) dropped both."""
    frame = pd.DataFrame([
        {"setting": "kv-cache", "layers": "all", "method": m, "num_features": 8, "window": w, "ok": True,
         "delta": delta, "spectral_median": median, "spectral_max": largest, "frobenius_median": median,
         "worst_query_median": median, "causal": "True"}
        for w in range(3)
        for m, delta, median, largest in [("exact", 0.0, 1e-9, 1e-9), ("a", 0.5, 0.3, 0.6), ("b", 0.4, 1e-8, 0.4),
                                          ("e", 1e-9, 1e-8, 2e-8)]])
    config = {"control": "exact", "context": 64, "n": 128}
    cells_, counts = judging.observations(frame, config)
    assert counts["degenerate"] == 1 and counts["degenerate_points"] == "e d=8" and set(cells_["method"]) == {"a", "b"}
    assert judging.exact_column(frame) == "spectral_max"
    former, former_counts = judging.observations(frame.drop(columns="spectral_max"), config)
    assert former_counts["degenerate"] == 2 and set(former["method"]) == {"a"}


def test_the_verdicts_under_the_first_degenerate_rule_stand_beside_the_changed_ones():
    from approxlab.studies.perplexity.premise_summary import _rule_changes

    rows = pd.DataFrame({"claim": ["p1", "p2"], "setting": ["whole", "whole"], "layers": ["all", "all"],
                         "kind": ["clean", "clean"], "measure": ["spectral", "frobenius"], "num_features": [-1, -1],
                         "estimate": [0.9, 0.5], "ci_low": [0.8, 0.3], "ci_high": [0.95, np.nan],
                         "verdict": ["holds", "inconclusive"]})
    assert "2 of 2 claim instances keep their estimate, interval and verdict; 0 change" in _rule_changes(rows, rows)[0]
    now = rows.assign(estimate=[0.85, 0.5], verdict=["inconclusive", "inconclusive"])
    lines = _rule_changes(now, rows)
    assert "1 of 2 claim instances keep" in lines[0] and "1 change" in lines[0]
    changed = [line for line in lines if line.startswith("| p1 ")]
    assert len(changed) == 1 and "0.9 [0.8, 0.95] | holds | 0.85 [0.8, 0.95] | inconclusive" in changed[0]
    assert _rule_changes(now, pd.DataFrame(columns=["claim", "verdict"])) == []  # no former rule's verdicts kept


def test_p3_on_method_means_reaches_its_threshold():
    """The reference orders the methods as their mean losses do, though windows disagree: rho = 1 on the means."""
    cells_ = _cells(budgets=(8,), windows=12, methods=10)
    cells_["delta"] += np.where(cells_["window"] % 2 == 0, 1.5, -1.5) * (cells_["method"] == "m2")  # crosses m1, m3
    reference = pd.DataFrame({"reference": "r", "study": "decoder", "layer": 0, "checkpoint": "ckpt",
                              "reference_n": 512, "method": [f"m{i}" for i in range(10)] + ["gone"],
                              "num_features": 8, "error": [*range(1, 11), math.inf]})
    rows, labels = agreement({("whole", "layer 0"): (cells_, {})}, reference, {"checkpoint": "ckpt"})
    assert rows[0]["estimate"] == pytest.approx(1.0) and rows[0]["former_verdict"] == "same places"
    assert labels["failed_in_reference"].iloc[0] == "gone"
    assert labels["compared_with"].iloc[0] == "layer 0 (same layer)" and "same model" in labels["model"].iloc[0]


def test_leave_one_method_out_prefers_the_measure_that_orders_the_losses():
    rows = pd.DataFrame(prediction.leave_one_method_out(_cells(), 1e-6, "whole", "all")).set_index("measure")
    assert rows.loc["spectral", "held_out_error"] < rows.loc["inverse_budget", "held_out_error"]


def test_deltas_mark_failures_as_inf_and_statistics_leave_them_out():
    perplexity_table = pd.DataFrame({"setting": "whole", "layers": "all", "method": "m", "num_features": 8,
                                     "window": [0, 1, 2], "nll": [3.5, math.inf, 3.25],
                                     "status": ["ok", "FloatingPointError: x", "ok"],
                                     "spectral_median": [0.5, math.inf, 0.25], "frobenius_median": 0.1,
                                     "worst_query_median": 0.2})
    baseline = pd.DataFrame({"setting": "whole", "window": [0, 1, 2], "nll": [3.0, 3.0, 3.0]})
    frame = stats.deltas(perplexity_table, baseline)
    assert frame["delta"].tolist() == [0.5, math.inf, 0.25]
    table = stats.delta_statistics(frame)
    assert table["delta"].iloc[0] == pytest.approx(0.375) and table["failures"].iloc[0] == 1
    assert table["windows"].iloc[0] == 3


def test_a_point_with_failed_windows_gets_an_interval_over_its_own_windows_and_its_failures_beside():
    """The KV row that read `nystrom | 12.5 [inf, inf]`: 9 of 12 windows failed, and the interval resampled every
    window of the run, so a resample without any of the 3 survivors gave no value and the bounds inf, the estimate
    outside them. Now each point resamples its own windows; one survivor gives no interval (n/a), none gives n/a."""
    rows = []
    for method, failed in (("full", set()), ("most-failed", set(range(9))), ("one-left", set(range(11))),
                           ("none-left", set(range(12)))):
        for window in range(12):
            bad = window in failed
            rows.append({"setting": "kv-cache", "layers": "all", "method": method, "num_features": 8,
                         "window": window, "nll": math.inf if bad else 3.0 + 0.1 * window + 0.01 * len(failed),
                         "status": "FloatingPointError: x" if bad else "ok",
                         "spectral_median": math.inf if bad else 0.5, "frobenius_median": 0.1,
                         "worst_query_median": 0.2})
    baseline = pd.DataFrame({"setting": "kv-cache", "window": range(12), "nll": 3.0})
    table = stats.delta_statistics(stats.deltas(pd.DataFrame(rows), baseline)).set_index("method")
    assert np.isfinite(table.loc[["full", "most-failed"], ["delta_low", "delta_high"]].to_numpy()).all()
    for method in ("full", "most-failed"):
        assert table.loc[method, "delta_low"] <= table.loc[method, "delta"] <= table.loc[method, "delta_high"]
    assert np.isnan(table.loc["one-left", ["delta_low", "delta_high"]].astype(float)).all()
    assert table.loc["none-left", "delta"] == math.inf
    from approxlab.studies.perplexity.claims_summary import delta_cells

    cells_ = dict(zip(table.index, delta_cells(table.reset_index())))
    assert re.fullmatch(r"[\d.]+ \[[\d.]+, [\d.]+\]", cells_["full"])
    assert re.fullmatch(r"[\d.]+ \[[\d.]+, [\d.]+\] \(9 of 12 failed\)", cells_["most-failed"])
    assert re.fullmatch(r"[\d.]+ \[n/a\] \(11 of 12 failed\)", cells_["one-left"])
    assert cells_["none-left"] == "n/a (12 of 12 failed)"
    assert not any("inf" in cell for cell in cells_.values())


@pytest.mark.parametrize(("folder", "table"), [("figures/decoder", "results.csv"),
                                               ("figures/figure1", "results.csv.bz2")])
def test_the_rankings_of_the_committed_runs_are_read(folder, table):
    if not (ROOT / folder / table).is_file():
        pytest.skip(f"no committed {folder}")
    rows = pd.DataFrame(references.compute_reference({"reference": str(ROOT / folder), "n": 512}))
    lengths = pd.read_csv(ROOT / folder / table, usecols=["n"])["n"].unique()
    closest = min(lengths, key=lambda n: (abs(n - 512), n))  # the folder's length closest to this run's n
    assert set(rows["study"]) == {folder.split("/")[1]} and (rows["reference_n"] == closest).all()
    assert rows["condition"].eq("pretrained").all() and np.isfinite(rows["error"]).any()
    assert "performer" in set(rows["method"]) and (rows["samples"] >= 1).all()


def test_grid_errors_name_the_option(tmp_path):
    with pytest.raises(UsageError, match="--methods: methods with a causal form .*, got 'linformer'"):
        perplexity.build_config(num_layers=30, methods=["linformer"])
    with pytest.raises(UsageError, match="--layer-settings: layer indices in 0..29 .*, got 0,30"):
        perplexity.build_config(num_layers=30, layer_settings=[0, 30])
    with pytest.raises(UsageError, match="--compare-with: result folders of figure1 or decoder runs"):
        perplexity.build_config(num_layers=30, compare_with=[str(tmp_path)])
    with pytest.raises(UsageError, match="--methods: each value at most once, got 'topk,topk'"):
        perplexity.build_config(num_layers=30, methods=["topk", "topk"])
    config = perplexity.build_config(num_layers=30, layer_settings=["last", 29, "all"], methods=["topk"])
    assert config["layers"] == ["layer 29", "all"] and config["methods"] == ["topk"]
    assert grid.method_features(config, "yoso-e") == [16]
    assert grid.method_features(config, "topk") == [16, 32, 64, 128, 256]


def _raises(q, k, v, *, num_features, generator=None, causal=False):
    raise RuntimeError("the plugin's own bug")


def _non_finite(q, k, v, *, num_features, generator=None, causal=False):
    return torch.full((*q.shape[:-1], v.shape[-1]), math.nan, dtype=v.dtype)


def test_a_method_that_fails_gets_failed_rows_and_the_report_is_written(fresh_registry, llama, cache, tmp_path,
                                                                         capsys):
    """A registered method raising RuntimeError used to end the run with a traceback (only ArithmeticError and
    LinAlgError were caught), and one with a non-finite output raised FloatingPointError from the cost step:
    both are failed rows naming their error (inf nll, inf cost), and the run writes its report."""
    from approxlab.methods import register

    register("raises", _raises, target="softmax", features="ignored", randomized=False, causal=True)
    register("non-finite", _non_finite, target="softmax", features="ignored", randomized=False, causal=True)
    out = tmp_path / "run"
    grid = [*GRID]
    grid[grid.index("--methods") + 1] = "raises,non-finite,performer"
    grid[grid.index("--windows") + 1] = "2"
    grid[grid.index("--layer-settings") + 1] = "last"
    assert main(["perplexity", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(out), *grid]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "method 'raises' failed in" in err, err
    rows = read_results(out / "perplexity.csv.gz")
    failed = rows[rows["method"] == "raises"]
    assert len(failed) and (failed["status"] == "RuntimeError: the plugin's own bug").all()
    assert (failed["nll"] == math.inf).all()
    assert (rows.loc[rows["method"] == "non-finite", "status"].str.startswith("FloatingPointError")).all()
    assert (rows.loc[rows["method"] == "performer", "status"] == "ok").all()
    cost = read_results(out / "cost.csv").set_index("method")
    assert cost.loc["raises", "status"] == "RuntimeError: the plugin's own bug"
    assert cost.loc["non-finite", "status"].startswith("FloatingPointError")
    assert cost.loc["non-finite", "ratio"] == math.inf and cost.loc["performer", "status"] == "ok"
    assert (out / "summary.md").is_file()


def test_the_default_methods_come_from_the_registry():
    from approxlab.methods import causal_support

    causal = set(causal_support(True)) | set(causal_support("mask-renormalise"))
    assert set(grid.METHODS) == causal - {"exact"}
    new = {"criticalkv", "caote", "minference", "xattention", "flexprefill", "duo-attention"}
    assert new <= set(grid.FULL_GRID["methods"]) and new <= set(grid.build_config(num_layers=30)["long_methods"])
    assert grid.FULL_GRID["windows"] >= 12 and len(grid.FULL_GRID["num_features"]) >= claims.MIN_BUDGETS


def test_a_reference_without_finite_errors_is_refused_before_any_cell(tmp_path):
    """A compared run whose errors are all non-finite gives no ranking: refused when the run is configured (not
    after its cells, as a KeyError or ValueError of the report)."""
    assert (FIGURE1 / "results.csv.bz2").is_file(), "the committed figures/figure1 run is this test's reference"
    folder = tmp_path / "figure1"
    folder.mkdir()
    for name in ("config.json", "results.csv.bz2"):
        (folder / name).write_bytes((FIGURE1 / name).read_bytes())
    results = pd.read_csv(folder / "results.csv.bz2")
    results["relative_error_mean"] = math.inf
    results.to_csv(folder / "results.csv.bz2", index=False)
    with pytest.raises(UsageError, match="--compare-with: .*no finite relative_error_mean"):
        perplexity.build_config(num_layers=30, compare_with=[str(folder)])


class _DigitTokenizer:
    """Words and punctuation as tokens, a space before a digit as a token of its own, each digit a token (as
    SmolLM2's tokenizer writes " 40076"); ``merge=True``: a space and the digits as one token (as GPT-2 does)."""

    def __init__(self, merge=False):
        self.merge, self.vocab = merge, {}

    def _pieces(self, text):
        return re.findall(r" ?[A-Za-z]+|[?.\n]| ?\d+" if self.merge else r" ?[A-Za-z]+|[?.\n]| (?=\d)|\d", text)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.vocab.setdefault(piece, len(self.vocab)) for piece in self._pieces(text)]}

    def decode(self, ids):
        words = {i: piece for piece, i in self.vocab.items()}
        return "".join(words[int(i)] for i in ids)


@pytest.mark.parametrize("merge", [False, True])
def test_the_pass_key_scores_the_key_s_tokens_not_a_space_before_them(merge):
    from approxlab.studies.perplexity import passkey

    tokenizer = _DigitTokenizer(merge)
    question, answer = passkey.question_and_key(tokenizer, 40076)
    assert tokenizer.decode(answer).strip() == "40076"
    assert tokenizer.decode(answer) == ("40076" if not merge else " 40076")  # a space token stays in the question
    filler = torch.arange(1000, 1400)
    ids, (first, stop), start = passkey.passkey_sequence(tokenizer, filler, length=300, depth=0.5, key=40076)
    assert ids.shape == (1, 300) and stop == 300
    assert ids[0, first:stop].tolist() == answer.tolist()
    assert ids[0, start:first].tolist() == question.tolist()


def test_the_long_settings_run_the_decoder_valid_methods_but_the_simulations():
    from approxlab.methods import get

    config = grid.build_config(num_layers=30)
    long = config["long_methods"]
    assert "magicpig" not in long and "vattention" not in long and "h2o" in long and "snapkv" in long
    assert all(get(m).causal in (True, "only") for m in long)
    assert {c["method"] for c in grid.long_study_cells(config, {})} == {*long, "unpatched", "exact"}
    chosen = grid.build_config(num_layers=30, long_methods=["magicpig"])["long_methods"]
    assert chosen == ["magicpig"]


def test_every_built_in_cache_policy_has_its_panel_and_a_plugin_s_its_own(fresh_registry):
    """The figures draw the cache policies in two panels (by attention; by position or key geometry): every built-in
    policy is in one of them, not both, and a policy registered by a user lands in a third panel, not among them."""
    from approxlab.methods import available, get, register
    from approxlab import plotting

    policies = {m for m in available() if get(m).causal == "only" and get(m).score is not None}
    assert {plotting.method_family(m) for m in plotting.SPARSE_PREFILL} == {"sparse selection"}  # no cache scores
    assert not set(plotting.ATTENTION_POLICIES) & set(plotting.GEOMETRY_POLICIES)
    assert policies == set(plotting.ATTENTION_POLICIES) | set(plotting.GEOMETRY_POLICIES)
    assert {plotting.method_family(m) for m in plotting.ATTENTION_POLICIES} == {"cache: attention scores"}
    assert {plotting.method_family(m) for m in plotting.GEOMETRY_POLICIES} == {"cache: position, keys"}
    register("my-policy", get("knorm").function, target="softmax", features="cache size", randomized=False,
             causal="only", score=get("knorm").score)
    assert plotting.method_family("my-policy") == "cache: other policies"


def test_p3_names_every_comparison_it_does_not_make():
    """A reference without this run's d, or a run with no single-layer setting, left (p3) with nothing to compare and
    nothing said; a reference without the replaced layer is compared at it as another layer. Each is a row of the
    labels (``compared``), and :func:`not_compared` lists the rows left out (the summary counts them, stderr names
    them)."""
    from approxlab.studies.perplexity.agreement import not_compared

    cells_ = _cells(budgets=(8, 16), methods=10)
    reference = pd.concat([pd.DataFrame({"reference": "r", "study": "decoder", "layer": layer, "checkpoint": "c",
                                         "reference_n": 512, "method": [f"m{i}" for i in range(10)],
                                         "num_features": 8, "error": range(1, 11)}) for layer in (0, 15, 29)])
    rows, labels = agreement({("whole", "layer 1"): (cells_, {}), ("whole", "all"): (cells_, {})}, reference,
                             {"checkpoint": "c"})
    assert len(rows) == 3 and len(labels) == 6
    compared = labels.set_index(["reference_layer", "num_features"])["compared"]
    assert compared[(15, 8)] == "yes, at another layer: the reference has no layer 1"
    assert compared[(15, 16)] == "no: the reference has no d = 16"
    assert sorted(not_compared(labels)["num_features"]) == [16, 16, 16]
    rows, labels = agreement({("whole", "all"): (cells_, {})}, reference, {"checkpoint": "c"})
    assert rows == [] and len(not_compared(labels)) == 3
    assert labels["compared"].str.startswith("no: this run replaces no single layer").all()
