r"""Text: which WikiText-2 article a byte window comes from (stands in for LRA's byte-level IMDb).

LRA's Text task (Tay et al., 2020) classifies IMDb movie reviews (Maas et al., 2011) as positive
or negative from their UTF-8 bytes, truncated or padded to 1,000-4,000 bytes (Skyformer's code:
4,000). IMDb cannot be had offline; this proxy keeps what the task asks of an encoder -- a
document-level label read from bytes, where no single position decides and the evidence (here
the article's topic words and names, there the reviewer's sentiment words) is spread over the
whole sequence -- on the WikiText-2 test split that ships with approxlab
(:func:`approxlab.data.wikitext.wikitext_articles`, 60 Wikipedia articles).

* **Input**: a window of ``n`` consecutive bytes of one article's body (the title line left
  out, so the label is never spelt out), at a uniformly random offset; vocabulary 256 (bytes),
  no padding. The instability study uses ``n = 256``; LRA's Text uses up to 4,000.
* **Label**: which of the ``num_articles`` longest articles (default 10; ties broken by corpus
  order) the window comes from, numbered in corpus order. Labels are balanced: every ``K =
  num_articles`` consecutive examples hold each article once, in a random order, so the chance
  level (and the majority rate over whole blocks) is exactly ``1/K``: 0.1 by default. LRA's Text
  is binary (chance 0.5); ``num_articles=2`` gives a binary task.
* **Split** (no leakage): each article's body is cut once, at the line end nearest to
  ``1 - VALIDATION_FRACTION = 80%`` of its bytes; ``split="train"`` draws windows from the first
  part, ``split="validation"`` from the rest. A validation window shares no byte with any
  training window, so a model cannot score by remembering passages; it has to recognise an
  article from text it has not seen (its topic, names, vocabulary), as an IMDb classifier must
  read a review it has not seen. The cut depends on the corpus only, never on the generator.

Differences from LRA's Text: topic rather than sentiment, ``K`` classes rather than 2 by
default, windows cut from 60 articles rather than 50,000 whole reviews (training windows of one
article overlap one another), WikiText's tokenised spacing (``" @-@ "``, spaces around
punctuation) kept as it is.

References
----------
Tay, Y. et al. (2020). Long Range Arena: A benchmark for efficient transformers. ICLR 2021.

Maas, A. L. et al. (2011). Learning word vectors for sentiment analysis. ACL.

Merity, S., Xiong, C., Bradbury, J. and Socher, R. (2017). Pointer sentinel mixture models.
ICLR (WikiText-2).

Chen, Y., Zeng, Q., Ji, H. and Yang, Y. (2021). Skyformer. NeurIPS. Section 5 (Text among the
five LRA tasks) and Appendix F (Table 3).
"""

from __future__ import annotations

import torch

from .._validation import check_int
from ._articles import VOCAB_SIZE, article_bytes, window_ids
from ._base import VALIDATION_FRACTION, Batch, Task, check_split, numpy_rng, permutation_cycle

__all__ = ["PROXY", "VOCAB_SIZE", "article_split", "text_articles", "make_task"]

PROXY = "wikitext-articles"
"""The proxy's name in tables (the ``proxy`` field of the task)."""


def article_split(body: bytes) -> int:
    """Where an article's bytes are cut into its training and validation parts.

    Returns
    -------
    int
        The offset just after the line end (``b"\\n"``) nearest to ``(1 - VALIDATION_FRACTION)
        * len(body)``; ``body[:cut]`` is for training, ``body[cut:]`` for validation. Without a
        line end, the offset itself.

    Examples
    --------
    >>> from approxlab.tasks.text import article_split
    >>> body = b"first line\\nsecond line\\nthird\\nfourth line is long\\n"  # 80% of its 49 bytes: 39.2
    >>> cut = article_split(body)
    >>> cut, body[:cut][-6:], body[cut:]
    (29, b'third\\n', b'fourth line is long\\n')
    """
    target = round((1.0 - VALIDATION_FRACTION) * len(body))
    before, after = body.rfind(b"\n", 0, target) + 1, body.find(b"\n", target) + 1  # 0: none on that side
    ends = [end for end in (before, after) if 0 < end < len(body)]
    return min(ends, key=lambda end: (abs(end - target), end)) if ends else target


