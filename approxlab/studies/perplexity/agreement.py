r"""Claim (p3): does a compared run's error ranking of the methods give their places in the loss ranking?

The reference (``references.csv``, :mod:`.references`) holds one error per method, layer and d; the losses
vary over windows. A per-window rank correlation with a per-method constant cannot reach 1 when windows
disagree, so (p3) compares the reference's error with each method's **mean** :math:`\Delta` over windows, at
one d, across the methods both runs measured: methods and windows drawn crossed, the reference's error travelling
with its method (:func:`.gating.rho_of_means`), the interval calibrated on the run's own methods and windows
(:func:`.gating.calibrated_row`; the former 90% coverage gate's verdict kept beside).

Each comparison is labelled with what the reference measured: its study and model (``same model`` when its
checkpoint is this run's decoder, else ``another model``), its length and its layer (``same layer`` when it
is the replaced layer, else ``other layers``). Methods this run measured that the reference lacks, and those
it ran but failed (a non-finite error), are listed and left out (the study's rule: a failed run enters no
rank statistic). Every reference layer and d is a row of the labels, its ``compared`` column saying whether (p3)
compared it and, where not or not at the same layer, why: a reference without this run's d, fewer than 3 methods
both measured, a run with no single-layer setting, a reference layer this run does not replace (compared at the
run's single-layer settings, as other layers); :func:`not_compared` lists the rows (p3) left out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import gating
from .claims import P3
from .grid import WHOLE
from .judging import verdict_row

__all__ = ["COLUMNS", "label", "agreement", "not_compared"]

COLUMNS = ["reference", "model", "reference_n", "reference_layer", "compared_with", "num_features", "methods_used",
           "missing", "failed_in_reference", "compared"]


def label(ranking: pd.DataFrame, config: dict, layers: str, run: dict | None = None) -> dict:
    """What a reference measured beside this run: ``model``, ``reference_n``, ``reference_layer``, ``compared_with``
    (the same model: the reference's checkpoint is this run's, as named or as resolved in ``run``)."""
    first = ranking.iloc[0]
    names = {str(config["checkpoint"]), str((run or {}).get("checkpoints", {}).get("decoder"))}
    same_model = str(first["checkpoint"]) in names
    layer = int(first["layer"])
    same_layer = layers == f"layer {layer}"
    return {"model": f"{first['checkpoint']} ({'same model' if same_model else 'another model'})",
            "reference_n": int(first["reference_n"]), "reference_layer": layer,
            "compared_with": f"{layers} ({'same layer' if same_layer and same_model else 'other layers'})"}


def _pairs(references: pd.DataFrame, settings: list[str]):
    """(reference key, ranking, layers compared): a decoder layer with the same replaced layer, else (no such
    layer in this run, or a figure1 run) every single-layer setting, labelled as other layers."""
    for (reference, study, layer), ranking in references.groupby(["reference", "study", "layer"], sort=False):
        same = [s for s in settings if s == f"layer {int(layer)}"]
        for layers in (same if study == "decoder" and same else [s for s in settings if s != "all"]) or [None]:
            yield (reference, study, int(layer)), ranking, layers


def not_compared(labels: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``labels`` (:func:`agreement`'s) that (p3) did not compare."""
    if "compared" not in labels:
        return labels.iloc[:0]
    return labels[~labels["compared"].astype(str).str.startswith("yes")]


def agreement(inputs: dict, references: pd.DataFrame, config: dict, run: dict | None = None) -> tuple:
    """``(verdict rows of p3, labels)`` per reference x whole-window setting x d both ran (``inputs``: the
    settings' observations, :func:`.stats.claim_inputs`)."""
    rows, labels = [], []
    if references is None or references.empty:
        return rows, pd.DataFrame(columns=COLUMNS)
    settings = [layers for setting, layers in inputs if setting == WHOLE]
    for (reference, study, layer), ranking, layers in _pairs(references, settings):
        name = f"{study} ({reference}, layer {layer})"
        if layers is None:
            labels.append({"reference": name, "reference_layer": layer, "methods_used": 0,
                           "compared": "no: this run replaces no single layer (p3 compares a run that replaces one "
                                       "layer at a time; 'all' is not compared)"})
            continue
        cells = inputs[(WHOLE, layers)][0]
        compared = ("yes" if study != "decoder" or layers == f"layer {layer}" else
                    f"yes, at another layer: the reference has no {layers}")
        for d, at in cells.groupby("budget", sort=True):
            errors = ranking[ranking["num_features"] == int(d)].set_index("method")["error"]
            if errors.empty:
                labels.append({"reference": name, **label(ranking, config, layers, run), "num_features": int(d),
                               "methods_used": 0, "compared": f"no: the reference has no d = {int(d)}"})
                continue
            failed = sorted(m for m in errors.index if not np.isfinite(errors[m]))
            missing = sorted(set(at["method"]) - set(errors.index))
            used = at[at["method"].isin([m for m in errors.index if np.isfinite(errors[m])])].copy()
            used["reference"] = errors.reindex(used["method"]).to_numpy(float)
            methods = int(used["method"].nunique())
            labels.append({"reference": name, **label(ranking, config, layers, run), "num_features": int(d),
                           "methods_used": methods, "missing": ", ".join(missing) or "none",
                           "failed_in_reference": ", ".join(failed) or "none",
                           "compared": compared if methods >= 3 else f"no: {methods} methods both measured (3 needed)"})
            if methods < 3:
                continue
            statistic = gating.rho_of_means(used, errors)
            windows = int(used["window"].nunique())
            estimate = float(statistic(np.ones((1, methods)), np.ones((1, windows)))[0])
            row = verdict_row(P3, WHOLE, layers, estimate, np.nan, np.nan, reference=name, num_features=int(d),
                              methods=methods, windows=windows, points=len(used), units=methods)
            rows.append(gating.calibrated_row(P3, row, statistic, methods, windows))
    return rows, pd.DataFrame(labels, columns=COLUMNS)
