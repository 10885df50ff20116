r"""Key tokens of a long text: the tokens whose prediction needs distant context (LongPPL).

A long-context method can leave the perplexity of a text almost unchanged while losing what only a distant token
tells, because most tokens are predicted from the last few hundred. LongPPL (Fang et al., 2025) scores only the
*key tokens*, those whose log-probability with the full context exceeds that with a truncated one:

.. math::

    \mathrm{LSD}(x_i) = \log p(x_i \mid x_{<i}) - \log p(x_i \mid x_{i-s'..i-1}), \qquad
    \mathrm{LCL}(x_i) = \log p(x_i \mid x_{<i}),

token :math:`i` being key when :math:`\mathrm{LSD}(x_i) > \alpha` and :math:`\mathrm{LCL}(x_i) > \beta`
(the paper's Eq. (3)-(4), :math:`\alpha = 2`, :math:`\beta = -2`). The truncated context is computed as the
paper's code does, by a sliding window: the predictions of positions :math:`a, \dots, a + w - 1` read the
:math:`s` tokens before :math:`a` and the window itself (:math:`s \le s' < s + w`), one forward pass of
:math:`s + w` tokens per window. :func:`key_tokens` returns both log-likelihoods and the mask;
:meth:`KeyTokens.delta` the change in NLL on the key tokens beside that on all tokens.

References
----------
.. [1] L. Fang, Y. Wang, Z. Liu, C. Zhang, S. Jegelka, J. Gao, B. Ding and Y. Wang, "What is wrong with
   perplexity for long-context language modeling?", ICLR 2025 (arXiv:2410.23771); code
   ``PKU-ML/LongPPL``, ``longppl/longppl.py`` (``trunc_len``, ``sliding_window``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validation import check_int
from .likelihood import token_nll

__all__ = ["key_tokens", "KeyTokens", "LSD_THRESHOLD", "LCL_THRESHOLD"]

LSD_THRESHOLD = 2.0
r""":math:`\alpha`: a key token's log-probability gains more than this (nats) from the distant context."""

LCL_THRESHOLD = -2.0
r""":math:`\beta`: a key token's log-probability with the full context exceeds this (nats)."""


@dataclass(frozen=True)
class KeyTokens:
    """What :func:`key_tokens` found, per predicted token: ``(S, n - 1)`` each, entry ``i`` predicting token
    ``i + 1`` (:func:`~approxlab.patching.token_nll`'s convention).

    Attributes
    ----------
    nll : torch.Tensor
        Float64 NLL with the full context.
    nll_short : torch.Tensor
        Float64 NLL with the truncated context (equal to ``nll`` for the first ``short_context + stride``
        predictions, whose window's context is the whole text before them).
    mask : torch.Tensor
        Bool, the key tokens.
    short_context, stride : int
    lsd_threshold, lcl_threshold : float

    Examples
    --------
    Built by hand (:func:`key_tokens` builds it from a model): token 1 gains 3 nats from the distant context and is
    predicted well with it, so it alone is key.

    >>> import torch
    >>> from approxlab.patching.key_tokens import KeyTokens
    >>> nll = torch.tensor([[1.0, 0.5, 1.0, 1.0]], dtype=torch.float64)
    >>> short = torch.tensor([[1.0, 3.5, 1.5, 1.0]], dtype=torch.float64)
    >>> found = KeyTokens(nll, short, (short - nll > 2.0) & (-nll > -2.0), short_context=1, stride=1,
    ...                   lsd_threshold=2.0, lcl_threshold=-2.0)
    >>> found.mask
    tensor([[False,  True, False, False]])
    >>> patched = nll + torch.tensor([[0.0, 2.0, 0.0, 0.0]], dtype=torch.float64)  # a method loses token 1
    >>> change = found.delta(patched, nll)
    >>> change["key"].tolist(), change["all"].tolist(), change["key_tokens"].tolist()
    ([2.0], [0.5], [1])
    """

    nll: torch.Tensor
    nll_short: torch.Tensor
    mask: torch.Tensor
    short_context: int
    stride: int
    lsd_threshold: float
    lcl_threshold: float

    def delta(self, nll: torch.Tensor, reference: torch.Tensor) -> dict:
        r"""``{"key": (S,), "all": (S,), "key_tokens": (S,)}``: the mean of ``nll - reference`` over the key
        tokens (NaN for a sequence without one) and over all tokens, and the number of key tokens.

        ``nll`` and ``reference`` are ``(S, t)`` NLLs of the last ``t`` predictions (``t <= n - 1``; e.g. a
        continuation's, :attr:`approxlab.patching.Continuation.nll`, or a whole sequence's), aligned with the last
        ``t`` entries of :attr:`mask`.
        """
        if nll.shape != reference.shape or nll.ndim != 2 or nll.shape[0] != self.mask.shape[0] \
                or nll.shape[1] > self.mask.shape[1]:
            raise ValueError(f"`nll` and `reference` must be (S, t) with S = {self.mask.shape[0]} and t <= "
                             f"{self.mask.shape[1]}; got {tuple(nll.shape)} and {tuple(reference.shape)}.")
        difference = (nll - reference).to(torch.float64)
        mask = self.mask[:, self.mask.shape[1] - nll.shape[1]:]
        count = mask.sum(dim=-1)
        key = torch.where(count > 0, (difference * mask).sum(dim=-1) / count.clamp_min(1), torch.nan)
        return {"key": key, "all": difference.mean(dim=-1), "key_tokens": count}


