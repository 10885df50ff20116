"""Skyformer Table 3 regenerated: ``table.md`` and the figure, from the saved files only.

The report step of :mod:`approxlab.studies.instability` reads ``results.csv`` and ``config.json`` and
writes ``ratios.csv``, ``intervals.csv`` (:mod:`.stats`), ``table.md`` (:func:`summarize`: laid out
like Table 3, then the verdicts, the power analysis, the settings against the paper's and an
entry-by-entry comparison); the figure is :func:`.figures.plot`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...stats import UnitModel
from ..reporting.calibrated import (CALIBRATED_COLUMNS, calibration_lines, calibration_table,
                                     holm_lines, in_short_lines)
from ..reporting.changes import changes_lines
from ..reporting.claims import coverage_lines
from ..reporting.markdown import markdown_table
from ..reporting.summary import render
from .design import budget_lines, task_seeds
from .settings import proxy_lines, settings_lines, task_label
from .spread import spread_lines
from .stats import BELOW_ONE, DEPENDS, PAPER_COLUMN, PAPER_TABLE3, POWER_GOAL, PRIMARY_MEAN, intervals

__all__ = ["ATTENTION_ORDER", "RESULTS", "RESIDUAL", "RATIOS", "INTERVALS", "KEY_COLUMNS", "TITLE", "ratio_table",
           "verdict_table", "paper_comparison", "summary_lines", "summarize", "sections"]


ATTENTION_ORDER = ("softmax", "kernelized", "skyformer", "nystromformer", "spectral-shifting", "yoso")
"""Rows of the table (softmax is the reference, ratio 1 by definition)."""

RESULTS = "results.csv"
RESIDUAL = "residual.csv"
RATIOS = "ratios.csv"
INTERVALS = "intervals.csv"
KEY_COLUMNS = ("task", "n", "seed", "attention")
TITLE = "Instability-score ratios (Skyformer Appendix F, Table 3)"


def _task_label(task: str, n: int) -> str:
    return task_label(task, n)


def _columns(summary: pd.DataFrame) -> list[tuple]:
    """The (task, n) of the summary in Table 3's column order (Text, ListOps, Retrieval, Pathfinder, Image),
    then any other task."""
    order = list(PAPER_COLUMN)
    pairs = dict.fromkeys((t, int(n)) for t, n in summary[["task", "n"]].itertuples(index=False))
    return sorted(pairs, key=lambda pair: (order.index(pair[0]) if pair[0] in order else len(order), pair[1]))


def _layout(summary: pd.DataFrame, cell) -> pd.DataFrame:
    """Rows = attentions, columns = tasks, entries ``cell(row)``."""
    columns = [_task_label(t, n) for t, n in _columns(summary)]
    attentions = [a for a in ATTENTION_ORDER if a in set(summary["attention"])]
    attentions += [a for a in dict.fromkeys(summary["attention"]) if a not in attentions]
    table = pd.DataFrame(index=attentions, columns=columns, dtype=object)
    for row in summary.itertuples(index=False):
        table.loc[row.attention, _task_label(row.task, row.n)] = cell(row)
    return table.fillna("-")


def _interval_cell(row, prefix: str = "") -> str:
    if row.verdict == "failed":
        return "failed"
    if row.verdict == "reference":
        return "1 (reference)"
    mean, low, high = (getattr(row, prefix + k) for k in ("mean", "low", "high"))
    text = f"{mean:.2f}" if row.seeds < 2 else f"{mean:.2f} [{low:.2f}, {high:.2f}]"
    return text + (f" ({row.failed} seeds failed)" if row.failed else "")


def _verdict_cell(row) -> str:
    """The verdict, the power beside it where the paper gives a value to size for, and the geometric
    mean's verdict (with its power on the log scale) where it differs."""
    text = (f"{DEPENDS}: " if getattr(row, "reading", None) == DEPENDS else "") + row.verdict \
        + _power_text(getattr(row, "power", None))
    geo = getattr(row, "geo_verdict", None)
    if isinstance(geo, str) and geo != row.verdict:
        text += f"; geometric mean: {geo}" + _power_text(getattr(row, "geo_power", None), " on the logs")
    return text


def _power_text(power, scale: str = "") -> str:
    return "" if power is None or pd.isna(power) else f" (power {power:.2f}{scale})"


