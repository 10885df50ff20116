r"""The decoder study's cells: one Q/K/V extraction per condition x layer x window; per condition x n x layer x
window the theorems' assumptions (every level of HyperAttention's causal recursion included), every method's
spectral error at each d, and Performer's logit-scale control; per condition x layer x window the KV-cache
setting.

In a causal model position :math:`i` sees tokens :math:`\le i` only, so the Q/K/V of a window's first
``n`` positions are the first ``n`` rows of the longest window's: one forward pass per condition x
layer x window serves every n (the shared, cached :func:`approxlab.studies.inputs.wikitext.reference`).
"""

from __future__ import annotations

import math
import warnings

import torch

from ...assumptions import block_levels, measure_assumptions, relative_error_at_scale
from ...attention import approximate
from ...cache import kv_cache_attention
from ...methods import get
from ...cache._scores import model_inputs
from ...metrics import spectral_norm
from ..engine.clock import Stopwatch
from ..engine.failures import METHOD_ERRORS, method_status
from ..engine.keys import cell_seed
from ..inputs import wikitext
from .grid import ASSUMPTION_KEY, KV_KEY, RESULT_KEY

__all__ = ["NEAR_ZERO_ROW", "METHOD_OPTIONS", "ASSUMPTIONS", "LEVELS", "RESULTS", "KV_CACHE", "PERFORMER",
           "compute_window", "compute_assumptions", "compute_errors", "compute_kv_cache", "compute_performer",
           "level_rows"]

ASSUMPTIONS, LEVELS, RESULTS, KV_CACHE, PERFORMER = ("assumptions.csv", "levels.csv", "results.csv", "kv_cache.csv",
                                                     "performer.csv")
NEAR_ZERO_ROW = 1e-3
"""A masked row sum is near zero when ``|sum| <= NEAR_ZERO_ROW * median |sums|`` of its head."""

METHOD_OPTIONS = {"vattention": {"max_samples": None}}
"""Options beside a method's library defaults that every error cell of the method passes, so that the committed
results re-derive (not in the config: its hash is unchanged): vAttention's uncapped draw, ``(heads, n, n)``
variates, its default before :data:`approxlab.methods.vattention.MAX_SAMPLES` capped it at 512 (the committed
cells at n = 768 to 4,096 were computed with it)."""


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


def _generator(*values, base_seed) -> torch.Generator:
    return torch.Generator().manual_seed(cell_seed(*values, base_seed=base_seed))


def compute_window(cell: dict) -> list[dict]:
    """One row per condition x layer x window: the extraction (cached on disk for the other tables)."""
    watch = Stopwatch()
    qkv = _qkv(cell)
    return [{"n_max": cell["n_max"], "checkpoint": qkv.checkpoint, "weights": qkv.weights,
             "distinct_tokens": int(qkv.input_ids[0].unique().numel()), "heads": qkv.num_heads,
             "kv_heads": int(qkv.kv_heads or qkv.num_heads), "sliding_window": qkv.sliding_window,
             "from_cache": bool(qkv.from_cache[0]), "seconds": watch.seconds()}]


def level_rows(levels, heads: int, epsilon: float) -> list[dict]:
    r"""One row per head x depth of :func:`approxlab.assumptions.block_levels` (its worst block at that depth):
    ``alpha``, the three ``kappa`` (the largest over the depth's blocks; sortLSH's over the blocks it samples),
    ``sampling_ratio`` :math:`\max_B m_B/c_B` (uniform samples needed at ``epsilon`` over the block's columns),
    ``saves_nothing`` (blocks where :math:`m_B \ge c_B`) and ``break_even_epsilon``
    :math:`\max_B\sqrt{\alpha_B/r_B}` (the smallest :math:`\varepsilon` with :math:`m_B \le c_B` in every block).

    No level (``n`` at most the block size: the recursion computes the matrix exactly): one row per head with
    ``depth = -1``, ``blocks = 0`` and NaN values.
    """
    if not levels:
        return [{"head": h, "depth": -1, "blocks": 0, "rows": 0, "columns": 0, **dict.fromkeys(
            ("alpha", "kappa_oracle", "kappa_sortlsh", "kappa_all_entries", "sampling_ratio", "break_even_epsilon"),
            math.nan), "saves_nothing": 0} for h in range(heads)]
    rows = []
    for level in levels:
        needed = level.samples_needed(epsilon=epsilon)
        columns = torch.tensor(level.columns, dtype=torch.float64)
        per_row = level.alpha / torch.tensor(level.rows, dtype=torch.float64)
        saves_nothing = level.sampling_saves_nothing(epsilon=epsilon)
        for h in range(heads):
            sortlsh = level.kappa_sortlsh[h]
            rows.append({"head": h, "depth": level.depth, "blocks": len(level.rows), "rows": min(level.rows),
                         "columns": min(level.columns), "alpha": float(level.alpha[h].max()),
                         "kappa_oracle": float(level.kappa_oracle[h].max()),
                         "kappa_sortlsh": float(sortlsh[~sortlsh.isnan()].max()) if bool((~sortlsh.isnan()).any())
                         else math.nan,
                         "kappa_all_entries": float(level.kappa_all_entries[h].max()),
                         "sampling_ratio": float((needed[h] / columns).max()),
                         "break_even_epsilon": math.sqrt(float(per_row[h].max())),
                         "saves_nothing": int(saves_nothing[h].sum())})
    return rows


