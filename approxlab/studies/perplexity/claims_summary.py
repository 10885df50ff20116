"""The claims sections of the perplexity study's ``summary.md``: the declarations, what entered each claim, the
verdicts, the measures compared, the references, the intervals' coverage, and the methods left out of the decoder
claims."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..reporting.claims import tally
from ..reporting.markdown import format_number as fmt
from ..reporting.markdown import markdown_table
from .claims import (DECLARED, DECODER_VALID, DEGENERATE, FLOOR, MEASURE_TEXT, MIN_BUDGETS, MIN_METHODS, P1,
                     P1_BUDGET, P1_METHOD, P1_WITHIN, P2, P3, RESAMPLING)
from .grid import KV_CACHE

__all__ = ["claim_sections"]

_OUTCOMES = ("reproduced", "not reproduced", "inconclusive", "too few units")


def _interval(estimate, low, high) -> str:
    if not math.isfinite(estimate):
        return "n/a"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{fmt(estimate)} [no interval]"
    return f"{fmt(estimate)} [{fmt(low)}, {fmt(high)}]"


def _where(setting, layers) -> str:
    return f"KV cache, {layers} layers" if setting == KV_CACHE else f"{layers} replaced"


def _rows(verdicts, claim) -> pd.DataFrame:
    rows = verdicts[verdicts["claim"] == claim.id].copy()
    rows["setting "] = [_where(s, layer) for s, layer in rows[["setting", "layers"]].itertuples(index=False)]
    rows["estimate [95% CI]"] = [_interval(*v) for v in rows[["estimate", "ci_low", "ci_high"]].to_numpy(float)]
    return rows


def _declared() -> list[str]:
    return ["## Claims (declared in `approxlab.studies.perplexity.claims` before the run)", "",
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
        "setting": [_where(s, layer) for s, layer in observed[["setting", "layers"]].itertuples(index=False)],
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
    lines = [f"- **(p1) across methods**: {P1.statistic}; {tally(P1, p1['verdict'], _OUTCOMES)}.", "",
             *_table(p1, ["setting ", "estimate [95% CI]", "verdict", "methods", "windows", "points"]),
             f"- **(p1w) within a method, pooled**: {P1_WITHIN.statistic}; "
             f"{tally(P1_WITHIN, within['verdict'], _OUTCOMES)}.", "",
             *_table(within, ["setting ", "estimate [95% CI]", "verdict", "methods"])]
    if len(per):
        table = per.pivot_table(index="method", columns="setting ", values="estimate [95% CI]", aggfunc="first",
                                fill_value="").reset_index()
        lines += [f"- **(p1m) within each method** ({P1_METHOD.statistic}; interval over windows): "
                  f"{tally(P1_METHOD, per['verdict'], _OUTCOMES)}.", "", *markdown_table(table), ""]
    if len(budget):
        table = budget.pivot_table(index="setting ", columns="num_features", values="estimate [95% CI]",
                                   aggfunc="first", fill_value="").reset_index()
        table.columns = ["setting", *[f"d = {d}" for d in table.columns[1:]]]
        lines += [f"- **(p1d) at a fixed budget** ({P1_BUDGET.statistic}): "
                  f"{tally(P1_BUDGET, budget['verdict'], _OUTCOMES)}.", "", *markdown_table(table), ""]
    return lines


def _p2(verdicts, correlations, prediction) -> list[str]:
    lines = []
    if len(correlations):
        shown = correlations.assign(**{"setting ": [_where(s, layer) for s, layer in
                                                    correlations[["setting", "layers"]].itertuples(index=False)],
                                       "rho [95% CI]": [_interval(*v) for v in correlations[["rho", "ci_low",
                                                                                             "ci_high"]].to_numpy()]})
        shown["measure"] = shown["measure"].map(lambda m: MEASURE_TEXT.get(m, m))
        table = shown.pivot_table(index="measure", columns="setting ", values="rho [95% CI]", aggfunc="first",
                                  fill_value="").reset_index()
        lines += ["- **(p2) which measure ranks the losses**: each measure's rho across methods [two-level 95% CI] "
                  "(a measure a run did not record is n/a):", "", *markdown_table(table), ""]
    p2 = _rows(verdicts, P2)
    lines += [f"  Paired, {P2.statistic}: {tally(P2, p2['verdict'], _OUTCOMES)}.", "",
              *_table(p2, ["setting ", "measure", "estimate [95% CI]", "verdict", "methods"])]
    if len(prediction):
        shown = prediction.assign(**{"held-out error [95% CI]": [_interval(*v) for v in prediction[
            ["held_out_error", "ci_low", "ci_high"]].to_numpy(float)], "minus spectral's [95% CI]": [
            _interval(*v) for v in prediction[["minus_spectral", "minus_spectral_low",
                                               "minus_spectral_high"]].to_numpy(float)],
            "setting ": [_where(s, layer) for s, layer in prediction[["setting", "layers"]].itertuples(index=False)]})
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
    return [f"- **(p3)** {P3.statistic}, holds at rho >= {P3.threshold:g}: {tally(P3, p3['verdict'], _OUTCOMES)}. "
            "On method means (a per-window comparison with a per-method constant cannot reach 1); each reference's "
            "model, length and layer, and the methods it lacks or failed (left out):", "",
            *_table(labels, list(labels.columns)),
            *_table(p3, ["reference", "setting ", "num_features", "estimate [95% CI]", "verdict", "methods"])]


def _calibration(calibration) -> list[str]:
    if calibration.empty:
        return []
    shown = calibration.assign(**{"setting": [_where(s, layer) for s, layer in
                                              calibration[["setting", "layers"]].itertuples(index=False)]})
    shown = shown.drop(columns=["layers"]).map(lambda v: fmt(v) if isinstance(v, float) else v)
    return ["**Coverage and width.** Coverage of the 95% two-level interval at this run's units, measured on the "
            "run's own data (the run as the population, its estimate as the truth, 100 data sets drawn as the run "
            "was, 200 resamples each; about +-4 points), and the (p1) interval's mean width on random subsets of "
            "5, 10 and all methods (how it narrows with the number of methods):", "", *markdown_table(shown), ""]


def _excluded(saved, delta) -> list[str]:
    from .judging import causal_form

    form = causal_form(delta)
    rows = delta[(form == "mask-renormalise").to_numpy()]
    if rows.empty:
        return []
    shown = rows.assign(cell=[_interval(*v) for v in rows[["delta", "delta_low", "delta_high"]].to_numpy(float)])
    shown = shown.assign(setting=[_where(s, layer) for s, layer in
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
             *_calibration(saved.product("calibration.csv")), *_excluded(saved, saved.product("delta.csv"))]
    return [line if not isinstance(line, float) or np.isfinite(line) else "" for line in lines]
