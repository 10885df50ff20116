"""Training tasks for the instability study (Skyformer Appendix F, Table 3).

A task factory turns a sequence length, a batch shape and a generator into a
:class:`Task`: padded ``(batch, n)`` token batches with labels (``(batch, 2, n)`` for a
pair task). The registry :data:`TASKS` maps names to factories (``"module:function"``,
imported lazily), so a new task is one module with a ``make_task`` and one line here.

The five columns of Skyformer's Table 3 (LRA's tasks), under LRA's names:

* ``"listops"`` and ``"pathfinder"``: generated the way LRA generates them;
* ``"text"``, ``"retrieval"``, ``"image"``: LRA's data (IMDb, AAN, CIFAR-10) cannot be had
  offline, so each is a declared proxy on data that ships with an installed package, named in
  the task's ``proxy`` field: ``"wikitext-articles"`` (which WikiText-2 article a byte window
  comes from), ``"wikitext-same-article"`` (whether two byte windows, encoded separately, come
  from one article) and ``"sklearn-digits"`` (handwritten digits as pixel sequences). Each
  module's docstring says what it stands in for, its labels, chance level and split.

``"wikitext-mlm"`` is masked-language modelling on WikiText-2 (no Table 3 column).

Not a training task: :mod:`approxlab.tasks.ruler` builds RULER-style long-context retrieval sequences
(needles of random keys in a WikiText-2 haystack) for evaluating a model, e.g. with
:func:`approxlab.patching.exact_prefill`.

Every factory has the signature::

    make_task(*, n, batch_size, num_batches, generator=None, data_dir=None) -> Task

Factories of tasks drawn from a finite data set (text, retrieval, image) also take
``split="train"`` or ``"validation"``; the two share no example (:data:`SPLITS`).

Public API::

    TASKS, available(), make_task(name, **kwargs), Batch, Task, IGNORE_INDEX, SPLITS
"""

from __future__ import annotations

import importlib

from .._validation import check_choice
from ._base import IGNORE_INDEX, SPLITS, Batch, Task

__all__ = ["TASKS", "available", "make_task", "Batch", "Task", "IGNORE_INDEX", "SPLITS"]

TASKS = {
    "listops": "listops:make_task",
    "pathfinder": "pathfinder:make_task",
    "text": "text:make_task",
    "retrieval": "retrieval:make_task",
    "image": "image:make_task",
    "wikitext-mlm": "mlm:make_task",
}
"""Task name -> ``module:function`` of its factory inside :mod:`approxlab.tasks`."""


def available() -> list[str]:
    """Registered task names, in registry order.

    Examples
    --------
    >>> from approxlab.tasks import available
    >>> available()
    ['listops', 'pathfinder', 'text', 'retrieval', 'image', 'wikitext-mlm']
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