def compute_assumptions(cell: dict) -> dict:
    """Per head, :func:`approxlab.assumptions.measure_assumptions` of the causal matrix (``assumptions.csv``), and
    per head x depth of HyperAttention's causal recursion its blocks' alpha and kappa (``levels.csv``)."""
    ref = _reference(cell)
    qkv = _qkv(cell)
    key = tuple(cell[c] for c in ASSUMPTION_KEY)
    watch = Stopwatch()
    found = measure_assumptions(ref["q"], ref["k"], heavy=cell["heavy"], rank_max_n=cell["rank_max_n"],
                                block_size=cell["block_size"], hashes=cell["hashes"],
                                generator=_generator(*key, "golub-kahan", base_seed=cell["base_seed"]))
    heads = ref["q"].shape[0]
    seconds = watch.seconds() / heads
    assumptions = [{"head": h, "kv_head": qkv.kv_head(h), "checkpoint": ref["checkpoint"],
                    **{name: float(values[h]) for name, values in found.items()},
                    "sqrt_log_n": math.sqrt(math.log(cell["n"])), "seconds": seconds} for h in range(heads)]
    watch = Stopwatch()
    levels = block_levels(ref["q"], ref["k"], block_size=cell["block_size"], heavy=cell["heavy"],
                          hashes=cell["hashes"], generator=_generator(*key, "sortlsh", base_seed=cell["base_seed"]))
    seconds = watch.seconds() / heads
    rows = [{**row, "seconds": seconds} for row in level_rows(levels, heads, cell["epsilon"])]
    return {ASSUMPTIONS: assumptions, LEVELS: rows}


def _row_sum_counts(approx) -> dict:
    sums = None if approx is None else approx.info.get("row_sums")
    if sums is None:
        return {"near_zero_rows": 0, "nonpositive_rows": 0}
    sums = torch.as_tensor(sums).detach().to(torch.float64).reshape(-1, torch.as_tensor(sums).shape[-1])
    floor = NEAR_ZERO_ROW * sums.abs().median(dim=-1, keepdim=True).values
    return {"near_zero_rows": int((sums.abs() <= floor).sum()), "nonpositive_rows": int((sums <= 0).sum())}


def _measured(method: str, run, output, output_norm) -> tuple[dict, object]:
    """Run ``run() -> Approximation`` of ``method`` against the exact ``output`` ``(heads, rows, p_v)``: the per-head
    errors, the seconds, the warnings and a ``status`` ("ok", or the method's error: a failed method has ``inf``
    errors: any exception it raises, :func:`~..engine.failures.method_status`)."""
    heads = output.shape[0]
    watch, approx = Stopwatch(), None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            approx = run()
            error, status = spectral_norm((approx.output - output).detach().cpu()), "ok"
        except METHOD_ERRORS as failure:  # the method's failure: a failed row
            error = torch.full((heads,), math.inf, dtype=torch.float64)
            status = method_status(method, failure)
    relative = error / output_norm
    kinds = sorted({w.category.__name__ for w in caught})
    return {"heads": heads, "error_heads": " ".join(repr(float(e)) for e in error),
            "relative_error_heads": " ".join(repr(float(e)) for e in relative),
            "error_mean": float(error.mean()), "error_max": float(error.max()),
            "relative_error_mean": float(relative.mean()), "relative_error_max": float(relative.max()),
            "output_norm_mean": float(output_norm.mean()), "seconds": watch.seconds(), "status": status,
            "num_warnings": len(caught), "warnings": ";".join(kinds) if kinds else "none"}, approx


