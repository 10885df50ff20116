r"""The long-context study's claims, fixed in code before the data: the accuracy gate and the premise.

**The gate.** A task enters the claims at a length only if the exact model answers it: its accuracy (exact match
of the greedy answer, over the task's sequences at that length) has a two-sided 95% Clopper-Pearson lower bound of
at least :data:`GATE` (:func:`approxlab.stats.binomial.clopper_pearson`; with 30 texts x 3 depths, 80 of 90
correct). A task that fails the gate is reported as such (:func:`gate_table`) and leaves the premise claims at
that length: a policy cannot lose what the model never had. The depths of one text share its filler, so the
sequences are not wholly independent; the bound treats them as such and is stated with that caveat.

**The premise**, per length, on the gated tasks' sequences; the error is each policy's **clean-input** relative
spectral error (the policy applied to the unpatched model's q, k, v: free of the drift earlier layers cause), the
mean over layers of each layer's median over heads (``clean_spectral_mean``). The losses are against the exact
model on the same sequence: accuracy (exact minus policy, -1, 0 or 1), the answer's log-probability (nats), and
LongPPL's key-token :math:`\Delta` NLL (mean over the continuation's key tokens; :data:`.grid.SHORT_CONTEXT`).

* **Across policies** (claims ``acc``, ``logprob``, ``key``): Spearman's :math:`\rho` between error and loss over
  the policies, **stratified within sequence x ratio** -- ranked among the policies that read the same sequence at
  the same budget, then averaged over strata. The reason: the text's and the task's own difficulty and the budget
  move every policy's loss together (the window-to-window spread the premise issue found to swamp a pooled
  :math:`\rho`), and the budget is the within-policy question below; a stratum whose loss (or error) is the same for
  every policy has no ranking and is left out (counted in the table). Threshold 0.7 (the perplexity study's
  (p1)): a rank correlation of 0.7 or more is a ranking a practitioner could choose policies by.
* **Within a policy against the budget** (claim ``budget``): over the ratios of one policy on one sequence, the
  paired difference :math:`\rho(\text{error}, \text{loss}) - \rho(1/b, \text{loss})` (answer log-prob loss),
  averaged over policy x sequence strata: does the error rank a policy's budgets better than the budget itself?
  Above 0 (strict): the error adds something the budget does not know.

**The whole-sequence setting** (claims ``whole-acc``, ``whole-logprob``, ``whole-key``): the same across-method
statistic over the methods that are not cache policies, each replacing every layer over the whole sequence
(``whole.csv``), within sequence x ratio; its own Holm family per length. The budget claim needs several ratios per
method, which the whole-sequence grid does not declare.

**The worst head** (rows ``"gated, worst head"``, on the sequences whose every row records
``clean_spectral_worst_head``):
the same claims with the error read as the mean over layers of each layer's *largest* error over heads. The
declared median over heads reads a method exact in most heads (DuoAttention's retrieval heads) as exact; these
rows say whether a verdict changes with that choice. They are not the declared claims and stay out of the Holm
families.

**Units.** Texts (WikiText-2 windows; for a task on RULER's noise haystack, draws of its keys and values, the
window and the draw of one index being one text) are resampled, each with all its sequences (tasks and depths):
the statistic is a ratio :math:`\sum_t S_t / \sum_t C_t` of each text's sum of stratum :math:`\rho` and its count, so
a resample is cheap. The interval is the percentile bootstrap over texts, calibrated by the double bootstrap on
the run's own texts (:func:`approxlab.studies.reporting.calibrated.calibrate`); the four claims of a length are
one Holm family.

Public API::

    GATE, GATE_LEVEL, CLAIMS, WHOLE_CLAIMS, SETTINGS, RESAMPLES, MIN_TEXTS, ERROR, WORST_HEAD
    gate_table(results, declared=None) -> DataFrame
    premise_frame(results, gate) -> DataFrame
    stratum_values(frame, claim, error=ERROR) -> [(text, value)]
    stratum_sums(frame, claim, error=ERROR) -> {text: (sum, count)}
    verdicts(results, whole=None) -> DataFrame
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from ...stats import Resamples
from ...stats.binomial import clopper_pearson
from ...stats.calibration import IntervalFamily
from ..declaration import Claim
from ..reporting.calibrated import calibrate, calibrated_columns
from ..reporting.claims import judge

__all__ = ["GATE", "GATE_LEVEL", "CLAIMS", "WHOLE_CLAIMS", "SETTINGS", "RESAMPLES", "MIN_TEXTS", "OUTCOMES", "UNIT",
           "TEXTS", "ERROR", "WORST_HEAD", "gate_table", "depth_table", "premise_frame", "stratum_values",
           "stratum_sums", "verdicts"]

GATE, GATE_LEVEL = 0.8, 0.95
"""A task enters the claims at a length when its exact accuracy's two-sided 95% Clopper-Pearson lower bound is
at least 0.8."""

RESAMPLES = 1000
"""Bootstrap resamples of the texts per interval (each one a ratio of sums: cheap)."""

MIN_TEXTS = 5
"""Fewer texts with a defined stratum at a length: no verdict (too few units)."""

ERROR, WORST_HEAD = "clean_spectral_mean", "clean_spectral_worst_head"
"""The claims' error (mean over layers of each layer's median over heads) and the worst head's (of its largest)."""

