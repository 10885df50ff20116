r"""The committed design's claims after the premise's redesign: (p3) and (p4) on calibrated intervals, the former
premise claims as superseded readings.

(p3) and (p4) are judged as the premise's claims are (:mod:`.premise`): their statistic is a function of the
multiplicities of methods and windows (sequences for (p4)) drawn **crossed** (:mod:`.strata`), and its interval is
calibrated on the run's own methods and windows (:func:`.strata.calibrate_setting`,
:func:`approxlab.studies.reporting.calibrated.calibrate`): the verdict is read from the calibrated interval, and no
verdict only where calibration fails, with the reason.

* :func:`rho_over_cells` -- (p4): Spearman's :math:`\rho` over every cell (method x budget x sequence), a cell
  counted :math:`c_m w_k` times.
* :func:`rho_of_means` -- (p3): Spearman's :math:`\rho` across methods of a per-method value (the reference's error)
  and the method's mean :math:`\Delta` over its drawn windows, a method counted :math:`c_m` times.

The former rule -- a two-level percentile interval judged only where its coverage on the run's own units, from
:data:`FORMER_DRAWS` draws, reached 90% -- is kept as ``former_verdict``
(:func:`approxlab.studies.reporting.calibrated.former_verdict`: the declared 95% interval judged, withheld where the
coverage of the first :data:`FORMER_DRAWS` draws of the same calibration is below 90%), so that the summary's
"Changes of verdict" lists every verdict the gate decided otherwise.

(p1), (p1w), (p1m), (p1d) and (p2) are no longer judged here: :mod:`.premise` replaces them (ranks within windows,
clean-input error, calibrated intervals), and :func:`superseded` keeps each former reading beside the claim that
replaces it, with no coverage measured.

Public API::

    FORMER_DRAWS, COLUMNS, SUPERSEDED_BY
    superseded(rows) -> list[dict]                                   # the former reading, not a verdict
    rho_over_cells(cells, measure) / rho_of_means(cells, values)     # -> statistic(c, w) -> (resamples,)
    calibrated_row(claim, row, statistic, methods, windows) -> dict  # the verdict from the calibrated interval
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..reporting import calibrated as calibration
from ..reporting import claims as engine
from . import strata
from .prediction import COVERAGE_TRIALS

__all__ = ["FORMER_DRAWS", "COLUMNS", "SUPERSEDED_BY", "superseded", "rho_over_cells", "rho_of_means",
           "calibrated_row"]

FORMER_DRAWS = COVERAGE_TRIALS["trials"]
"""The draws of the former coverage gate (100): its reading is the coverage of the calibration's first 100 draws."""

COLUMNS = ["coverage", "coverage_low", "coverage_high", "former_verdict", "nominal_low", "nominal_high",
           "calibrated_level", "coverage_draws", "calibration", "p"]
"""What a verdict row carries besides its interval: the declared interval's coverage on the run's own units with its
Monte-Carlo (Wilson 95%) interval, the verdict by the former 90% gate, and the calibration's columns
(:data:`approxlab.studies.reporting.calibrated.CALIBRATED_COLUMNS`, and the calibrated p of the threshold)."""

SUPERSEDED_BY = {"p1": "p1", "p1w": "pw, pp", "p1m": "pw, pp", "p1d": "p1d", "p2": "p2"}
"""The claims of ``premise.csv`` that replace each former premise claim."""


def _uncalibrated(row: dict) -> dict:
    return {**row, **calibration.calibrated_columns(None, row.get("threshold")), "coverage_draws": 0}


def superseded(rows: list) -> list:
    """``rows`` (verdict rows of the former premise claims) with :data:`COLUMNS`: ``former_verdict`` the reading of
    their percentile interval, ``verdict`` naming the ``premise.csv`` claims that replace it, no coverage measured.

    Examples
    --------
    >>> superseded([{"claim": "p1w", "verdict": "ranks the losses", "_statistic": "within spectral"}])[0]["verdict"]
    'superseded by premise.csv (pw, pp)'
    """
    out = []
    for row in rows:
        row = {key: value for key, value in row.items() if key != "_statistic"}
        out.append({**_uncalibrated(row), "former_verdict": row["verdict"],
                    "verdict": f"superseded by premise.csv ({SUPERSEDED_BY[row['claim']]})", "calibration": ""})
    return out


