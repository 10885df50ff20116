r"""The singular-value study's conditioning claim, with a number, an interval, a unit and a test.

Skyformer says the Gaussian kernel's normalisation gives "a more reasonable condition number" than the softmax
structure. Statistic (:data:`CONDITIONING`): per head, :math:`\log_{10}(\kappa_2(C)/\kappa_2(D^{-1}A))` of the
kernelized matrix against the softmax one on the same head and window (a numerically singular matrix has
:math:`\kappa = \infty`; a pair where both are singular is left out, one where one is counts as :math:`\pm\infty`),
and its median over heads x windows. The units vary at the level of the **window within a case** (condition x
layer x n): heads share a window's text, cases differ systematically (hidden states against embeddings), so the
interval is a percentile bootstrap that resamples windows within each case (stratified), the median pooled over
the cases. Test: the interval against 0 -- below 0 the kernelized matrix is better conditioned, above 0 worse.
Its coverage is measured on the run's own windows (:func:`approxlab.studies.reporting.measured.measured_coverage`,
each case's windows drawn at their count): below 90%, no verdict, and the windows it would need are sized by the
same resampling at more windows (:func:`approxlab.studies.reporting.measured.units_needed`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ... import stats
from ..declaration import Claim
from ..reporting import claims as engine
from ..reporting import measured

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


def _interval(units, *, resamples: int = 2000, seed: int = 0, level: float = 0.95):
    """``units``: (case, values) pairs; the median pooled, windows resampled within each case."""
    cases = {}
    for case, values in units:
        cases.setdefault(case, []).append((case, values))
    found = stats.bootstrap(lambda u: {"m": _median([unit for members in u.values() for unit in members])},
                            cases, resamples=resamples, seed=seed, level=level, paired=False)["m"]
    return found.estimate, found.low, found.high


OWN_COVERAGE = {"trials": 200, "seed": 1}
"""The coverage on the run's own windows (:func:`approxlab.studies.reporting.measured.measured_coverage`): 200 draws
of the windows of every case at its count, each interval of 300 resamples; the same at 2, 3, 4, 6, 8 and 12 times
the windows for the windows 90% needs (:func:`approxlab.studies.reporting.measured.units_needed`)."""


def _inner(sample):
    return _interval(sample, resamples=300)


def conditioning(results: pd.DataFrame, *, by=None) -> pd.DataFrame:
    """The claim :data:`CONDITIONING` over the whole run (``by`` None) or per value of the column ``by`` (``"n"``):
    estimate, interval, windows (the units), heads, the coverage measured on the run's own windows, the windows
    its interval would need for 90% (``windows_for_90``, where it falls short; None where even 12 times the run's
    do not reach it) and the verdict."""
    table = log_ratios(results)
    rows = []
    for key, part in ([(None, table)] if by is None else list(table.groupby(by, sort=True))):
        units = [(tuple(case), group["log_ratio"].to_numpy(dtype=float))
                 for *case, group in ((*c, g) for c, g in part.groupby([*_CASE, "window"], sort=True))]
        units = [((case[:3]), values) for case, values in units]
        estimate, low, high = _interval(units)
        smallest = min((sum(1 for c, _ in units if c == case) for case in {c for c, _ in units}), default=0)
        found, needed = None, None
        if smallest > 1:
            groups = {}
            for case, values in units:
                groups.setdefault(case, []).append((case, values))
            found = measured.measured_coverage(_inner, groups, **OWN_COVERAGE)
            if found.coverage < measured.GATE:
                needed = measured.units_needed(_inner, groups, **OWN_COVERAGE)
        verdict = engine.judge(CONDITIONING, low, high, units=smallest, measured=found)
        rows.append({"subset": "all cases" if by is None else f"{by} = {key}", "estimate": estimate, "ci_low": low,
                     "ci_high": high, "windows": len(units), "cases": len({c for c, _ in units}),
                     "heads": int(sum(v.size for _, v in units)),
                     "coverage": None if found is None else found.coverage, "windows_for_90": needed,
                     "verdict": verdict,
                     "former_verdict": "not better conditioned" if by is None else None})
    return pd.DataFrame(rows)
