"""The premise's claims of the perplexity study on small synthetic tables: ranks within windows, clean-input error,
depth, the error against the budget, configurations, clones, Holm and no measurable loss."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from approxlab.studies.perplexity import premise, premise_claims, strata
from approxlab.studies.perplexity.premise_data import Points, clones, setting_points
from approxlab.studies.perplexity.premise_products import former_of
from approxlab.studies.perplexity.premise_summary import in_short_lines
from approxlab.studies.perplexity.resampling import spearman

CONFIG = {"control": "exact", "context": 10_000, "n": 10_000}
BUDGETS = (16, 32, 64, 128, 256)


@pytest.fixture(autouse=True)
def fewer_resamples(monkeypatch):
    """50 inner resamples instead of 200 (2,000 on the run itself: 200); the calibration's own draws unchanged."""
    monkeypatch.setitem(premise_claims.INNER, "resamples", 50)
    monkeypatch.setitem(premise_claims.INNER, "final", 200)


def _frame(methods=6, windows=4, layers="layer 0", setting="whole", offset=1.0, within=1.0, noise=0.0, seed=0):
    """``deltas``' table of one setting: method i's error and loss grow with i; within a method the loss follows
    ``within`` x its error over budgets; window k adds ``offset`` x k to every loss (a window effect)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(methods):
        for j, d in enumerate(BUDGETS):
            for k in range(windows):
                error = (i + 1) * 0.1 - 0.01 * j + noise * rng.normal()
                delta = (i + 1) * 0.05 - within * 0.005 * j + offset * k + 0.01 * noise * rng.normal()
                rows.append({"setting": setting, "layers": layers, "method": f"m{i}", "num_features": d, "window": k,
                             "nll": 3.0 + delta, "spectral_median": error, "frobenius_median": error,
                             "worst_query_median": error, "total_variation_median": error, "kept_mass_median": np.nan,
                             "causal": "own", "status": "ok", "ok": True, "delta": delta})
    return pd.DataFrame(rows)


def test_a_resample_s_multiplicities_give_the_rho_of_the_points_repeated():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=9), rng.normal(size=9)
    x[3] = x[5]  # a tie
    weights = np.array([2.0, 0, 1, 3, 1, 0, 1, 2, 1])
    found = strata.weighted_rho(strata._comparisons(x), strata._comparisons(y), weights[None])[0]
    repeated = np.repeat(np.arange(9), weights.astype(int))
    assert found == pytest.approx(spearman(x[repeated], y[repeated]), abs=1e-12)


def test_within_windows_rho_is_the_weighted_rho_of_each_window_s_points():
    """A window's rho under the method multiplicities is the rho of its measured points with each point weighted by
    its method's multiplicity (ties, unmeasured points and a method absent from the points included)."""
    rng = np.random.default_rng(2)
    methods, budgets = 7, 3
    point_method = np.repeat(np.array([0, 1, 2, 4, 5, 6, 3]), budgets)
    x, y = rng.lognormal(size=(4, methods * budgets)), rng.normal(size=(4, methods * budgets))
    x[0, 2], y[1, :4], x[2, 5:9] = np.nan, 0.5, 1.0
    c = rng.integers(0, 3, (6, methods + 1)).astype(float)
    found = strata.WithinWindows(x, y, point_method).values(c)
    for k in range(4):
        finite = np.flatnonzero(np.isfinite(x[k]) & np.isfinite(y[k]))
        expected = strata.weighted_rho(strata._comparisons(x[k, finite]), strata._comparisons(y[k, finite]),
                                       c[:, point_method[finite]])
        np.testing.assert_array_equal(found[:, k], expected)


def test_ranks_within_windows_do_not_count_the_window_effect_as_disagreement():
    """The windows shift every loss by far more than the methods differ: over cells rho is low, within windows 1."""
    points = setting_points(_frame(offset=1.0), pd.DataFrame(), CONFIG)[("whole", "layer 0")]
    rows = pd.DataFrame(premise.unit_rows("whole", "layer 0", points)).set_index("unit")
    assert rows.loc["cells", "rho"] < 0.5
    assert rows.loc["within windows", "rho"] == pytest.approx(1.0)
    verdicts = pd.DataFrame(premise.setting_rows("whole", "layer 0", points)).set_index(["claim", "measure",
                                                                                        "num_features"])
    p1 = verdicts.loc[("p1", "spectral", -1)]
    assert p1["kind"] == "clean" and p1["estimate"] == pytest.approx(1.0)
    assert 0 <= p1["coverage"] <= 1 and p1["coverage_draws"] >= 200


