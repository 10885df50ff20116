"""The claims engine's verdict rules (approxlab.studies.reporting.claims.judge): fewer than 2 units decide
nothing; an undecided interval that excludes the paper's value rejects it; the geometric mean is judged with
the power of the log scale; power is sized for a declared effect (lra-svd: tests/test_lra_svd.py). The former
rules beside them, and the coverage stated beside every claim table. Each rule's test fails on the former
rule."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from approxlab import stats
from approxlab.studies import Claim
from approxlab.studies import figure1
from approxlab.studies.decoder import claims as decoder_claims
from approxlab.studies.instability import stats as instability_stats
from approxlab.studies.reporting import changes, claims, measured

FALLS = Claim("a", "x falls", "ratio", side="at most", threshold=0.5)


def test_one_unit_decides_nothing():
    assert claims.judge(FALLS, 0.3, 0.3, units=1) == "inconclusive"  # the former rule: "reproduced"
    assert changes.former_judge(FALLS, 0.3, 0.3, units=1) == "reproduced"
    assert claims.judge(FALLS, 0.3, 0.4, units=2) == "reproduced"
    one = claims.bootstrap(lambda u: {"x": float(np.median(u))}, [0.3], resamples=20, seed=0, level=0.95)["x"]
    assert math.isnan(one.low) and claims.judge(FALLS, one.low, one.high) == "inconclusive"  # no units passed
    labelled = Claim("b", "x", "ratio", side="below", threshold=1.0, labels={"too few units": "inconclusive (1 seed)"})
    assert claims.judge(labelled, 0.5, 0.5, units=1) == "inconclusive (1 seed)"


def test_one_window_decides_nothing_in_the_decoder_and_figure1():
    """One window: every decoder claim and every Figure 1 claim is inconclusive, without an interval, where the
    former rules judged the zero-width interval."""
    for claim in (*decoder_claims.CLAIMS, *decoder_claims.CORRELATION_CLAIMS):  # zero width, one window
        assert claims.judge(claim, 0.3, 0.3, units=1) not in (claims.label(claim, "reproduced"),
                                                            claims.label(claim, "not reproduced")), claim.id
    errors = [{"condition": "pretrained", "n": n, "dtype": "float64", "window": 0, "method": method, "num_features": d,
               "seed": 0, "checkpoint": "ckpt", "error_mean": e, "error_heads": f"{e!r} {e!r}", "status": "ok"}
              for n in (512, 1024) for method in figure1.PAPER_METHODS for d, e in ((16, 1.0), (256, 0.3))]
    config = figure1.build_config(conditions=["pretrained"], n=[512, 1024], num_features=[16, 256])
    verdicts = figure1.verdicts(config, pd.DataFrame(errors))
    assert set(verdicts["verdict"]) == {"inconclusive"} and verdicts["ci_high"].isna().all()
    # one window: nothing to resample, nothing to calibrate, and the former rule said the same
    assert set(verdicts["former_verdict"]) == {"inconclusive"} and set(verdicts["calibration"]) == {"no interval"}


def _ratios(kernelized):
    return pd.DataFrame([{"task": "listops", "n": 256, "seed": s, "attention": a, "steps": 2, "ratio": r,
                          "status": "ok"} for s, value in enumerate(kernelized)
                         for a, r in (("softmax", 1.0), ("kernelized", value))])


def test_an_interval_that_excludes_the_papers_value_rejects_it():
    below = instability_stats.BELOW_ONE
    assert claims.judge(below, 0.967, 1.851, power=0.3, units=10, paper=0.77) == "rejects the paper's value"
    assert changes.former_judge(below, 0.967, 1.851, power=0.3, units=10) == "not confirmed (underpowered)"
    assert claims.judge(below, 0.70, 1.2, power=0.3, units=10, paper=0.77) == "not confirmed (underpowered)"
    assert claims.judge(below, 1.01, 1.9, power=0.3, units=10, paper=0.77) == "above 1"  # decided: no rejection
    declared = Claim("p", "x", "ratio", side="below", threshold=1.0, paper_value=0.5)
    assert claims.judge(declared, 0.8, 1.2) == "rejects the paper's value"
    # ListOps-like seeds: the geometric mean holds 1 and excludes 0.77.
    row = instability_stats.intervals(_ratios([0.61, 0.82, 0.87, 1.81, 2.18, 1.2, 1.5, 0.9, 2.5, 1.6])) \
        .set_index("attention").loc["kernelized"]
    assert row["geo_low"] < 1 < row["geo_high"] and row["geo_low"] > 0.77
    assert row["geo_verdict"] == "rejects the paper's value"
    assert row["former_geo_verdict"] == "rejects the paper's value"  # the former gate passed it (coverage >= 90%)


def test_the_geometric_mean_is_judged_with_the_power_of_the_logs():
    """Seeds whose geometric-mean interval holds both 1 and 0.77: 80% power on the logs (inconclusive), 64% on
    the ratios (the former rule: not confirmed (underpowered))."""
    values = [1.64, 0.87, 0.69, 0.88, 0.7, 1.0, 0.86, 0.89, 0.7, 1.07]
    row = instability_stats.intervals(_ratios(values)).set_index("attention").loc["kernelized"]
    logs = np.log(values)
    expected = stats.t_test_power(10, difference=math.log(0.77), sd=float(np.std(logs, ddof=1)))
    assert row["geo_power"] == pytest.approx(expected) and row["geo_power"] >= 0.8 > row["power"]
    assert row["geo_seeds_for_80"] == stats.t_test_sample_size(difference=math.log(0.77),
                                                                 sd=float(np.std(logs, ddof=1)))
    assert row["geo_low"] < 0.77 < 1 < row["geo_high"]
    assert row["geo_verdict"] == "inconclusive" and row["former_geo_verdict"] == "inconclusive"
    # the arithmetic mean keeps its own power; with 10 skewed seeds its t interval covers 84.5% of the first 400
    # draws of them: the former rule withheld its verdict, the calibrated interval (wider) is judged
    assert row["former_verdict"] == "no verdict: coverage 84.5% < 90%"
    assert row["verdict"] == "not confirmed (underpowered)" and row["low"] <= row["nominal_low"]


def test_bootstrap_se_claims_and_the_coverage_beside_them():
    ratio = Claim("r", "x", "ratio", side="at most", threshold=0.5, interval="bootstrap-se", scale="log")
    found = claims.resample(lambda u: {"r": float(np.median(u))}, [0.2, 0.3, 0.25, 0.4], resamples=300, seed=0)["r"]
    interval = claims.interval(ratio, found)
    percentile = claims.interval(Claim("r", "x", "ratio", side="at most", threshold=0.5), found)
    assert interval.low < percentile.low and interval.high > percentile.high and interval.units == 4
    with pytest.raises(ValueError, match="`claim` must be judged by a bootstrap interval"):
        claims.interval(Claim("t", "x", "mean", side="below", threshold=1.0, interval="t"), found)
    with pytest.raises(ValueError, match="`scale` must be 'linear' or 'log'; got 'ln'"):
        Claim("r", "x", "ratio", side="at most", threshold=0.5, scale="ln")
    lines = claims.coverage_lines([{"claims": "all", "claim": FALLS, "units": 1},
                                   {"claims": "all", "claim": ratio, "units": 4, "statistic": "ratio of medians"}])
    assert "| all | percentile bootstrap | median | 1 | no interval |" in lines
    assert any(line.startswith("| all | bootstrap standard error x Student t, log scale | ratio of medians | 4 | 9")
               for line in lines)
    assert claims.coverage(FALLS, 4) is claims.coverage(FALLS, 4)  # computed once per process


def test_changes_lists_the_verdicts_that_differ():
    table = pd.DataFrame({"claim": ["a", "b"], "verdict": ["inconclusive", "reproduced"],
                          "former_verdict": ["reproduced", "reproduced"]})
    lines = changes.changes_lines(table, ["claim"], rules="zero-width intervals judged")
    assert "1 of 2 claim instance(s) change:" in lines[3] and "| a | reproduced | inconclusive |" in lines
    assert changes.changes_lines(table.iloc[1:], ["claim"])[-1].endswith("0 of 1 claim instance(s) change.")


# -- coverage measured on the run's own units, the 90% gate, the level of the units, multiplicity -------------

def _mean_percentile(sample):
    found = stats.bootstrap(lambda u: {"m": float(np.mean(u))}, list(sample), resamples=200, seed=0)["m"]
    return found.estimate, found.low, found.high


def test_a_claim_whose_interval_covers_less_than_90_percent_gets_no_verdict():
    """Four windows, one far out (a skewed population), a percentile bootstrap of their mean: drawn from the
    run's own windows, its interval holds their mean in about 69% of draws. The former rules decided it."""
    windows = [0.10, 0.12, 0.15, 0.90]
    found = measured.measured_coverage(_mean_percentile, windows, trials=200)
    assert found.coverage < 0.8 and found.units == 4 and found.truth == pytest.approx(0.3175)
    estimate, low, high = _mean_percentile(windows)
    assert high < 0.8
    upper = Claim("m", "x small", "mean", side="at most", threshold=0.8)
    assert changes.former_judge(upper, low, high, units=4) == "reproduced"
    verdict = claims.judge(upper, low, high, units=4, measured=found)
    assert verdict == f"no verdict: coverage {found.coverage:.1%} < 90%"
    needed = measured.units_needed(_mean_percentile, windows, sizes=[8, 16, 32], trials=200)
    assert needed in (16, 32)  # more windows than the run has


