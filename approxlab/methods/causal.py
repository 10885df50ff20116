r"""Causal (decoder) attention through the methods: which form each has, and the evaluation variant.

In a decoder, query :math:`i` attends keys :math:`j \le i` only: exact causal softmax attention is
:math:`(L\odot A)` renormalised by its row sums, with :math:`L` the lower-triangular all-ones pattern
(:func:`approxlab.kernels.causal_mask`). ``approximate(..., causal=...)`` takes one of

``causal=True`` -- **the method's own causal form**, from its literature, at the method's own cost:

=================  ======================================================================================
exact, kernelized  the masked dense matrix (causal softmax rows; :math:`L\odot C`)
yoso-e             the masked dense expectation :math:`L\odot\mathbb E[\mathcal B]`
performer          prefix sums of :math:`\phi(k_j)v_j^\top` and :math:`\phi(k_j)` (unidirectional FAVOR+,
                   Choromanski et al. 2021, Section 2.6), in chunks: :math:`O(n r p_v)`, no n x n array
informer           causal ProbSparse: selected queries get causal softmax rows (ProbMask), the others the
                   cumulative mean of V (Zhou et al. 2021; their code's ``V.cumsum`` with ``causal_lazy="sum"``)
topk, topp, quest  each query selects among keys ``j <= i`` (Quest: from the pages so far, its own page's
                   min/max over the tokens inserted so far)
=================  ======================================================================================

**Causal-only methods** (declared ``causal="only"``): the decode-time cache policies streaming-llm,
h2o and snapkv exist only as causal attention. Row :math:`i` sees what the policy keeps in the cache
when token :math:`i` is the current decode step (SnapKV: the prompt rows see the whole causal prefix,
the rows after the prompt see the compressed prompt and themselves). ``causal=False`` is refused for them.

With ``causal=True`` a method whose function takes ``key_mask`` may also get one: row :math:`i` then
attends keys :math:`j \le i` that are kept (a row with no such key, a padded query before the first
real token, has output 0).

``causal="mask-renormalise"`` -- **an evaluation variant, not a causal method**: the method's
*bidirectional* matrix :math:`\tilde S`, masked and renormalised,

.. math::

    \tilde O_i = \frac{\sum_{j\le i}\tilde S_{ij} v_j}{\sum_{j\le i}\tilde S_{ij}}.

It measures how well a method's bidirectional matrix approximates the causal one *on the causal
part*. It is not a decoder layer: the landmarks (segment means, sampled columns) of a Nyström factor
are pooled over all positions, so every row has seen future tokens, and its cost is that of the
bidirectional method plus the masked products. Those are computed by structure
(:func:`masked_matmat`): for the factored matrices the Nyström family returns (a rank-:math:`d`
product, with diagonal scalings and shifts), by prefix sums in :math:`O(n\,d\,p_v)`; for any other
operator by forming :math:`\tilde S` row block by row block, :math:`O(n^2)` products per head -- the
quadratic cost of the general case. It is what the methods without a causal form of their own
(skyformer-softmax, nystromformer, nystrom, spectral-shifting) are evaluated with in the decoder
study. Renormalising divides by :math:`\sum_{j\le i}\tilde S_{ij}`, which for a signed :math:`\tilde S`
can be near zero or negative (reported in ``info["row_sums"]``); a zero sum gives a non-finite output
and :func:`approxlab.approximate` raises ``FloatingPointError``.

Every other method (skyformer, yoso, linformer, ...) refuses ``causal`` with a message naming the
methods that have a causal form. A registered method declares its support with
``register(..., causal=...)`` (:data:`~approxlab.methods.CAUSAL_SUPPORT`).

Public API (used by :func:`approxlab.approximate`)::

    check_causal_support(spec, causal, q, k, key_mask=None) -> False | True | "mask-renormalise"
    mask_renormalise(result, v) -> Approximation
    masked_matmat(operator, x) -> Tensor             # (L . S) x, by the operator's structure
    causal_rows(operator, start, stop) -> Tensor      # rows start:stop of an operator, causal part kept
"""

from __future__ import annotations

import torch

from ..kernels import causal_mask
from ..operators import DenseOperator, DiagonalOperator, ProductOperator, SumOperator
from ._base import CAUSAL_ONLY, MASK_RENORMALISE, Approximation, MethodSpec
from .registry import causal_support