def test_an_error_that_only_tracks_the_budget_says_nothing_beyond_it():
    """Within a method the error falls with d exactly as 1/d does: the paired difference is 0 and the partial
    correlation given d is undefined (no residual), so neither claim holds."""
    points = setting_points(_frame(noise=0.0), pd.DataFrame(), CONFIG)[("whole", "layer 0")]
    table = pd.DataFrame(premise.setting_rows("whole", "layer 0", points)).set_index("claim")
    assert table.loc["pw", "estimate"] == pytest.approx(0.0)
    assert table.loc["pw", "verdict"] != premise_claims.PAIRED.labels["reproduced"]
    assert np.isnan(table.loc["pp", "estimate"]) and table.loc["pp", "verdict"].startswith("no verdict: undefined")


def test_draws_whose_error_ranks_the_budgets_as_d_does_are_said_so_with_their_share():
    """One stratum of 24 breaks the budget's order (m0, window 0): (pp) is defined on the run, but most draws miss
    that stratum and leave it undefined; the verdict says so plainly, with the share of draws and of strata, not
    as a failed calibration."""
    frame = _frame(noise=0.0)
    chosen = (frame["method"] == "m0") & (frame["window"] == 0) & frame["num_features"].isin([16, 32])
    for column in ("spectral_median", "delta"):  # the error and the loss out of the budget's order, together
        frame.loc[chosen, column] = frame.loc[chosen, column].to_numpy()[::-1]
    points = setting_points(frame, pd.DataFrame(), CONFIG)[("whole", "layer 0")]
    assert premise.as_budget_strata(points, "clean") == (23, 24)
    table = pd.DataFrame(premise.setting_rows("whole", "layer 0", points)).set_index("claim")
    pp = table.loc["pp"]
    assert np.isfinite(pp["estimate"]) and pp["calibration"].endswith("(more than the 2.5% a tail may miss)")
    assert re.fullmatch(re.escape(premise.AS_BUDGET) + r": \d+\.\d% of [\d,]+ draws give no interval \(pp undefined "
                        r"or constant in their resamples, each stratum drawn in d's order\); on the run in 23 of 24 "
                        r"method x window strata", pp["verdict"])
    assert "no verdict" not in pp["verdict"]
    line = next(text for text in in_short_lines(table.reset_index().assign(holm_decided=False), pd.DataFrame())
                if "given the budget" in text)
    assert f"The {premise.AS_BUDGET[4:]}, in too many draws for an interval, in layer 0 replaced" in line


def test_an_error_with_information_beyond_the_budget_is_told_by_the_partial_correlation():
    """The loss follows the error's own noise, not only d: the partial correlation given d is positive."""
    frame = _frame(noise=0.0, methods=8)
    extra = np.random.default_rng(3).normal(size=len(frame)) * 0.02
    frame["spectral_median"] += extra
    frame["delta"] += extra
    points = setting_points(frame, pd.DataFrame(), CONFIG)[("whole", "layer 0")]
    table = pd.DataFrame(premise.setting_rows("whole", "layer 0", points)).set_index("claim")
    assert table.loc["pp", "estimate"] > 0.5
    assert table.loc["pp", "verdict"] == premise_claims.PARTIAL.labels["reproduced"]


def test_a_multi_layer_setting_without_clean_errors_is_not_run_on_them_and_with_them_uses_them():
    frame = _frame(layers="all")
    points = setting_points(frame, pd.DataFrame(), CONFIG)[("whole", "all")]
    rows = pd.DataFrame(premise.setting_rows("whole", "all", points))
    clean = rows[rows["kind"] == "clean"]
    assert set(clean["claim"]) == {"p1", "pw", "pp"} and clean["verdict"].str.startswith("not run").all()
    assert (rows.loc[rows["kind"] == "drifting", "verdict"].str.startswith("not run")).sum() == 0
    table = frame[["setting", "layers", "method", "num_features", "window"]].assign(
        spectral_median=-frame["spectral_median"], frobenius_median=1.0, worst_query_median=1.0, status="ok")
    points = setting_points(frame, table, CONFIG)[("whole", "all")]
    assert points.kinds == ("clean", "drifting")
    assert (points.cells["clean spectral"] == -points.cells["drifting spectral"]).all()


