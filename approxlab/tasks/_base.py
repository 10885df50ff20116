"""What a training task hands the instability study: padded batches and their shape."""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["Batch", "Task", "IGNORE_INDEX"]

IGNORE_INDEX = -100
"""Label of positions that carry no masked-LM target (PyTorch's cross-entropy default)."""


@dataclasses.dataclass
class Batch:
    """One batch of token sequences.

    Attributes
    ----------
    input_ids : torch.Tensor
        ``(batch, n)`` int64 token ids (padded to ``n``).
    mask : torch.Tensor
        ``(batch, n)`` bool, True on real (non-padding) tokens.
    labels : torch.Tensor
        Classification: ``(batch,)`` int64 classes. Masked LM: ``(batch, n)`` int64 original
        token ids at masked positions and ``IGNORE_INDEX`` elsewhere.

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks import Batch
    >>> ids = torch.tensor([[5, 6, 7, 0], [5, 6, 0, 0]])
    >>> batch = Batch(input_ids=ids, mask=ids != 0, labels=torch.tensor([1, 0]))
    >>> batch.mask.sum(-1).tolist()  # real tokens per sequence
    [3, 2]
    """

    input_ids: torch.Tensor
    mask: torch.Tensor
    labels: torch.Tensor


@dataclasses.dataclass
class Task:
    """A task's batches and what a model needs to know to fit it.

    Attributes
    ----------
    name : str
        Registry name (``approxlab.tasks.TASKS``).
    kind : {"classification", "mlm"}
        Mean-pooling classifier head, or masked-LM head over the vocabulary.
    vocab_size : int
    num_classes : int or None
        Classes for ``"classification"``; None for ``"mlm"``.
    n : int
        Sequence length (every batch is ``(batch, n)``).
    batches : list of Batch
    info : dict
        How the batches were made (lengths, masking rate, source file).

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks import make_task
    >>> task = make_task("pathfinder", n=256, batch_size=2, num_batches=1, generator=torch.Generator().manual_seed(0))
    >>> task.kind, task.num_classes, task.vocab_size, task.n
    ('classification', 2, 256, 256)
    """

    name: str
    kind: str
    vocab_size: int
    num_classes: int | None
    n: int
    batches: list
    info: dict = dataclasses.field(default_factory=dict)
