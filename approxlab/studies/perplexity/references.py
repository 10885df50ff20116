r"""The error rankings claim (p3) compares with: read once from saved ``figure1`` or ``decoder`` runs.

``--compare-with FOLDER`` names a result folder of ``approxlab figure1`` or ``approxlab decoder``. Its
results table (``results.csv.bz2`` for ``figure1``, ``results.csv`` for ``decoder``: the study's table named
``results``, :func:`results_table`) is read through that study's own loader
(:func:`approxlab.studies.reporting.saved.load`, the study looked up by name: a study never imports another) and
reduced to one error per method and d:
the median over windows and seeds of ``relative_error_mean`` (each window's mean over heads of the relative
spectral error) -- for ``figure1`` at its pretrained condition, float64 (when run), and its length closest to
this run's n; for ``decoder`` at its pretrained condition, each of its layers and its length closest to n.
The rows are kept in this run's ``references.csv``, so the report never reads another folder, and a copy of
the run redraws the same claim.
"""

from __future__ import annotations

import pathlib

from ...errors import UsageError

__all__ = ["COMPARABLE", "REQUIRED", "check_reference", "compute_reference", "results_table"]

COMPARABLE = ("figure1", "decoder")
"""The studies whose error rankings (p3) can be compared with: those whose results hold
``relative_error_mean`` per method, d and window."""


def _load(folder):
    from ...errors import StudyError
    from ..engine.store import read_json
    from ..registry import get
    from ..reporting.saved import load

    path = pathlib.Path(folder)
    allowed = f"result folders of {' or '.join(COMPARABLE)} runs (with config.json and their results table)"
    try:
        study = read_json(path / "config.json").get("config", {}).get("study")
    except (OSError, ValueError, AttributeError) as error:
        raise UsageError("--compare-with", allowed, f"{str(folder)!r} ({type(error).__name__})") from None
    if study not in COMPARABLE:
        raise UsageError("--compare-with", allowed, f"{str(folder)!r} (a run of {study!r})")
    try:
        return load(get(study), path)
    except (StudyError, ValueError) as error:  # no results, or a damaged table
        raise UsageError("--compare-with", allowed, f"{str(folder)!r} ({error})") from None


REQUIRED = ("method", "num_features", "n", "relative_error_mean", "checkpoint")
"""The columns a compared run's results table must hold."""


def results_table(saved):
    """The compared run's results table: the one its study names ``results`` (``results.csv``, ``results.csv.bz2``)."""
    names = [table.name for table in saved.study.tables if table.name.split(".", 1)[0] == "results"]
    if not names:
        raise ValueError(f"study {saved.study.name!r} has no results table; its tables are "
                         f"{[table.name for table in saved.study.tables]}.")
    return saved.table(names[0])


def check_reference(folder, budgets=None) -> None:
    """``folder`` holds a saved ``figure1`` or ``decoder`` run whose results give a ranking: the columns of
    :data:`REQUIRED`, at least one finite error at the condition compared and, when ``budgets`` (this run's d) are
    given, one of them (a :class:`~approxlab.errors.UsageError` if not: (p3) would compare nothing), checked when the
    run is configured, before any cell runs."""
    saved = _load(folder)
    allowed = f"result folders of {' or '.join(COMPARABLE)} runs whose results table has {', '.join(REQUIRED)}"
    results = results_table(saved)
    missing = [c for c in REQUIRED if c not in results]
    if missing:
        raise UsageError("--compare-with", allowed, f"{str(folder)!r} (no column {', '.join(missing)})")
    chosen = _chosen(results)
    if not chosen["relative_error_mean"].map(lambda v: v == v and abs(v) != float("inf")).any():
        raise UsageError("--compare-with", allowed, f"{str(folder)!r} (no finite relative_error_mean at its "
                         "pretrained condition)")
    found = sorted(set(int(d) for d in chosen["num_features"]))
    if budgets is not None and not set(int(d) for d in budgets) & set(found):
        raise UsageError("--compare-with", f"result folders with a d of this run ({', '.join(map(str, budgets))}: "
                         "claim (p3) compares at one d)", f"{str(folder)!r} (d = {', '.join(map(str, found))})")


def _chosen(results):
    """The rows compared: the pretrained condition (when run), float64 (when run)."""
    if "condition" in results and "pretrained" in set(results["condition"]):
        results = results[results["condition"] == "pretrained"]
    if "dtype" in results and "float64" in set(results["dtype"]):
        results = results[results["dtype"] == "float64"]
    return results


def _closest(values, n):
    values = sorted(set(int(v) for v in values))
    return min(values, key=lambda v: (abs(v - n), v))


def compute_reference(cell: dict) -> list[dict]:
    """One row per (layer, method, d) of the folder's ranking: its median relative spectral error."""
    saved = _load(cell["reference"])
    config, results = saved.config, results_table(saved)
    study = config["study"]
    results = _chosen(results)
    n = _closest(results["n"], cell["n"])
    results = results[results["n"] == n]
    layer_column = "layer" if "layer" in results else None
    groups = [*([layer_column] if layer_column else []), "method", "num_features"]
    medians = results.groupby(groups, sort=True)["relative_error_mean"].agg(["median", "size"]).reset_index()
    checkpoint = str(results["checkpoint"].iloc[0]) if len(results) else "n/a"
    return [{"study": study, "checkpoint": checkpoint,
             "condition": str(results["condition"].iloc[0]) if "condition" in results else "n/a",
             "reference_n": n, "layer": int(row[layer_column]) if layer_column else int(config.get("layer", 0)),
             "inputs": "the hidden states entering the layer" if study == "decoder" or config.get("layer", 0)
             else "the input embedding through layer 0's projections (BERT-family encoder)",
             "method": row["method"], "num_features": int(row["num_features"]), "error": float(row["median"]),
             "samples": int(row["size"]), "reference_hash": saved.record.get("config_hash", "n/a")}
            for _, row in medians.iterrows()]