OUTCOMES = {"acc": "accuracy_loss", "logprob": "delta_logprob", "key": "delta_key", "budget": "delta_logprob"}
"""The loss each claim ranks against the clean-input error."""

UNIT = ("Units: texts ({texts}), each resampled with all its sequences (tasks and depths). "
        "Across policies, Spearman's rho is ranked within each sequence x ratio and averaged over strata: the text's "
        "and the task's difficulty and the budget move every policy's loss together, and ranking within a stratum "
        "keeps that shared shift out of the ranking of policies; a stratum whose loss or error is the same for every "
        "policy ranks nothing and is left out. Within a policy, the paired difference rho(error, loss) - rho(1/b, loss) "
        "is taken over the ratios of one policy on one sequence. The error is the clean-input relative spectral error "
        "(mean over layers of each layer's median over heads); the patched-input error is recorded beside it, "
        "described only.")
"""The declared unit and strata of the premise claims, in words (printed in the summary, ``{texts}`` what a text is:
:data:`TEXTS` of the run's haystacks, joined)."""

TEXTS = {"wikitext": "disjoint WikiText-2 windows of each length",
         "noise": "for a task@noise, one draw of its keys, values and other needles' depths in RULER's noise "
                  "haystack, its line of plain sentences repeated, the same filler in every sequence"}
"""What a text is, per haystack (:data:`approxlab.tasks.ruler.HAYSTACKS`): the summary's run line and unit line."""

_RANKS = {"reproduced": "holds", "not reproduced": "fails", "inconclusive": "undecided",
          "too few units": "too few texts"}
CLAIMS = (
    Claim("acc", "across policies, the clean-input error ranks the accuracy loss", "stratified Spearman rho (within "
          "sequence x ratio, over policies)", side="at least", threshold=0.7, unit="text", min_units=MIN_TEXTS,
          labels=_RANKS, within="sequence x ratio", family="length"),
    Claim("logprob", "across policies, the clean-input error ranks the answer log-prob loss", "stratified Spearman "
          "rho (within sequence x ratio, over policies)", side="at least", threshold=0.7, unit="text",
          min_units=MIN_TEXTS, labels=_RANKS, within="sequence x ratio", family="length"),
    Claim("key", "across policies, the clean-input error ranks the key-token Delta NLL", "stratified Spearman rho "
          "(within sequence x ratio, over policies)", side="at least", threshold=0.7, unit="text",
          min_units=MIN_TEXTS, labels=_RANKS, within="sequence x ratio", family="length"),
    Claim("budget", "within a policy, the clean-input error ranks its budgets' log-prob loss better than 1/b",
          "rho(error, loss) - rho(1/b, loss) over ratios (within policy x sequence)", side="above", threshold=0.0,
          unit="text", min_units=MIN_TEXTS, strict=True, labels=_RANKS, within="policy x sequence", family="length"),
)
"""The premise claims, fixed before the run (the module docstring gives the reasons)."""

