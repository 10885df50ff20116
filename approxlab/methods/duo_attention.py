r"""DuoAttention (Xiao et al., ICLR 2025): retrieval heads attend the whole causal prefix, streaming heads sinks and a window.

The split of heads is given (``retrieval_heads``), or taken from attention statistics (:func:`duo_head_split`):
the authors learn one gate per head on synthetic retrieval data, which is per model; approxlab's documented
substitute ranks heads by the causal attention mass a streaming head would drop.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_int, check_positive_float
from ._base import CAUSAL_ONLY, method
from ._mask_attention import mask_approximation
from ._sparse_attention import attend_vertical_slash, causal_attention_with_lse

__all__ = ["duo_attention", "DUO_ATTENTION", "duo_head_split", "dropped_mass", "DEFAULT_SINKS"]

DEFAULT_SINKS = 64
"""The authors' ``sink_size`` (their ``recent_size`` is 256: ``num_features = 320`` is their streaming head)."""


def _streaming(start: int, stop: int, sinks: int, window: int, device, keys: int | None = None) -> torch.Tensor:
    """``(stop - start, keys)`` bool (``keys`` default ``stop``): the keys ``j <= i`` a streaming head keeps,
    ``j < sinks`` or ``i - j < window``, for rows ``start:stop``."""
    columns = torch.arange(stop if keys is None else keys, device=device)
    offset = torch.arange(start, stop, device=device).unsqueeze(-1) - columns
    return (offset >= 0) & ((offset < window) | (columns < sinks))


def _sizes(budget: int, sinks: int) -> tuple[int, int]:
    """``(sinks, window)`` of a streaming head with ``budget`` keys: StreamingLLM's rule, sinks below the budget."""
    first = min(check_int(sinks, "sinks", low=0), budget - 1)
    return first, budget - first


STREAMING_BLOCK = 64
"""Query rows per block of the streaming heads' sparse attention (:func:`~._sparse_attention.attend_vertical_slash`)."""


