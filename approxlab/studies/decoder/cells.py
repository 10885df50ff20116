r"""The decoder study's cells: one Q/K/V extraction per condition x layer x window, the theorems' assumptions
per head at each n, the spectral errors of every method at each n and d.

In a causal model position :math:`i` sees tokens :math:`\le i` only, so the Q/K/V of a window's first
``n`` positions are the first ``n`` rows of the longest window's: one forward pass per condition x
layer x window serves every n (the shared, cached :func:`approxlab.studies.inputs.wikitext.reference`).
"""

from __future__ import annotations

import math
import time
import warnings

import torch

from ...assumptions import measure_assumptions
from ...attention import approximate
from ...metrics import spectral_norm
from ..engine.failures import METHOD_ERRORS, method_status
from ..engine.keys import cell_seed
from ..inputs import wikitext

__all__ = ["ASSUMPTION_KEY", "RESULT_KEY", "WINDOW_KEY", "NEAR_ZERO_ROW", "compute_window", "compute_assumptions",
           "compute_errors"]

WINDOW_KEY = ("condition", "layer", "window")
ASSUMPTION_KEY = ("condition", "n", "layer", "window")
RESULT_KEY = ("condition", "n", "layer", "window", "method")
NEAR_ZERO_ROW = 1e-3
"""A masked row sum is near zero when ``|sum| <= NEAR_ZERO_ROW * median |sums|`` of its head."""


def _source(cell) -> wikitext.Window:
    """The window of ``max(n)`` tokens a cell's prefixes come from (the hidden states entering its layer)."""
    return wikitext.Window(cell["condition"], cell["n_max"], cell["window"], mode="hidden", layer=cell["layer"],
                           model_seed=cell["model_seed"], data_dir=cell["data_dir"], cache_dir=cell["cache_dir"],
                           device=cell["device"], checkpoint=cell["checkpoint"])


def _qkv(cell):
    """Q, K, V ``(1, heads, n_max, p)`` (float32) of the cell's window and the QKV record (per-process cache)."""
    return wikitext.qkv(_source(cell))


def _reference(cell):
    """Q/K/V ``(heads, n, p)`` in float64 (the first n positions), the exact causal output and its norms."""
    return wikitext.reference(_source(cell), n=cell["n"], dtype="float64", causal=True)


def compute_window(cell: dict) -> list[dict]:
    """One row per condition x layer x window: the extraction (cached on disk for the other tables)."""
    start = time.perf_counter()
    qkv = _qkv(cell)
    return [{"n_max": cell["n_max"], "checkpoint": qkv.checkpoint, "weights": qkv.weights,
             "distinct_tokens": int(qkv.input_ids[0].unique().numel()), "heads": qkv.num_heads,
             "kv_heads": int(qkv.kv_heads or qkv.num_heads), "from_cache": bool(qkv.from_cache[0]),
             "seconds": time.perf_counter() - start}]


def compute_assumptions(cell: dict) -> list[dict]:
    """One row per head: :func:`approxlab.assumptions.measure_assumptions` of the causal matrix."""
    ref = _reference(cell)
    qkv = _qkv(cell)
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(cell_seed(*(cell[c] for c in ASSUMPTION_KEY), "golub-kahan",
                                                        base_seed=cell["base_seed"]))
    found = measure_assumptions(ref["q"], ref["k"], heavy=cell["heavy"], rank_max_n=cell["rank_max_n"],
                                generator=generator)
    seconds = (time.perf_counter() - start) / ref["q"].shape[0]
    return [{"head": h, "kv_head": qkv.kv_head(h), "checkpoint": ref["checkpoint"],
             **{name: float(values[h]) for name, values in found.items()},
             "sqrt_log_n": math.sqrt(math.log(cell["n"])), "seconds": seconds}
            for h in range(ref["q"].shape[0])]


def _row_sum_counts(approx) -> dict:
    sums = None if approx is None else approx.info.get("row_sums")
    if sums is None:
        return {"near_zero_rows": 0, "nonpositive_rows": 0}
    sums = torch.as_tensor(sums).detach().to(torch.float64).reshape(-1, torch.as_tensor(sums).shape[-1])
    floor = NEAR_ZERO_ROW * sums.abs().median(dim=-1, keepdim=True).values
    return {"near_zero_rows": int((sums.abs() <= floor).sum()), "nonpositive_rows": int((sums <= 0).sum())}


def _one(cell, ref, d, seed) -> dict:
    """The row of one approximation (d, seed) of an error cell."""
    heads = ref["q"].shape[0]
    key = tuple(cell[c] for c in RESULT_KEY)
    generator = torch.Generator().manual_seed(cell_seed(*key, d, seed, base_seed=cell["base_seed"]))
    start, approx = time.perf_counter(), None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            approx = approximate(cell["method"], ref["q"], ref["k"], ref["v"], num_features=d, generator=generator,
                                 causal=cell["causal"])
            error, status = spectral_norm((approx.output - ref["output"]).detach().cpu()), "ok"
        except METHOD_ERRORS as failure:  # the method's failure: a failed row (a bug of approxlab re-raises)
            error = torch.full((heads,), math.inf, dtype=torch.float64)
            status = method_status(cell["method"], failure)
    relative = error / ref["output_norm"]
    kinds = sorted({w.category.__name__ for w in caught})
    return {"num_features": d, "seed": seed, "checkpoint": ref["checkpoint"], "heads": heads,
            "causal_form": "mask-renormalise" if cell["causal"] == "mask-renormalise" else "causal",
            "error_heads": " ".join(repr(float(e)) for e in error),
            "relative_error_heads": " ".join(repr(float(e)) for e in relative),
            "error_mean": float(error.mean()), "error_max": float(error.max()),
            "relative_error_mean": float(relative.mean()), "relative_error_max": float(relative.max()),
            "output_norm_mean": float(ref["output_norm"].mean()), **_row_sum_counts(approx),
            "seconds": time.perf_counter() - start, "status": status,
            "num_warnings": len(caught), "warnings": ";".join(kinds) if kinds else "none"}


def compute_errors(cell: dict) -> list[dict]:
    """Rows of one condition x n x layer x window x method cell: all its d x seeds.

    A method that fails (``FloatingPointError`` for a non-finite output, ``ArithmeticError``,
    ``LinAlgError``) gives ``inf`` errors and a ``status`` naming the error; warnings are counted.
    """
    ref = _reference(cell)
    return [_one(cell, ref, d, seed) for d in cell["num_features"] for seed in cell["seeds"]]