def key_tokens(model, input_ids: torch.Tensor, *, short_context: int, stride: int | None = None,
               lsd_threshold: float = LSD_THRESHOLD, lcl_threshold: float = LCL_THRESHOLD) -> KeyTokens:
    r"""The key tokens of ``input_ids`` for ``model`` (the module docstring gives the definition).

    Parameters
    ----------
    model : transformers.PreTrainedModel or LoadedModel
        A causal language model (as :func:`~approxlab.patching.token_nll` takes it); run unpatched.
    input_ids : torch.Tensor
        ``(S, n)`` token ids.
    short_context : int
        :math:`s`, the tokens a truncated prediction reads before its window (``1 <= s <= n - 2``); LongPPL
        uses 4,096 for texts of 32k tokens.
    stride : int, optional
        :math:`w`, the predictions per window (default ``max(1, s // 4)``, LongPPL's 1,024 for 4,096).
    lsd_threshold, lcl_threshold : float
        :math:`\alpha` and :math:`\beta` (:data:`LSD_THRESHOLD`, :data:`LCL_THRESHOLD`).

    Returns
    -------
    KeyTokens

    Raises
    ------
    TypeError, ValueError
        As :func:`~approxlab.patching.token_nll`; ``short_context`` or ``stride`` not an integer in range.

    Examples
    --------
    >>> import torch
    >>> from transformers import LlamaConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.patching.key_tokens import key_tokens
    >>> config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    >>> model = load_model("initialized", config=config, seed=0)
    >>> ids = torch.randint(30522, (1, 64), generator=torch.Generator().manual_seed(0))
    >>> found = key_tokens(model, ids, short_context=16, stride=8)
    >>> found.mask.shape, bool(torch.equal(found.nll[:, :16], found.nll_short[:, :16]))
    (torch.Size([1, 63]), True)
    """
    full = token_nll(model, input_ids)
    n = input_ids.shape[1]
    short_context = check_int(short_context, "short_context", low=1, high=max(1, n - 2))
    stride = check_int(max(1, short_context // 4) if stride is None else stride, "stride", low=1)
    short = full.clone()
    for start in range(short_context, n - 1, stride):  # predictions of positions start .. start + stride - 1
        stop = min(start + stride, n - 1)
        window = token_nll(model, input_ids[:, start - short_context:stop + 1])
        short[:, start:stop] = window[:, short_context:]
    mask = (short - full > lsd_threshold) & (-full > lcl_threshold)
    return KeyTokens(full, short, mask, short_context, stride, float(lsd_threshold), float(lcl_threshold))
