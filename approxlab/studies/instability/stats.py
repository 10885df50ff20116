r"""Skyformer Table 3's numbers from the per-seed ratios: intervals, power and verdicts.

Everything here is a function of the tables (no data, no model): the cells of
:mod:`approxlab.studies.instability` write ``results.csv``; its report step calls these to write
``ratios.csv``, ``intervals.csv``, ``table.md`` and the figure. Per (task, n, seed, attention) the
ratio is the mean over steps of :math:`\tau_i/\tau_i^{softmax}` (:func:`ratios`); over seeds, the
arithmetic and geometric means with their 95% Student-t intervals (:func:`ratio_interval`), the power
of the seeds to tell the paper's value from 1 on each mean's own scale (:func:`power_analysis`), the
verdicts of the claims engine on :data:`BELOW_ONE` (:func:`verdict`) and on :data:`AT_PAPER` (the
interval against the entry's Table 3 value), and whether the entry answers Table 3's question
(:func:`decision`), all gathered by :func:`intervals`. Every table names the task by LRA's name and the
data set standing in for LRA's, where one does, in its ``proxy`` column (:func:`proxy`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ...tasks import image, retrieval, text
from ..declaration import Claim
from ...stats.calibration import IntervalFamily
from ..reporting import calibrated, claims, measured

__all__ = ["PAPER_TABLE3", "PAPER_COLUMN", "PROXIES", "POWER_GOAL", "BELOW_ONE", "AT_PAPER", "ratios",
           "ratio_interval", "verdict", "power_analysis", "table3_value", "proxy", "decision", "intervals"]


PAPER_DIFFERENCE = "paper"
"""The effect the power analysis sizes for: each entry's own Table 3 value against 1 (ListOps
kernelized: 0.77 vs 1.0)."""

POWER_GOAL = 0.8
"""Power a verdict needs before "no difference from 1" may be read as such (two-sided t, 5%)."""

NEAR_ONE = 0.05
"""A Table 3 ratio this close to 1 is no "below 1" claim: no power is sized for it (a power at an effect of a few
percent says nothing). The verdict tests every entry's paper value alike, near 1 or not (rule 3 of
:func:`approxlab.studies.reporting.claims.judge`)."""

PRIMARY_MEAN = "geometric"
"""The mean that leads, declared with its reason: the per-seed ratios are right-skewed (skewness 1.6-2.0 in the
committed run) and their logarithms roughly symmetric, so the t interval is taken on the log scale (the geometric
mean); the arithmetic mean, Table 3's own statistic over seeds, is reported beside it. Where the two disagree about
the paper's value the reading is "depends on the statistic", not either verdict."""

DEPENDS = "depends on the statistic"
"""The reading of an entry whose arithmetic and geometric means disagree about the paper's value."""

PAPER_TABLE3 = {
    "nystromformer": {"Text": 1.03, "ListOps": 1.01, "Retrieval": 0.97, "Pathfinder": 0.99, "Image": 1.02},
    "kernelized": {"Text": 0.83, "ListOps": 0.77, "Retrieval": 0.64, "Pathfinder": 0.74, "Image": 0.62},
    "skyformer": {"Text": 0.81, "ListOps": 0.79, "Retrieval": 0.64, "Pathfinder": 0.79, "Image": 0.65},
}
"""Skyformer Table 3 (ratios of instability score on LRA), for the comparison in table.md."""

PAPER_COLUMN = {"text": "Text", "listops": "ListOps", "retrieval": "Retrieval", "pathfinder": "Pathfinder",
                "image": "Image"}
"""Our task (LRA's name) -> its column of Table 3, in the paper's order (WikiText-2 masked LM has none)."""

PROXIES = {"text": text.PROXY, "retrieval": retrieval.PROXY, "image": image.PROXY}
"""Task -> the offline data set standing in for LRA's (:mod:`approxlab.tasks`); the others are generated
the way LRA generates them (proxy "none")."""


