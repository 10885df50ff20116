r"""The Figure-4 proxy's cell: train the 2-layer softmax encoder on one (task, seed), gate it, measure its spectrum.

One cell writes its rows of the three tables at once: ``results.csv`` (accuracy against the gate, the
decay slope), ``spectra.csv`` (:math:`\sigma_j/\sigma_1` over the test batch) and ``training.csv``
(the evaluations along the way). The training pool and validation set of a task are shared by its
seeds (:func:`approxlab.studies.inputs.tasks.training_pool`).
"""

from __future__ import annotations

import copy

import torch

from ..engine.clock import Stopwatch
from ..engine.keys import cell_seed
from ..inputs.tasks import seeded_task, training_pool
from .grid import DECAY_INDICES, GATES, MODEL, RESULTS, SPECTRA, TRAINING

__all__ = ["decay_slope", "attention_output_spectrum", "compute_cell"]


def decay_slope(sigma: torch.Tensor, indices=DECAY_INDICES) -> torch.Tensor:
    r"""Least-squares slope of :math:`\ln\sigma_i` on :math:`i` over ``indices`` (1-based, inclusive).

    Parameters
    ----------
    sigma : torch.Tensor
        ``(*batch, r)`` positive singular values in decreasing order, ``r >= indices[1]``.
    indices : (int, int)
        First and last index of the fit (default :data:`DECAY_INDICES`: 2..64, :math:`\sigma_1` out).

    Returns
    -------
    torch.Tensor
        ``(*batch,)`` float64 slopes :math:`c` in :math:`\sigma_i \approx C e^{c i}`; the same for
        :math:`\sigma` and :math:`\sigma/\sigma_1`.
    """
    first, last = int(indices[0]), int(indices[1])
    if not 1 <= first < last or sigma.shape[-1] < last:
        raise ValueError(f"`sigma` must hold at least {last} values for indices {first}..{last}; "
                         f"got {sigma.shape[-1]}.")
    y = torch.log(sigma[..., first - 1:last].to(torch.float64))
    if not bool(torch.isfinite(y).all()):
        raise ValueError("`sigma` must be positive over the fitted indices (a log of 0 has no slope).")
    i = torch.arange(first, last + 1, dtype=torch.float64)
    i = i - i.mean()
    return ((y - y.mean(-1, keepdim=True)) * i).sum(-1) / i.square().sum()


def attention_output_spectrum(model, batch, *, layer: int = 1, dtype: torch.dtype = torch.float64):
    r"""Normalised singular values of layer ``layer``'s attention output (0-based).

    The measuring forward pass runs on a copy of the model in ``dtype`` (default float64; see
    :data:`~approxlab.studies.lra_svd.grid.MEASURE_DTYPE`); the trained model is left as it is.

    Returns
    -------
    torch.Tensor
        ``(batch, r)`` float64, :math:`\sigma_j/\sigma_1` of each example's ``(n_i, e)`` matrix
        (its real tokens' rows), ``r = min(min_i n_i, e)``.
    """
    from ...linalg.conditioning import singular_values

    outputs = []
    with torch.no_grad():
        measured = copy.deepcopy(model).to(dtype)
        measured.eval()
        measured.predict(batch, attention_outputs=outputs)
    matrices = [outputs[layer][i][batch.mask[i]].to(torch.float64) for i in range(batch.mask.shape[0])]
    rank = min(min(m.shape) for m in matrices)
    sigma = torch.stack([singular_values(m)[:rank] for m in matrices])
    return sigma / sigma[:, :1]


def _train(cell):
    from ...training import TinyEncoder, train_classifier

    train, validation = training_pool(cell["task"], cell["n"], cell["options"], cell["base_seed"], cell["batch_size"],
                                      cell["train_batches"], cell["validation_size"])
    seed = lambda part: cell_seed(cell["task"], cell["n"], cell["seed"], part, base_seed=cell["base_seed"])  # noqa: E731
    order = torch.cat([torch.randperm(len(train.batches), generator=torch.Generator().manual_seed(seed("order") + e))
                       for e in range(-(-cell["steps"] // len(train.batches)))])[:cell["steps"]]
    model = TinyEncoder(vocab_size=train.vocab_size, n=cell["n"], attention="softmax", kind="classification",
                        num_classes=train.num_classes, positions=cell["positions"], dropout=cell["dropout"],
                        generator=torch.Generator().manual_seed(seed("init")), **MODEL)
    trained = train_classifier(model, [train.batches[int(i)] for i in order], validation, lr=cell["lr"],
                               eval_every=cell["eval_every"], patience=None, seed=seed("steps") % 2**62,
                               optimizer=cell["optimizer"], warmup=cell["warmup"], clip_value=cell["clip_value"],
                               keep="last")
    test = seeded_task(cell["task"], cell["n"], cell["test_size"], 1, cell["seed"], "test", base_seed=cell["base_seed"],
                       **dict(cell["options"])).batches[0]
    labels = torch.cat([b.labels for b in validation])
    return model, trained, test, float(torch.bincount(labels).max()) / labels.numel()


def compute_cell(cell: dict) -> dict:
    """Train and measure one (task, seed): its rows of the three tables."""
    from ...training import accuracy

    watch = Stopwatch()
    model, trained, test, majority = _train(cell)
    sigma = attention_output_spectrum(model, test, layer=1, dtype=getattr(torch, cell["measure_dtype"]))
    last = DECAY_INDICES[1]
    slope = decay_slope(sigma) if sigma.shape[-1] >= last else torch.full((sigma.shape[0],), float("nan"))
    gate = GATES.get(cell["task"], float("nan"))
    summary = {"steps": trained["steps"], "validation_accuracy": trained["final_accuracy"],
               "validation_size": cell["validation_size"], "majority_rate": majority, "gate": gate,
               "passed": bool(trained["final_accuracy"] >= gate),
               "test_batch_accuracy": accuracy(model, [test]), "decay_slope": float(slope.mean()),
               "decay_slope_std": float(slope.std()) if slope.numel() > 1 else 0.0,
               "num_singular_values": sigma.shape[-1], "seconds": watch.seconds()}
    spectra = [{"index": j + 1, "mean": float(sigma[:, j].mean()), "min": float(sigma[:, j].min()),
                "max": float(sigma[:, j].max())} for j in range(sigma.shape[-1])]
    training = [{c: row[c] for c in ("step", "train_loss", "validation_accuracy")} for row in trained["history"]]
    return {RESULTS: [summary], SPECTRA: spectra, TRAINING: training}