__all__ = ["check_causal_support", "mask_renormalise", "masked_matmat", "causal_rows", "CAUSAL_OPTIONS"]

CAUSAL_OPTIONS = (False, True, MASK_RENORMALISE)
"""The values of ``approximate(..., causal=...)``."""

_BLOCK_ELEMENTS = 1 << 22
"""Entries of the ``(*batch, block, n)`` row block formed at once by the generic path of :func:`masked_matmat`."""

_CHUNK = 64
"""Positions per chunk of the prefix sums of :func:`masked_matmat`'s low-rank path."""


def _supported_text() -> str:
    own = causal_support(True)
    variant = causal_support(MASK_RENORMALISE)
    return (f"methods with a causal form of their own (causal=True): {own}; methods with only the evaluation "
            f"variant causal={MASK_RENORMALISE!r} (approximate bidirectionally, then mask and renormalise): {variant}")


def _causal_only_text() -> str:
    return (f"causal-only methods (decode-time cache policies: row i sees what the cache keeps when token i is "
            f"decoded; sparse-prefill patterns: row i sees the keys j <= i of its pattern): "
            f"{causal_support(CAUSAL_ONLY)}")


def check_causal_support(spec: MethodSpec, causal, q: torch.Tensor, k: torch.Tensor, key_mask=None):
    """``causal`` validated against method ``spec`` and the shapes; returns it.

    Raises
    ------
    ValueError
        ``causal`` not among :data:`CAUSAL_OPTIONS`; causal with ``n != m`` keys (causal attention is
        self-attention); ``"mask-renormalise"`` together with ``key_mask``; ``causal=False`` for a
        causal-only method; a method that does not declare the requested form (the message names the
        methods that have each form).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods import get
    >>> from approxlab.methods.causal import check_causal_support
    >>> q = torch.zeros(1, 4, 2, dtype=torch.float64)
    >>> check_causal_support(get("performer"), True, q, q)  # performer has a causal form of its own
    True
    >>> check_causal_support(get("nystromformer"), "mask-renormalise", q, q)
    'mask-renormalise'
    >>> check_causal_support(get("nystromformer"), True, q, q)
    Traceback (most recent call last):
    ...
    ValueError: method 'nystromformer' has no causal form of its own; ...
    """
    if not (causal is False or causal is True or (isinstance(causal, str) and causal == MASK_RENORMALISE)):
        raise ValueError(f"`causal` must be one of {list(CAUSAL_OPTIONS)}; got {causal!r}.")
    if causal is False:
        if spec.causal_only:
            raise ValueError(f"method {spec.name!r} is causal-only: pass causal=True. {_causal_only_text()}; "
                             "got causal=False.")
        return False
    if q.shape[-2] != k.shape[-2]:
        raise ValueError("`causal` needs self-attention (as many keys as queries: query i attends keys j <= i); "
                         f"got {q.shape[-2]} queries and {k.shape[-2]} keys.")
    if key_mask is not None and causal == MASK_RENORMALISE:
        raise ValueError(f"pass `key_mask` or causal={MASK_RENORMALISE!r}, not both: the variant renormalises "
                         "the bidirectional matrix, whose landmarks a mask would change; got both.")
    if causal is True and (spec.causal is True or spec.causal_only):
        return True
    if spec.causal is causal or (isinstance(spec.causal, str) and spec.causal == causal):
        return causal
    if causal is True and spec.causal == MASK_RENORMALISE:
        raise ValueError(f"method {spec.name!r} has no causal form of its own; it can be evaluated with "
                         f"causal={MASK_RENORMALISE!r} (its bidirectional matrix, which has seen future tokens, "
                         f"masked and renormalised). {_supported_text()}; got causal=True.")
    if causal is not True and (spec.causal is True or spec.causal_only):
        raise ValueError(f"method {spec.name!r} has a causal form of its own: pass causal=True, not "
                         f"{MASK_RENORMALISE!r}. {_supported_text()}; got causal={causal!r}.")
    raise ValueError(f"method {spec.name!r} does not support causal attention. {_supported_text()}; "
                     f"got causal={causal!r}.")