def ratios(results: pd.DataFrame) -> pd.DataFrame:
    r"""Per (task, n, seed, attention): the mean over steps of :math:`\tau_i/\tau_i^{softmax}`.

    Returns
    -------
    pandas.DataFrame
        Columns task (LRA's name), proxy (:func:`proxy`), n, seed, attention, ratio, steps, status.
        ``status`` is "ok", or
        why there is no ratio (the attention's or the reference's training failed); the
        ratio of a failed entry is not computed. A seed whose softmax reference has not run yet
        (a run stopped or still running) has no rows: it is pending, not failed.
    """
    rows = []
    for (task, n, seed), group in results.groupby(["task", "n", "seed"], sort=False):
        reference = group[group["attention"] == "softmax"]
        if not len(reference):
            continue
        ref_ok = (reference["status"] == "ok").all()
        ref_tau = reference.set_index("step")["tau"] if ref_ok else None
        for attention, rows_a in group.groupby("attention", sort=False):
            ok = (rows_a["status"] == "ok").all()
            entry = {"task": task, "proxy": proxy(task), "n": int(n), "seed": int(seed), "attention": attention,
                     "steps": len(rows_a)}
            if not ok:
                rows.append({**entry, "ratio": None, "status": str(rows_a["status"].iloc[0])})
            elif not ref_ok:
                rows.append({**entry, "ratio": None, "status": "no softmax reference"})
            else:
                tau = rows_a.set_index("step")["tau"]
                per_step = (tau / ref_tau.reindex(tau.index)).to_numpy(dtype=float)
                rows.append({**entry, "ratio": float(np.mean(per_step)), "status": "ok"})
    return pd.DataFrame.from_records(rows)


def ratio_interval(values, *, level: float = 0.95) -> tuple[float, float, float]:
    r"""Mean ratio over seeds and its Student-t confidence interval (:func:`approxlab.studies.reporting.claims.t_interval`).

    Parameters
    ----------
    values : array_like
        ``(s,)`` per-seed ratios (each the mean over steps of :math:`\tau_i/\tau_i^{softmax}`).
    level : float
        Confidence level (default 0.95).

    Returns
    -------
    (mean, low, high) : tuple of float
        :math:`\bar r \pm t_{(1+\text{level})/2,\,s-1}\,\hat\sigma/\sqrt s` (``hat sigma`` the
        sample standard deviation); ``low = high = nan`` for ``s < 2``.

    Notes
    -----
    Seeds differ in data, initial weights and landmarks, so the per-seed ratios are
    independent draws; the t interval assumes they are roughly normal (5 seeds cannot check
    that), and its width shrinks like :math:`1/\sqrt s`.
    """
    return claims.t_interval(values, level=level)


BELOW_ONE = Claim("below 1", "{attention} moves its output less than softmax attention for the same parameter change",
                  "mean over seeds of the mean over steps of tau_i / tau_i(softmax)", side="below", threshold=1.0,
                  unit="seed", interval="t", aggregations=("arithmetic", "geometric"), power_goal=POWER_GOAL,
                  min_units=2, strict=True,
                  labels={"reproduced": "below 1", "not reproduced": "above 1",
                          "too few units": "inconclusive (1 seed)"})
"""Skyformer's "more stable" (Table 3): the ratio's whole interval below 1 ("below 1") or above it
("above 1"); otherwise "not confirmed (underpowered)" when the seeds had less than :data:`POWER_GOAL`
power to tell the paper's value from 1, else "inconclusive"; one seed decides nothing."""


AT_PAPER = Claim("Table 3's value", "{attention}'s ratio is Table 3's value for the column",
                 "mean over seeds of the mean over steps of tau_i / tau_i(softmax)", side="below",
                 threshold=float("nan"), unit="seed", interval="t", aggregations=("arithmetic", "geometric"),
                 min_units=2, strict=True,
                 labels={"reproduced": "below the paper's value", "not reproduced": "above the paper's value",
                         "inconclusive": "holds the paper's value", "too few units": "inconclusive (1 seed)"})
