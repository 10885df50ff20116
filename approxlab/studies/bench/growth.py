r"""Growth exponents of the forward part of ``approxlab bench``: how each method's time grows with n.

A method whose forward costs :math:`c\,n^a` has :math:`\log t = \log c + a\log n`; :func:`growth_exponent`
fits :math:`a` by least squares to the median wall times over the n of the forward grid, with the
Student-t interval of the slope from the fit's residuals (``n - 2`` degrees of freedom; three n or more).
The interval holds both the timing noise and the departure from a single power law (a per-call
overhead that dominates at small n bends the curve, and widens the interval), so it says how well one
exponent describes the grid. :func:`forward_cost_lines` writes the "Forward cost against SDPA" section
of ``summary.md``: for every method its time against SDPA (bidirectional methods against torch's SDPA,
causal ones against its causal form) at each n, and its exponent. See :mod:`approxlab.studies.bench`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["Growth", "growth_exponent", "forward_cost_lines", "BASELINES"]

BASELINES = {"torch-sdpa": "torch SDPA", "torch-sdpa-causal": "torch SDPA, causal",
             "exact-sdpa": "approxlab exact attention (fused kernel)", "exact-blocked": "row-blocked exact attention"}
"""The exact-attention rows of the forward part and their names in the summary."""


@dataclasses.dataclass(frozen=True)
class Growth:
    """A fitted growth exponent: ``exponent`` and its ``level`` interval ``(low, high)`` (NaN below three
    n), over ``points`` values of n from ``n_min`` to ``n_max``."""

    exponent: float
    low: float
    high: float
    points: int
    n_min: int
    n_max: int
    level: float = 0.95


def growth_exponent(n, seconds, *, level: float = 0.95) -> Growth:
    r"""Least-squares slope :math:`a` of :math:`\log t` on :math:`\log n` and its Student-t interval.

    Parameters
    ----------
    n, seconds : sequences of float
        The lengths (at least two distinct) and the times measured at them (positive, finite).
    level : float
        Confidence level of the interval, in (0, 1).

    Returns
    -------
    Growth
        With two lengths the exponent of the two points and a NaN interval.

    Examples
    --------
    >>> from approxlab.studies.bench.growth import growth_exponent
    >>> fit = growth_exponent([1024, 2048, 4096, 8192], [1.0, 4.1, 15.9, 64.5])  # about n^2
    >>> round(fit.exponent, 2), fit.low < 2.0 < fit.high, fit.points
    (2.0, True, 4)
    """
    from scipy import stats

    x, y = np.log(np.asarray(n, dtype=np.float64)), np.asarray(seconds, dtype=np.float64)
    if x.shape != y.shape or len(np.unique(x)) < 2:
        raise ValueError(f"`n` and `seconds` must be of one length with two distinct n at least; got n={list(n)}, "
                         f"seconds={list(seconds)}.")
    if not (np.isfinite(y).all() and (y > 0).all()):
        raise ValueError(f"`seconds` must be positive and finite; got {list(seconds)}.")
    if not 0 < level < 1:
        raise ValueError(f"`level` must be in (0, 1); got {level}.")
    fit = stats.linregress(x, np.log(y))
    half = math.nan
    if len(x) > 2:
        half = float(stats.t.ppf(0.5 + level / 2, len(x) - 2)) * float(fit.stderr)
    ns = np.exp(x)
    return Growth(float(fit.slope), float(fit.slope) - half, float(fit.slope) + half, len(x), int(round(ns.min())),
                  int(round(ns.max())), level)


def _short(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _curve(rows, algorithm, method=None, time="wall_s"):
    sub = rows[rows["algorithm"] == algorithm]
    if method is not None:
        sub = sub[sub["method"] == method]
    if time not in sub:
        return sub.groupby("n")["n"].first().iloc[:0]
    sub = sub[np.isfinite(sub[time]) & (sub[time] > 0)]
    return sub.groupby("n")[time].median()


def _exponent(curve) -> str:
    """``"1.02 [0.95, 1.09]"``: the exponent of ``curve`` and its interval (``—`` where there is none)."""
    if len(curve) < 2:
        return "—"
    fit = growth_exponent(curve.index.to_numpy(), curve.to_numpy())
    return f"{fit.exponent:.2f}" + ("" if math.isnan(fit.low) else f" [{fit.low:.2f}, {fit.high:.2f}]")


def _exponents(rows, algorithm, method=None) -> str:
    return " | ".join(_exponent(_curve(rows, algorithm, method, time)) for time in ("wall_s", "cpu_s"))


def forward_cost_lines(wide) -> list[str]:
    """The "Forward cost against SDPA" section: each method's time / SDPA per n and its growth exponent."""
    rows = wide[wide["part"] == "forward"]
    if rows.empty or "wall_s" not in rows:
        return []
    ns = sorted({int(n) for n in rows["n"]})
    lines = ["## Forward cost against SDPA", "",
             "Growth exponent: the least-squares slope of log(time) on log(n) over the n measured "
             f"({', '.join(_short(n) for n in ns)}), with its 95% Student-t interval from the fit's residuals "
             "(timing noise and any departure from one power law; none below three n), of the median wall "
             "time and of the median process CPU time (which a loaded machine disturbs less). Bidirectional "
             "methods are timed against torch's SDPA (wall time); the causal-only KV-cache policies (form "
             "'causal') in their causal form, against torch's causal SDPA. Both baselines are one 4-D call on "
             "torch's fused kernel, the head as `(1, 1, n, p)`.", "",
             "| method | form | time / SDPA at n = " + ", ".join(_short(n) for n in ns) + " | seconds at the largest n "
             "| growth exponent [95% interval] | the same in CPU time |", "|---|---|---|---|---|---|"]
    for algorithm, name in BASELINES.items():
        curve = _curve(rows, algorithm)
        if len(curve):
            lines.append(f"| {name} | {'causal' if algorithm.endswith('causal') else 'bidirectional'} | — | "
                         f"{curve.iloc[-1]:.4f} (n = {_short(int(curve.index[-1]))}) | {_exponents(rows, algorithm)} |")
    causal_rows = rows[rows["algorithm"] == "approximation"]
    flags = causal_rows["causal"].fillna(0.0) > 0 if "causal" in causal_rows else [False] * len(causal_rows)
    causal = dict(zip(causal_rows["method"], flags))
    failed = rows[rows["algorithm"] == "approximation-failed"]
    for method in sorted({*causal, *failed["method"]}):
        curve = _curve(rows, "approximation", method)
        baseline = _curve(rows, "torch-sdpa-causal" if causal.get(method) else "torch-sdpa")
        ratios = ", ".join(f"{curve[n] / baseline[n]:.2f}" if n in curve.index and n in baseline.index
                           else ("failed" if n in set(failed.loc[failed["method"] == method, "n"]) else "—")
                           for n in ns)
        largest = f"{curve.iloc[-1]:.4f} (n = {_short(int(curve.index[-1]))})" if len(curve) else "—"
        lines.append(f"| `{method}` | {'causal' if causal.get(method) else 'bidirectional'} | {ratios} | {largest} | "
                     f"{_exponents(rows, 'approximation', method)} |")
    return lines + [""]