def causal_rows(operator, start: int, stop: int) -> torch.Tensor:
    r"""Rows ``start:stop`` of ``operator`` ``(*batch, n, n)`` with the entries above the diagonal set to 0.

    Formed as :math:`(S^\top E)^\top` for the unit columns :math:`E = [e_{start}, \dots, e_{stop-1}]`
    (one ``rmatmat``), so any :class:`~approxlab.operators.LinearOperator` works:
    ``(*batch, stop - start, n)``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.operators import DenseOperator
    >>> causal_rows(DenseOperator(torch.ones(1, 3, 3)), 1, 3)
    tensor([[[1., 1., 0.],
             [1., 1., 1.]]])
    """
    n = operator.shape[-1]
    units = torch.zeros(*operator.shape[:-2], n, stop - start, dtype=operator.dtype, device=operator.device)
    units[..., torch.arange(start, stop), torch.arange(stop - start)] = 1.0
    rows = operator.rmatmat(units).transpose(-1, -2)
    keep = causal_mask(stop - start, n, row_offset=start, device=rows.device)
    return rows * keep.to(rows.dtype)


def _factors(op) -> list:
    """The factors of a (nested) :class:`ProductOperator`, flattened, left to right."""
    if isinstance(op, ProductOperator):
        return [f for factor in op.factors for f in _factors(factor)]
    return [op]


