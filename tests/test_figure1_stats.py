"""Figure 1's statistics beside the paper: both aggregations, comparative (b), blow-up and win rates,
the paper's digitised curves against a run (hand-made tables, no data)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from approxlab.studies import figure1
from approxlab.studies.figure1 import figures as figure1_report
from approxlab.studies.figure1 import paper as figure1_paper
from approxlab.studies.figure1 import stats as figure1_stats

SKY, NYS, PERF, INF = figure1.PAPER_METHODS


def _rows(method, n, d, window, heads, *, seed=0, blowups=0, near_zero=0, reported=False):
    heads = [float(h) for h in heads]
    return {"condition": "pretrained", "n": n, "dtype": "float64", "window": window, "method": method,
            "num_features": d, "seed": seed, "checkpoint": "ckpt", "heads": len(heads),
            "error_mean": float(np.mean(heads)), "error_heads": " ".join(map(repr, heads)),
            "relative_error_mean": float(np.mean(heads)), "status": "ok", "error_blowups": blowups,
            "near_zero_rows": near_zero, "row_sums_reported": reported}


def _tailed(ns=(512, 1024)):
    """Skyformer: 1.0 at d=16, 0.2 at d=256 in every head, but one head of window 0 at d=256 is 100
    (its tail); the baselines: 1.0 -> 0.9 flat."""
    rows = []
    for n in ns:
        for w in (0, 1, 2):
            rows.append(_rows(SKY, n, 16, w, [1.0, 1.0, 1.0]))
            rows.append(_rows(SKY, n, 256, w, [0.2, 0.2, 100.0] if w == 0 else [0.2, 0.2, 0.2]))
            for m in (NYS, PERF, INF):
                rows.append(_rows(m, n, 16, w, [1.0, 1.0, 1.0]))
                rows.append(_rows(m, n, 256, w, [0.9, 0.9, 0.9]))
    return pd.DataFrame(rows)


def _config():
    return {**figure1.build_config(conditions=["pretrained"], n=[512, 1024], num_features=[16, 256]),
            "_command": "approxlab figure1 --test"}


@pytest.fixture(scope="module")
def tailed_verdicts():
    return figure1.verdicts(_config(), _tailed())


def test_both_aggregations_for_every_claim_and_the_verdicts_that_differ(tailed_verdicts):
    table = tailed_verdicts
    assert list(table.columns) == figure1.VERDICT_COLUMNS
    key = ["claim", "condition", "n", "method"]
    median, mean = (table[table["aggregation"] == how] for how in ("median", "mean"))
    assert list(dict.fromkeys(table["aggregation"])) == [figure1_stats.PRIMARY_AGGREGATION, "mean"]
    assert len(median) == len(mean) == 2 + 6 + 6 + 2 + 1
    assert sorted(map(tuple, median[key].values)) == sorted(map(tuple, mean[key].values))
    a = {how: t[(t["claim"] == "a") & (t["n"] == 512)].iloc[0] for how, t in (("median", median), ("mean", mean))}
    assert a["median"]["estimate"] == pytest.approx(0.2) and a["median"]["verdict"] == "reproduced"
    assert a["mean"]["estimate"] == pytest.approx((8 * 0.2 + 100) / 9) and a["mean"]["verdict"] != "reproduced"
    # (b-comparative): Skyformer's ratio over the baseline's, below 1 where Skyformer gains more
    comparative = median[(median["claim"] == "b-comparative") & (median["method"] == NYS) & (median["n"] == 512)]
    assert comparative["estimate"].iloc[0] == pytest.approx(0.2 / 0.9)
    assert comparative["threshold"].iloc[0] == 1.0 and comparative["verdict"].iloc[0] == "reproduced"
    differ = figure1_stats.aggregation_differences(table)
    assert ("a", "pretrained", 512, SKY) in set(map(tuple, differ[key].values))
    assert (differ["median_verdict"] != differ["mean_verdict"]).all()
    assert not set(differ["claim"]) & {"b"}  # the baselines have no tail: same verdict under both


def test_blowup_rates_and_per_head_win_rate_against_the_best_baseline():
    rows = []
    for w in (0, 1):
        # Skyformer wins heads 0 and 1 against Nystromformer (the best baseline), loses head 2; seeds 0, 1
        for seed, sky in ((0, [0.1, 0.1, 5.0]), (1, [0.3, 0.3, 7.0])):
            rows.append(_rows(SKY, 512, 16, w, sky, seed=seed, blowups=1, near_zero=3, reported=True))
        rows.append(_rows(NYS, 512, 16, w, [0.5, 0.5, 0.5]))
        rows.append(_rows(INF, 512, 16, w, [0.9, 0.9, 0.9]))
    panel = figure1.panel_statistics(pd.DataFrame(rows))
    sky = panel[panel["method"] == SKY].iloc[0]
    assert sky["samples"] == 12 and sky["blowup_rate"] == pytest.approx(4 / 12)
    assert sky["near_zero_row_rate"] == pytest.approx(12 / (12 * 512))
    assert sky["best_baseline"] == NYS and sky["win_pairs"] == 6  # (window, head) pairs, seeds pooled by median
    assert sky["win_rate"] == pytest.approx(4 / 6) and sky["win_rate_low"] < 4 / 6 < sky["win_rate_high"]
    nys = panel[panel["method"] == NYS].iloc[0]
    assert math.isnan(nys["near_zero_row_rate"]) and nys["blowup_rate"] == 0  # no row sums reported
    assert math.isnan(nys["win_rate"])


def _panel_from_paper(scale=2.0):
    """A run whose float64 medians are ``scale`` times the paper's points, means 3 times."""
    paper = figure1_paper.paper_curves()
    ours = paper.assign(dtype="float64", median=paper["error"] * scale, mean=paper["error"] * 3)
    lra = ours[ours["method"] == PERF].assign(method="performer-lra", median=1.0, mean=1.0)
    return paper, pd.concat([ours, lra], ignore_index=True)


