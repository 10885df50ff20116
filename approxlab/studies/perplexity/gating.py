r"""No perplexity verdict rests on an interval that covers less than 90% of the time with the run's own units.

Every claim across methods -- (p1), (p1w), (p1d), (p2), (p3), (p4) -- is judged on a two-level percentile
interval (methods with replacement, then windows within each drawn method: :func:`.resampling.two_level`). How
often that interval holds the truth at this run's units is measured on the run itself by the double bootstrap of
:func:`.prediction.coverage`: the run is the population and its estimate the truth; data sets are drawn from it
as the run was drawn, the interval recomputed on each (:data:`.prediction.COVERAGE_TRIALS`: 100 data sets of 200
resamples; every claim of a setting on the same draws). (p1m), one method's rho over its budgets with its windows
resampled, is measured by :func:`approxlab.studies.reporting.measured.measured_coverage` on the method's windows.

A verdict whose measured coverage is below 90% is withheld (:func:`approxlab.studies.reporting.measured.gate`:
``"no verdict: coverage 83.0% < 90%"``), and the units it would need -- methods, or windows for (p1m) -- are found
by the same measurement on draws of more methods than the run's
(:func:`approxlab.studies.reporting.measured.needed_size` at :data:`SIZING`'s counts and its fewer draws: a size
rests on it, not a verdict; (p1m): 2-12 times its windows). The verdict before the gate is kept
(``former_verdict``: the former rules had no gate) for the summary's "Changes of verdict".

(p1), (p1w), (p1m), (p1d) and (p2) are no longer judged here: :mod:`.premise` replaces them (ranks within windows,
clean-input error, calibrated intervals), and :func:`superseded` keeps each former reading beside the claim that
replaces it, with no coverage measured; (p3) and (p4) keep this gate.

Public API::

    SIZING, COLUMNS, SUPERSEDED_BY
    superseded(rows) -> list[dict]                                              # the former reading, not a verdict
    gate_rows(rows, cells, statistics, *, columns=MEASURES) -> list[dict]     # rows name their "_statistic"
    gate_over_windows(row, compute, windows) -> dict                           # (p1m): windows are the units
"""

from __future__ import annotations

import math

import pandas as pd

from ..reporting import measured
from .claims import MEASURES
from .prediction import COVERAGE_TRIALS, coverage

__all__ = ["SIZING", "COLUMNS", "SUPERSEDED_BY", "superseded", "gate_rows", "gate_over_windows"]

SIZING = {"trials": 20, "resamples": 100, "multiples": (2, 3, 4, 6)}
"""The methods a claim below 90% would need: :func:`.prediction.coverage` at 2, 3, 4 and 6 times the run's methods
with 20 data sets of 100 resamples each (the coverage to about +-13%: only a size rests on it, and each larger
count costs a full nested resampling of that many methods; "more than 6 times" where none reaches 90%)."""

COLUMNS = ["coverage", "coverage_low", "coverage_high", "units_for_90", "former_verdict"]
"""What :func:`gate_rows` adds to a verdict row: the measured coverage with its Wilson 95% interval, the units
(methods; windows for (p1m)) 90% would need where it falls short (None: not even the largest count tried), and the
verdict before the gate."""


SUPERSEDED_BY = {"p1": "p1", "p1w": "pw, pp", "p1m": "pw, pp", "p1d": "p1d", "p2": "p2"}
"""The claims of ``premise.csv`` that replace each former premise claim."""


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
        out.append({**row, "former_verdict": row["verdict"],
                    "verdict": f"superseded by premise.csv ({SUPERSEDED_BY[row['claim']]})",
                    "coverage": math.nan, "coverage_low": math.nan, "coverage_high": math.nan,
                    "units_for_90": None})
    return out


def _judged(row: dict) -> bool:
    """A row whose verdict rests on an interval (not withheld for too few units, both bounds computed)."""
    return not str(row["verdict"]).startswith("no verdict") and math.isfinite(row["ci_low"]) \
        and math.isfinite(row["ci_high"])


def _gated(row: dict, found, needed) -> dict:
    short = found is not None and found.coverage < measured.GATE
    return {**row, "former_verdict": row["verdict"], "verdict": measured.gate(None, row["verdict"], found),
            "coverage": found.coverage if found is not None else math.nan,
            "coverage_low": found.low if found is not None else math.nan,
            "coverage_high": found.high if found is not None else math.nan,
            "units_for_90": needed if short else None}


def _methods_needed(cells: pd.DataFrame, statistics: dict, columns) -> dict:
    """Per statistic: the fewest methods (of :data:`SIZING`'s multiples of the run's) whose interval covers 90%,
    or None."""
    pending = set(statistics)

    def coverage_at(size):
        found = coverage(cells, {name: statistics[name] for name in sorted(pending)}, columns=columns, methods=size,
                         trials=SIZING["trials"], resamples=SIZING["resamples"])
        values = {name: m.coverage if m is not None else 0.0 for name, m in found.items()}
        pending.difference_update(name for name, value in values.items() if value >= measured.GATE)
        return values

    count = int(cells["method"].nunique())
    return measured.needed_size(coverage_at, count, sizes=[count * k for k in SIZING["multiples"]])


def gate_rows(rows: list, cells: pd.DataFrame, statistics: dict, *, columns=MEASURES) -> list:
    """``rows`` (verdict rows of one setting; each names its statistic in ``statistics`` under ``"_statistic"``)
    with :data:`COLUMNS`: the coverage of every judged row's interval measured on ``cells`` (the run's own units, one
    double bootstrap for all of them), the verdict gated at 90% and the methods it would need."""
    judged = sorted({row["_statistic"] for row in rows if _judged(row)})
    found = coverage(cells, {name: statistics[name] for name in judged}, columns=columns) if judged else {}
    short = {name: statistics[name] for name, m in found.items() if m is not None and m.coverage < measured.GATE}
    needed = _methods_needed(cells, short, columns) if short else {}
    out = []
    for row in rows:
        name = row.pop("_statistic")
        out.append(_gated(row, found.get(name) if _judged(row) else None, needed.get(name)))
    return out


def gate_over_windows(row: dict, compute, windows: int) -> dict:
    """(p1m): ``row`` with :data:`COLUMNS`, its interval's coverage measured on the method's own ``windows``
    (``compute(sample) -> (estimate, low, high)`` for a list of window positions, a repeat counting twice;
    :func:`approxlab.studies.reporting.measured.measured_coverage`, :data:`.prediction.COVERAGE_TRIALS` draws) and
    the windows 90% would need (:func:`approxlab.studies.reporting.measured.units_needed`, :data:`SIZING` draws)."""
    if not _judged(row) or windows < 2:
        return _gated(row, None, None)
    units = list(range(int(windows)))
    found = measured.measured_coverage(compute, units, trials=COVERAGE_TRIALS["trials"], seed=COVERAGE_TRIALS["seed"])
    needed = measured.units_needed(compute, units, trials=SIZING["trials"], seed=COVERAGE_TRIALS["seed"]) \
        if found.coverage < measured.GATE else None
    return _gated(row, found, needed)