def _both_routes(q, k, v, sinks: int, window: int):
    """``(full, streaming, dropped)``: every head's exact causal output (the fused kernel) and streaming output (sinks
    and window, sparse), ``(*batch, n, p_v)`` each, and the mean dropped mass ``(*batch,)`` from their
    log-normalisers."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n = k.shape[-2]
    positions = torch.arange(n, device=q.device)
    streaming, kept = attend_vertical_slash(q, k, v, positions < sinks, positions < window,
                                            block_size=STREAMING_BLOCK, return_lse=True)
    full, every = causal_attention_with_lse(*(x.expand(*batch, *x.shape[-2:]).reshape(-1, *x.shape[-2:])
                                              for x in (q, k, v)))
    dropped = -torch.expm1(kept - every.view(*batch, n)).sum(-1) / n
    return full.view(*batch, n, -1), streaming, dropped


def dropped_mass(q, k, *, sinks: int = DEFAULT_SINKS, window: int = 256) -> torch.Tensor:
    r"""The mean over rows of the causal attention mass a streaming head drops,
    :math:`\delta = \frac1n\sum_i \sum_{j \le i,\ j \ge s,\ i - j \ge w} A_{ij}`, ``(*batch,)``, in the log
    domain: :math:`1 - \exp(\operatorname{lse}_{\text{kept}} - \operatorname{lse}_{\text{all}})`, the first from
    the streaming heads' sparse attention (:math:`O(n(s + w)p)`), the second from torch's fused causal kernel.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(8, 2, dtype=torch.float64)  # uniform rows: row i drops max(0, i - 2) / (i + 1)
    >>> round(float(dropped_mass(q, k, sinks=1, window=2)), 4)  # (1/4 + 2/5 + 3/6 + 4/7 + 5/8) / 8
    0.2933
    """
    return _both_routes(q, k, k, sinks, window)[2]


def duo_head_split(q, k, *, sinks: int = DEFAULT_SINKS, window: int = 256,
                   retrieval_fraction: float = 0.5) -> torch.Tensor:
    r"""A head split from attention statistics: the heads (the last batch dimension of ``q``/``k``) whose
    :func:`dropped_mass` is largest are retrieval heads, :math:`\lfloor fH + 1/2\rfloor` of :math:`H` for
    :math:`f` = ``retrieval_fraction`` (the authors' 0.5 sparsity keeps half); bool ``(*batch,)``, True on
    retrieval heads. Run on calibration text and pass the result as ``retrieval_heads``, or let
    :func:`duo_attention` run it on its own inputs. Inputs without a batch dimension are one head.

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k = torch.randn(2, 4, 64, 8, generator=g), torch.randn(2, 4, 64, 8, generator=g)  # 2 sequences, 4 heads
    >>> split = duo_head_split(q, k, sinks=4, window=8, retrieval_fraction=0.25)
    >>> mass = dropped_mass(q, k, sinks=4, window=8)
    >>> split.sum(-1).tolist(), torch.equal(split, mass == mass.amax(-1, keepdim=True))  # one head each: the most
    ([1, 1], True)
    """
    mass = dropped_mass(q, k, sinks=check_int(sinks, "sinks", low=0), window=check_int(window, "window", low=1))
    return _top_heads(mass, retrieval_fraction)


def _top_heads(mass: torch.Tensor, retrieval_fraction) -> torch.Tensor:
    """:func:`duo_head_split` from the dropped masses ``(*batch,)``."""
    fraction = check_positive_float(retrieval_fraction, "retrieval_fraction", allow_zero=True)
    if fraction > 1:
        raise ValueError(f"`retrieval_fraction` must be in [0, 1]; got {retrieval_fraction!r}.")
    if mass.dim() == 0:
        return mass.new_tensor(math.floor(fraction + 0.5) == 1, dtype=torch.bool)
    heads = mass.shape[-1]
    count = math.floor(fraction * heads + 0.5)
    split = torch.zeros_like(mass, dtype=torch.bool)
    return split.scatter_(-1, mass.topk(count, dim=-1).indices, True) if count else split


@method("duo-attention", target="softmax", features="keys per query of a streaming head: sinks plus recent tokens",
        randomized=False, causal=CAUSAL_ONLY)
def duo_attention(q, k, v, *, num_features, generator=None, retrieval_heads=None, sinks=DEFAULT_SINKS,
                  retrieval_fraction=0.5, causal=True):
    r"""DuoAttention's causal prefill: full causal attention on retrieval heads, sinks plus window on streaming heads.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``; the last batch dimension is the heads.
    num_features : int
        A streaming head's keys per query :math:`b` (``1 <= b <= n``): :math:`s = \min(\text{sinks}, b-1)` sinks
        and a window of :math:`b - s` recent tokens, itself included (the authors' 64 + 256 at :math:`b = 320`).
    generator : torch.Generator, optional
        Unused (deterministic).
    retrieval_heads : torch.Tensor, optional
        Bool, broadcastable to the batch shape (e.g. ``(heads,)``), True on retrieval heads. Default: the split
        :func:`duo_head_split` finds on these inputs (``retrieval_fraction`` of the heads).
    sinks : int, default 64
        The streaming heads' attention sinks (the authors' ``sink_size``).
    retrieval_fraction : float, default 0.5
        With ``retrieval_heads=None``: the share of retrieval heads (the authors' ``sparsity`` 0.5 leaves half).
    causal : bool, default True
        Must be True: causal only (``approximate(..., causal=True)``).

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a :class:`~approxlab.operators.RowSparseOperator`
        (formed on request); ``info``: ``retrieval_heads`` (the split used), ``sinks``, ``recent``.

    Notes
    -----
    Section 3 of the paper: head :math:`h` with gate :math:`\alpha_h` attends
    :math:`S_i = \{j \le i\}` (retrieval) or :math:`S_i = \{j \le i : j < s\} \cup \{j : i - w < j \le i\}`
    (streaming, StreamingLLM's pattern, tested equal to ``streaming-llm``), exact softmax over :math:`S_i`.
    The authors learn :math:`\alpha_h` by optimising a mixed output on synthetic passkey data and keep the
    heads of largest gate (``sparsify_attention_heads``); that training is per model. The substitute here
    (:func:`duo_head_split`) ranks heads by the mass streaming attention would drop on the given text -- the
    quantity their gate trades against -- which needs no training and is computed once on calibration text.

    **Where the published code departs** (mit-han-lab/duo-attention): the gates come from training, not from
    attention statistics; its streaming heads during prefill attend block-sparse sinks and windows in chunks
    (``prefilling_chunk_size``), here row-exact (the streaming heads' sparse route: sinks and window gathered per
    query block of 64 rows, the element mask inside).

    **Cost**, as at inference (``retrieval_heads`` given): the retrieval heads torch's fused causal kernel,
    :math:`O(n^2 p)`; the streaming heads :math:`O(n(s + w + 63)p)`
    (:func:`~approxlab.methods._sparse_attention.attend_vertical_slash`: sinks and window only). Without
    ``retrieval_heads`` the split is found on these inputs: every head's exact causal attention and its
    log-normalisers from the fused kernel (one fused causal attention in all) and every head's streaming
    attention, whose log-normalisers give :func:`dropped_mass`; each head then keeps its own output -- the split
    costs about one causal attention, which the authors pay once per model, offline. The same outputs as the dense
    mask route (:func:`~approxlab.methods._mask_attention.attend_mask`) to rounding.

    References
    ----------
    Xiao, Tang, Zuo, Guo, Yang, Tang, Fu and Han, "DuoAttention: Efficient long-context LLM inference with
    retrieval and streaming heads", ICLR 2025 (arXiv:2410.10819); code mit-han-lab/duo-attention.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((4,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> split = torch.tensor([True, False, False, True])
    >>> approx = approxlab.approximate("duo-attention", q, k, v, num_features=8, causal=True, sinks=4,
    ...                                retrieval_heads=split)
    >>> exact = approxlab.exact_attention(q, k, v, causal=True)
    >>> float((approx.output[0] - exact[0]).abs().max()) < 1e-12, float((approx.output[1] - exact[1]).abs().max()) > 0
    (True, True)
    """
    if causal is not True:
        raise ValueError(f"duo-attention is causal-only: pass causal=True; got causal={causal!r}.")
    first, window = _sizes(num_features, sinks)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    output = None
    if retrieval_heads is None:  # the split from these inputs: both routes on every head, then each head's own
        full, streaming, dropped = _both_routes(q, k, v, first, window)
        retrieval_heads = _top_heads(dropped, retrieval_fraction)
        output = torch.where(retrieval_heads[..., None, None], full, streaming)
    elif not isinstance(retrieval_heads, torch.Tensor) or retrieval_heads.dtype != torch.bool:
        raise TypeError(f"`retrieval_heads` must be a bool tensor broadcastable to the batch shape {tuple(batch)}; "
                        f"got {retrieval_heads!r}.")
    try:
        split = retrieval_heads.to(q.device).expand(batch)
    except RuntimeError:
        raise ValueError(f"`retrieval_heads` must broadcast to the batch shape {tuple(batch)}; got shape "
                         f"{tuple(retrieval_heads.shape)}.") from None

    def visible(start, stop):
        return _streaming(start, stop, first, window, q.device) | (
            split[..., None, None] & torch.ones(stop - start, stop, dtype=torch.bool, device=q.device).tril(start))

    if output is None:  # retrieval heads keep every diagonal: the fused kernel's dense route
        positions = torch.arange(k.shape[-2], device=q.device)
        output = attend_vertical_slash(q, k, v, positions < first, (positions < window) | split[..., None],
                                       block_size=STREAMING_BLOCK)
    info = {"retrieval_heads": split, "sinks": first, "recent": window}
    return mask_approximation("duo-attention", q, k, v, visible, info, output)


DUO_ATTENTION = duo_attention
__test__ = {"duo_attention": duo_attention.function}  # doctest skips a MethodSpec: run its function's examples
