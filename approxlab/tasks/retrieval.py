r"""Retrieval: do two byte windows come from the same WikiText-2 article? (stands in for LRA's AAN).

LRA's Retrieval task (Tay et al., 2020) asks whether one paper of the ACL Anthology Network
(AAN; Radev et al., 2013) cites another, from the two documents' UTF-8 bytes (4,000 bytes each).
It is a two-tower task: each document is encoded *separately* by the same encoder, mean-pooled to
``u`` and ``v``, and the classifier sees ``[u, v, u * v, u - v]``, so the encoder has to compress
a whole document into one vector that relations can be read from. AAN cannot be had offline; this
proxy keeps the two towers and the pair label on the WikiText-2 test split that ships with
approxlab (:func:`approxlab.data.wikitext.wikitext_articles`, 60 Wikipedia articles):

* **Input**: two windows of ``n`` consecutive bytes (vocabulary 256, no padding), each an
  ``(n,)`` sequence of its own: batches are ``(batch, 2, n)``. The instability study uses ``n =
  256`` per document; LRA's Retrieval uses 4,000.
* **Label**: 1 when both windows come from one article (two windows that do not overlap, at
  random offsets, in a random order), 0 when from two different articles.
  Articles are drawn uniformly among those with at least ``2 n`` bytes (so article length says
  nothing about the label). Every two consecutive examples hold one of each label, in a random
  order: the chance level is exactly 0.5.
* **Split** (no leakage): by article. Every fifth article in corpus order (12 of 60, the share
  ``VALIDATION_FRACTION``) is for ``split="validation"``, the other 48 for ``split="train"``. A
  validation pair comes from articles the model never saw in training, so it cannot match pairs
  by remembering articles; it has to judge relatedness from the text (shared names, topic, style),
  as AAN's citation matching has to for papers outside its training pairs.

Why a fair proxy: both tasks are the relatedness of two long byte documents judged through one
pooled vector per document; "same article" is a strong, unambiguous form of relatedness (AAN's
citation links are noisier). Differences from LRA's Retrieval: windows of articles rather than
whole papers, 48 training articles rather than about 150,000 training pairs.

References
----------
Tay, Y. et al. (2020). Long Range Arena: A benchmark for efficient transformers. ICLR 2021
(``lra_benchmarks/matching``: the two-tower model and ``[u, v, u * v, u - v]``).

Radev, D. R., Muthukrishnan, P., Qazvinian, V. and Abu-Jbara, A. (2013). The ACL Anthology
Network corpus. Language Resources and Evaluation 47.

Chen, Y., Zeng, Q., Ji, H. and Yang, Y. (2021). Skyformer. NeurIPS. Section 5 and Appendix F.
"""

from __future__ import annotations

import torch

from .._validation import check_int
from ._articles import VOCAB_SIZE, article_bytes, window_ids
from ._base import VALIDATION_FRACTION, Batch, Task, check_split, numpy_rng, permutation_cycle

__all__ = ["PROXY", "VOCAB_SIZE", "NUM_CLASSES", "retrieval_articles", "make_task"]

PROXY = "wikitext-same-article"
"""The proxy's name in tables (the ``proxy`` field of the task)."""

NUM_CLASSES = 2


def retrieval_articles(split: str = "train", *, data_dir=None) -> list[tuple[str, bytes]]:
    """The articles of a split: ``(title, body bytes)``; validation holds every fifth article.

    Examples
    --------
    >>> from approxlab.tasks.retrieval import retrieval_articles
    >>> train, validation = retrieval_articles(), retrieval_articles("validation")
    >>> len(train), len(validation), validation[0][0]
    (48, 12, 'Dick Rifenburg')
    >>> set(title for title, _ in train) & set(title for title, _ in validation)  # no article in both
    set()
    """
    split = check_split(split)
    stride = round(1 / VALIDATION_FRACTION)
    return [article for i, article in enumerate(article_bytes(data_dir))
            if (i % stride == stride - 1) == (split == "validation")]


def make_task(*, n: int, batch_size: int, num_batches: int, generator=None, data_dir=None,
              split: str = "train") -> Task:
    """The Retrieval proxy: pairs of ``n``-byte windows, label 1 when both come from one article.

    Parameters
    ----------
    n : int
        Bytes per document, ``>= 2``; at least two of the split's articles must have ``2 n``
        bytes (validation: all 12 have 2,340 or more).
    batch_size, num_batches : int
    generator : torch.Generator, optional
        Source of all randomness (labels, articles, offsets, order within a pair).
    data_dir : path, optional
        Where the corpus is (default: the copy shipped with approxlab).
    split : {"train", "validation"}
        Which articles the pairs come from (disjoint; see the module docstring).

    Returns
    -------
    approxlab.tasks.Task
        ``name="retrieval"``, ``kind="pair-classification"``, ``vocab_size=256``,
        ``num_classes=2``, ``proxy="wikitext-same-article"``; batches ``(batch_size, 2, n)``.

    Raises
    ------
    ValueError
        If fewer than two of the split's articles have ``2 n`` bytes.

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks.retrieval import make_task
    >>> task = make_task(n=256, batch_size=4, num_batches=2, generator=torch.Generator().manual_seed(0))
    >>> task.name, task.proxy, task.kind, task.num_classes, task.batches[0].input_ids.shape
    ('retrieval', 'wikitext-same-article', 'pair-classification', 2, torch.Size([4, 2, 256]))
    >>> sorted(task.batches[0].labels.tolist())  # balanced
    [0, 0, 1, 1]
    """
    n = check_int(n, "n", low=2)
    batch_size = check_int(batch_size, "batch_size", low=1)
    num_batches = check_int(num_batches, "num_batches", low=1)
    articles = retrieval_articles(split, data_dir=data_dir)
    eligible = [body for _, body in articles if len(body) >= 2 * n]
    if len(eligible) < 2:
        raise ValueError(f"`n` must leave at least two {split} articles with 2 n bytes; got n={n}, which leaves "
                         f"{len(eligible)}.")
    rng = numpy_rng(generator)
    count = batch_size * num_batches
    labels = permutation_cycle(rng, NUM_CLASSES, count)
    pairs = []
    for label in labels.tolist():
        if label:
            body = eligible[int(rng.integers(len(eligible)))]
            first, second = sorted(rng.integers(len(body) - 2 * n + 1, size=2).tolist())
            offsets = [(body, first), (body, second + n)]  # disjoint: the second starts >= n later
            if rng.integers(2):
                offsets.reverse()
        else:
            a, b = rng.choice(len(eligible), size=2, replace=False).tolist()
            offsets = [(eligible[i], int(rng.integers(len(eligible[i]) - n + 1))) for i in (a, b)]
        pairs.append(torch.stack([window_ids(body, offset, n) for body, offset in offsets]))
    ids = torch.stack(pairs)
    labels = torch.from_numpy(labels).to(torch.int64)
    batches = [Batch(chunk, torch.ones_like(chunk, dtype=torch.bool), y)
               for chunk, y in zip(ids.split(batch_size), labels.split(batch_size))]
    return Task(
        name="retrieval",
        kind="pair-classification",
        vocab_size=VOCAB_SIZE,
        num_classes=NUM_CLASSES,
        n=n,
        batches=batches,
        info={"split": split, "articles": len(eligible), "validation_fraction": VALIDATION_FRACTION,
              "towers": 2, "combination": "[u, v, u * v, u - v]"},
        proxy=PROXY,
    )
