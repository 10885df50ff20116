r"""How many seeds each column of Table 3 gets, declared before the run, and what they cost.

The question Table 3 is asked here, per column (Text, ListOps, Retrieval, Pathfinder, Image) for
kernelized attention and Skyformer: is the mean ratio :math:`R = \tau/\tau_{softmax}` below 1,
as the paper reports? A column is *decided* when the 95% interval of the mean excludes 1 or
excludes the paper's value, and *backed* when it does neither but the seeds had at least 80% power
to tell the paper's value from 1 (a two-sided one-sample t-test at 5%). The seeds that guarantee one
of the two, whatever the data say, are those that give 80% power at the paper's value: with them an
interval that holds 1 is backed, and every other outcome is decided.

The power needs the per-seed spread, which is measured on a pilot (:data:`PILOT`): for ListOps and
Pathfinder the 10-seed run saved in ``figures/instability/`` (seeds 0-9), for the three proxies the
first 10 seeds of this grid (the same cells the full run computes first; ``approxlab instability
--tasks text:256:8,retrieval:256:8,image:256:8 --seeds 10``). The counts are sized on the paper's statistic,
the arithmetic mean of the ratios, which needs more seeds than the geometric mean (the t-test on the
log ratios at ``log(paper)``); both are stated (:func:`plan`). The per-seed SD of 10 seeds is itself
uncertain (its 95% interval is about 0.69 to 1.8 times the estimate), so the power the full run
reaches is recomputed from its own seeds in ``table.md``; a run can be extended later, and only the
new seeds are computed.

Pilot (per-seed ratio over seeds 0-9: mean, SD, SD of its logarithm) and the seeds 80% power at Table
3's value needs on each scale:

========== ========== ===== ===== ====== ===== ============ ===========
task       attention  mean  SD    log SD paper arithmetic   geometric
========== ========== ===== ===== ====== ===== ============ ===========
text       kernelized 1.394 0.971 0.634  0.83  258          93
text       skyformer  1.414 0.964 0.636  0.81  204          74
listops    kernelized 1.463 0.642 0.454  0.77  64           26
listops    skyformer  1.463 0.642 0.457  0.79  76           32
retrieval  kernelized 1.782 1.140 0.552  0.64  81           15
retrieval  skyformer  1.781 1.115 0.543  0.64  78           14
pathfinder kernelized 1.051 0.708 0.529  0.74  61           27
pathfinder skyformer  1.032 0.731 0.537  0.79  98           43
image      kernelized 1.107 0.585 0.517  0.62  21           12
image      skyformer  1.126 0.610 0.533  0.65  26           15
========== ========== ===== ===== ====== ===== ============ ===========

(:func:`plan` computes the last two columns.) :data:`PLANNED_SEEDS` is, per task, the larger of
the two attentions' arithmetic requirement, capped at :data:`SEED_CAP` (no column reaches it): Text
258, ListOps 76, Retrieval 81, Pathfinder 98, Image 26. ListOps and Pathfinder share one count, the
larger of theirs (98): their entries name none of their own, so that the 10-seed run saved before
this grid extends into it (more ``--seeds`` later extend it again). A proxy's count is part of its
task entry, and a saved run extends only along entries it holds unchanged, so a larger count for a
proxy needs a new output folder or ``--restart``. The full grid is 3.55 hours of CPU on one idle
thread (Text 1.32, ListOps 0.64, Retrieval 0.86, Pathfinder 0.59, Image 0.14), 3.43 of them new.

Cost (:data:`SECONDS_PER_SEED`, one idle thread, all four attentions, n = 256, batch 8, 20 steps):
:func:`plan` multiplies it out; ``table.md`` states the total and the cell time actually used.
"""

from __future__ import annotations

import math

import pandas as pd

from ..reporting import claims
from ..reporting.markdown import markdown_table
from .stats import POWER_GOAL, PAPER_COLUMN, PAPER_TABLE3

__all__ = ["PILOT", "DECIDED", "SECONDS_PER_SEED", "SEED_CAP", "PLANNED_SEEDS", "seeds_needed", "task_seeds", "plan",
           "reached", "budget_lines"]

DECIDED = ("kernelized", "skyformer")
"""The attentions whose Table 3 entries the seeds are sized for."""

PILOT = {
    "text": {"seeds": 10, "kernelized": (1.394, 0.971, 0.634), "skyformer": (1.414, 0.964, 0.636)},
    "listops": {"seeds": 10, "kernelized": (1.463, 0.642, 0.454), "skyformer": (1.463, 0.642, 0.457)},
    "retrieval": {"seeds": 10, "kernelized": (1.782, 1.140, 0.552), "skyformer": (1.781, 1.115, 0.543)},
    "pathfinder": {"seeds": 10, "kernelized": (1.051, 0.708, 0.529), "skyformer": (1.032, 0.731, 0.537)},
    "image": {"seeds": 10, "kernelized": (1.107, 0.585, 0.517), "skyformer": (1.126, 0.610, 0.533)},
}
"""Per task: the pilot's seeds and, per attention, ``(mean, SD, SD of the log)`` of the per-seed ratios."""

