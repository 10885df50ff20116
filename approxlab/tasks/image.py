r"""Image: handwritten digits as pixel sequences (stands in for LRA's grey-scale CIFAR-10).

LRA's Image task (Tay et al., 2020) classifies CIFAR-10 (Krizhevsky, 2009) photographs, converted
to 8-bit grey and flattened row-major into ``32 x 32 = 1024`` pixel tokens (vocabulary 256), into
10 classes; no 2-D structure is given to the model, so it has to find it through attention.
CIFAR-10 cannot be had offline (no package on PyPI ships it; those that offer it download it).
This proxy uses the real images that scikit-learn ships inside its package:
:func:`sklearn.datasets.load_digits`, 1,797 handwritten digits (UCI "Optical Recognition of
Handwritten Digits", test part: 13 writers), ``8 x 8`` pixels with 17 grey levels ``0..16``.

* **Input**: a digit upsampled bilinearly (:func:`torch.nn.functional.interpolate`,
  ``align_corners=False``) to ``side x side`` with ``n = side**2`` (``side = 32``: LRA's
  ``n = 1024``; the instability study uses ``side = 16``, ``n = 256``), its grey levels mapped to
  ``round(255 v / 16)`` (vocabulary 256, like 8-bit grey), flattened row-major; no padding.
* **Label**: the digit, 10 classes; in both splits every class has 9.2-10.3% of the images,
  so the chance level is 0.1 (majority rate 0.103 on validation).
* **Split** (no leakage): the last ``VALIDATION_FRACTION`` of the set in its shipped order (the
  last 359 of 1,797 images) for ``split="validation"``, the first 1,438 for ``split="train"``:
  no image is in both. The cut is fixed by the data, never by the generator. Within a split the
  images are drawn in epochs (each image once per epoch, in a random order).

Why a fair proxy: the same shape of problem -- 10-way classification of a real image seen only
as a flat sequence of 8-bit grey pixels, at LRA's length for ``side = 32`` -- with the spatial
structure a model must recover from the order of the pixels. Differences: digits are simpler than
photographs (a tiny encoder learns them more easily than CIFAR-10, where LRA models reach about
40%), the 32 x 32 images carry only 8 x 8 pixels of information, and 1,438 training images
rather than 50,000.

References
----------
Tay, Y. et al. (2020). Long Range Arena: A benchmark for efficient transformers. ICLR 2021.

Alpaydin, E. and Kaynak, C. (1998). Optical recognition of handwritten digits. UCI Machine
Learning Repository (shipped by scikit-learn as ``load_digits``).

Chen, Y., Zeng, Q., Ji, H. and Yang, Y. (2021). Skyformer. NeurIPS. Section 5 and Appendix F.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from .._validation import check_int
from ._base import VALIDATION_FRACTION, Batch, Task, check_split, numpy_rng, permutation_cycle

__all__ = ["PROXY", "VOCAB_SIZE", "NUM_CLASSES", "GREY_LEVELS", "digits", "make_task"]

PROXY = "sklearn-digits"
"""The proxy's name in tables (the ``proxy`` field of the task)."""

VOCAB_SIZE = 256
NUM_CLASSES = 10
GREY_LEVELS = 16
"""The digits' largest grey level (levels ``0..16``), mapped to 255."""


@functools.lru_cache(maxsize=1)
def _load_digits() -> tuple:
    from sklearn.datasets import load_digits

    data = load_digits()
    return np.asarray(data.images, dtype=np.float64), np.asarray(data.target, dtype=np.int64)


@functools.lru_cache(maxsize=4)
def _upsampled(side: int) -> np.ndarray:
    images, _ = _load_digits()
    grown = F.interpolate(torch.from_numpy(images).unsqueeze(1), size=(side, side), mode="bilinear",
                          align_corners=False).squeeze(1)
    return np.rint(grown.numpy() * (255.0 / GREY_LEVELS)).clip(0, 255).astype(np.uint8)


def digits(side: int = 8, *, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """The images and labels of a split: ``(count, side, side)`` uint8 grey levels, ``(count,)`` int64.

    Parameters
    ----------
    side : int
        Image side after bilinear upsampling, ``8 <= side <= 64`` (8: the shipped pixels).
    split : {"train", "validation"}
        The first 1,438 images, or the last 359 (see the module docstring).

    Examples
    --------
    >>> from approxlab.tasks.image import digits
    >>> images, labels = digits(16, split="validation")
    >>> images.shape, images.dtype, int(images.max()), labels[:5].tolist()
    ((359, 16, 16), dtype('uint8'), 255, [3, 4, 5, 6, 7])
    >>> digits(split="train")[0].shape
    (1438, 8, 8)
    """
    side = check_int(side, "side", low=8, high=64)
    split = check_split(split)
    images, labels = _upsampled(side), _load_digits()[1]
    cut = len(labels) - round(VALIDATION_FRACTION * len(labels))
    part = slice(None, cut) if split == "train" else slice(cut, None)
    return images[part], labels[part]


def make_task(*, n: int = 1024, batch_size: int, num_batches: int, generator=None, data_dir=None,
              split: str = "train") -> Task:
    """The Image proxy: handwritten digits upsampled to ``n = side**2`` pixel tokens.

    Parameters
    ----------
    n : int
        A square ``side**2`` with ``8 <= side <= 64`` (LRA's Image: 1024).
    batch_size, num_batches : int
    generator : torch.Generator, optional
        Source of all randomness (the order of the images, epoch by epoch).
    data_dir : ignored
        The images ship with scikit-learn (every task factory has one signature).
    split : {"train", "validation"}
        Which images (disjoint; see :func:`digits`).

    Returns
    -------
    approxlab.tasks.Task
        ``name="image"``, ``kind="classification"``, ``vocab_size=256``, ``num_classes=10``,
        ``proxy="sklearn-digits"``; batches ``(batch_size, n)`` with no padding.

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks.image import make_task
    >>> task = make_task(n=256, batch_size=4, num_batches=2, generator=torch.Generator().manual_seed(0))
    >>> task.name, task.proxy, task.num_classes, task.vocab_size, task.batches[0].input_ids.shape
    ('image', 'sklearn-digits', 10, 256, torch.Size([4, 256]))
    """
    n = check_int(n, "n", low=64, high=4096)
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"`n` must be a square side**2 with 8 <= side <= 64 (LRA's Image: 1024); got {n}.")
    batch_size = check_int(batch_size, "batch_size", low=1)
    num_batches = check_int(num_batches, "num_batches", low=1)
    images, labels = digits(side, split=split)
    order = permutation_cycle(numpy_rng(generator), len(labels), batch_size * num_batches)
    ids = torch.from_numpy(images[order].reshape(len(order), n).astype(np.int64))
    targets = torch.from_numpy(labels[order])
    batches = [Batch(chunk, torch.ones_like(chunk, dtype=torch.bool), y)
               for chunk, y in zip(ids.split(batch_size), targets.split(batch_size))]
    return Task(
        name="image",
        kind="classification",
        vocab_size=VOCAB_SIZE,
        num_classes=NUM_CLASSES,
        n=n,
        batches=batches,
        info={"split": split, "side": side, "images": len(labels), "upsampling": "bilinear from 8 x 8",
              "validation_fraction": VALIDATION_FRACTION},
        proxy=PROXY,
    )
