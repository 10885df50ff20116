"""The instability study's cells: train one attention on one (task, n, seed) and score every step
(:func:`compute_cell`); measure the residual stream of softmax and kernelized attention at the initial
weights (:func:`compute_residual_cell`, the mechanism behind the spread of the ratios).

Every attention of a (task, n, seed) starts from the same weights (one draw from a generator seeded
with (task, n, seed, "init")) and sees the same batches (the shared, cached
:func:`approxlab.studies.inputs.tasks.training_batches`); the random draws of randomized attentions
come from (task, n, seed, "attention"), fixed per step so that both forward passes of a step see the
same landmarks.
"""

from __future__ import annotations

import warnings

import torch

from ..engine.clock import Stopwatch
from ..engine.failures import METHOD_ERRORS, method_status
from ..engine.keys import cell_seed
from ..inputs.tasks import to_device, training_batches
from .grid import MODEL

__all__ = ["compute_cell", "compute_residual_cell", "RESIDUAL_ATTENTIONS"]

RESIDUAL_ATTENTIONS = ("softmax", "kernelized")
"""The attentions whose residual stream :func:`compute_residual_cell` measures."""


def _task(cell):
    """The (task, n, seed)'s batches, shared by every attention (cached per process)."""
    return training_batches(cell["task"], cell["n"], cell["seed"], cell["batch_size"], cell["steps"],
                            cell["base_seed"], cell["data_dir"], cell["cache_dir"])


def _model(cell, task, attention):
    """The encoder with ``attention``, from the (task, n, seed)'s initial weights, on the cell's device."""
    from ...training import TinyEncoder

    dtype = {"float32": torch.float32, "float64": torch.float64}[cell["dtype"]]
    init = torch.Generator().manual_seed(cell_seed(cell["task"], cell["n"], cell["seed"], "init",
                                                   base_seed=cell["base_seed"]))
    return TinyEncoder(
        vocab_size=task.vocab_size, n=task.n, attention=attention, num_features=cell["num_features"],
        kind=task.kind, num_classes=task.num_classes, dropout=cell["dropout"], generator=init, dtype=dtype, **MODEL,
    ).to(cell["device"])


def _attention_seed(cell) -> int:
    return cell_seed(cell["task"], cell["n"], cell["seed"], "attention", base_seed=cell["base_seed"])


def compute_cell(cell: dict) -> list[dict]:
    """Train one attention on one (task, n, seed) and return one row per step."""
    from ...training import instability_trace

    watch = Stopwatch()
    task = _task(cell)
    attention_seed = _attention_seed(cell)
    model = _model(cell, task, cell["attention"])
    batches = [to_device(b, cell["device"]) for b in task.batches]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trace = instability_trace(model, batches, lr=cell["lr"], seed=attention_seed % (2**62),
                                      optimizer=cell["optimizer"], warmup=cell["warmup"],
                                      total_steps=max(cell["total_steps"], len(batches)),
                                      clip_value=cell["clip_value"])
            status = "ok"
        except METHOD_ERRORS as error:  # the attention's failure: a failed row
            trace, status = None, f"failed: {method_status(cell['attention'], error)}"
    seconds = watch.seconds()
    common = {"seconds": seconds, "warnings": len(caught), "status": status}
    if trace is None:
        return [{"step": 0, "tau": None, "output_change": None, "parameter_change": None, "loss": None, **common}]
    return [
        {"step": i + 1, "tau": float(trace["tau"][i]), "output_change": float(trace["output_change"][i]),
         "parameter_change": float(trace["parameter_change"][i]), "loss": float(trace["loss"][i]), **common}
        for i in range(len(batches))
    ]


@torch.no_grad()
def compute_residual_cell(cell: dict) -> list[dict]:
    r"""The RMS of the residual stream entering the final LayerNorm, per attention of
    :data:`RESIDUAL_ATTENTIONS`, at the (task, n, seed)'s initial weights on its first batch.

    The pre-LayerNorm encoder adds each layer's attention output to the residual stream; softmax
    attention averages the values (its rows sum to 1), kernelized attention sums them with Gaussian
    weights (Eq. (5) of Skyformer, no normalisation), so its contribution grows with the number of
    keys a query sees. The final LayerNorm divides by the stream's RMS,
    :math:`\sqrt{\text{mean}(x^2)}` over real tokens and features. Forward passes only, dropout off
    (evaluation mode), the attention's draws from the cell's "attention" seed.

    Returns
    -------
    list of dict
        One row: ``rms_<attention>`` per attention, ``seconds``.
    """
    watch = Stopwatch()
    task = _task(cell)
    batch = to_device(task.batches[0], cell["device"])
    row = {}
    for attention in RESIDUAL_ATTENTIONS:
        model = _model(cell, task, attention).eval()
        captured = []
        hook = model.norm.register_forward_hook(lambda module, inputs, output: captured.append(inputs[0]))
        try:
            model.embed(batch.input_ids, seed=_attention_seed(cell) % (2**62), mask=batch.mask)
        finally:
            hook.remove()
        stream = captured[0].reshape(*batch.mask.shape, -1)[batch.mask]  # (real tokens, embedding_dim)
        row[f"rms_{attention}"] = float(stream.double().square().mean().sqrt())
    return [{**row, "seconds": watch.seconds()}]
