"""The claims sections of the perplexity study's ``summary.md``: the declarations, what entered each claim, the
verdicts, the measures compared, the references, the intervals' coverage, and the methods left out of the decoder
claims."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..reporting.changes import changes_lines
from ..reporting.claims import tally
from ..reporting.markdown import format_interval, markdown_table
from ..reporting.markdown import format_interval as _interval
from ..reporting.markdown import format_number as fmt
from ..reporting.measured import GATE
from .agreement import not_compared
from .claims import (DECLARED, DECODER_VALID, DEGENERATE, FLOOR, MEASURE_TEXT, MIN_BUDGETS, MIN_METHODS, P1,
                     P1_BUDGET, P1_METHOD, P1_WITHIN, P2, P3, RESAMPLING)
from .gating import SIZING
from .prediction import COVERAGE_TRIALS
from .grid import KV_CACHE
from .long_grid import LONG_KV, LONG_WHOLE

__all__ = ["claim_sections", "coverage_cell", "needed_cell", "setting_text", "delta_cells"]

_OUTCOMES = ("reproduced", "not reproduced", "inconclusive", "too few units")


def delta_cells(delta: pd.DataFrame) -> list[str]:
    """Each row of ``delta.csv`` as ``"mean [low, high] (k of n failed)"`` (:func:`format_interval`)."""
    return [format_interval(e, lo, hi, failed=f, units=w) for e, lo, hi, f, w in
            delta[["delta", "delta_low", "delta_high", "failures", "windows"]].itertuples(index=False)]


def setting_text(setting, layers) -> str:
    """A setting in the summary's words: ``"layer 0 replaced"``, ``"all replaced"``, ``"KV cache, all layers"``;
    a long-context one by its name, ``"long-kv: all, 2048 tokens"``."""
    if setting == KV_CACHE:
        return f"KV cache, {layers} layers"
    return f"{setting}: {layers}" if setting in (LONG_WHOLE, LONG_KV) else f"{layers} replaced"


def _rows(verdicts, claim) -> pd.DataFrame:
    rows = verdicts[verdicts["claim"] == claim.id].copy()
    if "former_verdict" in rows:  # a superseded claim shows the reading of its interval (the section says so)
        superseded = rows["verdict"].astype(str).str.startswith("superseded")
        rows.loc[superseded, "verdict"] = rows.loc[superseded, "former_verdict"]
    rows["setting "] = [setting_text(s, layer) for s, layer in rows[["setting", "layers"]].itertuples(index=False)]
    rows["estimate [95% CI]"] = [_interval(*v) for v in rows[["estimate", "ci_low", "ci_high"]].to_numpy(float)]
    rows["coverage (own units)"] = [coverage_cell(*v) for v in rows[["coverage", "coverage_low", "coverage_high"]]
                                    .to_numpy(float)] if "coverage" in rows else ""
    largest = 12 if claim.unit == "window" else max(SIZING["multiples"])
    rows[f"{claim.unit}s for 90%"] = [needed_cell(c, n, u, largest) for c, n, u in zip(
        rows.get("coverage", pd.Series(np.nan, index=rows.index)), rows.get("units_for_90", pd.Series(
            np.nan, index=rows.index)), rows["windows" if claim.unit == "window" else "methods"])]
    return rows


def coverage_cell(rate, low, high) -> str:
    """``"93% [87%, 97%]"``: a coverage measured on the run's own units with its Wilson interval."""
    return "not measured" if not math.isfinite(rate) else f"{rate:.0%} [{low:.0%}, {high:.0%}]"


def needed_cell(rate, needed, units, largest: int = 12) -> str:
    """The units 90% coverage would need, for a row below it: a count, or more than ``largest`` times the run's."""
    if not math.isfinite(rate) or rate >= GATE:
        return ""
    return str(int(needed)) if pd.notna(needed) else f"more than {largest * int(units)}"


