"""What the current verdict rules change: the rules as they stood before, and the verdicts that differ.

:func:`~approxlab.studies.reporting.claims.judge` gives no verdict on fewer than 2 units and names an
interval that excludes the paper's value, where the former rules judged a zero-width interval
over one unit like any other and called every undecided interval with too little power "not
confirmed (underpowered)". Studies also changed how some intervals are built (Figure 1's bootstrap
standard error, the geometric mean's power on the log scale, a power sized for a declared smallest
effect). A study computes each verdict both ways from the same saved tables -- :func:`former_judge`
on the former interval and power -- and its summary lists the verdicts that differ
(:func:`changes_lines`), so no change of verdict goes unstated.

Public API::

    FORMER_RULES
    former_judge(claim, low, high, *, power=nan, units=None) -> str
    former_interval(resamples, *, level=0.95) -> (low, high)      # the percentile interval, zero width on one unit
    changes_lines(table, key, *, current="verdict", former="former_verdict", shown=(), what="claim instance",
                  rules=FORMER_RULES) -> list[str]
"""

from __future__ import annotations

import math

import pandas as pd

from ... import stats
from .claims import label, threshold_outcome
from .markdown import markdown_table

__all__ = ["FORMER_RULES", "former_judge", "former_interval", "changes_lines"]

FORMER_RULES = ("they judged a one-unit interval of zero width like any other, and called an undecided interval "
                "that excludes the paper's value \"not confirmed (underpowered)\" or \"inconclusive\"")
"""The former rules of :func:`former_judge` in words; a study says what of them (and of its intervals and power)
applies to it."""


def former_judge(claim, low: float, high: float, *, power: float = math.nan, units: int | None = None) -> str:
    """The verdict by the former rules: no minimum of units beyond the claim's ``min_units``, no verdict for an
    excluded paper value; else as :func:`~approxlab.studies.reporting.claims.judge`. Pass the former interval
    (over one unit: the estimate itself, zero width) and the former power.

    Examples
    --------
    >>> from approxlab.studies import Claim
    >>> claim = Claim("a", "x falls", "ratio", side="at most", threshold=0.5)
    >>> former_judge(claim, 0.3, 0.3, units=1)
    'reproduced'
    """
    if claim.min_units is not None and units is not None and units < claim.min_units:
        return label(claim, "too few units")
    outcome = threshold_outcome(claim, low, high)
    if outcome == "inconclusive" and claim.power_goal is not None and power < claim.power_goal:
        outcome = "underpowered"
    return label(claim, outcome)


def former_interval(resamples, *, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval as the former rules computed it (:func:`approxlab.stats.bootstrap_interval`, but
    over a single unit the estimate itself, an interval of zero width)."""
    if resamples.units < 2:
        return resamples.estimate, resamples.estimate
    found = stats.bootstrap_interval(resamples, level=level)
    return found.low, found.high


def changes_lines(table: pd.DataFrame, key, *, current: str = "verdict", former: str = "former_verdict",
                  shown=(), what: str = "claim instance", rules: str = FORMER_RULES) -> list[str]:
    """A summary's "Changes of verdict" section: the rows of ``table`` whose ``current`` verdict differs from the
    ``former`` one, with the ``key`` columns, the ``shown`` ones and both verdicts (none: one line saying so).
    ``rules``: what the former rules did differently for this study, in words."""
    lines = ["", "### Changes of verdict", ""]
    if table.empty or former not in table:
        return lines + ["No verdict to compare."]
    changed = table[table[current].astype(str) != table[former].astype(str)]
    lines.append(f"Each verdict is also computed as the former rules gave it ({rules}): {len(changed)} of "
                 f"{len(table)} {what}(s) change" + (":" if len(changed) else "."))
    if changed.empty:
        return lines
    columns = [*key, *shown, former, current]
    view = changed[columns].rename(columns={former: "former verdict", current: "verdict now"})
    return lines + ["", *markdown_table(view.reset_index(drop=True))]