def text_articles(num_articles: int = 10, *, split: str = "train", data_dir=None) -> list[tuple[str, bytes]]:
    """The task's articles in label order: ``(title, bytes of the split's part)``.

    Parameters
    ----------
    num_articles : int
        The ``num_articles`` longest articles (ties: corpus order), ``2 <= num_articles <= 60``;
        label ``i`` is the ``i``-th of them in corpus order.
    split : {"train", "validation"}
        The part of each article (see :func:`article_split`).
    data_dir : path, optional
        Where the corpus is (default: the copy shipped with approxlab).

    Examples
    --------
    >>> from approxlab.tasks.text import text_articles
    >>> train = text_articles(3)
    >>> [title for title, _ in train]
    ['Ironclad warship', 'American Beauty ( 1999 film )', 'Manila']
    >>> validation = text_articles(3, split="validation")
    >>> [round(len(v) / (len(t) + len(v)), 3) for (_, t), (_, v) in zip(train, validation)]  # about 20% each
    [0.192, 0.201, 0.199]
    """
    articles = article_bytes(data_dir)
    num_articles = check_int(num_articles, "num_articles", low=2, high=len(articles))
    split = check_split(split)
    longest = sorted(range(len(articles)), key=lambda i: (-len(articles[i][1]), i))[:num_articles]
    chosen = []
    for i in sorted(longest):
        title, body = articles[i]
        cut = article_split(body)
        chosen.append((title, body[:cut] if split == "train" else body[cut:]))
    return chosen


def make_task(*, n: int, batch_size: int, num_batches: int, generator=None, data_dir=None, split: str = "train",
              num_articles: int = 10) -> Task:
    """The Text proxy: which of ``num_articles`` WikiText-2 articles an ``n``-byte window comes from.

    Parameters
    ----------
    n : int
        Window length in bytes, ``>= 2``, at most the shortest part of a chosen article
        (validation parts of the 10 longest articles: 8,024 bytes or more).
    batch_size, num_batches : int
    generator : torch.Generator, optional
        Source of all randomness (the label order and the windows' offsets).
    data_dir : path, optional
        Where the corpus is (default: the copy shipped with approxlab).
    split : {"train", "validation"}
        Which part of each article the windows come from (disjoint; see the module docstring).
    num_articles : int
        Classes (default 10; LRA's Text has 2).

    Returns
    -------
    approxlab.tasks.Task
        ``name="text"``, ``kind="classification"``, ``vocab_size=256``,
        ``num_classes=num_articles``, ``proxy="wikitext-articles"``; batches ``(batch_size, n)``
        with no padding.

    Raises
    ------
    ValueError
        If a chosen article's part is shorter than ``n`` bytes.

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks.text import make_task
    >>> task = make_task(n=256, batch_size=4, num_batches=2, generator=torch.Generator().manual_seed(0))
    >>> task.name, task.proxy, task.kind, task.num_classes, task.vocab_size, task.batches[0].input_ids.shape
    ('text', 'wikitext-articles', 'classification', 10, 256, torch.Size([4, 256]))
    >>> bytes(task.batches[0].input_ids[0, :12].tolist())  # a window of an article's UTF-8 bytes
    b'...'
    """
    n = check_int(n, "n", low=2)
    batch_size = check_int(batch_size, "batch_size", low=1)
    num_batches = check_int(num_batches, "num_batches", low=1)
    articles = text_articles(num_articles, split=split, data_dir=data_dir)
    shortest = min(len(part) for _, part in articles)
    if n > shortest:
        raise ValueError(f"`n` must be at most {shortest} (the shortest {split} part of the {len(articles)} "
                         f"articles, in bytes); got {n}.")
    rng = numpy_rng(generator)
    count = batch_size * num_batches
    labels = torch.from_numpy(permutation_cycle(rng, len(articles), count)).to(torch.int64)
    ids = torch.stack([
        window_ids(articles[label][1], int(rng.integers(len(articles[label][1]) - n + 1)), n) for label in labels.tolist()
    ])
    batches = [Batch(chunk, torch.ones_like(chunk, dtype=torch.bool), y)
               for chunk, y in zip(ids.split(batch_size), labels.split(batch_size))]
    return Task(
        name="text",
        kind="classification",
        vocab_size=VOCAB_SIZE,
        num_classes=len(articles),
        n=n,
        batches=batches,
        info={"split": split, "articles": [title for title, _ in articles],
              "part_bytes": [len(part) for _, part in articles], "validation_fraction": VALIDATION_FRACTION},
        proxy=PROXY,
    )
