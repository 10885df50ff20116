"""What a training task hands the instability study: padded batches and their shape, and the
helpers every task factory shares (splits of a finite data set, the local NumPy generator)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .._validation import as_generator, check_choice

__all__ = ["Batch", "Task", "IGNORE_INDEX", "SPLITS", "VALIDATION_FRACTION", "check_split", "numpy_rng",
           "permutation_cycle"]

IGNORE_INDEX = -100
"""Label of positions that carry no masked-LM target (PyTorch's cross-entropy default)."""

SPLITS = ("train", "validation")
"""The parts of a task drawn from a finite data set (``make_task(split=...)``): they share no example."""

VALIDATION_FRACTION = 0.2
"""The share of a finite data set kept for ``split="validation"``."""


def check_split(split) -> str:
    """``split`` checked against :data:`SPLITS` (the message names the parameter and the value)."""
    return check_choice(split, "split", SPLITS)


def numpy_rng(generator) -> np.random.Generator:
    """A local NumPy generator seeded by one 62-bit draw from ``generator`` (a ``torch.Generator``;
    None: a fresh one), for fast scalar draws; the same generator state gives the same stream."""
    return np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=as_generator(generator))))


def permutation_cycle(rng: np.random.Generator, size: int, count: int) -> np.ndarray:
    """The first ``count`` entries of independent random permutations of ``range(size)``, concatenated.

    Every ``size`` consecutive entries from the start hold each value once: balanced labels (values
    = classes), or epochs over a data set without replacement (values = example indices).

    Examples
    --------
    >>> import numpy as np
    >>> from approxlab.tasks._base import permutation_cycle
    >>> drawn = permutation_cycle(np.random.default_rng(0), 3, 7)
    >>> sorted(drawn[:3].tolist()), sorted(drawn[3:6].tolist()), len(drawn)
    ([0, 1, 2], [0, 1, 2], 7)
    """
    return np.concatenate([rng.permutation(size) for _ in range(-(-count // size))])[:count]


@dataclasses.dataclass
class Batch:
    """One batch of token sequences.

    Attributes
    ----------
    input_ids : torch.Tensor
        ``(batch, n)`` int64 token ids (padded to ``n``); ``(batch, 2, n)`` for a pair task
        (``kind="pair-classification"``: two sequences per example, encoded separately).
    mask : torch.Tensor
        Shaped like ``input_ids``, bool, True on real (non-padding) tokens.
    labels : torch.Tensor
        Classification and pair classification: ``(batch,)`` int64 classes. Masked LM:
        ``(batch, n)`` int64 original token ids at masked positions and ``IGNORE_INDEX`` elsewhere.

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
    kind : {"classification", "pair-classification", "mlm"}
        Mean-pooling classifier head; two sequences per example, each encoded and mean-pooled
        on its own, then classified together (LRA's two-tower retrieval); or masked-LM head over
        the vocabulary.
    vocab_size : int
    num_classes : int or None
        Classes for the two classification kinds; None for ``"mlm"``.
    n : int
        Sequence length (every batch is ``(batch, n)``, or ``(batch, 2, n)`` for pairs).
    batches : list of Batch
    info : dict
        How the batches were made (lengths, masking rate, source file, split).
    proxy : str or None
        For a task that stands in for an LRA task whose data cannot be had offline, the name of
        the stand-in (``"wikitext-articles"`` for ``"text"``); None for a task generated the way
        LRA generates it.

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
    proxy: str | None = None