"""The interval against the entry's own Table 3 value (its threshold, set per entry by :func:`at_paper`):
wholly below or above it rejects the paper's value; otherwise the interval holds it."""


def at_paper(value: float) -> Claim:
    """:data:`AT_PAPER` with Table 3's ``value`` of one entry as its threshold."""
    return dataclasses.replace(AT_PAPER, threshold=float(value))


def verdict(low: float, high: float, power: float = float("nan"), paper: float | None = None) -> str:
    """``"below 1"`` / ``"above 1"`` when the whole interval is on that side of 1; otherwise ``"rejects the
    paper's value"`` when it excludes ``paper``, ``"not confirmed (underpowered)"`` when the seeds had less
    than :data:`POWER_GOAL` power to tell the paper's value from 1, else ``"inconclusive"`` (``power`` NaN:
    no paper value to size for). The claim :data:`BELOW_ONE`, judged by
    :func:`approxlab.studies.reporting.claims.judge`."""
    return claims.judge(BELOW_ONE, low, high, power=power, paper=paper)


def power_analysis(values, paper_value, *, log: bool = False) -> tuple[float, float, int | None]:
    """``(sd, power, seeds_needed)`` of a two-sided one-sample t-test (5%) of "mean ratio = 1" when the
    true mean is ``paper_value``, at the per-seed spread ``sd`` of ``values``: the power of these seeds
    and the seeds 80% power needs (:func:`approxlab.stats.t_test_power`, ``t_test_sample_size``).
    ``log``: the same test on the log ratios (the geometric mean's scale): "mean log ratio = 0" against
    ``log(paper_value)``, at the SD of the logs -- the power the geometric mean's verdict rests on.
    NaN / None when there is no paper value (or one within :data:`NEAR_ONE` of 1), fewer than 2 seeds or no spread."""
    values = np.asarray(values, dtype=float)
    values = np.log(values) if log else values
    sd = float(values.std(ddof=1)) if values.size > 1 else float("nan")
    if _sized(paper_value) is None:
        return sd, float("nan"), None
    effect = float(np.log(paper_value)) if log else float(paper_value) - 1.0
    power, needed = claims.power(effect, sd, int(values.size), goal=POWER_GOAL)
    return sd, power, needed


def _sized(paper_value):
    """The paper's value where the claim sizes for it (a Table 3 ratio at least :data:`NEAR_ONE` from 1), else None:
    Table 3's values near 1 (Nystromformer's) claim "around 1", not "below 1"."""
    return None if paper_value is None or abs(paper_value - 1.0) < NEAR_ONE else paper_value


def proxy(task: str) -> str:
    """The data set standing in for LRA's under ``task`` (:data:`PROXIES`), ``"none"`` for a generated task."""
    return PROXIES.get(task, "none")


def decision(verdict: str, paper_verdict, power: float, needed) -> str | None:
    """Whether an entry answers Table 3's question: ``"decided: excludes 1"`` (the :data:`BELOW_ONE`
    verdict is "below 1" or "above 1"), ``"decided: rejects the paper's value"`` (the :data:`AT_PAPER`
    interval lies wholly on one side of it), ``"backed: power 0.83"`` (neither, with at least
    :data:`POWER_GOAL` power at the paper's value), else ``"open: N seeds for 80% power"``.
    None where the entry has no paper value (``paper_verdict`` None); an entry whose value is within
    :data:`NEAR_ONE` of 1 has no power sized for it, so it is decided or "open".

    Examples
    --------
    >>> from approxlab.studies.instability import decision
    >>> decision("not confirmed (underpowered)", "above the paper's value", 0.17, 64)  # holds 1, excludes 0.77
    "decided: rejects the paper's value"
    >>> decision("not confirmed (underpowered)", "holds the paper's value", 0.3, 61)
    'open: 61 seeds for 80% power'
    """
    if paper_verdict is None:
        return None
    if verdict in (claims.label(BELOW_ONE, "reproduced"), claims.label(BELOW_ONE, "not reproduced")):
        return "decided: excludes 1"
    if paper_verdict in (claims.label(AT_PAPER, "reproduced"), claims.label(AT_PAPER, "not reproduced")):
        return "decided: rejects the paper's value"
    if power >= POWER_GOAL:
        return f"backed: power {power:.2f}"
    return "open" + (f": {needed} seeds for {POWER_GOAL:.0%} power" if needed else "")


