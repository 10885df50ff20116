r"""The spectra of one window: every singular value of the exact attention matrices and of the approximations.

One cell per (condition, layer, n, window) writes two tables: ``results.csv`` (per head and matrix, the
measures of :func:`approxlab.metrics.spectrum_measures`) and ``spectra.csv.gz`` (per matrix and index,
the mean, min and max over heads of :math:`\log_{10}(\sigma_i/\sigma_1)`).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from ...metrics import spectrum_measures
from ..engine.clock import Stopwatch
from ..engine.failures import METHOD_ERRORS, method_status
from ..engine.keys import cell_seed
from ..inputs import wikitext

__all__ = ["EXACT_MATRICES", "APPROXIMATIONS", "MATRICES", "RESULTS", "SPECTRA", "noise_floor", "layer_index",
           "attention_spectra", "compute_cell", "spectrum_measures"]

EXACT_MATRICES = ("scores", "softmax", "kernelized", "completion", "output")
APPROXIMATIONS = ("skyformer", "nystromformer", "spectral-shifting")
MATRICES = EXACT_MATRICES + APPROXIMATIONS
"""Matrix names of the table, in plotting order."""

RESULTS = "results.csv"
SPECTRA = "spectra.csv.gz"
LOG10_FLOOR = -20.0
SPECTRUM_DECIMALS = 6
"""log10 values in ``spectra.csv.gz`` are rounded to this many decimals (1e-6 in log10 is a relative
change of 2e-6 in sigma, far below what the figure resolves). The table is stored gzip-compressed: the
committed run's is 6.4 MB as text, 1.4 MB compressed, under the project's 4 MB for a committed file."""
DENSE_PREFIX = 64
"""Spectra keep every index below this, then about :data:`SPECTRUM_POINTS` evenly spaced ones."""
SPECTRUM_POINTS = 192


def noise_floor(n: int, dtype=torch.float64) -> float:
    r"""Smallest trustworthy :math:`\sigma_i/\sigma_1` in a panel of length ``n``: ``2 n eps``.

    An SVD of a ``k x k`` matrix returns singular values with absolute errors of about
    ``k * eps * sigma_1`` (Golub and Van Loan, 8.6); the largest matrix of a panel is the
    ``2n x 2n`` completion.
    """
    return 2 * int(n) * float(torch.finfo(dtype).eps)


def layer_index(layer, num_layers: int) -> int:
    """``"first" -> 0``, ``"middle" -> num_layers // 2``, ``"last" -> num_layers - 1``; an index as it is."""
    if isinstance(layer, int) and not isinstance(layer, bool) and 0 <= layer < num_layers:
        return layer
    positions = {"first": 0, "middle": num_layers // 2, "last": num_layers - 1}
    if layer not in positions:
        raise ValueError(f"`layer` must be one of {sorted(positions)} or an index in 0..{num_layers - 1}; "
                         f"got {layer!r}.")
    return positions[layer]


def attention_spectra(q, k, v, *, approximations=APPROXIMATIONS, num_features=64, generator=None) -> dict:
    r"""Singular values of the exact attention matrices and of the approximations.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``; cast to float64.
    approximations : sequence of str
        Registered method names whose ``.matrix()`` is analysed.
    num_features : int
        Their ``d``.
    generator : torch.Generator, optional
        For randomized methods.

    Returns
    -------
    dict of str -> (sigma ``(*batch, r)``, shape ``(n, k)``) or str
        Keys from :data:`MATRICES` (those computed). ``completion`` holds the eigenvalues
        of :math:`\bar C` (clamped at 0), descending. An approximation that raised maps to its error
        (:func:`~approxlab.studies.engine.method_status`), not to a spectrum.
    """
    from ...attention import approximate
    from ...kernels import kernelized_matrix, scaled_logits, softmax_matrix

    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    n = q.shape[-2]
    logits = scaled_logits(q, k)
    scores = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    softmax = softmax_matrix(q, k)
    z = torch.cat([q, k], dim=-2)
    out = {
        "scores": (torch.linalg.svdvals(scores), (n, n)),
        "softmax": (torch.linalg.svdvals(softmax), (n, n)),
        "kernelized": (torch.linalg.svdvals(kernelized_matrix(q, k)), (n, n)),
        "completion": (torch.linalg.eigvalsh(kernelized_matrix(z, z)).flip(-1).clamp_min(0.0), (2 * n, 2 * n)),
        "output": (torch.linalg.svdvals(softmax @ v), tuple(v.shape[-2:])),
    }
    for name in approximations:
        try:
            matrix = approximate(name, q, k, v, num_features=num_features, generator=generator).matrix()
            out[name] = (torch.linalg.svdvals(matrix), (n, n))
        except METHOD_ERRORS as failure:  # the method's failure: its rows record it (compute_cell)
            out[name] = method_status(name, failure)
    return out


def _spectrum_indices(r: int) -> np.ndarray:
    dense = np.arange(min(r, DENSE_PREFIX))
    if r <= DENSE_PREFIX:
        return dense
    tail = np.unique(np.linspace(DENSE_PREFIX, r - 1, SPECTRUM_POINTS).round().astype(int))
    return np.concatenate([dense, tail])


def _load(cell):
    """Q, K, V ``(heads, n, head_dim)`` in float64 of the cell's window, the layer index and the checkpoint;
    hidden-mode cells always carry BERT's own positions."""
    index = layer_index(cell["layer"], wikitext.num_layers(cell["condition"], cell.get("checkpoint")))
    mode = cell["mode"]
    window = wikitext.Window(cell["condition"], cell["n"], cell["window"], mode=mode, layer=index,
                             model_seed=cell["model_seed"], data_dir=cell["data_dir"], cache_dir=cell["cache_dir"],
                             device=cell["device"], checkpoint=cell.get("checkpoint"), dtype="float64",
                             positions=cell.get("positions", "none") if mode == "embedding" else "interpolate")
    record = wikitext.qkv(window)
    return record.q[0], record.k[0], record.v[0], index, str(record.checkpoint)


def compute_cell(cell: dict) -> dict:
    """Spectra of one window: ``{"results.csv": rows (head x matrix), "spectra.csv": rows}``."""
    watch = Stopwatch()
    q, k, v, index, checkpoint = _load(cell)
    heads = min(int(cell["heads"]), q.shape[0])
    q, k, v = q[:heads], k[:heads], v[:heads]
    seed = cell_seed(cell["condition"], cell["layer"], cell["n"], cell["window"], base_seed=cell["base_seed"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spectra = attention_spectra(q, k, v, approximations=cell["approximations"],
                                    num_features=min(cell["num_features"], cell["n"]),
                                    generator=torch.Generator().manual_seed(seed))
    rows, curves = [], []
    common = {"layer_index": index, "checkpoint": checkpoint, "mode": cell["mode"], "warnings": len(caught)}
    names = []  # the measures' columns, from the exact matrices (computed first, never failing)
    for name, spectrum in spectra.items():
        if isinstance(spectrum, str):  # a failed approximation: a row per head holding its error, inf measures
            rows.extend({"head": h, "matrix": name, **dict.fromkeys(names, math.inf), "sigma_1": math.inf,
                         "status": spectrum, **common} for h in range(heads))
            continue
        sigma, shape = spectrum
        sigma = sigma.cpu()
        measures = spectrum_measures(sigma, shape)
        names = list(measures)
        for h in range(heads):
            rows.append({"head": h, "matrix": name, **{key: float(val[h]) for key, val in measures.items()},
                         "sigma_1": float(sigma[h, 0]), "status": "ok", **common})
        ratio = (sigma / sigma[:, :1]).clamp_min(10.0**LOG10_FLOOR)
        logs = torch.log10(ratio).numpy()
        for i in _spectrum_indices(sigma.shape[-1]):
            column = logs[:, i]
            curves.append({"matrix": name, "index": int(i),
                           **{f"log10_{stat}": round(float(getattr(column, stat)()), SPECTRUM_DECIMALS)
                              for stat in ("mean", "min", "max")}, "heads": heads})
    seconds = watch.seconds()
    for row in rows:
        row["seconds"] = seconds
    return {RESULTS: rows, SPECTRA: curves}
