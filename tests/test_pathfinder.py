"""Pathfinder generator (approxlab.tasks.pathfinder): labels right by construction."""

from collections import deque

import numpy as np
import pytest
import torch

from approxlab import tasks
from approxlab.tasks import pathfinder


def _connected(image, start, goal, reach=2):
    """Flood fill over drawn pixels, joining pixels at Chebyshev distance <= ``reach``
    (bridges the one-pixel gaps of the dashes)."""
    side = image.shape[0]
    seen = {start}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return True
        for dr in range(-reach, reach + 1):
            for dc in range(-reach, reach + 1):
                nxt = (r + dr, c + dc)
                if 0 <= nxt[0] < side and 0 <= nxt[1] < side and nxt not in seen and image[nxt]:
                    seen.add(nxt)
                    queue.append(nxt)
    return False


@pytest.mark.parametrize("seed", range(40))
def test_label_is_dot_connectivity_by_flood_fill(seed):
    """Label 1 iff a flood fill over the image's path pixels joins the two dots."""
    rng = np.random.default_rng(seed)
    for _ in range(5):
        image = pathfinder.generate_image(rng)
        assert image.pixels[image.dots[0]] == pathfinder.INK and image.pixels[image.dots[1]] == pathfinder.INK
        assert _connected(image.pixels, *image.dots) == bool(image.label)


def test_flood_fill_needs_the_gap_bridge():
    """The dashes really are dashed: without joining across one-pixel gaps, positive images
    usually fall apart (so the check above is not vacuous)."""
    rng = np.random.default_rng(0)
    broken = 0
    for _ in range(30):
        image = pathfinder.generate_image(rng, label=1)
        broken += not _connected(image.pixels, *image.dots, reach=1)
    assert broken >= 20


def test_distinct_paths_are_separated():
    rng = np.random.default_rng(1)
    for _ in range(20):
        image = pathfinder.generate_image(rng)
        cells = [np.array(sorted(pathfinder._footprint(p))) for p in image.paths]
        for i in range(len(cells)):
            for j in range(i + 1, len(cells)):
                gaps = np.abs(cells[i][:, None, :] - cells[j][None, :, :]).max(-1)
                assert int(gaps.min()) >= 3


def test_task_shapes_balance_and_seed():
    def build(seed):
        return tasks.make_task("pathfinder", n=1024, batch_size=8, num_batches=3,
                               generator=torch.Generator().manual_seed(seed))

    task = build(0)
    assert task.kind == "classification" and task.num_classes == 2 and task.vocab_size == 256
    for batch in task.batches:
        assert batch.input_ids.shape == (8, 1024) and batch.input_ids.dtype == torch.int64
        assert bool(batch.mask.all())
        assert int(batch.labels.sum()) == 4  # balanced batches
        assert set(batch.input_ids.unique().tolist()) <= {0, 255}
    again = build(0)
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(task.batches, again.batches))
    assert not torch.equal(task.batches[0].input_ids, build(1).batches[0].input_ids)


def test_flattened_row_major():
    task = tasks.make_task("pathfinder", n=256, batch_size=2, num_batches=1, generator=torch.Generator().manual_seed(3))
    assert task.info["side"] == 16
    assert task.batches[0].input_ids.shape == (2, 256)


def test_bad_n():
    with pytest.raises(ValueError, match=r"`n` must be a square side\*\*2 \(Pathfinder-32: 1024\); got 1000"):
        tasks.make_task("pathfinder", n=1000, batch_size=2, num_batches=1)


@pytest.mark.parametrize("seed", range(5))
def test_dot_intensity_marks_exactly_the_dots(seed):
    """``dot_intensity`` paints the two plus-shaped dots (10 pixels) and nothing else; the label
    is still the connectivity of the dots over every drawn pixel."""
    image = pathfinder.generate_image(np.random.default_rng(seed), dot_intensity=128)
    dots = {(r + dr, c + dc) for r, c in image.dots for dr, dc in pathfinder._PLUS}
    assert {tuple(p) for p in np.argwhere(image.pixels == 128)} == dots
    assert set(np.unique(image.pixels)) == {0, 128, pathfinder.INK}
    assert _connected(image.pixels, *image.dots) == bool(image.label)
    task = tasks.make_task("pathfinder", n=256, batch_size=2, num_batches=1, dot_intensity=128,
                           generator=torch.Generator().manual_seed(seed))
    assert int((task.batches[0].input_ids == 128).sum()) == 2 * 10 and task.info["dot_intensity"] == 128


@pytest.mark.parametrize("value", [0, 256, 1.5])
def test_bad_dot_intensity_names_the_parameter(value):
    with pytest.raises((ValueError, TypeError), match="dot_intensity"):
        tasks.make_task("pathfinder", n=256, batch_size=2, num_batches=1, dot_intensity=value)


def test_path_length_bounds_every_path():
    """``path_length=(4, 7)``: every chain (distractors too) has 4-7 pixels; bad pairs name the parameter."""
    task = tasks.make_task("pathfinder", n=256, batch_size=2, num_batches=1, path_length=(4, 7),
                           generator=torch.Generator().manual_seed(0))
    assert (task.info["min_length"], task.info["max_length"]) == (4, 7)
    rng = np.random.default_rng(0)
    lengths = {len(p) for _ in range(10) for p in pathfinder.generate_image(rng, side=16, min_length=4,
                                                                             max_length=7).paths}
    assert lengths <= {4, 5, 6, 7} and len(lengths) > 1
    for bad in ((3, 7), (7, 4), (4,), 5):
        with pytest.raises(ValueError, match="path_length"):
            tasks.make_task("pathfinder", n=256, batch_size=2, num_batches=1, path_length=bad)
