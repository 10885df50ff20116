"""The Text proxy (approxlab.tasks.text): WikiText-2 articles, labels right by construction, no leakage."""

import pytest
import torch

from approxlab import tasks
from approxlab.data.wikitext import load_wikitext, wikitext_articles
from approxlab.tasks import text


def _g(seed):
    return torch.Generator().manual_seed(seed)


def test_articles_partition_the_corpus():
    """Every line of the corpus is in exactly one article (its title line or its body), in order;
    the two formula lines that look like titles stay inside "Constant k filter"."""
    articles = wikitext_articles()
    rebuilt = []
    for title, body in articles:
        rebuilt += [f" = {title} = ", *body.split("\n")]
    assert rebuilt == load_wikitext().split("\n")
    assert len({title for title, _ in articles}) == len(articles) == 60
    assert " = 1 rad / s and a nominal impedance k = " in dict(articles)["Constant k filter"].split("\n")


def _windows(task):
    return [(bytes(ids.tolist()), int(label)) for batch in task.batches for ids, label in zip(batch.input_ids, batch.labels)]


def test_shapes_balanced_labels_and_seed():
    def build(seed):
        return tasks.make_task("text", n=256, batch_size=8, num_batches=3, generator=_g(seed))

    task = build(0)
    assert (task.name, task.kind, task.proxy, task.vocab_size, task.num_classes) == (
        "text", "classification", "wikitext-articles", 256, 10)
    for batch in task.batches:
        assert batch.input_ids.shape == (8, 256) and batch.input_ids.dtype == torch.int64
        assert bool(batch.mask.all()) and batch.labels.shape == (8,)
    labels = torch.cat([b.labels for b in task.batches])
    assert sorted(labels[:10].tolist()) == sorted(labels[10:20].tolist()) == list(range(10))  # balanced blocks
    assert all(torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
               for a, b in zip(task.batches, build(0).batches))
    assert not torch.equal(task.batches[0].input_ids, build(1).batches[0].input_ids)
    binary = text.make_task(n=64, batch_size=4, num_batches=1, num_articles=2, generator=_g(0))
    assert binary.num_classes == 2 and sorted(binary.batches[0].labels.tolist()) == [0, 0, 1, 1]


def test_labels_right_by_construction_and_no_leakage():
    """Each window is a passage of its labelled article's part of the split; no validation window
    occurs in any training part (the parts are disjoint byte ranges cut at a line end)."""
    train_parts = text.text_articles(10)
    validation_parts = text.text_articles(10, split="validation")
    full = dict(article for article in wikitext_articles())
    for (title, train_part), (same, validation_part) in zip(train_parts, validation_parts):
        assert title == same and train_part + validation_part == full[title].encode("utf-8")
        assert train_part.endswith(b"\n")
    for split, parts in (("train", train_parts), ("validation", validation_parts)):
        task = text.make_task(n=256, batch_size=16, num_batches=2, split=split, generator=_g(3))
        for window, label in _windows(task):
            assert window in parts[label][1]
            assert not any(window in part for i, (_, part) in enumerate(parts) if i != label)
            if split == "validation":
                assert not any(window in part for _, part in train_parts)


def test_validation_messages():
    with pytest.raises(ValueError, match=r"`n` must be at most 8024 .*validation part.*got 9000"):
        text.make_task(n=9000, batch_size=1, num_batches=1, split="validation")
    with pytest.raises(ValueError, match=r"`split` must be one of \['train', 'validation'\]; got 'test'"):
        text.make_task(n=64, batch_size=1, num_batches=1, split="test")
    with pytest.raises(ValueError, match="`num_articles` must be"):
        text.make_task(n=64, batch_size=1, num_batches=1, num_articles=61)
    with pytest.raises(ValueError, match="`n` must be"):
        text.make_task(n=1, batch_size=1, num_batches=1)