WHOLE_CLAIMS = tuple(dataclasses.replace(claim, id=f"whole-{claim.id}", text=claim.text.replace(
    "across policies", "across whole-sequence methods"), statistic=claim.statistic.replace("policies", "methods"))
    for claim in CLAIMS if claim.id != "budget")
"""The across-method claims in the whole-sequence setting (fixed before its first cell ran)."""

SETTINGS = {"kv-cache": CLAIMS, "whole-sequence": WHOLE_CLAIMS}
"""Each setting's claims: the cache policies on the exact prefill; the other methods over the whole sequence."""


def gate_table(results: pd.DataFrame, declared: int | None = None) -> pd.DataFrame:
    """Per task and length: the exact model's sequences, correct answers, accuracy, its 95% Clopper-Pearson
    interval and whether the task passes the gate (``passes``, on the sequences there are).

    With ``declared`` (the sequences the grid declares per task and length), ``settled`` says whether the rest of a
    run can still change that: ``"pass"`` when the bound passes even if every missing sequence is answered wrong,
    ``"fail"`` when it fails even if every one is answered right, ``"open"`` otherwise (a complete task is
    ``"pass"`` or ``"fail"``). A consequence of the rule, not a second one: with 90 declared, 11 wrong answers
    settle a failure.

    Examples
    --------
    >>> import pandas as pd
    >>> from approxlab.studies.long_context.claims import gate_table
    >>> rows = pd.DataFrame({"method": "unpatched", "task": "single-needle", "length": 8192, "text": range(12),
    ...                      "correct": [True] * 1 + [False] * 11})
    >>> gate_table(rows, declared=90)[["sequences", "correct", "passes", "settled"]].to_dict("records")
    [{'sequences': 12, 'correct': 1, 'passes': False, 'settled': 'fail'}]
    """
    rows = []
    for (task, length), group in _exact(results).groupby(["task", "length"], sort=False):
        found = _accuracy(group)
        count, correct = found["sequences"], found["correct"]
        total = max(count, int(declared)) if declared is not None else count
        worst = clopper_pearson(correct, total, level=GATE_LEVEL)[0] >= GATE  # every missing one wrong
        best = clopper_pearson(correct + total - count, total, level=GATE_LEVEL)[0] >= GATE  # every one right
        rows.append({"task": task, "length": int(length), "declared": total, "texts": group["text"].nunique(),
                     **found, "passes": bool(found["cp_low"] >= GATE),
                     "settled": "pass" if worst else "fail" if not best else "open"})
    return pd.DataFrame(rows, columns=["task", "length", "sequences", "declared", "texts", "correct", "accuracy",
                                       "cp_low", "cp_high", "passes", "settled"])


def depth_table(results: pd.DataFrame) -> pd.DataFrame:
    """Per task, length and depth of the asked needle: the exact model's sequences, correct answers, accuracy and
    95% Clopper-Pearson interval. A description beside :func:`gate_table` (the gate pools the depths): where a
    model finds a needle only near the question, the pooled accuracy hides it.

    Examples
    --------
    >>> import pandas as pd
    >>> from approxlab.studies.long_context.claims import depth_table
    >>> rows = pd.DataFrame({"method": "unpatched", "task": "single-needle", "length": 8192, "text": [0, 0, 1, 1],
    ...                      "depth": [0.1, 0.9] * 2, "correct": [False, True, False, True]})
    >>> depth_table(rows)[["depth", "sequences", "correct"]].to_dict("records")
    [{'depth': 0.1, 'sequences': 2, 'correct': 0}, {'depth': 0.9, 'sequences': 2, 'correct': 2}]
    """
    rows = [{"task": task, "length": int(length), "depth": float(depth), **_accuracy(group)}
            for (task, length, depth), group in _exact(results).groupby(["task", "length", "depth"], sort=False)]
    columns = ["task", "length", "depth", "sequences", "correct", "accuracy", "cp_low", "cp_high"]
    return pd.DataFrame(rows, columns=columns).sort_values("length", kind="stable").reset_index(drop=True)


def _exact(results: pd.DataFrame) -> pd.DataFrame:
    """The exact (unpatched) model's rows."""
    return results[results["method"] == "unpatched"]


