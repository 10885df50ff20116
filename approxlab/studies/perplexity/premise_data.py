r"""What the premise's claims are over, from the saved tables: each setting's points on clean and drifting inputs,
near-clones merged, as window x point arrays for :mod:`.strata`.

A **setting** is a (setting, layers) pair of ``perplexity.csv.gz``. Its points (method x d) are the decoder-valid,
non-degenerate, non-control ones that ran (:func:`.judging.observations`' rules, without its tie at 0). Its
**clean** measures are the errors on the unpatched model's inputs: a single-layer setting's own errors, or for a
setting that replaces several layers the rows of ``clean_errors.csv`` (joined on setting, layers, method, d and
window; absent rows: NaN, and a setting without any: "not run"). Its **drifting** measures are those a multi-layer
run recorded on its own inputs. Points that are near-clones (:data:`.premise_claims.CLONES`) are merged.

Public API::

    optional_table(saved, name) -> DataFrame        # a table the study may not declare yet: empty when absent
    setting_points(frame, clean, config) -> dict     # {(setting, layers): Points}
    Points.arrays(kind, measure) -> (x (windows, points), y (windows, points)); .point_method; .budgets
    clones(frame) -> list[(method, d, same as)]
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from . import judging
from .premise_claims import CLONE_TOLERANCE, PRIMARY, SECONDARY

__all__ = ["optional_table", "single_layer", "clones", "Points", "setting_points", "KEY"]

KEY = ["setting", "layers", "method", "num_features", "window"]


def optional_table(saved, name: str) -> pd.DataFrame:
    """A saved table by name: the study's declared table, else the file in the output folder, else empty (the run
    made none)."""
    from ..engine.store import has_results, read_results

    if name in {table.name for table in saved.study.tables}:
        return saved.table(name)
    path = saved.out / name
    return read_results(path) if has_results(path) else pd.DataFrame()


def single_layer(layers) -> bool:
    """Whether a setting replaces one layer (``"layer 8"``): its errors are clean by construction."""
    return str(layers).startswith("layer ")


def clones(frame: pd.DataFrame) -> list[tuple]:
    """``[(method, d, same as)]``: the points of one setting whose ``nll`` and ``spectral_median`` equal an earlier
    method's (name order) on every window, to :data:`.premise_claims.CLONE_TOLERANCE`.

    Examples
    --------
    >>> import pandas as pd
    >>> frame = pd.DataFrame({"method": ["b", "a", "b", "a"], "num_features": [16] * 4, "window": [0, 0, 1, 1],
    ...                       "nll": [1.0, 1.0, 2.0, 2.0], "spectral_median": [0.5, 0.5, 0.4, 0.4]})
    >>> clones(frame)
    [('b', 16, 'a')]
    """
    found = []
    for d, group in frame.groupby("num_features", sort=True):
        table = group.pivot_table(index="method", columns="window", values=["nll", "spectral_median"])
        kept = []
        for method in sorted(table.index):
            same = next((k for k in kept if _same(table.loc[method], table.loc[k])), None)
            if same is None:
                kept.append(method)
            else:
                found.append((method, int(d), same))
    return found


def _same(a: pd.Series, b: pd.Series) -> bool:
    """Whether two points' values agree everywhere to :data:`.premise_claims.CLONE_TOLERANCE` (relative), missing in the
    same places."""
    x, y = a.to_numpy(float), b.to_numpy(float)
    return bool(np.array_equal(np.isnan(x), np.isnan(y))
                and np.allclose(x, y, rtol=CLONE_TOLERANCE, atol=0.0, equal_nan=True))


@dataclasses.dataclass
class Points:
    """One setting's points: ``cells`` (one row per method x d x window with ``delta`` and the measures of each
    kind, columns ``clean spectral``, ``drifting frobenius``, ...), the methods and windows in order, the merged
    clones and whether clean and drifting errors exist."""

    cells: pd.DataFrame
    methods: list
    windows: list
    merged: list
    kinds: tuple

    @property
    def table(self) -> pd.DataFrame:
        """One row per point (method, d) with its method index."""
        points = self.cells[["method", "budget"]].drop_duplicates().sort_values(["method", "budget"])
        return points.assign(index=points["method"].map({m: i for i, m in enumerate(self.methods)})).reset_index(
            drop=True)

    def arrays(self, kind: str, measure: str, budget=None):
        """``(x, y, point_method)``: the ``kind`` ``measure`` and Delta as ``(windows, points)`` arrays (NaN where a
        point did not run in a window), optionally at one ``budget``."""
        points = self.table if budget is None else self.table[self.table["budget"] == budget]
        pivot = {c: self.cells.pivot_table(index="window", columns=["method", "budget"], values=c, aggfunc="mean",
                                           dropna=False) for c in (f"{kind} {measure}", "delta")}
        columns = pd.MultiIndex.from_arrays([points["method"], points["budget"]])
        x, y = (pivot[c].reindex(index=self.windows, columns=columns).to_numpy(float) for c in pivot)
        return x, y, points["index"].to_numpy(int)

    def strata(self, kind: str, measure: str):
        """Per (method, window): the budgets, the measure and Delta of that method in that window, as a dict."""
        column = f"{kind} {measure}"
        out = {}
        for (method, window), rows in self.cells.groupby(["method", "window"], sort=True):
            rows = rows.sort_values("budget")
            out[(self.methods.index(method), self.windows.index(window))] = (
                rows["budget"].to_numpy(float), rows[column].to_numpy(float), rows["delta"].to_numpy(float))
        return out


def _clean_measures(rows: pd.DataFrame, clean: pd.DataFrame, setting, layers) -> pd.DataFrame | None:
    """The clean measures of a multi-layer setting's rows (None when ``clean_errors.csv`` has none for it)."""
    if clean.empty:
        return None
    mine = clean[(clean["setting"] == setting) & (clean["layers"].astype(str) == str(layers))]
    if "status" in mine:
        mine = mine[mine["status"] == "ok"]
    if mine.empty:
        return None
    columns = [c for c in mine.columns if c.endswith("_median")]
    joined = rows[KEY].merge(mine[[*KEY, *columns]], on=KEY, how="left", validate="one_to_one")
    joined.index = rows.index
    return judging.measures_of(joined.assign(num_features=rows["num_features"]))


