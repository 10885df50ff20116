"""The Retrieval proxy (approxlab.tasks.retrieval): pairs labelled right by construction, split by article."""

import pytest
import torch

from approxlab import tasks
from approxlab.tasks import retrieval


def _g(seed):
    return torch.Generator().manual_seed(seed)


def test_shapes_balanced_labels_and_seed():
    def build(seed):
        return tasks.make_task("retrieval", n=128, batch_size=8, num_batches=2, generator=_g(seed))

    task = build(0)
    assert (task.name, task.kind, task.proxy, task.vocab_size, task.num_classes) == (
        "retrieval", "pair-classification", "wikitext-same-article", 256, 2)
    for batch in task.batches:
        assert batch.input_ids.shape == batch.mask.shape == (8, 2, 128) and batch.input_ids.dtype == torch.int64
        assert bool(batch.mask.all()) and int(batch.labels.sum()) == 4
    assert all(torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
               for a, b in zip(task.batches, build(0).batches))
    assert not torch.equal(task.batches[0].input_ids, build(1).batches[0].input_ids)


@pytest.mark.parametrize("split", ["train", "validation"])
def test_labels_right_by_construction_and_no_leakage(split):
    """Label 1 iff the two windows are passages of one article, at offsets at least n apart (they
    do not overlap); every window comes from an article of its own split and of no other."""
    n = 256
    own = [body for _, body in retrieval.retrieval_articles(split)]
    other = [body for _, body in retrieval.retrieval_articles("validation" if split == "train" else "train")]
    task = retrieval.make_task(n=n, batch_size=16, num_batches=2, split=split, generator=_g(5))
    for batch in task.batches:
        for pair, label in zip(batch.input_ids, batch.labels.tolist()):
            first, second = (bytes(ids.tolist()) for ids in pair)
            sources = [[i for i, body in enumerate(own) if window in body] for window in (first, second)]
            assert all(len(s) == 1 for s in sources)  # each window is one article's passage
            assert (sources[0] == sources[1]) == bool(label)
            if label:
                body = own[sources[0][0]]
                assert abs(body.find(first) - body.find(second)) >= n
            assert not any(window in body for window in (first, second) for body in other)


def test_split_is_by_article():
    train, validation = retrieval.retrieval_articles("train"), retrieval.retrieval_articles("validation")
    assert (len(train), len(validation)) == (48, 12)
    assert not {title for title, _ in train} & {title for title, _ in validation}


def test_validation_messages():
    with pytest.raises(ValueError, match=r"`n` must leave at least two validation articles with 2 n bytes; got n=40000"):
        retrieval.make_task(n=40000, batch_size=2, num_batches=1, split="validation")
    with pytest.raises(ValueError, match="`split` must be one of"):
        retrieval.make_task(n=64, batch_size=2, num_batches=1, split="dev")
    with pytest.raises(ValueError, match="`batch_size` must be"):
        retrieval.make_task(n=64, batch_size=0, num_batches=1)
