"""The instability study's cell: train one attention on one (task, n, seed) and score every step.

Every attention of a (task, n, seed) starts from the same weights (one draw from a generator seeded
with (task, n, seed, "init")) and sees the same batches (the shared, cached
:func:`approxlab.studies.inputs.tasks.training_batches`); the random draws of randomized attentions
come from (task, n, seed, "attention"), fixed per step so that both forward passes of a step see the
same landmarks.
"""

from __future__ import annotations

import time
import warnings

import torch

from ..engine.keys import cell_seed
from ..inputs.tasks import to_device, training_batches
from .grid import MODEL

__all__ = ["compute_cell"]


def compute_cell(cell: dict) -> list[dict]:
    """Train one attention on one (task, n, seed) and return one row per step."""
    from ...training import TinyEncoder, instability_trace

    start = time.perf_counter()
    task = training_batches(cell["task"], cell["n"], cell["seed"], cell["batch_size"], cell["steps"],
                            cell["base_seed"], cell["data_dir"], cell["cache_dir"])
    dtype = {"float32": torch.float32, "float64": torch.float64}[cell["dtype"]]
    init = torch.Generator().manual_seed(cell_seed(cell["task"], cell["n"], cell["seed"], "init",
                                                   base_seed=cell["base_seed"]))
    attention_seed = cell_seed(cell["task"], cell["n"], cell["seed"], "attention", base_seed=cell["base_seed"])
    model = TinyEncoder(
        vocab_size=task.vocab_size, n=task.n, attention=cell["attention"], num_features=cell["num_features"],
        kind=task.kind, num_classes=task.num_classes, dropout=cell["dropout"], generator=init, dtype=dtype, **MODEL,
    ).to(cell["device"])
    batches = [to_device(b, cell["device"]) for b in task.batches]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trace = instability_trace(model, batches, lr=cell["lr"], seed=attention_seed % (2**62),
                                      optimizer=cell["optimizer"], warmup=cell["warmup"],
                                      total_steps=max(cell["total_steps"], len(batches)),
                                      clip_value=cell["clip_value"])
            status = "ok"
        except (FloatingPointError, ValueError, RuntimeError, ImportError, torch.linalg.LinAlgError) as error:
            trace, status = None, f"failed: {type(error).__name__}: {error}"
    seconds = time.perf_counter() - start
    common = {"seconds": seconds, "warnings": len(caught), "status": status}
    if trace is None:
        return [{"step": 0, "tau": None, "output_change": None, "parameter_change": None, "loss": None, **common}]
    return [
        {"step": i + 1, "tau": float(trace["tau"][i]), "output_change": float(trace["output_change"][i]),
         "parameter_change": float(trace["parameter_change"][i]), "loss": float(trace["loss"][i]), **common}
        for i in range(len(batches))
    ]
