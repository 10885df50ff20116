r"""The perplexity study's clean-input errors: each replaced layer's error on the unpatched model's inputs.

With every layer replaced (the whole window, the KV cache) a patched run's layer :math:`\ell` receives the q, k, v
that the approximations of layers :math:`< \ell` produced, so the error recorded in ``perplexity.csv.gz`` mixes the
layer's own error with the drift of its inputs -- and a method that breaks early layers shows both more error and
more loss downstream. ``clean_errors.csv`` records, for the same setting, method, budget and window, each layer's
error with the approximation applied to the **unpatched** model's q, k, v at that layer (a teacher-forced pass):

.. math::

    e^{\mathrm{clean}}_\ell = \frac{\| \mathcal A_\ell(Q_\ell, K_\ell, V_\ell) - \operatorname{softmax}(Q_\ell
    K_\ell^\top/\sqrt p)\,V_\ell \|_2}{\| \operatorname{softmax}(Q_\ell K_\ell^\top/\sqrt p)\,V_\ell \|_2},

with :math:`Q_\ell, K_\ell, V_\ell` the unpatched model's at layer :math:`\ell`, pooled over layers and heads as
``perplexity.csv.gz`` pools (median and max; the Frobenius and worst-query errors and the attention measures alike).
In the KV-cache setting :math:`\mathcal A_\ell` is the compressed cache, as a patched run computes it
(:func:`approxlab.kv_cache_attention` on the layer's window, the continuation's rows).

**Cost.** The unpatched q, k, v of a window are captured once (:func:`approxlab.patching.exact_prefill`, one
forward pass, kept for the window's cells) and every method and budget replays its layers on them
(:func:`approxlab.patching.replay`): a cell costs the method and the error measures at every layer, no model run.
What does not depend on the method or the budget -- each layer's exact output rows
:math:`O_\ell = \operatorname{softmax}(Q_\ell K_\ell^\top/\sqrt p)\,V_\ell` (causal) in float64 and their spectral,
Frobenius and row norms -- is computed once per window, setting and layer and kept for the window's cells
(:func:`exact_reference`), and the spectral norm of a cell's difference :math:`D = \tilde O_\ell - O_\ell`
(``(r, p_v)`` per head, :math:`p_v = 64 \ll r`) is :math:`\sqrt{\lambda_{\max}(D^\top D)}` from the
:math:`p_v \times p_v` Gram matrix (:func:`spectral_norms`) instead of a dense SVD of :math:`D`: the same numbers
to rounding (a test compares them with :meth:`approxlab.patching.AttentionPatch.errors`); with the replay's KV-cache
rows alone (no exact context rows) about 0.9 CPU-s less per cell at n = 512, whatever the method
(``benchmarks/results/perplexity_clean_cells.md``). What is left is the method and the attention measures.
A cell's random streams come from the key of the ``perplexity.csv.gz`` cell it accompanies (common random numbers).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from ...patching import exact_prefill, replay
from ...patching.records import dense_errors
from ..engine.clock import Stopwatch
from .cells import (DECODER_KEY, decoder_model, measured, patch_options, ratio_column, run_patch, warning_columns,
                    window_inputs)
from .config_grid import ratio_of
from .grid import ALL_LAYERS, KV_CACHE, WHOLE, decoder_common, method_features, window_ids

__all__ = ["CLEAN_KEY", "CLEAN_INPUTS", "ExactReference", "clean_inputs", "clean_run", "compute_clean", "clean_cells",
           "exact_reference", "reference_errors", "spectral_norms"]

CLEAN_KEY = DECODER_KEY
CLEAN_INPUTS = "the unpatched model's"
"""``error_inputs`` of ``clean_errors.csv``."""


@functools.lru_cache(maxsize=2)
def _captured(checkpoint, data_dir, cache_dir, device, ids: tuple):
    import torch

    cell = {"checkpoint": checkpoint, "data_dir": data_dir, "cache_dir": cache_dir, "device": device}
    prefill = exact_prefill(decoder_model(cell), torch.tensor([ids]))
    return prefill.queries, prefill.keys, prefill.values


def _window(cell) -> tuple:
    """What names a window's capture: the model, where it is read from, the tokens."""
    return cell["checkpoint"], cell["data_dir"], cell["cache_dir"], cell["device"], tuple(window_inputs(cell)[0].tolist())


def clean_inputs(cell) -> tuple:
    """The unpatched model's ``(queries, keys, values)`` at every layer on the cell's tokens
    (:attr:`approxlab.patching.ExactPrefill.queries`, ...), captured once per window and process."""
    return _captured(*_window(cell))


