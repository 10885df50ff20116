"""Iterated-bootstrap calibration (approxlab.stats.calibration) and the engine's calibrated intervals."""

import math

import numpy as np
import pytest

from approxlab.stats import Resamples
from approxlab.stats.calibration import (IntervalFamily, calibrated_bounds, calibration, double_bootstrap, settled)
from approxlab.stats.intervals import bounds
from approxlab.studies.declaration import Claim
from approxlab.studies.reporting import calibrated, claims

SETS = 1000
"""Simulated data sets for the calibrated interval's coverage: its Monte-Carlo standard error is about 0.75 points
at 94%."""


def test_calibrated_percentile_interval_reaches_93_percent_where_the_plain_one_misses_90():
    """Exponential population (skewness 2), n = 10 units, the mean (truth 1). Over the same 1,000 simulated data
    sets (fixed seeds: the test is deterministic), the plain 95% percentile interval (2,000 resamples) covers less
    than 90% and the calibrated one (400 outer x 200 inner draws) at least 93% (measured: 87.9% and 94.8%); each
    estimate's Monte-Carlo standard error is about 1 point (plain) and 0.7 points (calibrated), stated in the
    assertions' messages."""
    units, truth = 10, 1.0
    rng = np.random.default_rng(2026)
    data = rng.exponential(size=(SETS, units))
    draws = data[np.arange(SETS)[:, None, None], rng.integers(0, units, size=(SETS, 2000, units))].mean(-1)
    low, high = bounds(draws, data.mean(-1), units=units, method="percentile", level=0.95)
    plain = float(np.mean((low <= truth) & (truth <= high)))
    held = []
    for k in range(SETS):
        interval, found = double_bootstrap(data[k], np.mean, outer=400, inner=200, seed=k)
        assert found.reason is None and found.level >= 0.95
        held.append(interval.low <= truth <= interval.high)
    covered = float(np.mean(held))
    plain_se, covered_se = (math.sqrt(p * (1 - p) / SETS) for p in (plain, covered))
    assert plain < 0.90, f"plain {plain:.3f} +- {plain_se:.3f}"
    assert covered >= 0.93, f"calibrated {covered:.3f} +- {covered_se:.3f}"


def test_calibration_widens_only_the_short_side_and_never_narrows():
    roots = np.concatenate([np.zeros(50), np.linspace(0.1, 0.99, 950)])  # 5% of draws below every resample
    found = calibration(roots, roots >= 0.025)
    assert found.lower == 0.0 and found.upper == 0.975 and found.reason is None
    wide = calibration(np.full(1000, 0.5), np.ones(1000, dtype=bool))  # all draws centred: keep the declared 95%
    assert (wide.lower, wide.upper, wide.level) == pytest.approx((0.025, 0.975, 0.95))


def test_calibration_fails_with_its_reason_and_a_zero_width_interval_is_never_judged():
    found = calibration([math.nan] * 10 + [0.5] * 90, [False] * 10 + [True] * 90)
    assert math.isnan(found.level) and "give no interval" in found.reason
    family = IntervalFamily.percentile(Resamples(1.0, np.ones(2000), 4))  # every resample gives 1: [1, 1]
    covered = calibration(np.full(200, 0.5), np.ones(200, dtype=bool))
    assert covered.coverage == 1.0  # the former gate passed it trivially
    (low, high), reason = calibrated_bounds(family, covered)
    assert math.isnan(low) and reason.startswith("the interval has zero width")


