"""The perplexity study's derived tables (its :class:`~approxlab.studies.Product` functions), from the saved tables:
the settings' observations are gathered once per loaded run and shared by every product."""

from __future__ import annotations

import sys

import pandas as pd

from . import agreement, judging, prediction as predict
from .cells import PATCHED
from .stats import claim_inputs, claim_tables, counts_table, delta_statistics, deltas, encoder_statistics

__all__ = ["inputs", "delta_table", "observed", "correlations", "claim_verdicts", "agreement_labels",
           "prediction_table",
           "calibration", "long_stats", "encoder"]

_CACHE = "_perplexity_claims"


def _cached(saved, name, make):
    store = saved.__dict__.setdefault(_CACHE, {})
    if name not in store:
        store[name] = make()
    return store[name]


def inputs(saved) -> dict:
    """Every decoder setting's observations (:func:`.stats.claim_inputs`), computed once per loaded run."""
    return _cached(saved, "inputs", lambda: claim_inputs(deltas(saved.table(PATCHED),
                                                                saved.table("baseline.csv")), saved.config))


def delta_table(saved) -> pd.DataFrame:
    """``delta.csv``."""
    return delta_statistics(deltas(saved.table(PATCHED), saved.table("baseline.csv")))


def observed(saved) -> pd.DataFrame:
    """``observations.csv``: what entered the claims per setting, and what was dropped."""
    return counts_table(inputs(saved))


def _claims(saved):
    return _cached(saved, "claims", lambda: claim_tables(inputs(saved)))


def _agreement(saved):
    return _cached(saved, "agreement", lambda: _warn_not_compared(agreement.agreement(
        inputs(saved), saved.table("references.csv"), saved.config, saved.run)))


def _warn_not_compared(found):
    """``found`` (:func:`.agreement.agreement`'s), with one line on stderr per comparison (p3) left out."""
    for _, row in agreement.not_compared(found[1]).iterrows():
        where = "" if row["num_features"] != row["num_features"] else f" at d = {int(row['num_features'])}"
        print(f"perplexity: warning: claim (p3) did not compare {row['reference']}{where}: "
              f"{row['compared'][len('no: '):]}", file=sys.stderr)
    return found


def correlations(saved) -> pd.DataFrame:
    """``correlations.csv``: each measure's rho per setting [two-level interval]."""
    return _claims(saved)[1]


def claim_verdicts(saved) -> pd.DataFrame:
    """``verdicts.csv``: every claim's estimate, interval and verdict."""
    from .long_report import long_verdicts

    rows = pd.DataFrame(_agreement(saved)[0] + long_verdicts(_long(saved), saved.config),
                        columns=judging.VERDICT_COLUMNS)
    return pd.concat([_claims(saved)[0], rows], ignore_index=True) if len(rows) else _claims(saved)[0]


def _long(saved):
    from .long_report import saved_long

    return saved_long(saved)


def long_stats(saved) -> pd.DataFrame:
    """``long_stats.csv``: retrieval and loss per long setting, method and d."""
    from .long import long_statistics

    return long_statistics(_long(saved))


def agreement_labels(saved) -> pd.DataFrame:
    """``references_used.csv``: what each compared ranking measured, the methods used, missing and failed."""
    return _agreement(saved)[1]


def prediction_table(saved) -> pd.DataFrame:
    """``prediction.csv``: leave-one-method-out held-out error per measure and setting."""
    rows = []
    for (setting, layers), (cells, counts) in inputs(saved).items():
        if cells["method"].nunique() >= 3:
            rows += predict.leave_one_method_out(cells, counts["floor"], setting, layers)
    return pd.DataFrame(rows, columns=["setting", "layers", "measure", "methods", "held_out_error", "ci_low",
                                       "ci_high", "minus_spectral", "minus_spectral_low", "minus_spectral_high"])


def calibration(saved) -> pd.DataFrame:
    """``calibration.csv``: per setting, the measured coverage of the (p1) and (p1w) intervals at the run's units
    (:mod:`.gating`, as their verdicts use it), and the (p1) interval's width on 5, 10 and all methods."""
    verdicts = _claims(saved)[0]
    rows = []
    for (setting, layers), (cells, _) in inputs(saved).items():
        if cells.empty:
            continue
        mine = verdicts[(verdicts["setting"] == setting) & (verdicts["layers"] == layers)].set_index("claim")
        widths = {f"width_{row['label']}": row["mean_width"]
                  for row in predict.narrowing(cells)} if cells["method"].nunique() >= 3 else {}
        rows.append({"setting": setting, "layers": layers, "methods": int(cells["method"].nunique()),
                     "windows": int(cells["window"].nunique()),
                     **{f"coverage_{c}": float(mine.loc[c, "coverage"]) if c in mine.index else float("nan")
                        for c in ("p1", "p1w")}, **widths})
    return pd.DataFrame(rows)


def encoder(saved) -> pd.DataFrame:
    """``encoder_stats.csv``."""
    return encoder_statistics(saved.table("encoder.csv"))