def _tally(claim, rows) -> str:
    gated = int(rows["verdict"].astype(str).str.startswith("no verdict: coverage").sum())
    return f"{tally(claim, rows['verdict'], _OUTCOMES)}, {gated} no verdict (coverage below 90%)"


def _declared() -> list[str]:
    return ["## The committed design's claims (declared in `approxlab.studies.perplexity.claims`)", "",
            "Their premise claims (p1), (p1w), (p1m), (p1d), (p2) are superseded by the premise's claims above (each "
            "row's `former_verdict` in `verdicts.csv` is the reading of its percentile interval, shown here for "
            "comparison, with no coverage measured); (p3) and (p4) are still judged by them.", "",
            *markdown_table(pd.DataFrame(DECLARED)), "",
            f"- Decoder-valid methods: {DECODER_VALID}.", f"- Degenerate points: {DEGENERATE}.",
            f"- Noise floor: {FLOOR}.",
            f"- Intervals: 95% percentile, {RESAMPLING['resamples']:,} resamples; across methods, a two-level "
            "bootstrap (methods with replacement, then each drawn method's windows with replacement: the methods are "
            f"a sample of approximations, not the population); no verdict below {MIN_METHODS} methods; a "
            f"within-method rho needs {MIN_BUDGETS} budgets.", ""]


def _entered(observed) -> list[str]:
    if observed.empty:
        return []
    shown = pd.DataFrame({
        "setting": [setting_text(s, layer) for s, layer in observed[["setting", "layers"]].itertuples(index=False)],
        "methods": observed["methods"], "windows": observed["windows"], "cells": observed["cells"],
        "noise floor (nats)": [fmt(v) for v in observed["floor"]],
        "cells tied at 0": observed["tied"],
        "points with no measurable loss": [f"{a} of {b}" for a, b in observed[["no_loss", "points"]].to_numpy()],
        "degenerate points dropped": [f"{n} ({text})" if n else "0" for n, text in
                                      observed[["degenerate", "degenerate_points"]].to_numpy()],
        "mask-renormalise methods out": observed["mask_renormalise"], "failed cells": observed["failed"]})
    return ["**What entered the claims** (`observations.csv`):", "", *markdown_table(shown), ""]


def _table(rows, columns) -> list[str]:
    return [*markdown_table(rows[columns]), ""] if len(rows) else ["(none)", ""]


def _p1(verdicts) -> list[str]:
    p1, within, per, budget = (_rows(verdicts, c) for c in (P1, P1_WITHIN, P1_METHOD, P1_BUDGET))
    measured = ["coverage (own units)", "methods for 90%"]
    lines = [f"- **(p1) across methods**: {P1.statistic}; holds at rho >= {P1.threshold:g}; {_tally(P1, p1)}.", "",
             *_table(p1, ["setting ", "estimate [95% CI]", *measured, "verdict", "methods", "windows", "points"]),
             f"- **(p1w) within a method, pooled**: {P1_WITHIN.statistic}; holds at mean rho >= "
             f"{P1_WITHIN.threshold:g}; {_tally(P1_WITHIN, within)}.", "",
             *_table(within, ["setting ", "estimate [95% CI]", *measured, "verdict", "methods"])]
    if len(per):
        table = per.pivot_table(index="method", columns="setting ", values="estimate [95% CI]", aggfunc="first",
                                fill_value="").reset_index()
        lines += [f"- **(p1m) within each method** ({P1_METHOD.statistic}; interval over windows, holds at rho >= "
                  f"{P1_METHOD.threshold:g}): {_tally(P1_METHOD, per)}.", "", *markdown_table(table), "",
                  *_table(per, ["method", "setting ", "estimate [95% CI]", "coverage (own units)", "windows for 90%",
                                "verdict", "windows"])]
    if len(budget):
        lines += [f"- **(p1d) at a fixed budget** ({P1_BUDGET.statistic}; holds at rho >= {P1_BUDGET.threshold:g}): "
                  f"{_tally(P1_BUDGET, budget)}.", "",
                  *_table(budget, ["setting ", "num_features", "estimate [95% CI]", *measured, "verdict", "methods"])]
    return lines


