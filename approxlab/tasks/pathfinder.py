r"""Pathfinder: are the two dots joined by a dashed curve? (LRA's Pathfinder-32, regenerated).

LRA's Pathfinder images (Tay et al., 2020, after Linsley et al., 2018) come from a synthetic
generator: curved dashed paths on a ``32 x 32`` canvas, two of the paths' end points marked by
dots; label 1 when both dots lie on the same path. The image is flattened row-major to
``n = 1024`` pixel tokens (intensity ``0..255``, vocabulary 256). This module is a seeded
generator of such images, simplified so that the label is right *by construction*:

* a path is a smooth random walk (unit steps, heading changed by a Gaussian of standard
  deviation ``curvature`` per step) rounded to the pixel grid, an 8-connected chain of
  ``min_length .. max_length`` pixels at least one pixel from the border;
* it is *dashed*: every ``dash_period``-th pixel of the chain is left out (a gap of one pixel,
  so consecutive drawn pixels of one path are at Chebyshev distance <= 2), except next to its
  end points;
* distinct paths, with a plus-shaped dot at each end point, are at Chebyshev distance >= 3;
* the dots are drawn at ``dot_intensity`` (default ``INK``, like the paths; LRA's dots are
  larger discs than the dashes, which a pixel-level model tells apart by shape, and a
  distinct intensity stands in for that shape on this small canvas);
* every image has ``num_paths`` paths (default 3). Label 1: dots on both ends of path 0;
  label 0: one dot on an end of path 0, one on an end of path 1. The other paths are
  distractors, so both classes have the same number of paths and dots.

Hence, joining drawn pixels at Chebyshev distance <= 2, the connected components of the
drawn pixels are exactly the paths (with their dots), and the dots are connected iff the label
is 1 -- the property ``tests/test_pathfinder.py`` checks with a flood fill on the image.

Differences from LRA's images: no anti-aliasing (intensities 0 and 255 only), fixed-gap dashes,
fewer and shorter paths than Pathfinder-32's "hard" setting, no dot-size variation (optionally a
distinct dot intensity instead).

References
----------
Linsley, D., Kim, J., Veerabadran, V., Windolf, C. and Serre, T. (2018). Learning long-range
spatial dependencies with horizontal gated recurrent units. NeurIPS.

Tay, Y. et al. (2020). Long Range Arena: A benchmark for efficient transformers. ICLR 2021.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._validation import as_generator, check_int
from ._base import Batch, Task

__all__ = ["VOCAB_SIZE", "NUM_CLASSES", "INK", "PathfinderImage", "generate_image", "pathfinder_batches", "make_task"]

VOCAB_SIZE = 256
NUM_CLASSES = 2
INK = 255
"""Intensity of path and dot pixels (background 0)."""
_SEPARATION = 3  # Chebyshev distance between distinct paths (with their dots)
_PLUS = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))


class PathfinderImage:
    """One image: ``pixels`` ``(side, side)`` uint8, ``label``, ``dots`` (two (row, col)), ``paths``.

    Examples
    --------
    >>> import numpy as np
    >>> from approxlab.tasks.pathfinder import generate_image
    >>> image = generate_image(np.random.default_rng(0), side=16, min_length=5, max_length=10, label=1)
    >>> image.pixels.shape, image.pixels.dtype, image.label, len(image.dots), len(image.paths)
    ((16, 16), dtype('uint8'), 1, 2, 3)
    """

    def __init__(self, pixels, label, dots, paths):
        self.pixels, self.label, self.dots, self.paths = pixels, label, dots, paths


def _walk(rng, side, length, curvature):
    """A smooth random walk of ``length`` distinct consecutive pixels, or None if it leaves the canvas."""
    row, col = rng.uniform(2, side - 3, size=2)
    heading = rng.uniform(0, 2 * math.pi)
    pixels = [(math.floor(row + 0.5), math.floor(col + 0.5))]
    for _ in range(8 * length):
        if len(pixels) == length:
            return pixels
        heading += rng.normal(0.0, curvature)
        row, col = row + math.sin(heading), col + math.cos(heading)
        pixel = (math.floor(row + 0.5), math.floor(col + 0.5))  # moves at most 1 per axis
        if not (1 <= pixel[0] <= side - 2 and 1 <= pixel[1] <= side - 2):
            return None
        if pixel != pixels[-1]:
            pixels.append(pixel)
    return None


def _footprint(pixels):
    """The chain's pixels plus a dot at each end point (everything that may be drawn)."""
    cells = set(pixels)
    for r, c in (pixels[0], pixels[-1]):
        cells.update((r + dr, c + dc) for dr, dc in _PLUS)
    return cells


