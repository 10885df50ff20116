"""WikiText-2's articles as UTF-8 bytes, and byte windows cut from them (the Text and Retrieval proxies).

Byte-level, as LRA's Text and Retrieval tasks are: a token is one byte of the UTF-8 text (ids
``0..255``, :data:`VOCAB_SIZE`), so a multi-byte character spans several tokens and a window may
start or end inside one. The articles are :func:`approxlab.data.wikitext.wikitext_articles`.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

__all__ = ["VOCAB_SIZE", "article_bytes", "window_ids"]

VOCAB_SIZE = 256
"""Byte values ``0..255``."""


@functools.lru_cache(maxsize=2)
def _article_bytes(data_dir) -> tuple:
    from ..data.wikitext import wikitext_articles

    return tuple((title, body.encode("utf-8")) for title, body in wikitext_articles(data_dir))


def article_bytes(data_dir=None) -> tuple:
    """``((title, body_bytes), ...)`` of every article, in corpus order (cached per ``data_dir``).

    Examples
    --------
    >>> from approxlab.tasks._articles import article_bytes
    >>> articles = article_bytes()
    >>> len(articles), articles[0][0], articles[0][1][:15]
    (60, 'Robert Boulter', b' Robert Boulter')
    """
    return _article_bytes(None if data_dir is None else str(data_dir))


def window_ids(data: bytes, offset: int, n: int) -> torch.Tensor:
    """The ``n`` bytes of ``data`` from ``offset`` as token ids ``(n,)`` int64.

    Examples
    --------
    >>> from approxlab.tasks._articles import window_ids
    >>> window_ids(b"abcdef", 2, 3)
    tensor([ 99, 100, 101])
    """
    if not 0 <= offset <= len(data) - n:
        raise ValueError(f"`offset` must be in [0, {len(data) - n}] for a window of n={n} bytes; got {offset}.")
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8, count=n, offset=offset).astype(np.int64))
