"""The benchmark's cell: one (part, n, method), measured in this process, its rows tidy.

A cell dispatches to its part (:mod:`.spectral`, :mod:`.forward`, :mod:`.ratios`, :mod:`.training`,
:mod:`.patched` or :mod:`.causal`), which returns wide measurement rows; :func:`compute` turns them into tidy
rows ``(algorithm, compute_dtype, quantity, value)``.
"""

from __future__ import annotations

import sys

from ..engine.failures import METHOD_ERRORS, method_status
from ..engine.keys import cell_seed
from .causal import causal_rows
from .forward import forward_rows
from .grid import DTYPES
from .parts import load_head
from .patched import patch_rows
from .ratios import ratio_rows
from .spectral import spectral_rows
from .timing import collected
from .training import training_rows

__all__ = ["compute"]


def compute(cell: dict) -> list[dict]:
    """Rows of one (part, n, method) cell (see the module docstring).

    The cell's measurements run inside one :func:`~.timing.collected`: the process's heap is walked
    once per cell, not once per timed call.
    """
    with collected():
        return _compute(cell)


def _compute(cell: dict) -> list[dict]:
    config = cell["config"]
    n, method, part = cell["n"], cell["method"], cell["part"]
    if part == "training":
        return _tidy(training_rows(cell))
    if part == "patch":
        return _guarded(cell, lambda: patch_rows(cell))
    if part == "causal":
        return _tidy(causal_rows(cell))
    q, k, v = load_head(config, n, data_dir=cell["data_dir"], cache_dir=cell["cache_dir"], device=cell["device"])
    p = int(q.shape[-1])
    compute_dtype = DTYPES[config["compute_dtype"]]
    seed = cell_seed(part, n, method, base_seed=config["seed"])
    common = {"p": p, "num_features": min(config["num_features"], n), "dtype": str(q.dtype).replace("torch.", "")}
    if part == "forward":
        return _tidy(forward_rows(config, method, q, k, v, n, common, cell["device"]))
    if part == "ratios":
        return _guarded(cell, lambda: ratio_rows(cell, q, k, v, common))
    return _guarded(cell, lambda: spectral_rows(config, part, method, q, k, v, n, common, seed, compute_dtype))


def _guarded(cell: dict, rows) -> list[dict]:
    """``_tidy(rows())``; a method that raises is the cell's failure, as in the forward part: its error in one line
    on stderr and one ``<part>-failed`` row (``failed = 1``), and the run goes on to its report."""
    try:
        return _tidy(rows())
    except METHOD_ERRORS as error:
        method = cell["config"]["error_method"] if cell["part"] == "ratios" else cell["method"]
        print(f"approxlab bench: {method} failed in the {cell['part']} part at n={cell['n']}: "
              f"{method_status(method, error)}", file=sys.stderr)
        return _tidy([{"algorithm": f"{cell['part']}-failed", "compute_dtype": cell["config"]["compute_dtype"],
                       "failed": 1.0}])


def _tidy(rows: list[dict]) -> list[dict]:
    """Wide measurement dicts -> tidy rows ``(algorithm, compute_dtype, quantity, value)``.

    Every row of ``results.csv`` then holds a number, and no row carries a NaN for a quantity
    that does not apply to its algorithm.
    """
    tidy = []
    for row in rows:
        row = dict(row)
        algorithm = row.pop("algorithm")
        compute_dtype = row.pop("compute_dtype", row.get("dtype"))
        row.pop("dtype", None)
        for quantity, value in row.items():
            tidy.append({"algorithm": algorithm, "compute_dtype": compute_dtype, "quantity": quantity,
                         "value": float(value)})
    return tidy