def table3_value(task, attention):
    """Table 3's ratio for our ``task`` and ``attention``, or None where the paper has none."""
    column = PAPER_COLUMN.get(task)
    return PAPER_TABLE3.get(attention, {}).get(column) if column else None


def intervals(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per (task, n, attention): the task's proxy, seeds, failed seeds, arithmetic mean (the paper's
    statistic) with its 95% t interval, geometric mean with its interval (t on the log ratios), per-seed SD,
    power and seeds needed for 80% power at the paper's value (on the ratios for the arithmetic mean, on the
    log ratios for the geometric mean: ``geo_sd``, ``geo_power``, ``geo_seeds_for_80``), the verdicts of both
    means on :data:`BELOW_ONE` and on :data:`AT_PAPER` (``paper_verdict``, ``geo_paper_verdict``) and the
    :func:`decision` of each (``decision``, ``geo_decision``)."""
    rows = []
    for (task, n, attention), group in per_seed.groupby(["task", "n", "attention"], sort=False):
        ok = group[group["status"] == "ok"]
        entry = {"task": task, "proxy": proxy(task), "n": int(n), "attention": attention, "seeds": len(ok),
                 "failed": len(group) - len(ok)}
        if attention == "softmax" or not len(ok):
            rows.append({**entry, "mean": 1.0 if len(ok) else None, "low": None, "high": None,
                         "verdict": "reference" if len(ok) else "failed"})
            continue
        values = ok["ratio"].to_numpy(dtype=float)
        mean, low, high = ratio_interval(values)
        log_mean, log_low, log_high = ratio_interval(np.log(values))
        paper = table3_value(task, attention)
        sd, power, needed = power_analysis(values, paper)
        geo_sd, geo_power, geo_needed = power_analysis(values, paper, log=True)
        geo_low, geo_high = float(np.exp(log_low)), float(np.exp(log_high))
        found = _calibrated(values)
        arithmetic, geometric = found["arithmetic"], found["geometric"]
        if arithmetic is not None:  # the verdicts read the calibrated intervals
            low, high, geo_low, geo_high = arithmetic.low, arithmetic.high, geometric.low, geometric.high
        rows.append({**entry, "mean": mean, "low": low, "high": high, "geo_mean": float(np.exp(log_mean)),
                     "geo_low": geo_low, "geo_high": geo_high, "sd": sd, "paper": paper, "power": power,
                     "seeds_for_80": needed, "geo_sd": geo_sd, "geo_power": geo_power, "geo_seeds_for_80": geo_needed,
                     **_seed_draw(values, paper),
                     "verdict": claims.judge(BELOW_ONE, low, high, power=power, units=len(ok), paper=paper,
                                             calibrated=arithmetic),
                     "geo_verdict": claims.judge(BELOW_ONE, geo_low, geo_high, power=geo_power, units=len(ok),
                                                 paper=paper, calibrated=geometric),
                     **calibrated.calibrated_columns(arithmetic, threshold=BELOW_ONE.threshold),
                     **{"geo_" + k: v for k, v in
                        calibrated.calibrated_columns(geometric, threshold=BELOW_ONE.threshold).items()},
                     "former_verdict": _former(arithmetic, power, len(ok), paper, low, high),
                     "former_geo_verdict": _former(geometric, geo_power, len(ok), paper, geo_low, geo_high)})
        rows[-1].update(_against_paper(rows[-1], units=len(ok)))
        rows[-1]["reading"] = _reading(rows[-1])
    return pd.DataFrame.from_records(rows)


def _calibrated(values) -> dict:
    """Each mean's t interval calibrated on the run's own seeds (:func:`approxlab.studies.reporting.calibrated.
    calibrate`; None for fewer than 2 seeds); the first 400 draws are the former coverage estimate (its gate)."""
    if len(values) < 2:
        return {"arithmetic": None, "geometric": None}
    former = measured.MEASURED["trials"]
    return {"arithmetic": calibrated.calibrate(lambda sample, _: IntervalFamily.student(sample), list(values),
                                               former_draws=former),
            "geometric": calibrated.calibrate(lambda sample, _: IntervalFamily.student(sample, log=True), list(values),
                                              former_draws=former)}


def _former(found, power, units, paper, low, high) -> str:
    """The verdict the former rule gave: the declared t interval, withheld where its coverage on the seeds (the first
    400 draws) was below 90%."""
    if found is None:
        return claims.judge(BELOW_ONE, low, high, power=power, units=units, paper=paper)
    return calibrated.former_verdict(BELOW_ONE, found, power=power, units=units, paper=paper)


def _seed_draw(values, paper) -> dict:
    r"""Table 3's value as what it is, one draw of the per-seed statistic (Appendix F: one run's 20 per-step ratios
    averaged): ``paper_percentile``, the share of seeds whose ratio is at or below it, and ``pred_low``,
    ``pred_high``, the 95% prediction interval for one new seed's ratio, on the log scale (the logs are roughly
    normal): :math:`\exp(\bar\ell \pm t_{s-1}\, s_\ell \sqrt{1 + 1/s})`."""
    logs = np.log(np.asarray(values, dtype=float))
    found = {"paper_percentile": float(np.mean(values <= paper)) if paper is not None else None,
             "pred_low": None, "pred_high": None}
    if logs.size > 1:
        half = float(_t_quantile(logs.size - 1) * logs.std(ddof=1) * np.sqrt(1 + 1 / logs.size))
        found["pred_low"], found["pred_high"] = float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))
    return found


def _t_quantile(df: int, level: float = 0.95) -> float:
    from scipy import stats as scipy_stats

    return float(scipy_stats.t.ppf(0.5 + level / 2, df))


def _reading(row: dict):
    """What the entry says about the paper's value: the two means' :data:`AT_PAPER` verdicts where they agree,
    :data:`DEPENDS` where one rejects the paper's value and the other holds it, or where one mean's
    :data:`BELOW_ONE` verdict bears the paper out ("below 1") and the other's contradicts it ("above 1", "rejects
    the paper's value")."""
    first, second = row.get("paper_verdict"), row.get("geo_paper_verdict")
    if first is None or second is None:
        return None
    holds = claims.label(AT_PAPER, "inconclusive")
    if (first == holds) != (second == holds):
        return DEPENDS
    below = claims.label(BELOW_ONE, "reproduced")
    against = (claims.label(BELOW_ONE, "not reproduced"), claims.label(BELOW_ONE, "rejects paper"))
    sides = {row.get("verdict"), row.get("geo_verdict")}
    if below in sides and sides & set(against):  # one mean bears the paper out (below 1), the other contradicts it
        return DEPENDS
    return second


def _against_paper(row: dict, *, units: int) -> dict:
    """Both means' intervals judged on :data:`AT_PAPER` at the entry's Table 3 value, and their :func:`decision`
    (None where the entry has no paper value; every paper value alike, near 1 or not)."""
    sized = row["paper"] is not None  # every entry with a paper value alike (Nystromformer's near 1 too)
    found = {}
    for prefix in ("", "geo_"):
        paper_verdict = (claims.judge(at_paper(row["paper"]), row[prefix + "low"], row[prefix + "high"], units=units)
                         if sized else None)
        found.update({prefix + "paper_verdict": paper_verdict,
                      prefix + "decision": decision(row[prefix + "verdict"], paper_verdict, row[prefix + "power"],
                                                    row[prefix + "seeds_for_80"])})
    return found
