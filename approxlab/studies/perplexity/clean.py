r"""The perplexity study's clean-input errors: each replaced layer's error on the unpatched model's inputs.

With every layer replaced (the whole window, the KV cache) a patched run's layer :math:`\ell` receives the q, k, v
that the approximations of layers :math:`< \ell` produced, so the error recorded in ``perplexity.csv`` mixes the
layer's own error with the drift of its inputs -- and a method that breaks early layers shows both more error and
more loss downstream. ``clean_errors.csv`` records, for the same setting, method, budget and window, each layer's
error with the approximation applied to the **unpatched** model's q, k, v at that layer (a teacher-forced pass):

.. math::

    e^{\mathrm{clean}}_\ell = \frac{\| \mathcal A_\ell(Q_\ell, K_\ell, V_\ell) - \operatorname{softmax}(Q_\ell
    K_\ell^\top/\sqrt p)\,V_\ell \|_2}{\| \operatorname{softmax}(Q_\ell K_\ell^\top/\sqrt p)\,V_\ell \|_2},

with :math:`Q_\ell, K_\ell, V_\ell` the unpatched model's at layer :math:`\ell`, pooled over layers and heads as
``perplexity.csv`` pools (median and max; the Frobenius and worst-query errors and the attention measures alike).
In the KV-cache setting :math:`\mathcal A_\ell` is the compressed cache, as a patched run computes it
(:func:`approxlab.kv_cache_attention` on the layer's window, the continuation's rows).

**Cost.** The unpatched q, k, v of a window are captured once (:func:`approxlab.patching.exact_prefill`, one
forward pass, kept for the window's cells) and every method and budget replays its layers on them
(:func:`approxlab.patching.replay`): a cell costs the method and the error measures at every layer, no model run.
A cell's random streams come from the key of the ``perplexity.csv`` cell it accompanies (common random numbers).
"""

from __future__ import annotations

import functools

from ...patching import exact_prefill, replay
from ..engine.clock import Stopwatch
from .cells import (DECODER_KEY, decoder_model, measured, patch_options, ratio_column, run_patch, warning_columns,
                    window_inputs)
from .config_grid import ratio_of
from .grid import ALL_LAYERS, KV_CACHE, WHOLE, decoder_common, method_features, window_ids

__all__ = ["CLEAN_KEY", "CLEAN_INPUTS", "clean_inputs", "clean_run", "compute_clean", "clean_cells"]

CLEAN_KEY = DECODER_KEY
CLEAN_INPUTS = "the unpatched model's"
"""``error_inputs`` of ``clean_errors.csv``."""


@functools.lru_cache(maxsize=2)
def _captured(checkpoint, data_dir, cache_dir, device, ids: tuple):
    import torch

    cell = {"checkpoint": checkpoint, "data_dir": data_dir, "cache_dir": cache_dir, "device": device}
    prefill = exact_prefill(decoder_model(cell), torch.tensor([ids]))
    return prefill.queries, prefill.keys, prefill.values


def clean_inputs(cell) -> tuple:
    """The unpatched model's ``(queries, keys, values)`` at every layer on the cell's tokens
    (:attr:`approxlab.patching.ExactPrefill.queries`, ...), captured once per window and process."""
    ids = tuple(window_inputs(cell)[0].tolist())
    return _captured(cell["checkpoint"], cell["data_dir"], cell["cache_dir"], cell["device"], ids)


def clean_run(cell: dict, key: tuple) -> dict:
    """The cell's layers replayed on the unpatched model's inputs (random streams from ``key``): the pooled error
    and attention measures (``inf`` for a failed method), ``status``, warnings and the seconds of the replay (the
    window's capture, shared, not counted)."""
    queries, keys, values = clean_inputs(cell)
    watch = Stopwatch()
    _, patch, status, caught = run_patch(cell, key, lambda patch: replay(patch, queries, keys, values),
                                         **patch_options(cell, decoder_model(cell)))
    errors = [] if patch is None else patch.errors()
    return {"error_inputs": CLEAN_INPUTS, **measured(errors, patch), "status": status, **warning_columns(caught),
            **watch.times()}


def compute_clean(cell: dict) -> list[dict]:
    """``clean_errors.csv``: one row, the clean-input errors of the ``perplexity.csv`` cell of the same key."""
    return [{**clean_run(cell, tuple(cell[c] for c in CLEAN_KEY)), **ratio_column(cell)}]


def clean_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per multi-layer setting (the whole window with every layer replaced, if run; the KV cache) x
    method x d x window, window by window (each window's capture serves its cells)."""
    common = decoder_common(config, settings)
    plan = ([(WHOLE, ALL_LAYERS)] if ALL_LAYERS in config["layers"] else []) + [(KV_CACHE, ALL_LAYERS)]
    return [{"setting": setting, "layers": layers, "method": method, "num_features": d, "window": window,
             **ratio_of(config, d), **common}
            for window in window_ids(config) for setting, layers in plan
            for method in [config["control"], *config["methods"]]
            for d in (config["num_features"][:1] if method == config["control"] else method_features(config, method))]