SECONDS_PER_SEED = {"text": 18.4, "listops": 23.6, "retrieval": 38.2, "pathfinder": 21.5, "image": 19.9}
"""CPU seconds of one seed (softmax, kernelized, skyformer and nystromformer; n = 256, batch 8, 20
steps) on one idle thread."""

SEED_CAP = 300
"""The most seeds a column is given (Text at about 18 s a seed: 1.5 hours of CPU)."""


def seeds_needed(task: str, attention: str, *, log: bool = False) -> int | None:
    """Seeds for 80% power at Table 3's value with the pilot's spread: on the ratios (the arithmetic mean, the
    paper's statistic, at ``paper - 1``) or, with ``log``, on their logs (the geometric mean, at ``log(paper)``)."""
    paper = PAPER_TABLE3[attention][PAPER_COLUMN[task]]
    _, sd, log_sd = PILOT[task][attention]
    difference, spread = (math.log(paper), log_sd) if log else (paper - 1.0, sd)
    return claims.power(difference, spread, 2, goal=POWER_GOAL)[1]


PLANNED_SEEDS = {task: min(SEED_CAP, max(PILOT[task]["seeds"], *(seeds_needed(task, a) for a in DECIDED)))
                 for task in PILOT}
"""Per task, the seeds of the full grid (declared here, from the pilot, before the run)."""


def task_seeds(config: dict, entry: dict) -> int:
    """The seed count of a task ``entry`` of ``config``: its own, else ``config["seeds"]``.

    Examples
    --------
    >>> from approxlab.studies.instability import build_config, task_seeds
    >>> config = build_config(tasks=["text:256:8:40", "listops:256:8"], seeds=12)
    >>> [task_seeds(config, entry) for entry in config["tasks"]]
    [40, 12]
    """
    return int(entry.get("seeds", config["seeds"]))


def plan(planned: dict) -> pd.DataFrame:
    """Per task x attention of :data:`DECIDED`: the pilot's SDs, Table 3's value, the seeds 80% power
    needs on each scale, the seeds planned (``planned``: task -> seeds, e.g. those of the full grid)
    and their CPU time on one idle thread (hours)."""
    rows = []
    for task, pilot in PILOT.items():
        for attention in DECIDED:
            mean, sd, log_sd = pilot[attention]
            rows.append({"task": task, "attention": attention, "pilot seeds": pilot["seeds"], "pilot mean": mean,
                         "pilot SD": sd, "pilot log SD": log_sd,
                         "paper": PAPER_TABLE3[attention][PAPER_COLUMN[task]],
                         "seeds for 80% (arithmetic)": seeds_needed(task, attention),
                         "seeds for 80% (geometric)": seeds_needed(task, attention, log=True),
                         "seeds planned": planned.get(task),
                         "CPU hours": None if planned.get(task) is None else
                         planned[task] * SECONDS_PER_SEED[task] / 3600})
    return pd.DataFrame.from_records(rows)


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds:.0f} s"


def _number(value, pattern: str) -> str:
    return "-" if value is None or pd.isna(value) else pattern.format(value)


def reached(summary: pd.DataFrame) -> pd.DataFrame:
    """Per kernelized / Skyformer entry of ``summary`` (:func:`~.stats.intervals`), in words: the seeds run,
    the power at the paper's value and the seeds 80% power needs under each statistic, and whether the entry
    answers Table 3's question (:func:`~.stats.decision`) under each."""
    rows = summary[summary["attention"].isin(DECIDED) & summary["task"].isin(list(PAPER_COLUMN))]
    rows = rows[rows["verdict"] != "failed"]
    order = {task: i for i, task in enumerate(PAPER_COLUMN)}
    rows = rows.assign(_order=rows["task"].map(order)).sort_values(["_order", "n", "attention"], kind="stable")
    return pd.DataFrame([[f"{PAPER_COLUMN[r.task]} (n={r.n})", r.attention, r.seeds, _number(r.paper, "{:.2f}"),
                          _number(r.power, "{:.2f}"), _number(r.seeds_for_80, "{:.0f}"), r.decision or "-",
                          _number(r.geo_power, "{:.2f}"), _number(r.geo_seeds_for_80, "{:.0f}"), r.geo_decision or "-"]
                         for r in rows.itertuples(index=False)],
                        columns=["task", "attention", "seeds", "paper", "power (arithmetic)",
                                 "seeds for 80% (arithmetic)", "answer (arithmetic)", "power (geometric)",
                                 "seeds for 80% (geometric)", "answer (geometric)"])


def _workers(run: dict) -> str:
    """How the run's cells were computed, from ``config.json``'s run record (``"2 workers, 1 thread(s) each"``)."""
    workers, threads = run.get("workers"), run.get("threads")
    if not workers:
        return "one process" + (f", {threads} thread(s)" if threads else "")
    return f"{workers} workers" + (f", {threads} thread(s) each" if threads else "")