def _p2(verdicts, correlations, prediction) -> list[str]:
    lines = []
    if len(correlations):
        shown = correlations.assign(**{"setting ": [setting_text(s, layer) for s, layer in
                                                    correlations[["setting", "layers"]].itertuples(index=False)],
                                       "rho [95% CI]": [_interval(*v) for v in correlations[["rho", "ci_low",
                                                                                             "ci_high"]].to_numpy()]})
        shown["measure"] = shown["measure"].map(lambda m: MEASURE_TEXT.get(m, m))
        table = shown.pivot_table(index="measure", columns="setting ", values="rho [95% CI]", aggfunc="first",
                                  fill_value="").reset_index()
        lines += ["- **(p2) which measure ranks the losses**: each measure's rho across methods [two-level 95% CI] "
                  "(a measure a run did not record is n/a):", "", *markdown_table(table), ""]
    p2 = _rows(verdicts, P2)
    lines += [f"  Paired, {P2.statistic}; better when the whole interval is above {P2.threshold:g}: {_tally(P2, p2)}.",
              "", *_table(p2, ["setting ", "measure", "estimate [95% CI]", "coverage (own units)", "methods for 90%",
                               "verdict", "methods"])]
    if len(prediction):
        shown = prediction.assign(**{"held-out error [95% CI]": [_interval(*v) for v in prediction[
            ["held_out_error", "ci_low", "ci_high"]].to_numpy(float)], "minus spectral's [95% CI]": [
            _interval(*v) for v in prediction[["minus_spectral", "minus_spectral_low",
                                               "minus_spectral_high"]].to_numpy(float)],
            "setting ": [setting_text(s, layer) for s, layer in prediction[["setting", "layers"]].itertuples(index=False)]})
        lines += ["- **Leave one method out**: an isotonic fit of log10 Delta on the measure over the other methods "
                  "predicts the held-out method's points; mean absolute error in decades over methods [95% CI, "
                  "methods resampled], and minus the spectral error's on the same methods (below 0: predicts "
                  "better):", "", *markdown_table(shown[["setting ", "measure", "methods", "held-out error [95% CI]",
                                                         "minus spectral's [95% CI]"]]), ""]
    return lines


def _p3(saved, verdicts, labels) -> list[str]:
    if not saved.config.get("compare_with"):
        return ["- **(p3)** not decided: no `--compare-with` folders were named.", ""]
    p3 = _rows(verdicts, P3)
    skipped = len(not_compared(labels))
    left_out = (f" **{skipped} comparison{'s' if skipped != 1 else ''} not made** (the `compared` column says why)."
                if skipped else "")
    return [f"- **(p3)** {P3.statistic}, holds at rho >= {P3.threshold:g}: {_tally(P3, p3)}.{left_out} "
            "On method means (a per-window comparison with a per-method constant cannot reach 1); each reference's "
            "model, length and layer, and the methods it lacks or failed (left out):", "",
            *_table(labels, list(labels.columns)),
            *_table(p3, ["reference", "setting ", "num_features", "estimate [95% CI]", "coverage (own units)",
                         "methods for 90%", "verdict", "methods"])]


def _calibration(calibration) -> list[str]:
    if calibration.empty:
        return []
    shown = calibration.assign(**{"setting": [setting_text(s, layer) for s, layer in
                                              calibration[["setting", "layers"]].itertuples(index=False)]})
    shown = shown.drop(columns=["layers"]).map(lambda v: fmt(v) if isinstance(v, float) else v)
    return ["**Width.** The (p1) interval's mean width on random subsets of 5, 10 and all methods (how it narrows "
            "with the number of methods), beside the coverage of the (p1) and (p1w) intervals on the run's own units "
            "(`calibration.csv`):", "", *markdown_table(shown), ""]