def test_units_needed_counts_every_unit_of_grouped_units():
    """Units in groups (each case's windows, drawn at their count): the sizes tried are multiples of all the
    units, not of the groups (the former count: 2 groups, so 4 units tried -- fewer than the run's 8)."""
    groups = {"a": [0.10, 0.12, 0.15, 0.90], "b": [0.20, 0.22, 0.25, 1.00]}
    tried = []

    def pooled(sample):
        tried.append(len(sample))
        return _mean_percentile(sample)

    measured.units_needed(pooled, groups, trials=20)
    assert min(set(tried) - {8}) == 16  # 2 x the 8 units (each size's first call is the population itself)
    assert measured.needed_size(lambda size: {"x": size / 20, "y": 0.95}, 8) == {"x": 24, "y": 16}


def test_measured_coverage_keeps_a_verdict_whose_interval_covers():
    seeds = list(np.random.default_rng(0).lognormal(0.0, 0.3, size=30))

    def geometric(sample):
        found = stats.t_interval(np.log(sample))
        return math.exp(found.estimate), math.exp(found.low), math.exp(found.high)

    found = measured.measured_coverage(geometric, seeds, trials=300)
    assert found.coverage >= 0.9
    assert claims.judge(FALLS, 0.2, 0.4, units=30, measured=found) == "reproduced"