def test_paper_comparison_shapes_and_orderings():
    paper, panel = _panel_from_paper()
    table = figure1_paper.paper_comparison(panel)
    assert list(table.columns) == figure1_paper.COMPARISON_COLUMNS and len(table) == len(paper) + 40
    assert np.allclose(table["median_over_paper"][table["method"] != "performer-lra"], 2.0)
    lra = table[table["method"] == "performer-lra"]
    assert set(lra["paper_method"]) == {PERF} and np.allclose(lra["paper"] * lra["median_over_paper"], 1.0)
    shapes = figure1_paper.shape_comparison(table)
    same = shapes[shapes["method"] != "performer-lra"]
    assert np.allclose(same["paper"], same["ours_median"]) and np.allclose(same["paper"], same["ours_mean"])
    assert np.allclose(shapes.loc[shapes["method"] == "performer-lra", "ours_median"], 1.0)
    order = figure1_paper.orderings(table, 256).set_index(["condition", "n"])
    assert order.loc[("initialized", 512), "ours_median"] == f"{SKY} < {INF} < {NYS} < {PERF}"
    # the paper's order marks ties within the summed reading errors
    assert order.loc[("pretrained", 2048), "paper"].count("≈") >= 1
    curves = pd.DataFrame([{"condition": "c", "n": 1, "method": m, "num_features": d, "error": e}
                           for m, (lo, hi) in {NYS: (1.0, 0.9), PERF: (1.0, 0.5), INF: (1.0, 0.8)}.items()
                           for d, e in ((16, lo), (256, hi))])
    assert figure1_paper.paper_claim_b(curves) == (2, 3)


def test_paper_curves_and_float32_medians_are_told_apart_each_with_one_legend_entry():
    """The paper's curves (wide, pale, no markers) and the float32 medians (thin, dotted, hollow markers) look
    different and each has its own legend entry: formerly both were faint broken lines with hollow markers and
    only the paper's was named."""
    import matplotlib.pyplot as plt

    paper, panel = _panel_from_paper()
    panel = pd.concat([panel, panel.assign(dtype="float32")], ignore_index=True)
    config = {"conditions": ["pretrained"], "n": [512], "num_features": [16, 32, 64, 128, 256]}
    cell = panel[(panel["condition"] == "pretrained") & (panel["n"] == 512)].assign(q25=1.0, q75=2.0)
    fig, axes = figure1_report._draw(config, cell, [SKY, NYS, PERF, INF, "performer-lra"], "test")
    lines = axes[0][0].get_lines()
    pale = [line for line in lines if line.get_alpha() == figure1_report.PAPER_ALPHA
            and line.get_label() == "_nolegend_"]
    expected = paper[(paper["condition"] == "pretrained") & (paper["n"] == 512) & (paper["method"] == SKY)]
    assert len(pale) == 4
    assert any(np.allclose(line.get_ydata(), expected["error"]) for line in pale)
    dotted = [line for line in lines if line.get_linestyle() == ":" and len(line.get_xdata())]
    assert dotted  # the float32 medians
    for line in pale:
        assert line.get_marker() in ("None", None, "") and line.get_linestyle() == "-"
        assert line.get_linewidth() > 2 * max(d.get_linewidth() for d in dotted)
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert labels.count(figure1_report.PAPER_LABEL) == 1 and labels.count(figure1_report.FLOAT32_LABEL) == 1
    assert len(labels) == 7
    plt.close(fig)