def _positions(cells: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Each cell's method and window position (sorted names), and the counts of both."""
    methods, windows = sorted(set(cells["method"])), sorted(set(cells["window"]))
    return (cells["method"].map({m: i for i, m in enumerate(methods)}).to_numpy(int),
            cells["window"].map({k: i for i, k in enumerate(windows)}).to_numpy(int), len(methods), len(windows))


def rho_over_cells(cells: pd.DataFrame, measure: str = "spectral"):
    r"""``statistic(c, w) -> (resamples,)``: Spearman's :math:`\rho(\text{measure}, \Delta)` over the cells where
    both are finite, cell :math:`(m, k)` counted :math:`c_m w_k` times (``c``: ``(resamples, methods)``, ``w``:
    ``(resamples, windows)`` multiplicities, methods and windows in sorted order).

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> cells = pd.DataFrame({"method": list("aabbcc"), "window": [0, 1] * 3,
    ...                       "spectral": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "delta": [1.0, 2.0, 3.0, 4.0, 6.0, 5.0]})
    >>> statistic = rho_over_cells(cells)
    >>> float(round(statistic(np.ones((1, 3)), np.ones((1, 2)))[0], 4))
    0.9429
    """
    x, y = cells[measure].to_numpy(float), cells["delta"].to_numpy(float)
    finite = np.isfinite(x) & np.isfinite(y)
    method, window, _, _ = _positions(cells)
    method, window = method[finite], window[finite]
    lx, ly = strata._comparisons(x[finite]), strata._comparisons(y[finite])

    def statistic(c, w):
        c, w = np.atleast_2d(c), np.atleast_2d(w)
        return strata.weighted_rho(lx, ly, c[:, method] * w[:, window])

    return statistic


def rho_of_means(cells: pd.DataFrame, values: pd.Series):
    r"""``statistic(c, w) -> (resamples,)``: Spearman's :math:`\rho` across methods of ``values`` (one per method,
    e.g. a reference's error) and each method's mean :math:`\Delta` over its windows weighted by ``w`` (a method
    none of whose windows is drawn drops out), method :math:`m` counted :math:`c_m` times.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> cells = pd.DataFrame({"method": list("aabbcc"), "window": [0, 1] * 3, "delta": [1.0, 3.0, 2.0, 2.0, 5.0, 0.0]})
    >>> statistic = rho_of_means(cells, pd.Series({"a": 1.0, "b": 2.0, "c": 3.0}))
    >>> statistic(np.ones((1, 3)), np.array([[1.0, 1.0], [1.0, 0.0]])).round(4).tolist()   # means 2, 2, 2.5; 1, 2, 5
    [0.866, 1.0]
    """
    method, window, count, windows = _positions(cells)
    table = np.full((count, windows), np.nan)
    table[method, window] = cells["delta"].to_numpy(float)
    has = np.isfinite(table)
    known = np.where(has, table, 0.0)
    names = sorted(set(cells["method"]))
    lx = strata._comparisons(values.reindex(names).to_numpy(float))

    def statistic(c, w):
        c, w = np.atleast_2d(c), np.atleast_2d(w)
        total = w @ has.T
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(total > 0, (w @ known.T) / total, np.nan)
        equal = (means[:, None, :] == means[:, :, None]).astype(float)
        equal[:, np.arange(count), np.arange(count)] = 0.0
        ly = (means[:, None, :] < means[:, :, None]).astype(float) + 0.5 * equal
        return strata.weighted_rho(lx, ly, np.where(total > 0, c, 0.0))

    return statistic


def calibrated_row(claim, row: dict, statistic, methods: int, windows: int) -> dict:
    """``row`` (a verdict row of ``claim``, :func:`.judging.verdict_row`) with its interval calibrated on the run's
    ``methods`` and ``windows`` (crossed; :func:`.strata.calibrate_setting`): the estimate, the calibrated interval,
    the verdict read from it, the former 90% gate's verdict and :data:`COLUMNS`. A row already withheld (too few
    methods, a gate of its own) or over fewer than 2 windows is not calibrated (its verdict and former verdict as
    they are)."""
    if str(row["verdict"]).startswith("no verdict") or methods < max(2, claim.min_units or 2) or windows < 2:
        return {**_uncalibrated(row), "former_verdict": row["verdict"]}
    found = strata.calibrate_setting({"claim": statistic}, methods, windows, former_draws=FORMER_DRAWS)["claim"]
    verdict = engine.judge(claim, found.low, found.high, units=methods, calibrated=found)
    return {**row, "estimate": found.estimate, "ci_low": found.low, "ci_high": found.high, "verdict": verdict,
            "former_verdict": calibration.former_verdict(claim, found, units=methods),
            **calibration.calibrated_columns(found, claim.threshold)}