def _accuracy(group: pd.DataFrame) -> dict:
    """A group of the exact model's rows: its sequences, correct answers, accuracy and 95% Clopper-Pearson
    interval."""
    count, correct = len(group), int(group["correct"].astype(bool).sum())
    low, high = clopper_pearson(correct, count, level=GATE_LEVEL)
    return {"sequences": count, "correct": correct, "accuracy": correct / count, "cp_low": low, "cp_high": high}


def premise_frame(results: pd.DataFrame, gate: pd.DataFrame) -> pd.DataFrame:
    """The policies' rows of the gated tasks, each with its losses against the exact model on its sequence
    (``accuracy_loss``, ``delta_logprob``, ``delta_key``) and ``sequence`` (task, text, depth); failed rows out."""
    passed = gate[gate["passes"]][["task", "length"]]
    frame = results.merge(passed, on=["task", "length"])
    keys = ["task", "length", "text", "depth"]
    exact = frame[frame["method"] == "unpatched"][[*keys, "correct"]].rename(columns={"correct": "exact_correct"})
    frame = frame[(frame["method"] != "unpatched") & (frame["status"] == "ok")].merge(exact, on=keys)
    frame = frame.assign(accuracy_loss=frame["exact_correct"].astype(float) - frame["correct"].astype(float),
                         sequence=[f"{t}/{x}@{d:g}" for t, x, d in frame[["task", "text", "depth"]].itertuples(
                             index=False)])
    return frame


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho of finite pairs (average ranks for ties); NaN where either side is constant or < 3 pairs."""
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    return float(np.corrcoef(rx, ry)[0, 1])


def stratum_values(frame: pd.DataFrame, claim: str, error: str = ERROR) -> list[tuple[int, float]]:
    """``[(text, value)]``, one per stratum with a defined value, of one length's premise rows for ``claim``
    (:data:`OUTCOMES`): the across-policy rho of the column ``error`` per sequence x ratio, or (``"budget"``) the
    paired difference per policy x sequence."""
    claim = claim.removeprefix("whole-")
    outcome, values = OUTCOMES[claim], []
    strata = ["sequence", "method"] if claim == "budget" else ["sequence", "compression_ratio"]
    for (sequence, _), group in frame.groupby(strata, sort=False):
        value = _spearman(group[error].to_numpy(float), loss := group[outcome].to_numpy(float))
        if claim == "budget":
            value -= _spearman(1.0 / group["num_features"].to_numpy(float), loss)
        if math.isfinite(value):
            values.append((int(group["text"].iloc[0]), value))
    return values


def stratum_sums(frame: pd.DataFrame, claim: str, error: str = ERROR) -> dict:
    """``{text: (sum of stratum values, strata)}`` of :func:`stratum_values`: each text's share of the statistic."""
    return _text_sums(stratum_values(frame, claim, error))


def _text_sums(values) -> dict:
    """``{text: (sum, count)}`` of ``[(text, value)]``."""
    sums = {}
    for text, value in values:
        total, count = sums.get(text, (0.0, 0))
        sums[text] = (total + value, count + 1)
    return sums


def _family(units, trial: int) -> IntervalFamily:
    """The percentile interval family of :math:`\\sum S / \\sum C` over ``units`` ((sum, count) pairs)."""
    values = np.asarray(units, dtype=float).reshape(-1, 2)
    estimate = values[:, 0].sum() / values[:, 1].sum()
    picks = np.random.default_rng(max(trial, 0) + 17).integers(0, len(values), size=(RESAMPLES, len(values)))
    draws = values[picks, 0].sum(axis=1) / np.maximum(values[picks, 1].sum(axis=1), 1)
    return IntervalFamily.percentile(Resamples(float(estimate), draws, len(values)))


