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
from ..reporting.calibrated import calibration_lines, interval_cell, level_cell
from ..reporting.calibrated import coverage_cell as calibrated_coverage
from .agreement import not_compared
from .claims import (DECLARED, DECODER_VALID, DEGENERATE, FLOOR, MEASURE_TEXT, MIN_BUDGETS, MIN_METHODS, P1,
                     P1_BUDGET, P1_METHOD, P1_WITHIN, P2, P3, RESAMPLING)
from .gating import FORMER_DRAWS
from .grid import KV_CACHE
from .long_grid import LONG_KV, LONG_WHOLE

__all__ = ["claim_sections", "coverage_cell", "setting_text", "delta_cells", "CALIBRATED_SHOWN", "calibrated_cells",
           "verdict_tally"]

CALIBRATED_SHOWN = ["estimate [calibrated CI]", "declared 95% CI", "coverage [MC 95%]", "calibrated level",
                    "verdict", "former verdict (90% gate)"]
"""The columns :func:`calibrated_cells` adds, as the summary shows (p3) and (p4)."""

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
    return rows


def calibrated_cells(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (verdict rows judged on a calibrated interval: (p3), (p4)) with :data:`CALIBRATED_SHOWN`."""
    cells = [r for _, r in rows.iterrows()]
    return rows.assign(**{
        "estimate [calibrated CI]": [_interval(*v) for v in rows[["estimate", "ci_low", "ci_high"]].to_numpy(float)],
        "declared 95% CI": [interval_cell(lo, hi) if np.isfinite(lo) else "" for lo, hi in
                            rows[["nominal_low", "nominal_high"]].to_numpy(float)] if "nominal_low" in rows else "",
        "coverage [MC 95%]": [calibrated_coverage(r) for r in cells],
        "calibrated level": [level_cell(r) for r in cells],
        "former verdict (90% gate)": rows["former_verdict"].fillna("").astype(str) if "former_verdict" in rows
        else ""})


def coverage_cell(rate, low, high) -> str:
    """``"93% [87%, 97%]"``: a coverage measured on the run's own units with its Wilson interval."""
    return "not measured" if not math.isfinite(rate) else f"{rate:.0%} [{low:.0%}, {high:.0%}]"


def _tally(claim, rows) -> str:
    return verdict_tally(claim, rows["verdict"])


def verdict_tally(claim, verdicts) -> str:
    """The verdicts of ``claim`` counted by outcome, and those whose calibration failed ("no verdict: <reason>").

    Examples
    --------
    >>> from approxlab.studies.perplexity.claims import P3
    >>> verdict_tally(P3, pd.Series(["same places", "no verdict: 34.3% of 2300 resamples give no interval"]))
    '1 same places, 0 different places, 0 inconclusive, 0 no verdict (too few units), 1 no verdict (calibration fails)'
    """
    verdicts = pd.Series(verdicts).astype(str)
    failed = int(verdicts.str.startswith("no verdict:").sum())
    return f"{tally(claim, verdicts, _OUTCOMES)}, {failed} no verdict (calibration fails)"


def _declared() -> list[str]:
    return ["## The committed design's claims (declared in `approxlab.studies.perplexity.claims`)", "",
            "Their premise claims (p1), (p1w), (p1m), (p1d), (p2) are superseded by the premise's claims above (each "
            "row's `former_verdict` in `verdicts.csv` is the reading of its percentile interval, shown here for "
            "comparison, with no coverage measured); (p3) and (p4) are still judged by them, on intervals calibrated "
            "as the premise's are (methods and windows drawn crossed; the former 90% coverage gate's verdict "
            "beside).", "",
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
    measured = ["coverage (own units)"]
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
                  *_table(per, ["method", "setting ", "estimate [95% CI]", "coverage (own units)", "verdict",
                                "windows"])]
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
              "", *_table(p2, ["setting ", "measure", "estimate [95% CI]", "coverage (own units)", "verdict",
                               "methods"])]
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
    p3 = calibrated_cells(_rows(verdicts, P3))
    skipped = len(not_compared(labels))
    left_out = (f" **{skipped} comparison{'s' if skipped != 1 else ''} not made** (the `compared` column says why)."
                if skipped else "")
    return [f"- **(p3)** {P3.statistic}, holds at rho >= {P3.threshold:g}: {_tally(P3, p3)}.{left_out} "
            "On method means (a per-window comparison with a per-method constant cannot reach 1); each reference's "
            "model, length and layer, and the methods it lacks or failed (left out):", "",
            *_table(labels, list(labels.columns)),
            *_table(p3, ["reference", "setting ", "num_features", *CALIBRATED_SHOWN, "methods"])]


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
    return [*calibration_lines("(p3) and (p4) claims"), "",
            "(p3) and (p4) draw methods and windows (sequences) crossed, as the premise's claims do "
            "(`approxlab.studies.perplexity.gating`); the former rule -- a two-level percentile interval, its verdict "
            "withheld where its coverage on the run's own units fell below 90% -- is kept as `former_verdict`: the "
            f"declared interval judged, withheld where the coverage of the calibration's first {FORMER_DRAWS} draws "
            "is below 90% (\"no verdict: coverage ... < 90%\").", ""]


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
                           rules="(p3) and (p4): the 90% coverage gate on the declared interval (its coverage from "
                                 f"the calibration's first {FORMER_DRAWS} draws), where the verdict is now read from "
                                 "the calibrated interval"), ""]


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