def budget_lines(config: dict, results: pd.DataFrame, summary: pd.DataFrame,
                 run: dict | None = None) -> list[str]:
    """The section of ``table.md`` on the seeds: whether each kernelized / Skyformer entry answers Table 3's
    question with the seeds run (:func:`reached`), how the seeds were sized (before the run, from the pilot),
    what the planned grid costs on one idle thread, and the cell time this run used."""
    planned = {t["task"]: task_seeds(config, t) for t in config["tasks"] if t["task"] in PILOT}
    if not planned:
        return []
    table = plan(planned)
    table = table[table["task"].isin(list(planned))]
    hours = sum(seeds * SECONDS_PER_SEED[task] / 3600 for task, seeds in planned.items())
    shown = table.assign(**{"CPU hours": table["CPU hours"].map(lambda h: f"{h:.2f}"),
                            "task": table["task"].map(PAPER_COLUMN),
                            **{c: table[c].map(lambda v: "-" if v is None or pd.isna(v) else f"{int(v)}")
                               for c in ("seeds for 80% (arithmetic)", "seeds for 80% (geometric)", "seeds planned")}})
    ok = results[results["status"] == "ok"] if "status" in results else results
    cells = ok.groupby(["task", "n", "seed", "attention"])["seconds"].first()
    used = cells.groupby(level="task").agg(["sum", "size"])
    seed_median = cells.groupby(level=["task", "seed"]).sum().groupby(level="task").median()
    seeds_run = ok.groupby("task")["seed"].nunique()
    spent = "; ".join(f"{PAPER_COLUMN.get(task, task)}: {seeds_run.get(task, 0)} seeds, "
                      f"{_duration(used.loc[task, 'sum'])} (median {seed_median[task]:.0f} s a seed)"
                      for task in planned if task in used.index)
    per_seed = ", ".join(f"{PAPER_COLUMN[task]} {seconds:g} s" for task, seconds in SECONDS_PER_SEED.items())
    return [
        "## Does each column answer Table 3? The seeds: sized before the run, and what they cost", "",
        "A column answers Table 3's question for kernelized attention and Skyformer when the 95% interval of the "
        "mean ratio excludes 1 or excludes the paper's value (\"decided\"; the interval against the paper's value is "
        "the `paper_verdict` of `intervals.csv`), or when it does neither but the seeds had at least "
        f"{POWER_GOAL:.0%} power to tell the paper's value from 1 (\"backed\"), else it is \"open\". The power is the "
        "two-sided one-sample t-test's at 5% with the per-seed SD measured here: on the ratios for the arithmetic "
        "mean (the paper's statistic), on the log ratios at log(paper) for the geometric mean.", "",
        *markdown_table(reached(summary), default=str, empty="(no kernelized or Skyformer entry)"), "",
        f"The seeds that guarantee an answer, whatever the data say, are those with {POWER_GOAL:.0%} power at the "
        "paper's value. They were "
        "sized from the per-seed SD of a 10-seed pilot (ListOps and Pathfinder: the 10-seed run made before this "
        "grid; the proxies: their first 10 seeds, the same cells the full grid computes first) on the paper's statistic, the "
        f"arithmetic mean (at most {SEED_CAP} a column), and declared in `approxlab.studies.instability.design` "
        "before the run. The geometric mean (a t-test on the log ratios at log(paper)) needs fewer; both are "
        "shown. The SD of 10 seeds is itself uncertain, so the power reached is recomputed above from the seeds "
        "run; a run extends, and only new seeds are computed.", "",
        *markdown_table(shown, default=str, empty=None), "",
        f"CPU time of the planned grid on one idle thread: {hours:.2f} h (a seed of the four attentions at n = 256, "
        f"batch 8, 20 steps: {per_seed}). Cell time used by this run, summed over its cells (with "
        f"{_workers(run or {})}): " + (spent or "none yet") + ". Cells that share the cores run slower than on one "
        "idle thread, so the per-seed times here are the ones to plan an extension with.", "",
        *_open_lines(summary, seed_median),
    ]


def _open_lines(summary: pd.DataFrame, seed_median: pd.Series) -> list[str]:
    """For every kernelized / Skyformer entry still open on the paper's statistic: the seeds 80% power needs,
    how many more than were run, and their cell time at this run's median seconds a seed."""
    if summary.empty or "decision" not in summary.columns:  # no attention beside the softmax reference was run
        return []
    rows = summary[summary["attention"].isin(DECIDED) & summary["decision"].fillna("").str.startswith("open")]
    needs = []
    for r in rows.itertuples(index=False):
        if pd.isna(r.seeds_for_80) or r.task not in seed_median.index:
            continue
        more = max(int(r.seeds_for_80) - int(r.seeds), 0)
        needs.append(f"{PAPER_COLUMN.get(r.task, r.task)} {r.attention}: {int(r.seeds_for_80)} seeds, {more} more "
                     f"than run, about {more * seed_median[r.task] / 3600:.1f} h of cell time")
    if not needs:
        return []
    return ["What the open entries would take (on the arithmetic mean, at this run's per-seed SD; the seeds of a "
            "column serve all its attentions): " + "; ".join(needs) + ".", ""]