def test_interval_families_match_the_studies_intervals_and_their_roots():
    values = np.array([0.4, 1.2, 0.9, 2.5, 0.7])
    t = IntervalFamily.student(values)
    found = claims.t_interval(values)
    assert t.interval(0.95) == pytest.approx(found[1:])
    assert t.position(found[1]) == pytest.approx(0.025) and t.position(found[2]) == pytest.approx(0.975)
    geometric = IntervalFamily.student(values, log=True)
    logs = claims.t_interval(np.log(values))
    assert geometric.interval(0.95) == pytest.approx(tuple(np.exp(logs[1:])))
    welch = IntervalFamily.welch(values, values + 1.0)
    assert welch.interval(0.95) == pytest.approx(claims.welch_interval(values, values + 1.0)[1:])
    draws = np.random.default_rng(0).normal(size=2000)
    percentile = IntervalFamily.percentile(Resamples(0.0, draws, 8))
    assert percentile.interval(0.95) == pytest.approx(tuple(np.quantile(draws, [0.025, 0.975])))
    assert percentile.position(np.quantile(draws, 0.3)) == pytest.approx(0.3, abs=1e-3)


def test_settled_is_the_wilson_half_width():
    assert not settled([True] * 180 + [False] * 20) and settled([True] * 950 + [False] * 50)


def test_engine_calibrates_until_the_coverage_is_known_to_two_points_and_keeps_the_former_estimate():
    values = list(np.random.default_rng(1).lognormal(size=6))
    found = calibrated.calibrate(lambda sample, _: IntervalFamily.student(sample), values, former_draws=400)
    assert found.calibration.draws >= 400 and found.calibration.high - found.calibration.low <= 0.04
    assert found.former.trials == 400 and 0 < found.former.coverage <= 1
    assert found.low <= found.nominal_low and found.high >= found.nominal_high
    claim = Claim("a", "x below 3", "mean", side="below", threshold=3.0, interval="t")
    verdict = claims.judge(claim, found.low, found.high, units=6, calibrated=found)
    assert verdict == claims.judge(claim, found.low, found.high, units=6)
    assert 0 <= found.p_value(3.0) <= 1 and (found.p_value(3.0) < 0.05) == (found.high < 3.0)


def test_judge_gives_no_verdict_where_calibration_fails():
    family = IntervalFamily.percentile(Resamples(1.0, np.ones(500), 3))
    found = calibrated.calibrate(lambda sample, _: family, [1.0, 1.0, 1.0])
    claim = Claim("a", "x below 2", "median", side="below", threshold=2.0)
    verdict = claims.judge(claim, found.low, found.high, units=3, calibrated=found)
    assert verdict.startswith("no verdict: 100.0% of") and "give no interval" in verdict  # zero width: none judged


def test_summary_tables_show_a_key_that_does_not_apply_as_a_dash_not_nan():
    """The decoder's criteria carry no depth (NaN): its calibration and Holm tables printed ``| nan |`` there."""
    import pandas as pd

    row = {"claim": "kappa", "layer": 0, "depth": float("nan"), "nominal_low": 0.1, "nominal_high": 0.2,
           "calibrated_level": 0.97, "coverage": 0.9, "coverage_low": 0.88, "coverage_high": 0.92,
           "coverage_draws": 1000, "calibration": "", "ci_low": 0.05, "ci_high": 0.25, "verdict": "holds",
           "former_verdict": "holds", "p": 0.01, "family": "kappa"}
    table = pd.DataFrame([row])
    lines = [*calibrated.calibration_table(table, ["claim", "layer", "depth"]),
             *calibrated.holm_lines(table, ["claim", "layer", "depth"], family="family", decided=("holds",))]
    rows = [line for line in lines if line.startswith("| kappa")]
    assert len(rows) == 2 and all("| - |" in line and "nan" not in line for line in rows), rows


def test_sv_decay_prints_n_a_for_an_interval_it_could_not_compute():
    from approxlab.studies.sv_decay.summary import _signed_interval

    assert _signed_interval(0.09, 0.08, 0.12) == "+0.09 [+0.08, +0.12]"
    assert _signed_interval(0.09, float("nan"), float("nan")) == "+0.09 [n/a]"
    assert _signed_interval(float("nan"), float("nan"), float("nan")) == "n/a [n/a]"