def _place_paths(rng, side, num_paths, min_length, max_length, curvature, max_tries=200):
    """``num_paths`` chains, pairwise at Chebyshev distance >= 3 (with their dots), or None."""
    blocked = np.zeros((side, side), dtype=bool)
    paths = []
    for _ in range(max_tries):
        pixels = _walk(rng, side, int(rng.integers(min_length, max_length + 1)), curvature)
        if pixels is None:
            continue
        cells = _footprint(pixels)
        if any(blocked[r, c] for r, c in cells):
            continue
        paths.append(pixels)
        for r, c in cells:
            reach = _SEPARATION - 1
            blocked[max(r - reach, 0) : r + reach + 1, max(c - reach, 0) : c + reach + 1] = True
        if len(paths) == num_paths:
            return paths
    return None


def _draw(side, paths, dots, dash_period, dot_intensity=INK):
    image = np.zeros((side, side), dtype=np.uint8)
    for pixels in paths:
        for i, (r, c) in enumerate(pixels):
            if 1 <= i < len(pixels) - 2 and i % dash_period == dash_period - 1:
                continue  # the gap of a dash (never next to an end point)
            image[r, c] = INK
    for r, c in dots:
        for dr, dc in _PLUS:
            image[r + dr, c + dc] = dot_intensity
    return image


def generate_image(
    rng: np.random.Generator,
    *,
    side: int = 32,
    num_paths: int = 3,
    min_length: int = 10,
    max_length: int = 20,
    curvature: float = 0.3,
    dash_period: int = 4,
    dot_intensity: int = INK,
    label: int | None = None,
) -> PathfinderImage:
    """One Pathfinder image (see the module docstring for the construction).

    Parameters
    ----------
    rng : numpy.random.Generator
        A local generator (derived from a ``torch.Generator`` by :func:`pathfinder_batches`).
    side : int
        Canvas side (LRA Pathfinder-32: 32); ``n = side**2`` tokens.
    num_paths : int
        Paths per image, ``>= 2``.
    min_length, max_length : int
        Pixels per path chain.
    curvature : float
        Standard deviation (radians) of the heading change per unit step.
    dash_period : int
        Every ``dash_period``-th chain pixel is a gap (``>= 2``).
    dot_intensity : int
        Intensity of the dots' pixels, ``1..255`` (default ``INK``, that of the paths).
    label : {0, 1}, optional
        Force the label; drawn uniformly otherwise.

    Raises
    ------
    RuntimeError
        If 100 canvases in a row could not hold ``num_paths`` separated paths (too many or
        too long paths for ``side``).

    Examples
    --------
    >>> import numpy as np
    >>> from approxlab.tasks.pathfinder import generate_image
    >>> connected = generate_image(np.random.default_rng(0), side=16, min_length=5, max_length=10, label=1)
    >>> first, second = connected.dots  # label 1: both dots end the same path
    >>> {first, second} == {connected.paths[0][0], connected.paths[0][-1]}
    True
    """
    dot_intensity = check_int(dot_intensity, "dot_intensity", low=1, high=VOCAB_SIZE - 1)
    label = int(rng.integers(2)) if label is None else label
    for _ in range(100):
        paths = _place_paths(rng, side, num_paths, min_length, max_length, curvature)
        if paths is not None:
            break
    else:
        raise RuntimeError(
            f"could not place {num_paths} separated paths of {min_length}-{max_length} pixels on a "
            f"{side}x{side} canvas; use fewer or shorter paths."
        )
    ends = [(p[0], p[-1]) if rng.integers(2) else (p[-1], p[0]) for p in paths[:2]]
    dots = (ends[0][0], ends[0][1]) if label == 1 else (ends[0][0], ends[1][0])
    return PathfinderImage(_draw(side, paths, dots, dash_period, dot_intensity), label, dots, paths)