def _one(cell, ref, d, seed) -> dict:
    """The row of one approximation (d, seed) of an error cell."""
    generator = _generator(*(cell[c] for c in RESULT_KEY), d, seed, base_seed=cell["base_seed"])
    options = METHOD_OPTIONS.get(cell["method"], {})
    row, approx = _measured(cell["method"], lambda: approximate(cell["method"], ref["q"], ref["k"], ref["v"], num_features=d,
                                                generator=generator, causal=cell["causal"], **options),
                            ref["output"], ref["output_norm"])
    return {"num_features": d, "seed": seed, "checkpoint": ref["checkpoint"],
            "causal_form": "mask-renormalise" if cell["causal"] == "mask-renormalise" else "causal", **row,
            **_row_sum_counts(approx)}


def compute_errors(cell: dict) -> list[dict]:
    """Rows of one condition x n x layer x window x method cell: all its d x seeds.

    A method that fails (any exception it raises, e.g. ``FloatingPointError`` for a non-finite output:
    :mod:`approxlab.studies.engine.failures`) gives ``inf`` errors and a ``status`` naming the error; warnings
    are counted.
    """
    ref = _reference(cell)
    return [_one(cell, ref, d, seed) for d in cell["num_features"] for seed in cell["seeds"]]


def compute_kv_cache(cell: dict) -> list[dict]:
    r"""Rows of one condition x layer x window x method cell of the KV-cache setting: every budget x seed.

    The window's first ``n`` tokens (``n`` = context + continuation) split into the context ``cell["context"]``
    and the continuation; :func:`approxlab.kv_cache_attention` gives the continuation's rows, compared with exact
    causal attention's rows :math:`n_c, \dots, n-1` (relative to their own spectral norm, per head). The captured
    ``q``, ``k`` are after RoPE: a policy that takes ``rope_base``/``rope_frequencies`` gets the model's rotary
    ``inv_freq`` (:func:`approxlab.cache._scores.model_inputs`). The captured K/V are repeated to the query
    heads, and each query head keeps its own ``b`` tokens (``grouping="query-head"``, stated so that no
    :class:`~approxlab.errors.RepeatedKVWarning` is raised: the kept sets are the ones a per-KV-head default would
    give on these repeated heads). With budgets given as compression ratios
    (``cell["ratios"]``, ``--kv-ratios``) each row carries its ``compression_ratio`` beside its ``budget``.
    """
    ref = _reference(cell)
    context = cell["context"]
    options = model_inputs(get(cell["method"]), {}, rope_frequencies=wikitext.rotary_frequencies(_source(cell)))
    exact = ref["output"][..., context:, :]
    norm = spectral_norm(exact.detach().cpu())
    rows = []
    ratios = dict(zip(cell["budgets"], cell["ratios"])) if "ratios" in cell else {}  # budgets given as ratios
    for budget in cell["budgets"]:
        for seed in cell["seeds"]:
            generator = _generator(*(cell[c] for c in KV_KEY), budget, seed, base_seed=cell["base_seed"])
            row, approx = _measured(cell["method"], lambda: kv_cache_attention(cell["method"], ref["q"], ref["k"], ref["v"],
                                                               context_length=context, num_features=budget,
                                                               generator=generator, grouping="query-head",
                                                               **options), exact, norm)
            rows.append({"n": cell["n"], "context": context, "continuation": cell["n"] - context, "budget": budget,
                         **({"compression_ratio": ratios[budget]} if ratios else {}), "seed": seed,
                         "checkpoint": ref["checkpoint"],
                         "setting": "failed" if approx is None else str(approx.info.get("setting")), **row})
    return rows


def compute_performer(cell: dict) -> list[dict]:
    """Per head x seed: causal Performer's relative error at the model's logit scale and with Q and K multiplied by
    ``cell["scale"]`` (:func:`approxlab.assumptions.relative_error_at_scale`), on the same projection (the seed of
    the error cell at that d, so the first equals ``results.csv``)."""
    ref = _reference(cell)
    d = cell["num_features"]
    rows = []
    for seed in cell["seeds"]:
        key = (cell["condition"], cell["n"], cell["layer"], cell["window"], "performer", d, seed)
        errors = {scale: relative_error_at_scale("performer", ref["q"], ref["k"], ref["v"], num_features=d,
                                                 scale=scale, causal=True,
                                                 generator=_generator(*key, base_seed=cell["base_seed"]))
                  for scale in (1.0, cell["scale"])}
        rows += [{"head": h, "num_features": d, "seed": seed, "scale": cell["scale"],
                  "relative_error": float(errors[1.0][h]), "relative_error_scaled": float(errors[cell["scale"]][h])}
                 for h in range(ref["q"].shape[0])]
    return rows
