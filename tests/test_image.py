"""The Image proxy (approxlab.tasks.image): scikit-learn's digits as pixel sequences."""

import numpy as np
import pytest
import torch

from approxlab import tasks
from approxlab.tasks import image


def _g(seed):
    return torch.Generator().manual_seed(seed)


def test_shapes_labels_and_seed():
    def build(seed, **kw):
        return tasks.make_task("image", batch_size=8, num_batches=2, generator=_g(seed), **kw)

    task = build(0)
    assert (task.name, task.kind, task.proxy, task.vocab_size, task.num_classes, task.n) == (
        "image", "classification", "sklearn-digits", 256, 10, 1024)
    small = build(0, n=256)
    for batch in small.batches:
        assert batch.input_ids.shape == (8, 256) and batch.input_ids.dtype == torch.int64 and bool(batch.mask.all())
        assert 0 <= int(batch.input_ids.min()) and int(batch.input_ids.max()) <= 255
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(small.batches, build(0, n=256).batches))
    assert not torch.equal(small.batches[0].input_ids, build(1, n=256).batches[0].input_ids)


def test_labels_right_by_construction_and_epochs():
    """At side 8 a sequence is a shipped digit's grey levels (x 255/16) and carries that digit's label;
    one epoch of the validation split shows every validation image once."""
    from sklearn.datasets import load_digits

    shipped = load_digits()
    expected = np.rint(shipped.images * 255 / 16).astype(np.int64).reshape(len(shipped.target), 64)
    cut = len(shipped.target) - 359
    task = image.make_task(n=64, batch_size=359, num_batches=1, split="validation", generator=_g(2))
    ids, labels = task.batches[0].input_ids.numpy(), task.batches[0].labels.numpy()
    order = [int(np.flatnonzero((expected[cut:] == row).all(1))[0]) for row in ids]
    assert sorted(order) == list(range(359))  # each validation image exactly once
    assert (labels == shipped.target[cut:][order]).all()


def test_upsampling_keeps_the_digit():
    """Bilinear upsampling: the 2 x 2 block means of a 16 x 16 image follow the 8 x 8 original."""
    original, _ = image.digits(8, split="train")
    grown, _ = image.digits(16, split="train")
    blocks = grown.astype(np.float64).reshape(-1, 8, 2, 8, 2).mean((2, 4))
    correlation = np.corrcoef(blocks.ravel(), original.astype(np.float64).ravel())[0, 1]
    assert correlation > 0.95 and grown.shape == (1438, 16, 16)


def test_splits_share_no_image():
    train, _ = image.digits(split="train")
    validation, _ = image.digits(split="validation")
    assert len(train) + len(validation) == 1797
    assert not {a.tobytes() for a in train} & {a.tobytes() for a in validation}


def test_validation_messages():
    with pytest.raises(ValueError, match=r"`n` must be a square side\*\*2 .*got 300"):
        image.make_task(n=300, batch_size=1, num_batches=1)
    with pytest.raises(ValueError, match=r"`n` must be an integer with 64 <= n <= 4096; got 16"):
        image.make_task(n=16, batch_size=1, num_batches=1)
    with pytest.raises(ValueError, match="`split` must be one of"):
        image.make_task(n=64, batch_size=1, num_batches=1, split="test")