def setting_points(frame: pd.DataFrame, clean: pd.DataFrame, config: dict) -> dict:
    """``{(setting, layers): Points}`` for every decoder setting of ``frame`` (:func:`.stats.deltas`' table)."""
    from .stats import settings_of

    out = {}
    for setting, layers in settings_of(frame):
        rows = frame[(frame["setting"] == setting) & (frame["layers"] == layers)]
        rows = rows[(rows["method"] != config["control"]) & rows["ok"]]
        rows = rows[(judging.causal_form(rows) != "mask-renormalise").to_numpy()]
        rows = rows[~judging.degenerate(rows, config).to_numpy()]
        merged = clones(rows)
        for method, d, _ in merged:
            rows = rows[~((rows["method"] == method) & (rows["num_features"] == d))]
        drifting = judging.measures_of(rows)
        clean_found = drifting if single_layer(layers) else _clean_measures(rows, clean, setting, layers)
        kinds = (PRIMARY,) if single_layer(layers) else ((PRIMARY,) if clean_found is not None else ()) + (SECONDARY,)
        cells = rows[["method", "window"]].assign(budget=rows["num_features"].astype(float),
                                                  delta=rows["delta"].astype(float))
        for name in drifting.columns:
            if clean_found is not None:
                cells[f"{PRIMARY} {name}"] = clean_found[name].to_numpy(float)
            if not single_layer(layers):
                cells[f"{SECONDARY} {name}"] = drifting[name].to_numpy(float)
        out[(setting, layers)] = Points(cells.reset_index(drop=True), sorted(set(cells["method"])),
                                        sorted(set(cells["window"])), merged, kinds)
    return out

