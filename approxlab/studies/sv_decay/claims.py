r"""The singular-value study's conditioning claim, with a number, an interval, a unit and a test.

Skyformer says the Gaussian kernel's normalisation gives "a more reasonable condition number" than the softmax
structure. Statistic (:data:`CONDITIONING`): per head, :math:`\log_{10}(\kappa_2(C)/\kappa_2(D^{-1}A))` of the
kernelized matrix against the softmax one on the same head and window (a numerically singular matrix has
:math:`\kappa = \infty`; a pair where both are singular is left out, one where one is counts as :math:`\pm\infty`),
and its median over heads x windows. The units vary at the level of the **window within a case** (condition x
layer x n): heads share a window's text, cases differ systematically (hidden states against embeddings), so the
interval is a percentile bootstrap that resamples windows within each case (stratified), the median pooled over
the cases. Test: the interval against 0 -- below 0 the kernelized matrix is better conditioned, above 0 worse.
The interval is calibrated on the run's own windows (:func:`approxlab.studies.reporting.calibrated.calibrate`, each
case's windows drawn at their count) and the verdict read from the calibrated interval; the former rule (no verdict
where the coverage of the first 200 draws was below 90%) is kept as the former verdict.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ... import stats
from ..declaration import Claim
from ..reporting import claims as engine
from ...stats.calibration import IntervalFamily
from ..reporting import calibrated

__all__ = ["CONDITIONING", "OWN_COVERAGE", "log_ratios", "conditioning"]

CONDITIONING = Claim("conditioning", "kernelized C is better conditioned than D^-1 A",
                     "median over heads x windows of log10(kappa_2(C) / kappa_2(D^-1 A)), same head and window",
                     side="below", threshold=0.0, unit="window", varies="window within case (condition x layer x n)",
                     within="case (windows resampled within each)", strict=True,
                     labels={"reproduced": "kernelized better conditioned", "not reproduced": "kernelized worse "
                             "conditioned", "inconclusive": "no difference shown"})
"""Skyformer's conditioning claim, as this study tests it (see the module docstring)."""

_CASE = ["condition", "layer", "n"]


def log_ratios(results: pd.DataFrame) -> pd.DataFrame:
    """Per case x window x head: ``log_ratio`` = log10 of the kernelized condition number over the softmax one
    (``inf`` / ``-inf`` where only one is singular; pairs singular on both sides left out)."""
    keys = [*_CASE, "window", "head"]
    wide = results[results["matrix"].isin(["softmax", "kernelized"])].pivot_table(
        index=keys, columns="matrix", values="condition_number", aggfunc="first")
    wide = wide.dropna()
    kernel, soft = wide["kernelized"].astype(float), wide["softmax"].astype(float)
    both = np.isinf(kernel) & np.isinf(soft)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(np.isinf(kernel), math.inf, np.where(np.isinf(soft), -math.inf, np.log10(kernel / soft)))
    return wide.assign(log_ratio=ratio)[~both].reset_index()[[*keys, "log_ratio"]]


def _median(units) -> float:
    values = np.concatenate([values for _, values in units]) if len(units) else np.array([])
    return float(np.median(values)) if values.size else math.nan


OWN_COVERAGE = {"trials": 200, "seed": 1}
"""The calibration on the run's own windows (:func:`approxlab.studies.reporting.calibrated.calibrate`): each draw of
the windows of every case at its count gets an interval of 300 resamples (the interval on all the windows: 2,000);
the first 200 draws (seed 1) are the former coverage estimate."""


def _family(units, trial):
    """The percentile interval family of the pooled median, windows resampled within each case (300 resamples for a
    draw, 2,000 for all the windows, ``trial == -1``)."""
    cases = {}
    for case, values in units:
        cases.setdefault(case, []).append((case, values))
    found = stats.resample(lambda u: {"m": _median([unit for members in u.values() for unit in members])},
                           cases, resamples=2000 if trial < 0 else 300, seed=0, paired=False)["m"]
    return IntervalFamily.percentile(found)


def conditioning(results: pd.DataFrame, *, by=None) -> pd.DataFrame:
    """The claim :data:`CONDITIONING` over the whole run (``by`` None) or per value of the column ``by`` (``"n"``):
    estimate, calibrated interval (``ci_low``, ``ci_high``), windows (the units), heads, the calibration
    (:data:`approxlab.studies.reporting.calibrated.CALIBRATED_COLUMNS`), the verdict read from the calibrated
    interval, and the verdict the former 90% coverage gate gave (``gated_verdict``)."""
    table = log_ratios(results)
    rows = []
    for key, part in ([(None, table)] if by is None else list(table.groupby(by, sort=True))):
        units = [(tuple(case), group["log_ratio"].to_numpy(dtype=float))
                 for *case, group in ((*c, g) for c, g in part.groupby([*_CASE, "window"], sort=True))]
        units = [((case[:3]), values) for case, values in units]
        whole = _family(units, -1)
        estimate, (low, high) = whole.estimate, whole.interval(0.95)
        smallest = min((sum(1 for c, _ in units if c == case) for case in {c for c, _ in units}), default=0)
        found = None
        if smallest > 1:
            groups = {}
            for case, values in units:
                groups.setdefault(case, []).append((case, values))
            found = calibrated.calibrate(_family, groups, former_draws=OWN_COVERAGE["trials"], seed=OWN_COVERAGE["seed"])
            low, high = found.low, found.high
        verdict = engine.judge(CONDITIONING, low, high, units=smallest, calibrated=found)
        gated = verdict if found is None else calibrated.former_verdict(CONDITIONING, found, units=smallest)
        rows.append({"subset": "all cases" if by is None else f"{by} = {key}", "estimate": estimate, "ci_low": low,
                     "ci_high": high, "windows": len(units), "cases": len({c for c, _ in units}),
                     "heads": int(sum(v.size for _, v in units)),
                     **calibrated.calibrated_columns(found, threshold=CONDITIONING.threshold),
                     "verdict": verdict, "gated_verdict": gated,
                     "former_verdict": "not better conditioned" if by is None else None})
    return pd.DataFrame(rows)