def spectral_norms(x: torch.Tensor) -> torch.Tensor:
    r"""``(*batch,)`` float64: the spectral norm :math:`\|X\|_2` of each ``(r, c)`` matrix of ``x`` from its smaller
    Gram matrix.

    Notes
    -----
    :math:`\|X\|_2 = s\,\sqrt{\lambda_{\max}((X/s)^\top (X/s))}` (or :math:`(X/s)(X/s)^\top` when :math:`r < c`),
    with :math:`s = \max_{ij} |x_{ij}|` keeping the squares in range. The symmetric eigensolver gives
    :math:`\lambda_{\max}` to an absolute error of a few :math:`\epsilon \|G\|_2 = \epsilon\, \lambda_{\max}`
    (Weyl's inequality for a backward-stable method; Golub and Van Loan, *Matrix Computations*, 4th ed., Section
    8.1.2), so the norm has a relative error of a few :math:`\epsilon` -- as the SVD's -- for the
    :math:`O(r c^2)` flops of the product instead of the SVD's bidiagonalisation of :math:`X`. Only the largest
    singular value is read: the small ones, which squaring loses, never enter. ``x`` must be finite.

    Examples
    --------
    >>> import torch
    >>> x = torch.tensor([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    >>> float(spectral_norms(x)), float(torch.linalg.matrix_norm(x, ord=2))
    (3.0, 3.0)
    """
    x = x.to(torch.float64)
    scale = x.abs().amax(dim=(-2, -1), keepdim=True)
    scaled = x / torch.where(scale > 0, scale, 1.0)
    gram = scaled.mT @ scaled if x.shape[-2] >= x.shape[-1] else scaled @ scaled.mT
    largest = torch.linalg.eigvalsh(gram)[..., -1].clamp_min(0.0)
    return largest.sqrt() * scale[..., 0, 0]


class ExactReference(NamedTuple):
    """A layer's exact output rows and their norms on one window (:func:`exact_reference`)."""

    output: torch.Tensor
    """``(S, H, r, p_v)`` float64: :meth:`approxlab.patching.LayerCall.exact_output`."""
    spectral: torch.Tensor
    r"""``(S, H)``: :math:`\|O\|_2`."""
    frobenius: torch.Tensor
    r"""``(S, H)``: :math:`\|O\|_F`."""
    row_norms: torch.Tensor
    r"""``(S, H, r)``: :math:`\|o_i\|_2`."""


_REFERENCES: dict = {}
_KEPT = 64
"""References kept per process (the oldest dropped first): a window's 30 layers in both multi-layer settings (at
the full grid, 2.4 MB per whole-window layer)."""


def exact_reference(call, window: tuple) -> ExactReference | None:
    """The exact rows and norms of a :class:`~approxlab.patching.LayerCall`'s layer, computed once per ``window``
    (what names the inputs), layer, rows and causal form and kept for the window's cells; ``None`` where
    :func:`reference_errors` does not apply (padding, an exact output of norm 0: the call's own errors decide)."""
    key = (window, call.layer, tuple(call.rows), bool(call.causal), call.inputs[0].dtype, tuple(call.inputs[0].shape))
    found = _REFERENCES.get(key)
    if found is None and call.key_mask is None:
        exact = call.exact_output()
        frobenius = torch.linalg.matrix_norm(exact)
        if not bool((frobenius == 0).any()):
            found = ExactReference(exact, torch.linalg.matrix_norm(exact, ord=2), frobenius,
                                   torch.linalg.vector_norm(exact, dim=-1))
            while len(_REFERENCES) >= _KEPT:
                _REFERENCES.pop(next(iter(_REFERENCES)))
            _REFERENCES[key] = found
    return found


def reference_errors(output: torch.Tensor, reference: ExactReference) -> dict | None:
    """:func:`approxlab.patching.output_errors` of ``output`` against a kept reference: the Frobenius and
    worst-query errors by the same operations, the spectral error by :func:`spectral_norms` (equal to rounding);
    ``None`` for a non-finite ``output`` (its own errors decide)."""
    difference = output.to(torch.float64) - reference.output
    if not bool(difference.isfinite().all()):
        return None
    return {"spectral": spectral_norms(difference) / reference.spectral,
            **dense_errors(difference, reference.frobenius, reference.row_norms)}


def _clean_errors(patch, window: tuple) -> list[dict]:
    """The rows of :meth:`approxlab.patching.AttentionPatch.errors` (layer, head and the three measures), each
    call's against its layer's kept reference (:func:`exact_reference`)."""
    rows = []
    for call in patch.calls:
        reference = exact_reference(call, window)
        errors = None if reference is None else reference_errors(call.output, reference)
        errors = call.errors() if errors is None else errors
        sequences, heads = errors["spectral"].shape
        rows += [{"layer": call.layer, "sequence": s, "head": h, **{name: float(value[s, h])
                                                                     for name, value in errors.items()}}
                 for s in range(sequences) for h in range(heads)]
    return rows


def clean_run(cell: dict, key: tuple) -> dict:
    """The cell's layers replayed on the unpatched model's inputs (random streams from ``key``): the pooled error
    and attention measures (``inf`` for a failed method), ``status``, warnings and the seconds of the replay (the
    window's capture, shared, not counted; each layer's exact reference, shared, counted by the window's first cell
    of a setting)."""
    window = _window(cell)
    queries, keys, values = _captured(*window)
    watch = Stopwatch()
    _, patch, status, caught = run_patch(cell, key, lambda patch: replay(patch, queries, keys, values),
                                         **patch_options(cell, decoder_model(cell)))
    errors = [] if patch is None else _clean_errors(patch, window)
    return {"error_inputs": CLEAN_INPUTS, **measured(errors, patch), "status": status, **warning_columns(caught),
            **watch.times()}


def compute_clean(cell: dict) -> list[dict]:
    """``clean_errors.csv``: one row, the clean-input errors of the ``perplexity.csv.gz`` cell of the same key."""
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