def ratio_table(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Rows = attentions, columns = tasks; entries ``"0.77 [0.65, 0.89]"`` (mean, 95% CI over seeds)."""
    return _layout(intervals(per_seed), _interval_cell)


def verdict_table(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Rows = attentions, columns = tasks; entries ``below 1`` / ``above 1`` / ``inconclusive``."""
    return _layout(intervals(per_seed), _verdict_cell)


def _markdown(table: pd.DataFrame) -> str:
    """A Table-3 layout (rows = attentions) as markdown, entries as they are."""
    return "\n".join(markdown_table(table, default=str, empty=None, index="attention"))


def _claim(summary: pd.DataFrame, attention: str, holds) -> str:
    """Whether a paper claim holds on every task, from the intervals (``holds(row) -> bool|None``)."""
    rows = summary[summary["attention"] == attention]
    if not len(rows) or (rows["verdict"] == "failed").all():
        return f"{attention}: no result (not run or failed)"
    answers = [holds(r) for r in rows.itertuples(index=False)]
    parts = [f"{_task_label(r.task, r.n)}: {_interval_cell(r)}, {r.verdict}" for r in rows.itertuples(index=False)]
    word = ("yes" if all(a is True for a in answers) else "no" if any(a is False for a in answers)
            else "inconclusive" if all(a is None for a in answers) else "partly (the other tasks inconclusive)")
    return f"{attention}: {word} ({'; '.join(parts)})"


def _below_one(row):
    return {"below 1": True, "above 1": False}.get(row.verdict)


def _near_one(row):
    """Nyströmformer "fluctuates around 1": the interval lies within [0.9, 1.1]."""
    if row.low is None or np.isnan(row.low):
        return None
    if 0.9 <= row.low and row.high <= 1.1:
        return True
    return False if (row.high < 0.9 or row.low > 1.1) else None


def paper_comparison(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (attention, task) with a Table 3 counterpart: the paper's ratio, ours with its interval,
    whether the paper's value lies inside our interval and whether both are on the same side of 1."""
    rows = []
    for row in summary.itertuples(index=False):
        column = PAPER_COLUMN.get(row.task)
        if column is None or row.attention not in PAPER_TABLE3 or row.verdict == "failed":
            continue
        paper = PAPER_TABLE3[row.attention][column]
        inside = row.low is not None and not np.isnan(row.low) and row.low <= paper <= row.high
        ours_side = {"below 1": "below", "above 1": "above"}.get(row.verdict, "undecided")
        rows.append({"attention": row.attention, "task": _task_label(row.task, row.n), "paper": f"{paper:.2f}",
                     "ours [95% CI]": _interval_cell(row), "paper inside our CI": "yes" if inside else "no",
                     "same side of 1": ("yes" if ours_side == ("below" if paper < 1 else "above") else
                                        "undecided" if ours_side == "undecided" else "no")})
    return pd.DataFrame.from_records(rows)


def _records_markdown(frame: pd.DataFrame) -> str:
    return "\n".join(markdown_table(frame, default=str, empty="(no task with a Table 3 counterpart)"))


def _power_lines(summary: pd.DataFrame) -> list[str]:
    """The power analysis: per entry with a Table 3 value below 1, the per-seed SD, the power of the
    seeds run and the seeds 80% power needs, on the ratios (the arithmetic mean's verdict) and on the log
    ratios (the geometric mean's)."""
    rows = summary[summary["attention"].isin(["kernelized", "skyformer"])]
    lines = ["## Power analysis", "",
             "Each seed gives one ratio (its own data, initial weights, landmarks and dropout masks). The question "
             "is whether the mean ratio differs from 1 when it is in truth the paper's value (e.g. 0.77): a "
             "two-sided one-sample t-test at 5%, with the per-seed standard deviation measured here -- on the ratios "
             "for the arithmetic mean, on the log ratios (against log of the paper's value) for the geometric mean, "
             "each verdict with the power of its own scale. A verdict that is not decisive and holds the paper's "
             f"value counts as \"not confirmed (underpowered)\" when the power is below {POWER_GOAL:.0%}. The SD of "
             "a handful of seeds is itself a rough estimate, so the seeds-needed columns are indicative; an entry "
             "with one seed has no SD and no power.", ""]
    table = []
    for r in rows.itertuples(index=False):
        if r.verdict == "failed":
            continue
        paper = "-" if r.paper is None or pd.isna(r.paper) else f"{r.paper:.2f}"
        table.append([r.attention, _task_label(r.task, r.n), r.seeds, f"{r.sd:.3f}", paper, _number(r.power, "{:.2f}"),
                      _number(r.seeds_for_80, "{:.0f}"), _number(getattr(r, "geo_sd", None), "{:.3f}"),
                      _number(getattr(r, "geo_power", None), "{:.2f}"),
                      _number(getattr(r, "geo_seeds_for_80", None), "{:.0f}")])
    columns = ["attention", "task", "seeds", "per-seed SD", "paper", "power at the paper's value",
               "seeds for 80% power", "SD of the log ratios", "power on the logs", "seeds for 80% on the logs"]
    return lines + markdown_table(pd.DataFrame(table, columns=columns), default=str, empty=None) + [""]


def _number(value, pattern: str) -> str:
    return "-" if value is None or pd.isna(value) else pattern.format(value)


def _coverage_lines(summary: pd.DataFrame) -> list[str]:
    """The coverage of both t intervals at this run's seed count, the units lognormal with the largest SD of
    the log ratios measured among kernelized and Skyformer."""
    decided = summary[summary["attention"].isin(["kernelized", "skyformer"]) & (summary["seeds"] > 0)]
    if decided.empty or "geo_sd" not in decided:
        return []
    spread = decided["geo_sd"].astype(float).dropna()
    seeds = int(decided["seeds"].min())
    model = UnitModel(sigma=float(spread.max())) if len(spread) and spread.max() > 0 else UnitModel()
    entries = [{"claims": "arithmetic mean", "claim": BELOW_ONE, "units": seeds, "statistic": "mean", "model": model},
               {"claims": "geometric mean", "claim": BELOW_ONE, "units": seeds, "statistic": "geometric mean",
                "model": model}]
    return [*coverage_lines(entries), "",
            "The simulated seeds are lognormal with the largest SD of the log ratios measured here (kernelized, "
            "Skyformer): the t interval on the logs is exact for them; the arithmetic mean's covers less the more "
            "skewed the ratios.", ""]


def _calibration_lines(summary: pd.DataFrame) -> list[str]:
    """How each mean's interval is calibrated on the run's own seeds, entry by entry (both means)."""
    judged = summary[summary["coverage_draws"].fillna(0) > 0] if "coverage_draws" in summary else summary.iloc[:0]
    if judged.empty:
        return []
    judged = judged.assign(task=[_task_label(t, n) for t, n in zip(judged["task"], judged["n"])])
    geometric = judged.assign(**{k: judged["geo_" + k] for k in [*CALIBRATED_COLUMNS, "p"]}, ci_low=judged["geo_low"],
                              ci_high=judged["geo_high"], verdict=judged["geo_verdict"],
                              former_verdict=judged["former_geo_verdict"], mean="geometric")
    both = pd.concat([judged.assign(ci_low=judged["low"], ci_high=judged["high"], mean="arithmetic"), geometric],
                     ignore_index=True)
    return [*calibration_lines("means"), "",
            *calibration_table(both, ["attention", "task", "mean"]), "",
            *holm_lines(both, ["attention", "task", "mean"], family="mean",
                        decided=(BELOW_ONE.labels["reproduced"], BELOW_ONE.labels["not reproduced"]))]


def _in_short(summary: pd.DataFrame) -> list[str]:
    """The "In short" section: Table 3's "below 1" for kernelized attention and Skyformer, entry by entry, by the
    arithmetic mean (the paper's statistic); the other attentions' entries counted beside."""
    rows = summary[summary["attention"].isin(["kernelized", "skyformer"]) & (summary["seeds"] > 0)]
    words = {True: [], False: [], None: []}
    for r in rows.itertuples(index=False):
        words[_below_one(r)].append(f"{r.attention} on {_task_label(r.task, r.n)} ({r.verdict})")
    return in_short_lines(words[True], words[False], words[None], notes=[
        "Table 3's claim read here: kernelized attention and Skyformer move their output less than softmax attention "
        "for the same parameter change (ratio below 1), each entry judged by the calibrated 95% interval of the mean "
        "ratio over seeds."])


def _seed_lines(summary: pd.DataFrame) -> list[str]:
    """Table 3's value as one seed's statistic, apart from the population mean's interval against 1."""
    rows = summary[summary["paper"].notna()] if "paper" in summary else summary.iloc[:0]
    if rows.empty:  # e.g. the softmax reference alone: no entry of Table 3 to place
        return []
    table = pd.DataFrame({"attention": rows["attention"], "task": [_task_label(t, n) for t, n in zip(rows["task"],
                                                                                                   rows["n"])],
                          "paper": rows["paper"], "seeds at or below it": [f"{p:.0%}" for p in rows["paper_percentile"]],
                          "one new seed (95% prediction)": [f"[{lo:.2f}, {hi:.2f}]" for lo, hi in
                                                            zip(rows["pred_low"], rows["pred_high"])],
                          "arithmetic mean": rows["paper_verdict"], "geometric mean": rows["geo_paper_verdict"],
                          "reading": rows["reading"]})
    return ["## Table 3's value among the seeds", "",
            "Appendix F defines each entry as the average of one run's 20 per-step ratios: the paper's value is one "
            "draw of the per-seed statistic, not a population mean. It is placed here in the distribution of the "
            "seeds (the share of seeds at or below it, and the 95% prediction interval for one new seed's ratio, t on "
            "the logs), apart from the population mean's interval against 1 above. The mean that leads is declared: "
            f"the {PRIMARY_MEAN} mean, because the per-seed ratios are right-skewed and their logs roughly symmetric. "
            "The last columns say whether each mean's interval holds the paper's value; where the two means disagree "
            f"the reading is \"{DEPENDS}\", neither verdict. Every entry is tested alike, Nystromformer's values "
            "near 1 included.", "", *markdown_table(table.reset_index(drop=True), default=str), ""]


def _changes_lines(summary: pd.DataFrame) -> list[str]:
    """The verdicts that the current rules change, both means (from :func:`~.stats.intervals`)."""
    if "former_verdict" not in summary:
        return []
    judged = summary[summary["former_verdict"].notna()].assign(task=lambda f: [
        _task_label(t, n) for t, n in zip(f["task"], f["n"])])
    both = pd.concat([judged.assign(mean="arithmetic"),
                      judged.assign(mean="geometric", verdict=judged["geo_verdict"],
                                    former_verdict=judged["former_geo_verdict"], low=judged["geo_low"],
                                    high=judged["geo_high"])])
    both["interval"] = [f"[{low:.3f}, {high:.3f}]" if pd.notna(low) else "-" for low, high in
                        zip(both["low"], both["high"])]
    depends = judged[judged["reading"] == DEPENDS] if "reading" in judged else judged.iloc[:0]
    entries = depends.assign(mean="both (the entry)", verdict=DEPENDS, interval=[
        f"[{a:.3f}, {b:.3f}] / [{c:.3f}, {d:.3f}]" for a, b, c, d in
        depends[["low", "high", "geo_low", "geo_high"]].to_numpy(float)], former_verdict=[
        f"{a} / {g}" for a, g in zip(depends["former_verdict"], depends["former_geo_verdict"])])
    both = pd.concat([both, entries], ignore_index=True)
    return [*changes_lines(both, ["attention", "task", "mean"], shown=["interval", "paper"], what="verdict",
                           rules="the declared 95% t interval judged, and no verdict where its coverage on the "
                                 "run's own seeds, estimated from 400 draws, was below 90%; the rows of an entry read "
                                 f"\"{DEPENDS}\" give both means' calibrated intervals, arithmetic / geometric, and "
                                 "their former verdicts")[1:], ""]


def _seeds_line(config: dict, per_seed: pd.DataFrame) -> str:
    """``"Seeds run (of those configured): Text 12 (of 259), ..."``, in Table 3's column order."""
    run = per_seed.groupby(["task", "n"])["seed"].nunique()
    configured = {(t["task"], t["n"]): task_seeds(config, t) for t in config["tasks"]}
    line = "Seeds run (of those configured): " + ", ".join(
        f"{_task_label(task, n)} {run.get((task, n), 0)} (of {configured.get((task, n), '-')})"
        for task, n in _columns(pd.DataFrame(list(configured) or [], columns=["task", "n"]))) + "."
    if any(run.get(key, 0) < count for key, count in configured.items()):
        line += (" **Partial run**: the intervals, verdicts and answers are those of the seeds run. The seeds run "
                 "in an order fixed before the run (seed by seed, every column together), so where the run stopped "
                 "was not chosen by its results; the same command resumes it, computing only the missing seeds.")
    return line


def summary_lines(config: dict, per_seed: pd.DataFrame, results: pd.DataFrame,
                  residual: pd.DataFrame | None = None, run: dict | None = None) -> list[str]:
    """The lines of ``table.md`` under its title: intervals, verdicts with their power, the power analysis
    and the decision per entry, the seeds and their budget, where the spread comes from, the proxies, the
    settings against the paper's, Table 3 beside ours, and the compute used."""
    summary = intervals(per_seed)
    seconds = results.groupby(list(KEY_COLUMNS))["seconds"].first()
    lines = [
        *_in_short(summary),
        f"Mean over {config['steps']} training steps of tau_i(method) / tau_i(softmax) per seed; then over "
        "the seeds the arithmetic mean (the paper's statistic) "
        "with its 95% Student-t interval, calibrated on the run's own seeds (**Calibrated intervals** below). tau_i = ||f(x_i, W_i) - f(x_i, W_(i-1))||_F^2 / ||W_i - W_(i-1)||_F^2, "
        "f the embedding after the two encoder layers. Below 1: more stable than softmax attention.", "",
        _markdown(_layout(summary, _interval_cell)), "", _seeds_line(config, per_seed), "",
        "Geometric mean of the ratios (exp of the mean log ratio, 95% t interval on the logs, calibrated), beside it:", "",
        _markdown(_layout(summary, lambda r: _interval_cell(r, "geo_"))), "",
        "Verdicts (arithmetic mean): \"below 1\" / \"above 1\" only when the whole 95% interval is on that "
        "side; otherwise \"rejects the paper's value\" when the interval excludes the paper's Table 3 value, "
        f"\"not confirmed (underpowered)\" when it holds it and the seeds had less than {POWER_GOAL:.0%} power to "
        "tell the paper's value from 1, else \"inconclusive\"; one seed decides nothing. The power is printed "
        "beside; where the geometric mean's verdict differs, it is named, with its power on the log scale.", "",
        _markdown(_layout(summary, _verdict_cell)), "",
        *_coverage_lines(summary),
        *_calibration_lines(summary),
        *_seed_lines(summary),
        *_changes_lines(summary),
        *_power_lines(summary),
        *budget_lines(config, results, summary, run=run),
        *spread_lines(results, per_seed, residual, _task_label, _columns(summary)),
        f"Model: 2-layer pre-LN encoder, embedding {config['model']['embedding_dim']}, feed-forward "
        f"{config['model']['hidden_dim']}, {config['model']['num_heads']} heads; padding keys masked inside every "
        "attention (landmarks and segment means over real tokens only); " + _method_note(config) + ".", "",
        *proxy_lines(config),
        *settings_lines(config),
        "## Skyformer's Table 3 (LRA, for comparison)", "", _markdown(pd.DataFrame(PAPER_TABLE3).T), "",
        "## Entry by entry against Table 3", "", _records_markdown(paper_comparison(summary)), "",
        "## Does the paper's claim hold here? (from the intervals)", "",
        "- kernelized below 1 on every task? " + _claim(summary, "kernelized", _below_one),
        "- skyformer below 1 on every task? " + _claim(summary, "skyformer", _below_one),
        "- nystromformer around 1 (interval within 0.9-1.1)? " + _claim(summary, "nystromformer", _near_one), "",
        f"Compute: {len(seconds)} training cells, {seconds.sum():.0f} s of cell "
        f"time in total (slowest attention: {seconds.groupby(level='attention').sum().idxmax()}).",
    ]
    failed = per_seed[per_seed["status"] != "ok"]
    if len(failed):
        lines += ["", "## Failed entries", ""]
        lines += [f"- {r.task} n={r.n} seed={r.seed} {r.attention}: {r.status}" for r in failed.itertuples()]
    return lines


def summarize(config: dict, per_seed: pd.DataFrame, results: pd.DataFrame, residual=None) -> str:
    """The markdown of ``table.md`` (:func:`summary_lines` under its title)."""
    return render(TITLE, summary_lines(config, per_seed, results, residual))


def sections(saved) -> list[str]:
    """``table.md``'s lines from a saved run (the report step's :class:`~approxlab.studies.Summary`)."""
    return summary_lines(saved.config, saved.product(RATIOS), saved.table(RESULTS), saved.table(RESIDUAL),
                         run=saved.run)


def _method_note(config: dict) -> str:
    options = config.get("attention_options", {})
    notes = []
    if "yoso" in config["attentions"]:
        notes.append("`yoso` is YOSO-E trained with " + (
            "the lower bound of YOSO's Eq. (4) as its backward pass" if options.get("yoso", {}).get("gradient")
            == "lower-bound" else "the true derivative of its weights"))
    notes.append("`skyformer` uses its " + options.get("skyformer", {}).get("core", "pinv") + " core")
    notes.append(f"num_features = {config['num_features']}")
    return "; ".join(notes)