def pathfinder_batches(num_batches: int, batch_size: int, side: int = 32, *, generator=None, **options) -> list:
    """``num_batches`` batches of flattened images: ids ``(batch_size, side**2)``, labels ``(batch_size,)``.

    Labels alternate 0/1 within a batch in a random order (balanced batches); ``options`` go to
    :func:`generate_image`. The mask is all True (images have no padding).

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks.pathfinder import pathfinder_batches
    >>> batches = pathfinder_batches(1, 4, side=16, generator=torch.Generator().manual_seed(0), min_length=5,
    ...                              max_length=10)
    >>> batches[0].input_ids.shape, sorted(batches[0].labels.tolist())  # balanced labels
    (torch.Size([4, 256]), [0, 0, 1, 1])
    """
    g = as_generator(generator)
    rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=g)))
    batches = []
    for _ in range(num_batches):
        labels = rng.permutation(np.arange(batch_size) % 2)
        images = [generate_image(rng, side=side, label=int(y), **options).pixels for y in labels]
        ids = torch.from_numpy(np.stack(images).reshape(batch_size, side * side).astype(np.int64))
        batches.append(Batch(ids, torch.ones_like(ids, dtype=torch.bool), torch.from_numpy(labels.astype(np.int64))))
    return batches


def make_task(*, n: int = 1024, batch_size: int, num_batches: int, generator=None, data_dir=None,
              dot_intensity: int = INK, path_length=None) -> Task:
    """The Pathfinder task: ``n = side**2`` pixel tokens (LRA Pathfinder-32: ``n = 1024``).

    Parameters
    ----------
    n : int
        A square ``side**2`` with ``16 <= side <= 64``; paths get ``side/3 .. 2 side/3`` pixels
        unless ``path_length`` says otherwise.
    batch_size, num_batches : int
    generator : torch.Generator, optional
        Source of all randomness.
    data_dir : ignored
        Generated, not read (every task factory has one signature).
    dot_intensity : int
        Intensity of the dots (default ``INK``, that of the paths; see :func:`generate_image`).
    path_length : (int, int), optional
        Shortest and longest path chain in pixels, ``4 <= first <= second``; default
        ``(max(side // 3, 4), max(2 * side // 3, 5))``.

    Returns
    -------
    approxlab.tasks.Task
        ``kind="classification"``, ``num_classes=2``, ``vocab_size=256``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks.pathfinder import make_task
    >>> task = make_task(n=256, batch_size=2, num_batches=1, generator=torch.Generator().manual_seed(0))
    >>> task.kind, task.num_classes, task.vocab_size, task.batches[0].input_ids.shape
    ('classification', 2, 256, torch.Size([2, 256]))
    """
    n = check_int(n, "n", low=256, high=4096)
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"`n` must be a square side**2 (Pathfinder-32: 1024); got {n}.")
    batch_size = check_int(batch_size, "batch_size", low=1)
    num_batches = check_int(num_batches, "num_batches", low=1)
    if path_length is None:
        path_length = (max(side // 3, 4), max(2 * side // 3, 5))
    if not (isinstance(path_length, (tuple, list)) and len(path_length) == 2):
        raise ValueError(f"`path_length` must be a pair (shortest, longest) of pixel counts; got {path_length!r}.")
    shortest = check_int(path_length[0], "path_length[0]", low=4, high=side)
    options = {"min_length": shortest, "max_length": check_int(path_length[1], "path_length[1]", low=shortest, high=side),
               "dot_intensity": dot_intensity}  # checked by generate_image
    batches = pathfinder_batches(num_batches, batch_size, side, generator=generator, **options)
    return Task(
        name="pathfinder",
        kind="classification",
        vocab_size=VOCAB_SIZE,
        num_classes=NUM_CLASSES,
        n=n,
        batches=batches,
        info={"side": side, "num_paths": 3, "dash_period": 4, "curvature": 0.3, **options},
    )