def _low_rank_masked(left: torch.Tensor, right: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    r""":math:`(L\odot UW)x` for ``left`` :math:`U` ``(*b, n, r)``, ``right`` :math:`W` ``(*b, r, n)``: prefix
    sums of :math:`W_{:,j}x_j^\top` in chunks, :math:`O(n\,r\,c)`."""
    n = left.shape[-2]
    batch = torch.broadcast_shapes(left.shape[:-2], right.shape[:-2], x.shape[:-2])
    state = x.new_zeros(*batch, right.shape[-2], x.shape[-1])  # sum_{j < start} W_{:, j} x_j^T
    out = []
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        rows, columns, values = left[..., start:stop, :], right[..., start:stop], x[..., start:stop, :]
        out.append(rows @ state + (rows @ columns).tril() @ values)
        state = state + columns @ values
    return torch.cat(out, dim=-2)


def _blocked_masked(op, x: torch.Tensor) -> torch.Tensor:
    """:math:`(L\\odot S)x` of any operator, from its rows in blocks (:func:`causal_rows`), :math:`O(n^2)`."""
    n = op.shape[-1]
    batch = max(1, int(torch.Size(op.shape[:-2]).numel()))
    block = max(1, min(n, _BLOCK_ELEMENTS // max(1, n * batch)))
    return torch.cat([causal_rows(op, start, min(start + block, n)) @ x for start in range(0, n, block)], dim=-2)


def _product_masked(op: ProductOperator, x: torch.Tensor):
    """The low-rank path for ``D_1 U (W_1 ... W_k) D_2``, or None when ``op`` has no such form."""
    factors = _factors(op)
    row_scale, n = None, op.shape[-2]
    while len(factors) > 1 and isinstance(factors[0], DiagonalOperator):
        diag = factors.pop(0).diag
        row_scale = diag if row_scale is None else row_scale * diag
    while len(factors) > 1 and isinstance(factors[-1], DiagonalOperator):
        x = factors.pop().matmat(x)  # (L . (M D)) x = (L . M)(D x)
    first = factors[0]
    if len(factors) < 2 or not isinstance(first, DenseOperator) or first.shape[-1] >= n:
        return None
    rank = first.shape[-1]
    eye = torch.eye(rank, dtype=op.dtype, device=op.device)
    right = ProductOperator(*factors[1:]).rmatmat(eye.expand(*factors[-1].shape[:-2], rank, rank))
    out = _low_rank_masked(first.matrix, right.transpose(-1, -2), x)
    return out if row_scale is None else row_scale.unsqueeze(-1) * out


def masked_matmat(operator, x: torch.Tensor) -> torch.Tensor:
    r""":math:`(L\odot S)\,x`: the causal part of an ``(*batch, n, n)`` operator :math:`S` times ``x``.

    Parameters
    ----------
    operator : LinearOperator
        :math:`S`, square.
    x : torch.Tensor
        ``(*batch, n, c)``, in the operator's dtype.

    Returns
    -------
    torch.Tensor
        ``(*batch, n, c)``: row :math:`i` is :math:`\sum_{j\le i}S_{ij}x_j`.

    Notes
    -----
    By structure, so the factored matrices of the Nyström family never become ``n x n``:
    a :class:`~approxlab.operators.DiagonalOperator` is kept whole (the mask keeps the diagonal); a
    :class:`~approxlab.operators.SumOperator` is masked term by term; a
    :class:`~approxlab.operators.ProductOperator` :math:`D_1\,U\,(W_1\cdots W_k)\,D_2` with diagonal
    :math:`D_1, D_2` and a dense :math:`U` ``(n, r)``, :math:`r < n`, goes by prefix sums
    (:math:`(L\odot D_1UWD_2)x = D_1\,[(L\odot UW)(D_2x)]`, row :math:`i` is
    :math:`U_i\sum_{j\le i}W_{:,j}x_j^\top`, in chunks), :math:`O(n\,r\,c)`; a
    :class:`~approxlab.operators.DenseOperator` is its lower triangle times ``x``; any other operator
    goes by row blocks of :math:`S` (:func:`causal_rows`), :math:`O(n^2)` products, memory
    :math:`O(2^{22})` entries per block.

    Examples
    --------
    >>> import torch
    >>> from approxlab.operators import ProductOperator
    >>> u, w = torch.ones(1, 3, 1, dtype=torch.float64), torch.ones(1, 1, 3, dtype=torch.float64)
    >>> masked_matmat(ProductOperator(u, w), torch.ones(1, 3, 1, dtype=torch.float64)).flatten()
    tensor([1., 2., 3.], dtype=torch.float64)
    """
    if isinstance(operator, DiagonalOperator):
        return operator.matmat(x)
    if isinstance(operator, DenseOperator):
        return operator.matrix.tril() @ x
    if isinstance(operator, SumOperator):
        return sum(c * masked_matmat(a, x) for c, a in zip(operator.coefficients, operator.operators))
    if isinstance(operator, ProductOperator):
        out = _product_masked(operator, x)
        if out is not None:
            return out
    return _blocked_masked(operator, x)


def mask_renormalise(result: Approximation, v: torch.Tensor) -> Approximation:
    r"""The evaluation variant ``causal="mask-renormalise"`` of a bidirectional approximation.

    Parameters
    ----------
    result : Approximation
        The method's bidirectional result, with an operator or matrix :math:`\tilde S`
        ``(*batch, n, n)`` (target softmax attention).
    v : torch.Tensor
        ``(*batch, n, p_v)``, the values.

    Returns
    -------
    Approximation
        Same method and target; ``output`` :math:`\tilde O_i = \sum_{j\le i}\tilde S_{ij}v_j /
        \sum_{j\le i}\tilde S_{ij}`; ``operator()`` the dense masked, renormalised matrix (formed
        on request: :math:`n^2` entries per head); ``info``: the method's own, plus ``causal``
        (``"mask-renormalise"``) and ``row_sums`` ``(*batch, n)``, the masked row sums
        :math:`\sum_{j\le i}\tilde S_{ij}` (renormalisation divides by them; near zero, it amplifies).

    Notes
    -----
    The masked products :math:`(L\odot\tilde S)[V, \mathbf 1]` come from :func:`masked_matmat`
    (linear in :math:`n` for the factored matrices of the Nyström family, :math:`O(n^2)` for a general
    operator). A row scaling of :math:`\tilde S` (e.g. its own normaliser :math:`\tilde D^{-1}`)
    cancels. See the module docstring for why this is an evaluation variant, not a causal method.

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods import Approximation
    >>> uniform = torch.full((1, 3, 3), 1 / 3, dtype=torch.float64)
    >>> v = torch.tensor([[[3.0], [6.0], [9.0]]], dtype=torch.float64)
    >>> mask_renormalise(Approximation("uniform", "softmax", uniform @ v, matrix=uniform), v).output.flatten()
    tensor([3.0000, 4.5000, 6.0000], dtype=torch.float64)
    """
    operator = result.operator()
    n = operator.shape[-1]
    values = v.to(operator.dtype)
    batch = torch.broadcast_shapes(operator.shape[:-2], values.shape[:-2])
    ones = values.new_ones(*batch, n, 1)
    both = masked_matmat(operator, torch.cat([values.expand(*batch, n, values.shape[-1]), ones], dim=-1))
    numerators, row_sums = both[..., :-1], both[..., -1]
    output = (numerators / row_sums.unsqueeze(-1)).to(result.output.dtype)

    def build_operator():
        rows = causal_rows(operator, 0, n)
        return DenseOperator(rows / rows.sum(-1, keepdim=True))

    info = {**result.info, "causal": MASK_RENORMALISE, "row_sums": row_sums}
    return Approximation(result.method, result.target, output, build_operator, info)