def test_near_clones_are_merged_and_named():
    frame = _frame()
    copy = frame[frame["method"] == "m1"].assign(method="m9")
    near = frame[frame["method"] == "m2"].assign(method="m8")  # the same kept tokens, summed in another order
    near = near.assign(nll=near["nll"] * (1 + 1e-6), spectral_median=near["spectral_median"] * (1 - 1e-7))
    other = frame[frame["method"] == "m3"].assign(method="m7", nll=lambda t: t["nll"] * (1 + 1e-4))
    frame = pd.concat([frame, copy, near, other], ignore_index=True)
    found = clones(frame)
    assert sorted(found) == sorted([("m9", d, "m1") for d in BUDGETS] + [("m8", d, "m2") for d in BUDGETS])
    points = setting_points(frame, pd.DataFrame(), CONFIG)[("whole", "layer 0")]
    assert "m9" not in points.methods and "m8" not in points.methods and "m7" in points.methods
    assert len(points.merged) == 2 * len(BUDGETS)


def test_depths_pool_only_with_two_depths_and_configurations_need_their_table():
    one = setting_points(_frame(), pd.DataFrame(), CONFIG)
    assert premise.depth_rows(one)[0]["verdict"].startswith("not run")
    two = setting_points(pd.concat([_frame(), _frame(layers="layer 8", offset=2.0)]), pd.DataFrame(), CONFIG)
    pooled = premise.depth_rows(two)[0]
    assert pooled["estimate"] == pytest.approx(1.0) and pooled["layers"] == "layer 0, layer 8"
    rows, per_method = premise.config_rows(pd.DataFrame(), pd.DataFrame())
    assert rows[0]["verdict"] == "not run: configs.csv holds no rows" and per_method == []


def test_configurations_at_one_budget_are_ranked_by_their_clean_error():
    """Six configurations of each of 5 methods at d = 64; the loss follows the clean error, against the drifting."""
    rng = np.random.default_rng(0)
    rows = []
    for m in range(5):
        for c in range(6):
            for w in range(6):
                clean = c + 0.1 * rng.normal()
                rows.append({"method": f"m{m}", "config": f"c{c}", "num_features": 64, "window": w, "status": "ok",
                             "nll": 3.0 + 0.01 * clean + w + 0.006 * rng.normal(), "clean_spectral_median": clean, "spectral_median": -clean})
    baseline = pd.DataFrame({"setting": "kv-cache", "window": range(6), "nll": 3.0 + np.arange(6)})
    verdicts, per_method = premise.config_rows(pd.DataFrame(rows), baseline)
    found = pd.DataFrame(verdicts).set_index("kind")
    assert found.loc["clean", "estimate"] > 0.9 and found.loc["clean", "verdict"] == "ranks the losses"
    assert found.loc["drifting", "estimate"] < -0.9 and found.loc["drifting", "verdict"] == "does not rank the losses"
    assert len(per_method) == 10 and found.loc["clean", "num_features"] == 64


def test_holm_adjusts_within_each_family():
    table = pd.DataFrame({"family": ["a", "a", "a", "b"], "p": [0.01, 0.02, 0.04, 0.04]})
    found = premise.with_holm(table)
    assert found["p_holm"].tolist() == pytest.approx([0.03, 0.04, 0.04, 0.04])
    assert found["holm_decided"].tolist() == [True, True, True, True]
    found = premise.with_holm(table.assign(p=[0.02, 0.03, 0.04, 0.04]))
    assert found["holm_decided"].tolist() == [False, False, False, True]


def test_no_measurable_loss_is_counted_by_the_stated_rule_at_both_floors():
    """Three points: one whose interval holds 0, one whose mean is inside the kernel floor, one clear loss of 0.5
    nats whose windows disagree (its interval excludes 0): only the first two count, and only the first two have
    no loss that matters."""
    frame = _frame(methods=3)
    points = setting_points(frame, pd.DataFrame(), CONFIG)[("whole", "layer 0")]
    delta = pd.DataFrame({"setting": "whole", "layers": "layer 0", "method": ["m0", "m1", "m2"], "num_features": 16,
                          "delta": [0.001, 1e-7, 0.5], "delta_low": [-0.002, 5e-8, 0.1],
                          "delta_high": [0.004, 2e-7, 0.9]})
    row = premise.loss_rows("whole", "layer 0", points, delta, 1e-6)
    assert row["points"] == 3 and row["no_measurable_loss"] == 2 and row["no_loss_that_matters"] == 2
    assert row["tied_cells"] == 0