def test_holm_within_a_family():
    """Four comparisons at p = 0.01, 0.02, 0.03, 0.04: each decided on its own (per comparison), none but the first
    with Holm's adjustment (4 x 0.01, 3 x 0.02 = 0.06, ...)."""
    table = pd.DataFrame({"family": ["c"] * 4 + ["d"], "p": [0.01, 0.02, 0.03, 0.04, 0.04]})
    found = measured.holm_column(table, family="family")
    assert found["p_holm"].round(3).tolist() == [0.04, 0.06, 0.06, 0.06, 0.04]
    assert found["holm_decided"].tolist() == [True, False, False, False, True]
    lines = measured.family_lines(found.assign(decided=True), family="family", what="verdicts")
    assert "2 of the 5 verdicts decided by their interval hold" in lines[0] and "per comparison" in lines[0]


def test_p_value_is_the_inversion_of_the_interval():
    below = Claim("k", "below 1", "mean", side="below", threshold=1.0, interval="t")
    values = [0.8, 0.9, 0.85, 0.95, 1.02]
    mean, low, high = claims.t_interval(values)
    assert (measured.p_value(below, values=values) < 0.05) == (high < 1.0)
    resampled = claims.resample(lambda u: {"m": float(np.mean(u))}, values, resamples=2000, seed=0)["m"]
    percentile = claims.interval(Claim("k", "x", "mean", side="below", threshold=1.0), resampled)
    assert (measured.p_value(below, resampled=resampled) < 0.05) == (percentile.high < 1.0)



def test_every_claim_declares_the_level_its_units_vary_at():
    from approxlab.studies.lra_svd import report as lra_report
    claimed = [*decoder_claims.CLAIMS, *decoder_claims.CORRELATION_CLAIMS, instability_stats.BELOW_ONE,
               lra_report.SLOWER, *figure1.CLAIMS]
    assert all(claim.varies for claim in claimed)
    within = {claim.id: claim.within for claim in decoder_claims.CORRELATION_CLAIMS}
    assert within == {"hyper_alpha": "layer x window", "hyper_kappa": "layer x window"}
    assert {claim.varies for claim in decoder_claims.CORRELATION_CLAIMS} == {"head within layer x window"}
    assert all(claim.family for claim in figure1.CLAIMS)
