"""The generated LRA tasks the training studies share: seeded batches, cached per process.

A task's batches come from :func:`approxlab.tasks.make_task` with a generator seeded by
:func:`~approxlab.studies.engine.cell_seed` of the task, its length and what the batches are for,
so every process builds the same batches, and the attentions (or seeds) that share them get them
from this process's cache instead of generating them again (generation costs about a training step).

Public API::

    seeded_task(task, n, batch_size, num_batches, *parts, base_seed=0, **options) -> approxlab.tasks.Task
    training_batches(task, n, seed, batch_size, steps, base_seed, data_dir, cache_dir) -> Task
    training_pool(task, n, options, base_seed, batch_size, train_batches, validation_size) -> (Task, batches)
    to_device(batch, device) -> approxlab.tasks.Batch
"""

from __future__ import annotations

import functools

import torch

from ..engine.keys import cell_seed

__all__ = ["seeded_task", "training_batches", "training_pool", "to_device"]


def seeded_task(task: str, n: int, batch_size: int, num_batches: int, *parts, base_seed: int = 0, **options):
    """``num_batches`` batches of ``task`` drawn with the generator of ``cell_seed(task, n, *parts)``."""
    from ...tasks import make_task

    generator = torch.Generator().manual_seed(cell_seed(task, n, *parts, base_seed=base_seed))
    return make_task(task, n=n, batch_size=batch_size, num_batches=num_batches, generator=generator, **options)


@functools.lru_cache(maxsize=2)
def training_batches(task, n, seed, batch_size, steps, base_seed, data_dir, cache_dir):
    """The ``steps`` batches of (task, n, seed), identical for every attention trained on them."""
    options = {"data_dir": data_dir}
    if task == "wikitext-mlm":
        options["cache_dir"] = cache_dir
    return seeded_task(task, n, batch_size, steps, seed, "data", base_seed=base_seed, **options)


@functools.lru_cache(maxsize=4)
def training_pool(task, n, options, base_seed, batch_size, train_batches, validation_size):
    """A task's training pool and validation batches, shared by its seeds.

    ``options``: the task's generator options as sorted ``(name, value)`` pairs (hashable).
    """
    validation_batch = min(32, validation_size)
    return (seeded_task(task, n, batch_size, train_batches, "train", base_seed=base_seed, **dict(options)),
            seeded_task(task, n, validation_batch, -(-validation_size // validation_batch), "validation",
                        base_seed=base_seed, **dict(options)).batches)


def to_device(batch, device):
    """``batch`` (:class:`approxlab.tasks.Batch`) on ``device``."""
    from ...tasks import Batch

    return Batch(batch.input_ids.to(device), batch.mask.to(device), batch.labels.to(device))