def test_in_short_words_every_level_and_says_not_run_plainly():
    frame = pd.concat([_frame(noise=0.02), _frame(layers="all", noise=0.02)])
    settings = setting_points(frame, pd.DataFrame(), CONFIG)
    rows = [r for (s, layer), p in settings.items() for r in premise.setting_rows(s, layer, p)]
    rows += premise.depth_rows(settings) + premise.config_rows(pd.DataFrame(), pd.DataFrame())[0]
    table = premise.with_holm(pd.DataFrame(rows, columns=premise.PREMISE_COLUMNS[:-2]))
    loss = pd.DataFrame([{"points": 10, "no_measurable_loss": 3, "no_loss_that_matters": 4, "tied_cells": 0}])
    text = "\n".join(in_short_lines(table, loss))
    assert text.startswith("## In short")
    assert "Holds in layer 0 replaced: 0.989 [" in text
    assert "Not run in all replaced: n/a (not run: clean_errors.csv holds no clean-input error" in text
    assert "Not run in pooled over depths: n/a (not run: 1 single-layer depth(s)" in text and "Not run in KV cache, all layers" in text
    assert "3 of 10 points at the kernel floor" in text and "no loss that matters (within +-0.01 nats): 4" in text
    former = pd.DataFrame({"claim": ["p1w"], "setting": ["whole"], "layers": ["layer 0"], "measure": ["spectral"],
                           "num_features": [-1], "verdict": ["ranks the losses"]})
    row = table[(table["claim"] == "pp") & (table["layers"] == "layer 0")].iloc[0]
    assert former_of(row, former) == "ranks the losses"


def _kv_frame(gain, windows=6, seed=0, same_at=()):
    """``deltas``' KV-cache rows of snapkv, tova, criticalkv and caote at two budgets: each output-aware policy's
    Delta is its base's minus ``gain`` (nats), with noise and a window effect; at the budgets ``same_at`` criticalkv's
    rows are snapkv's (the same kept tokens)."""
    rng = np.random.default_rng(seed)
    rows = []
    for d in (16, 32, 64):
        for k in range(windows):
            base = {"snapkv": 0.3 + 0.1 * k, "tova": 0.4 + 0.1 * k}
            for name, delta in [*base.items(), ("criticalkv", base["snapkv"] - gain), ("caote", base["tova"] - gain)]:
                rows.append({"setting": "kv-cache", "layers": "all", "method": name, "num_features": d, "window": k,
                             "ok": True, "delta": delta + 0.002 * rng.normal()})
                if name == "criticalkv" and d in same_at:
                    rows[-1]["delta"] = rows[-3]["delta"] + 1e-6  # summed in another order
    return pd.DataFrame(rows)


def test_output_aware_policies_are_judged_against_those_they_extend_and_not_run_without_them():
    """(po): the paired loss difference at each budget, windows resampled; its sign decides, its absence says "not
    run" in the table and in "In short"."""
    less = pd.DataFrame(premise.output_aware_rows(_kv_frame(0.05, same_at=(16,))))
    same = less[less["num_features"] == 16].set_index("measure")
    assert same.loc["criticalkv - snapkv", "verdict"] == f"{premise.SAME}: criticalkv = snapkv"
    assert same.loc["pooled", "methods"] == 1 and same.loc["pooled", "estimate"] == pytest.approx(0.05, abs=0.005)
    less = less[less["num_features"] != 16]
    assert set(less["num_features"]) == {32, 64} and set(less["measure"]) == {"pooled", "criticalkv - snapkv",
                                                                             "caote - tova"}
    pooled = less[less["measure"] == "pooled"]
    assert (pooled["estimate"] - 0.05).abs().max() < 0.005 and (pooled["ci_low"] > 0).all()
    assert (less["verdict"] == "the output-aware policies lose less").all() and (less["windows"] == 6).all()
    more = pd.DataFrame(premise.output_aware_rows(_kv_frame(-0.05).query("num_features != 16")))
    assert (more["verdict"] == "the output-aware policies lose more").all()
    missing = premise.output_aware_rows(_kv_frame(0.05).query("method != 'caote'"))
    assert len(missing) == 1 and missing[0]["verdict"] == "not run: perplexity.csv.gz holds no KV-cache rows of caote"
    both = _kv_frame(0.05, same_at=(16,)).query("num_features != 32").reset_index(drop=True)
    at16 = both["num_features"] == 16  # CAOTE keeps TOVA's tokens there too: every pair is the same
    both.loc[at16 & (both["method"] == "caote"), "delta"] = both.loc[at16 & (both["method"] == "tova"), "delta"].values
    table = premise.with_holm(pd.DataFrame(missing + premise.output_aware_rows(both),
                                           columns=premise.PREMISE_COLUMNS[:-2]))
    text = "\n".join(in_short_lines(table, pd.DataFrame()))
    assert "Not run in the KV cache (perplexity.csv.gz holds no KV-cache rows of caote)" in text
    assert re.search(r"Holds in d = 64: 0\.0[45]\d* \[0\.0\d+, 0\.0\d+\] nats "
                     r"\(the output-aware policies lose less\)", text)
    assert "At d = 16 every pair keeps the same tokens (criticalkv = snapkv, caote = tova)." in text