def _measured_lines() -> list[str]:
    return ["**Coverage on the run's own units** (the `coverage (own units)` of (p3) and (p4); `approxlab.studies."
            "perplexity.gating`). The claims' units vary at the level of the method (then the window within it): the run is "
            f"taken as the population and its estimate as the truth; {COVERAGE_TRIALS['trials']} data sets are drawn "
            "from it as the run was drawn (methods with replacement, then each drawn method's windows), each with "
            f"its own {COVERAGE_TRIALS['resamples']}-resample two-level interval, every claim of a setting on the "
            "same draws, and the share of the intervals that hold the truth is the coverage (Wilson 95% interval; "
            "(p1m): the method's windows drawn, `measured_coverage`). A verdict whose interval covers less than "
            f"{GATE:.0%} is withheld (\"no verdict: coverage ... < 90%\"); the methods (windows for (p1m)) it would "
            "need are the first of " + ", ".join(map(str, SIZING["multiples"])) + " times the run's methods (2-12 "
            "times the windows for (p1m)) at which the same measurement reaches 90% "
            f"({SIZING['trials']} data sets of {SIZING['resamples']} resamples per count, to keep the report's cost "
            "modest: a size, not a verdict, rests on it; an approximation, the run's methods standing for the "
            "population).", ""]


def _changes(verdicts) -> list[str]:
    if verdicts.empty or "former_verdict" not in verdicts:
        return []
    verdicts = verdicts[~verdicts["verdict"].astype(str).str.startswith("superseded")]
    shown = verdicts.assign(**{"setting ": [setting_text(s, layer) for s, layer in
                                            verdicts[["setting", "layers"]].itertuples(index=False)],
                               "estimate [95% CI]": [_interval(*v) for v in verdicts[["estimate", "ci_low",
                                                                                      "ci_high"]].to_numpy(float)],
                               "coverage": [coverage_cell(*v) for v in verdicts[["coverage", "coverage_low",
                                                                           "coverage_high"]].to_numpy(float)]})
    shown["num_features"] = shown["num_features"].map(lambda d: "" if d < 0 else str(int(d)))
    return [*changes_lines(shown, ["claim", "setting ", "measure", "method", "reference", "num_features"],
                           shown=["estimate [95% CI]", "coverage"], what="verdict",
                           rules="(p3) and (p4): the same intervals and thresholds, but a verdict given whatever "
                                 "its interval's coverage"), ""]


def _excluded(saved, delta) -> list[str]:
    from .judging import causal_form

    form = causal_form(delta)
    rows = delta[(form == "mask-renormalise").to_numpy()]
    if rows.empty:
        return []
    shown = rows.assign(cell=delta_cells(rows))
    shown = shown.assign(setting=[setting_text(s, layer) for s, layer in
                                  shown[["setting", "layers"]].itertuples(index=False)])
    table = shown.pivot_table(index=["setting", "method"], columns="num_features", values="cell", aggfunc="first",
                              fill_value="").reset_index()
    table.columns = ["setting", "method", *[f"d = {d}" for d in table.columns[2:]]]
    return ["## Not decoder attention: the `mask-renormalise` runs", "",
            "Their landmarks pool every position, so a token's output depends on later tokens: the loss below is not "
            "that of a decoder, and these runs enter no decoder claim. Change in log-perplexity [95% CI over "
            "windows]:", "", *markdown_table(table), ""]


def claim_sections(saved) -> list[str]:
    """The claims part of the summary."""
    verdicts = saved.product("verdicts.csv")
    lines = ["", *_declared(), *_entered(saved.product("observations.csv")), *_p1(verdicts),
             *_p2(verdicts, saved.product("correlations.csv"), saved.product("prediction.csv")),
             *_p3(saved, verdicts, saved.product("references_used.csv")),
             *_measured_lines(), *_calibration(saved.product("calibration.csv")), *_changes(verdicts),
             *_excluded(saved, saved.product("delta.csv"))]
    return [line if not isinstance(line, float) or np.isfinite(line) else "" for line in lines]
