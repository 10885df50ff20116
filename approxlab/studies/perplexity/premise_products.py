r"""The premise's derived tables (:class:`~approxlab.studies.Product` functions), from the saved tables only.

``former_verdicts.csv`` keeps the verdicts of the run this folder held before the premise's claims were
redesigned (its ``verdicts.csv`` with the 90% coverage gate, read before the report rewrites it; kept once
written), so that every verdict of ``premise.csv`` stands beside the one it replaces (``former_verdict``) and the
summary lists the changes with what changed in the design (``deviation``). ``premise_former_rule.csv`` keeps, the
same way, the premise's verdicts as the folder held them before the degenerate rule changed (:data:`RULE`).
"""

from __future__ import annotations

import pandas as pd

from . import premise
from .cells import PATCHED
from .premise_claims import PRIMARY
from .premise_data import optional_table, setting_points
from .products import _cached
from .stats import deltas

__all__ = ["FORMER", "DEVIATIONS", "RULE", "former_verdicts", "former_rule_verdicts", "premise_verdicts", "premise_rho",
           "premise_loss", "former_of"]

FORMER = {"p1": "p1", "p1d": "p1d", "p2": "p2", "pw": "p1w", "pp": "p1w"}
"""Which committed claim each premise claim replaces (the others are new)."""

DEVIATIONS = {
    "p1": "ranks within windows (was: every cell together); crossed, calibrated interval (was: two-level "
          "percentile, gated at 90% coverage); clones merged",
    "p1d": "ranks within windows (was: window means); crossed, calibrated interval; clones merged",
    "p2": "ranks within windows (was: every cell together); crossed, calibrated interval; clones merged",
    "pw": "the error against the budget (was: the error's rho over budgets alone, which a measure tracking d "
          "passes); crossed, calibrated interval",
    "pp": "the error's partial correlation given d (was: its rho over budgets alone); crossed, calibrated interval",
}
"""What each replacement changes, beside the measure (clean where the committed run used the drifting error)."""

RULE = "largest spectral error over heads < 1e-6"
"""``premise.csv``'s ``degenerate_rule``: the rule that tells a point of exact attention (:data:`.judging.EXACT_ERROR`).
It was first declared on the median error over heads, which dropped DuoAttention (exact in its retrieval heads only)
as exact attention; it changed after the data, so the verdicts under the first rule stay beside the new ones."""


def former_rule_verdicts(saved) -> pd.DataFrame:
    """``premise_former_rule.csv``: the premise's verdicts under the degenerate rule as first declared (the median
    error over heads): the folder's own copy once written, else its ``premise.csv`` where that was judged under it (no
    ``degenerate_rule`` column), else empty."""
    kept = optional_table(saved, "premise_former_rule.csv")
    if len(kept):
        return kept
    found = optional_table(saved, "premise.csv")
    return found if len(found) and "degenerate_rule" not in found else pd.DataFrame(columns=["claim", "verdict"])


def former_verdicts(saved) -> pd.DataFrame:
    """``former_verdicts.csv``: the committed run's verdicts (the folder's own copy once written, else its
    ``verdicts.csv`` where that is still the committed design's: no row "superseded"), else empty."""
    kept = optional_table(saved, "former_verdicts.csv")
    if len(kept):
        return kept
    found = optional_table(saved, "verdicts.csv")
    committed = "verdict" in found and not found["verdict"].astype(str).str.startswith("superseded").any()
    return found if committed and len(found) else pd.DataFrame(columns=["claim", "setting", "layers", "measure",
                                                                        "num_features", "verdict"])


def _points(saved) -> dict:
    return _cached(saved, "points", lambda: setting_points(
        deltas(saved.table(PATCHED), saved.table("baseline.csv")),
        optional_table(saved, "clean_errors.csv"), saved.config))


def former_of(row, former: pd.DataFrame) -> str:
    """The committed verdict a premise row replaces ("" where none: a new claim). The committed claims ranked the
    error of the run itself: clean with one layer replaced, drifting with several; a multi-layer setting's clean row
    and its drifting row both stand beside it (the drifting one changes the unit and the interval alone)."""
    if row["claim"] not in FORMER or former.empty:
        return ""
    match = former[(former["claim"] == FORMER[row["claim"]]) & (former["setting"] == row["setting"])
                   & (former["layers"].astype(str) == str(row["layers"]))]
    if row["claim"] == "p1d":
        match = match[match["num_features"].astype(int) == int(row["num_features"])]
    if row["claim"] == "p2":
        match = match[match["measure"] == row["measure"]]
    return str(match["verdict"].iloc[0]) if len(match) else ""


def _verdicts(saved) -> pd.DataFrame:
    rows = []
    for (setting, layers), points in _points(saved).items():
        rows += premise.setting_rows(setting, layers, points)
    rows += premise.depth_rows(_points(saved))
    rows += premise.output_aware_rows(deltas(saved.table(PATCHED), saved.table("baseline.csv")))
    found, per_method = premise.config_rows(optional_table(saved, "configs.csv"), saved.table("baseline.csv"))
    table = premise.with_holm(pd.DataFrame(rows + found, columns=premise.PREMISE_COLUMNS[:-2]))
    former = saved.product("former_verdicts.csv")
    table["former_verdict"] = [former_of(row, former) for _, row in table.iterrows()]
    table["deviation"] = [DEVIATIONS.get(c, "new claim") + ("; clean error (was: drifting)" if k == PRIMARY and
                                                            not str(layers).startswith("layer") else "")
                          for c, k, layers in table[["claim", "kind", "layers"]].itertuples(index=False)]
    table["degenerate_rule"] = RULE
    return table, per_method


def premise_verdicts(saved) -> pd.DataFrame:
    """``premise.csv``: every premise claim instance, calibrated, with Holm and the committed verdict beside."""
    return _cached(saved, "premise", lambda: _verdicts(saved))[0]


def premise_rho(saved) -> pd.DataFrame:
    """``premise_rho.csv``: the spectral error's rho per setting and kind at each unit (cells, window means,
    within windows), and per method over its configurations (``configs.csv``)."""
    per_method = _cached(saved, "premise", lambda: _verdicts(saved))[1]
    rows = [row for (setting, layers), points in _points(saved).items()
            for row in premise.unit_rows(setting, layers, points)]
    return pd.DataFrame(rows + per_method,
                        columns=["setting", "layers", "kind", "measure", "unit", "rho", "methods", "windows",
                                 "points"])


def premise_loss(saved) -> pd.DataFrame:
    """``premise_loss.csv``: per setting, the points with no measurable loss and with no loss that matters."""
    frame = deltas(saved.table(PATCHED), saved.table("baseline.csv"))
    delta = saved.product("delta.csv")
    return pd.DataFrame([premise.loss_rows(setting, layers, points, delta, premise.noise_floor_of(
        frame, setting, layers, saved.config["control"])) for (setting, layers), points in _points(saved).items()])