def test_summary_names_the_deviations_history_and_the_claims_that_change(tailed_verdicts):
    results = _tailed()
    panel = figure1.panel_statistics(results)
    text = figure1.summarize(_config(), results, panel, verdict_table=tailed_verdicts)
    for phrase in ("## How this run differs from the paper's setting", "*test* split", "d is u, the number of active",
                   "*exact* pseudo-inverse", "log y axis", "**History.**", "switched to the median after",
                   "## The paper beside this run", "| a | pretrained | 512 | skyformer-softmax |"):
        assert phrase in text, phrase
    assert "change verdict between the two statistics" in text and "Why they differ: the tail" in text


def test_each_family_states_holm_and_every_instance_its_calibrated_interval(tailed_verdicts):
    """The verdicts are per comparison: p (the calibrated test each interval inverts) and Holm's p within claim x
    aggregation beside them; each instance's interval is calibrated by recomputing its own statistic (the gaps (c),
    (d) included) on draws of the run's windows, its coverage known to +-2 points; one below 90% coverage is judged
    by its calibrated interval, where the former rule gave no verdict."""
    table = tailed_verdicts
    assert {"p", "p_holm", "holm_decided", "coverage", "coverage_low", "coverage_high", "calibrated_level"} <= set(
        table.columns)
    for _, family in table.dropna(subset=["p"]).groupby(["claim", "aggregation"]):
        assert (family["p_holm"] >= family["p"] - 1e-12).all()
    gaps = table[table["claim"].isin(["c", "d"])]
    assert gaps["coverage"].notna().all() and gaps["coverage"].between(0, 1).all()
    assert ((table["coverage_high"] - table["coverage_low"]) <= 0.04 + 1e-12).all()
    low = table[table["coverage"] < 0.9]
    assert len(low) and not low["verdict"].str.startswith("no verdict: coverage").any()
    gated = table[table["former_verdict"].str.startswith("no verdict: coverage")]
    assert len(gated) and (gated["verdict"] != gated["former_verdict"]).all()
    judged = table[~table["verdict"].str.startswith("no verdict")]
    assert (judged["ci_low"] <= judged["nominal_low"] + 1e-12).all()
    assert (judged["ci_high"] >= judged["nominal_high"] - 1e-12).all()


def test_the_summary_lists_the_calibration_and_the_former_gated_verdicts(tailed_verdicts):
    """The summary opens with "In short", shows the coverage with its Monte-Carlo interval and the calibrated level
    beside each verdict, and lists the verdicts the former 90% gate gave where they differ."""
    table = tailed_verdicts
    results = _tailed()
    text = figure1.summarize(_config(), results, figure1.panel_statistics(results), verdict_table=table)
    assert text.index("## In short") < text.index("## Conditions")
    assert "| coverage [MC 95%] |" in text and "| calibrated level |" in text
    assert "### Changes of verdict" in text and "no verdict: coverage" in text


def test_no_claim_is_computed_where_the_largest_d_reaches_n():
    """``figure1 --quick`` ran d = n = 256, where Informer is exact: its error of 1e-14 made the gap (c) -5.84e+12
    and (d) with it. Claims are computed only at lengths above the largest d; the summary says which were left out,
    and the quick grid keeps every d below every n."""
    data = _tailed(ns=(256, 512))
    data.loc[(data["n"] == 256) & (data["method"] == INF) & (data["num_features"] == 256), "error_heads"] = \
        "1e-14 1e-14 1e-14"
    config = {**figure1.build_config(conditions=["pretrained"], n=[256, 512], num_features=[16, 256]),
              "_command": "approxlab figure1 --test"}
    table = figure1.verdicts(config, data)
    assert set(table["n"]) == {512} and "d" not in set(table["claim"])
    assert table["estimate"].abs().max() < 1e3  # the tail of 100 in the fixture, not a gap over 1e-14
    assert figure1_stats.degenerate_lengths(config) == [256]
    text = "\n".join(figure1.summary.summary_lines(config, data, figure1.panel_statistics(data), verdict_table=table))
    assert "No claim is computed at n = 256: the largest d (256) reaches n there" in text
    quick = figure1.build_config(quick=True)
    assert max(quick["num_features"]) < min(quick["n"]) and figure1_stats.degenerate_lengths(quick) == []
