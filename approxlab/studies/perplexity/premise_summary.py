"""The premise's part of the perplexity study's ``summary.md``: "In short" (first, from ``premise.csv`` alone, by
fixed rules), the claims as declared, the verdicts with their calibration, Holm, rho at each unit, no measurable
loss, and the changes of verdict against the committed run."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..reporting.calibrated import calibration_lines, calibration_table, holm_lines
from ..reporting.markdown import markdown_table
from ..reporting.markdown import format_number as fmt
from .claims_summary import setting_text
from .in_short import FAILS, HOLDS, UNDECIDED, kind
from .premise import AS_BUDGET, LOSS, SAME
from .premise_products import RULE
from .premise_claims import (CLONES, DEPTHS, MEASURE, NO_LOSS, OTHER_SIDE, PRACTICAL_FLOOR, PREMISE_CLAIMS,
                             PREMISE_DECLARED, PRIMARY, SECONDARY, STATISTICS, UNIT, WITHIN)

__all__ = ["in_short_lines", "premise_sections"]

_BY_ID = {claim.id: claim for claim in PREMISE_CLAIMS}
_DECIDED = {word for claim in PREMISE_CLAIMS for key, word in claim.labels.items()
            if key in ("reproduced", "not reproduced")}


def _interval(row, suffix: str = "") -> str:
    """``estimate [ci_low, ci_high]`` of ``row`` (the columns with ``suffix``: another reading's), or n/a."""
    estimate, low, high = (float(row[f"{name}{suffix}"]) for name in ("estimate", "ci_low", "ci_high"))
    shown = f" [{fmt(low)}, {fmt(high)}]" if np.isfinite(low) and np.isfinite(high) else ""
    return f"{fmt(estimate)}{shown}" if np.isfinite(estimate) else "n/a"


def _where(row) -> str:
    if row["claim"] == "p1-depths":
        return "pooled over depths" + (f" ({row['layers']})" if str(row["layers"]) != "-" else "")
    return setting_text(row["setting"], row["layers"])


def _kind_of(row) -> str:
    verdict = str(row["verdict"])
    if verdict.startswith(AS_BUDGET):
        return AS_BUDGET
    return "not run" if verdict.startswith("not run") else kind(_BY_ID[row["claim"]], verdict)


def _sentence(rows: pd.DataFrame, name) -> str:
    """Where the claim holds, fails, cannot be told, where its draws are too often in the budget's order for an
    interval ((pw), (pp)) and where it was not run, each row worded by ``name``."""
    found = {HOLDS: [], FAILS: [], UNDECIDED: [], AS_BUDGET: [], "not run": []}
    for _, row in rows.iterrows():
        found[_kind_of(row)].append(name(row))
    words = {HOLDS: "holds in", FAILS: "fails in", UNDECIDED: "cannot be told in",
             AS_BUDGET: f"{AS_BUDGET}, in too many draws for an interval, in", "not run": "not run in"}
    parts = [f"{words[k]} {'; '.join(v)}" for k, v in found.items() if v]
    return (". ".join(p[0].upper() + p[1:] for p in parts) + ".") if parts else "no claim instance."


def _rho(row) -> str:
    verdict = str(row["verdict"])
    shown = verdict[len(AS_BUDGET) + 2:] if verdict.startswith(AS_BUDGET) else verdict
    return f"{_where(row)}: {_interval(row)} ({shown})"


def _other_side(row) -> str:
    if str(row["verdict"]).startswith("not run"):
        return f"the KV cache ({str(row['verdict'])[len('not run: '):]})"
    budget = "" if int(row["num_features"]) < 0 else f"d = {int(row['num_features'])}: "
    return f"{budget}{_interval(row)} nats ({row['verdict']})"


def in_short_lines(premise: pd.DataFrame, loss: pd.DataFrame) -> list[str]:
    """The ``## In short`` section, first in the summary: at each level and depth, where the premise holds, fails or
    cannot be told, each number with its calibrated 95% interval ("holds": the whole interval on the claim's side of
    its threshold; "cannot be told": the interval straddles it, or calibration failed; "not run": the table the
    claim needs is absent)."""
    if premise.empty:
        return ["## In short", "", "No claim instance of the premise was judged.", ""]

    def rows(claim, kind_=PRIMARY):
        return premise[(premise["claim"] == claim) & (premise["kind"] == kind_)]

    lines = ["## In short", "",
             "Does the relative spectral error of attention order what the model loses (the change in "
             "log-perplexity Delta)? Ranks within a window (stratified Spearman rho), on the error measured on the "
             "unpatched model's inputs (clean), methods and windows both resampled, intervals calibrated "
             "(95%; \"cannot be told\": the interval straddles the threshold).", "",
             "- **Across methods, per depth** (rho >= 0.7): " + _sentence(rows("p1"), _rho),
             "- **Across methods, pooled over depths**: " + _sentence(rows("p1-depths"), _rho),
             "- **Across methods, on the drifting error** (secondary: the patched run's own inputs, a shared cause "
             "of error and loss): " + _sentence(rows("p1", SECONDARY), _rho)]
    budget = rows("p1d")
    found = {k: int((budget.apply(_kind_of, axis=1) == k).sum()) if len(budget) else 0
             for k in (HOLDS, FAILS, UNDECIDED)}
    lines.append(f"- **At a fixed budget** (clean error, across methods at one d): holds in {found[HOLDS]}, fails in "
                 f"{found[FAILS]}, cannot be told in {found[UNDECIDED]} of {len(budget)} settings x d"
                 + (": " + "; ".join(f"{_where(r)} d = {int(r['num_features'])}: {_interval(r)}"
                                      for _, r in budget.iterrows()) if len(budget) else "") + ".")
    lines += ["- **Within a method, against the budget** (rho(error, Delta) - rho(1/d, Delta) > 0): "
              + _sentence(rows("pw"), _rho),
              "- **Within a method, given the budget** (partial rank correlation of error and Delta given d > 0): "
              + _sentence(rows("pp"), _rho),
              "- **At one budget, across a method's configurations** (`configs.csv`): " + _sentence(rows("pc"), _rho)]
    other = rows("po", LOSS).query("measure == 'pooled'")
    same = other["verdict"].astype(str).str.startswith(SAME)
    lines.append("- **From the other side** (at a fixed budget in the KV cache, Delta(base) - Delta(output-aware) > 0: "
                 "CriticalKV against SnapKV, CAOTE against TOVA, pooled): " + _sentence(other[~same], _other_side)
                 + "".join(f" At d = {int(r['num_features'])} every pair keeps the same tokens "
                           f"({str(r['verdict'])[len(SAME) + 2:]})." for _, r in other[same].iterrows()))
    p2 = rows("p2")
    better = [f"{r['measure']} in {_where(r)} ({_interval(r)})" for _, r in p2.iterrows() if _kind_of(r) == HOLDS]
    worse = [f"{r['measure']} in {_where(r)} ({_interval(r)})" for _, r in p2.iterrows() if _kind_of(r) == FAILS]
    lines.append("- **Which measure** (stratified rho minus the spectral error's): better than the spectral error: "
                 f"{', '.join(better) or 'none'}; worse: {', '.join(worse) or 'none'}; cannot be told: "
                 f"{sum(_kind_of(r) == UNDECIDED for _, r in p2.iterrows())} comparisons.")
    judged = premise[premise["verdict"].isin(_DECIDED)]
    lines.append(f"- **With Holm** within each claim family: {int(judged['holm_decided'].sum())} of the {len(judged)} "
                 "decided verdicts stand (the table under \"Multiplicity\").")
    if len(loss):
        lines.append(f"- **No measurable loss** ({NO_LOSS}): {int(loss['no_measurable_loss'].sum())} of "
                     f"{int(loss['points'].sum())} points at the kernel floor; no loss that matters (within "
                     f"+-{PRACTICAL_FLOOR} nats): {int(loss['no_loss_that_matters'].sum())}; cells whose Delta equals "
                     f"another's in the same window: {int(loss['tied_cells'].sum())}.")
    return [*lines, ""]


def _declared() -> list[str]:
    return ["## The premise's claims (declared in `approxlab.studies.perplexity.premise_claims` before the data)", "",
            *markdown_table(pd.DataFrame(PREMISE_DECLARED)), "",
            f"- Unit of rho: {UNIT}.", f"- Measure: {MEASURE}.", f"- Depth: {DEPTHS}.", f"- Within a method: {WITHIN}.",
            f"- Statistics: {STATISTICS}.", f"- Near-clones: {CLONES}.", f"- No measurable loss: {NO_LOSS}.",
            f"- From the other side (po): {OTHER_SIDE}.", ""]


def _verdicts(premise: pd.DataFrame) -> list[str]:
    shown = premise.assign(**{"setting ": [_where(r) for _, r in premise.iterrows()],
                              "d": premise["num_features"].map(lambda d: "-" if d < 0 else str(int(d)))})
    return ["### Verdicts (`premise.csv`)", "", *calibration_lines("claims"), "",
            *calibration_table(shown, ["claim", "setting ", "kind", "measure", "d"], former=None), ""]


def _units(rho: pd.DataFrame) -> list[str]:
    if rho.empty:
        return []
    shown = rho.assign(**{"setting ": [setting_text(s, layer) for s, layer in rho[["setting", "layers"]]
                                       .itertuples(index=False)], "rho": rho["rho"].map(fmt)})
    return ["### rho at each unit (`premise_rho.csv`)", "",
            "The spectral error's rho over every cell (the committed design), over the window means of each point, "
            "and within windows (the declared unit); with `configs.csv`, per method over its configurations (mean "
            "over windows):", "",
            *markdown_table(shown[["setting ", "kind", "unit", "rho", "methods", "windows", "points"]]), ""]


def _loss(loss: pd.DataFrame) -> list[str]:
    if loss.empty:
        return []
    shown = loss.assign(**{"setting ": [setting_text(s, layer) for s, layer in loss[["setting", "layers"]]
                                        .itertuples(index=False)], "kernel floor": loss["kernel_floor"].map(fmt)})
    return ["### No measurable loss (`premise_loss.csv`)", "", NO_LOSS + ".", "",
            *markdown_table(shown[["setting ", "points", "kernel floor", "no_measurable_loss", "no_loss_that_matters",
                                   "tied_cells", "cells", "merged"]]), ""]


def _changes(premise: pd.DataFrame) -> list[str]:
    committed = premise["former_verdict"].fillna("").astype(str)  # empty in memory, NaN read back from the CSV
    former = premise[committed != ""]
    changed = former[committed[former.index] != former["verdict"].astype(str)]
    lines = ["### Changes of verdict", "",
             f"Against the committed run's verdicts (`former_verdicts.csv`: its `verdicts.csv`, with the 90% coverage "
             f"gate): {len(changed)} of the {len(former)} claim instances that replace a committed one change. (pw) and "
             "(pp) each replace the committed within-method rho (p1w); a multi-layer setting's clean and drifting "
             "rows both stand beside its committed verdict (which ranked the drifting error); the depths pooled "
             "and the configurations are new."]
    if len(changed):
        shown = changed.assign(**{"setting ": [_where(r) for _, r in changed.iterrows()],
                                  "d": changed["num_features"].map(lambda d: "-" if d < 0 else str(int(d)))})
        lines += ["", *markdown_table(shown[["claim", "setting ", "measure", "d", "former_verdict", "verdict",
                                             "deviation"]].rename(columns={"former_verdict": "committed verdict"}))]
    return [*lines, ""]


_INSTANCE = ["claim", "setting", "layers", "kind", "measure", "num_features"]


def _rule_changes(premise: pd.DataFrame, former: pd.DataFrame) -> list[str]:
    """The claim instances that changed when the degenerate rule did (``premise_former_rule.csv`` against
    ``premise.csv``): a verdict, an estimate or an interval that moved, or an instance only one rule judged."""
    if former.empty or "setting" not in former:
        return []
    keyed = [frame.assign(layers=frame["layers"].astype(str), num_features=frame["num_features"].astype(int))
             for frame in (premise, former)]
    both = keyed[0].merge(keyed[1], on=_INSTANCE, how="outer", suffixes=("", " (first rule)"), indicator=True)
    same = (both["_merge"] == "both").to_numpy() & (both["verdict"].astype(str) == both["verdict (first rule)"]
                                                    .astype(str)).to_numpy()
    for column in ("estimate", "ci_low", "ci_high"):  # equal, NaN equal to NaN
        same &= np.isclose(both[column].astype(float), both[f"{column} (first rule)"].astype(float), rtol=0, atol=0,
                           equal_nan=True)
    changed = both[~same]
    lines = [f"**The degenerate rule changed after the data.** It was first declared on the median relative spectral "
             f"error over heads (below 1e-6: exact attention). A method exact in some heads only (DuoAttention "
             f"computes its retrieval heads exactly) has that median at the kernel's floor although its other heads "
             f"are not exact and the model loses with it, so the first rule dropped its points as exact attention. "
             f"The rule now reads the largest error over heads ({RULE}): only a method exact in every head is "
             f"dropped. Against the verdicts under the first rule (`premise_former_rule.csv`), {int(same.sum())} of "
             f"{len(both)} claim instances keep their estimate, interval and verdict; {len(changed)} change:"]
    if len(changed):
        shown = changed.assign(**{
            "setting ": [_where(r) for _, r in changed.iterrows()],
            "d": changed["num_features"].map(lambda d: "-" if d < 0 else str(int(d))),
            "first rule": [_interval(r, " (first rule)") for _, r in changed.iterrows()],
            "now": [_interval(r) for _, r in changed.iterrows()]})
        lines += ["", *markdown_table(shown[["claim", "setting ", "kind", "measure", "d", "first rule",
                                             "verdict (first rule)", "now", "verdict"]].fillna("n/a"))]
    return [*lines, ""]


def premise_sections(saved) -> list[str]:
    """The premise's sections of the summary (after the run and its deviations)."""
    premise = saved.product("premise.csv")
    return [*_declared(), *_verdicts(premise),
            *holm_lines(premise, _INSTANCE, family="family", decided=_DECIDED),
            *_units(saved.product("premise_rho.csv")), *_loss(saved.product("premise_loss.csv")), *_changes(premise),
            *_rule_changes(premise, saved.product("premise_former_rule.csv"))]
