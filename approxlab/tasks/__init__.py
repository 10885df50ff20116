"""Training tasks for the instability study (Skyformer Appendix F, Table 3).

A task factory turns a sequence length, a batch shape and a generator into a
:class:`Task`: padded ``(batch, n)`` token batches with labels. The registry
:data:`TASKS` maps names to factories (``"module:function"``, imported lazily), so an LRA
task whose data exists (Text/IMDb, Retrieval/AAN, Image/CIFAR-10) is one new
module with a ``make_task`` and one line here.

Every factory has the signature::

    make_task(*, n, batch_size, num_batches, generator=None, data_dir=None) -> Task

Public API::

    TASKS, available(), make_task(name, **kwargs), Batch, Task, IGNORE_INDEX
"""

from __future__ import annotations

import importlib

from .._validation import check_choice
from ._base import IGNORE_INDEX, Batch, Task

__all__ = ["TASKS", "available", "make_task", "Batch", "Task", "IGNORE_INDEX"]

TASKS = {
    "listops": "listops:make_task",
    "pathfinder": "pathfinder:make_task",
    "wikitext-mlm": "mlm:make_task",
}
"""Task name -> ``module:function`` of its factory inside :mod:`approxlab.tasks`."""


def available() -> list[str]:
    """Registered task names, in registry order.

    Examples
    --------
    >>> from approxlab.tasks import available
    >>> available()
    ['listops', 'pathfinder', 'wikitext-mlm']
    """
    return list(TASKS)


def make_task(name: str, **kwargs) -> Task:
    """Build task ``name`` with its factory (see the module docstring for the keywords).

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks import make_task
    >>> task = make_task("listops", n=32, batch_size=4, num_batches=2, generator=torch.Generator().manual_seed(0))
    >>> task.name, task.n, len(task.batches), task.batches[0].input_ids.shape
    ('listops', 32, 2, torch.Size([4, 32]))
    """
    check_choice(name, "name", TASKS)
    module, function = TASKS[name].split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), function)(**kwargs)