def verdicts(results: pd.DataFrame, whole: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per setting (:data:`SETTINGS`), length, claim and ``sequences`` (``every_stratum``: the value every
    stratum gives, where they all give the same, else NaN): ``"gated"`` (the claim: the gated tasks' sequences, the
    calibrated interval, the verdict) and ``"all"`` (every task's sequences, gate or not: the statistic and its
    declared 95% percentile interval over texts, described, never judged: a task the exact model cannot do still
    has an answer whose log-probability a policy can lower), and ``"gated, worst head"`` on the gated sequences
    whose every row records :data:`WORST_HEAD`, where there are any (the claim under the worst head's error, with
    ``median_head_estimate`` and ``median_head_verdict``: the declared error's on the same sequences). The
    whole-sequence setting's rows (``whole``, the columns of ``results``' policy rows) are read beside ``results``'
    unpatched rows, at the lengths they have."""
    gate = gate_table(results)
    everything = gate.assign(passes=True)
    rows = []
    exact = results[results["method"] == "unpatched"]
    settings = {"kv-cache": results}
    if whole is not None and len(whole):
        settings["whole-sequence"] = pd.concat([exact[exact["length"].isin(whole["length"].unique())], whole],
                                               ignore_index=True)
    for setting, rows_of in settings.items():
        gated, declared = premise_frame(rows_of, gate), {}  # declared: (length, claim) -> (rows judged, its row)
        for which, frame, error in (("gated", gated, ERROR), ("all", premise_frame(rows_of, everything), ERROR),
                                    ("gated, worst head", _recording(gated), WORST_HEAD)):
            for length in sorted(rows_of["length"].unique()):
                at = frame[frame["length"] == length]
                if error == WORST_HEAD and not len(at):
                    continue
                for claim in SETTINGS[setting]:
                    row = {"setting": setting, **_claim_row(claim, at, int(length), which, error)}
                    if which == "gated":
                        declared[(length, claim.id)] = (len(at), row)
                    if error == WORST_HEAD:
                        row.update(_median_head(claim, at, int(length), declared[(length, claim.id)]))
                    rows.append(row)
    return pd.DataFrame(rows)


def _recording(frame: pd.DataFrame) -> pd.DataFrame:
    """The premise rows of the sequences whose every row records :data:`WORST_HEAD` (rows computed before it
    was recorded lack it; a sequence is kept whole or left out, so that its strata rank the same methods)."""
    if WORST_HEAD not in frame:
        return frame.iloc[:0]
    finite = pd.Series(np.isfinite(frame[WORST_HEAD].to_numpy(float)), index=frame.index)
    return frame[finite.groupby([frame["length"], frame["sequence"]]).transform("all")]


def _median_head(claim, at: pd.DataFrame, length: int, gated: tuple) -> dict:
    """The declared statistic on the same sequences as a worst-head row (``at``): its estimate and verdict, so
    that a change of verdict is the statistic's, not the sequences'. ``gated`` is ``(rows, row)``, the declared
    claim's row on all gated sequences: where ``at`` holds them all (it is a subset of them), that row is it."""
    count, row = gated
    if len(at) != count:
        row = _claim_row(claim, at, length, "gated", ERROR)
    return {"median_head_estimate": row["estimate"], "median_head_verdict": row["verdict"]}


def _claim_row(claim, at: pd.DataFrame, length: int, which: str, error: str) -> dict:
    """One claim's row on the premise rows ``at`` of one length (judged only on the gated sequences)."""
    values = stratum_values(at, claim.id, error)  # the strata once: their sums per text, and whether they all agree
    units = list(_text_sums(values).values())
    distinct = {value for _, value in values}
    row = {"length": length, "sequences": which, "claim": claim.id, "text": claim.text,
           "threshold": claim.threshold, "side": claim.side, "texts": len(units),
           "strata": int(sum(c for _, c in units)), "tasks": ",".join(sorted(at["task"].unique())),
           "every_stratum": distinct.pop() if len(distinct) == 1 else math.nan}
    enough = len(units) >= max(2, claim.min_units)
    estimate = sum(s for s, _ in units) / row["strata"] if units else math.nan
    if not which.startswith("gated"):
        low, high = _family(units, -1).interval(0.95) if enough else (math.nan, math.nan)
        return {**row, "estimate": estimate, "ci_low": low, "ci_high": high, "verdict": "described, not judged",
                **calibrated_columns(None, claim.threshold)}
    found = calibrate(_family, units) if enough else None
    low, high = (found.low, found.high) if found else (math.nan, math.nan)
    return {**row, "estimate": estimate, "ci_low": low, "ci_high": high,
            "verdict": judge(claim, low, high, units=len(units), calibrated=found),
            **calibrated_columns(found, claim.threshold)}
