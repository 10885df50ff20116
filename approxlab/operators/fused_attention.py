r"""Exact attention through torch's fused attention kernel, as an output and as an operator.

:func:`softmax_attention` is :math:`\operatorname{softmax}(QK^\top/\sqrt p)\,V` through the fused
kernel; :class:`ExactAttentionOperator` applies the exact attention matrix (``A``, ``D^{-1}A`` or
the kernelized ``C``) and its adjoint without forming it ``n x m``: through the same kernel (the
adjoint swaps the roles of Q and K with the row log-sum-exps as a key bias) or in row blocks.
:func:`check_causal` validates the causal flag both use. :func:`attend_with_lse` (softmax attention with the
rows' log-sum-exps, a key bias and a causal or anti-causal mask, on the kernel) and :func:`flash_attention_cpu`
(torch's private CPU flash op, or ``None``) are the kernel calls both are built on, which the methods' own exact
parts (the sparse-prefill patterns) use too.
"""

from __future__ import annotations

import math

import torch

from .. import kernels
from .._validation import check_bool, check_choice, check_int, check_qkv
from .linear import LinearOperator

__all__ = ["ExactAttentionOperator", "softmax_attention", "check_causal",
           "attend_with_lse", "flash_attention_cpu"]


def check_causal(causal, q: torch.Tensor, k: torch.Tensor) -> bool:
    """Validate ``causal`` (a bool); causal attention needs as many keys as queries.

    The causal pattern is query ``i`` attending keys ``j <= i`` (self-attention of a decoder),
    so ``q: (*batch, n, p)`` and ``k: (*batch, m, p)`` must have ``n == m``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.operators import check_causal
    >>> q = torch.zeros(4, 2)
    >>> check_causal(True, q, q)
    True
    >>> check_causal(True, q, torch.zeros(5, 2))
    Traceback (most recent call last):
    ...
    ValueError: ...
    """
    causal = check_bool(causal, "causal")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            "`causal=True` needs self-attention (as many keys as queries: query i attends keys j <= i); "
            f"got {q.shape[-2]} queries and {k.shape[-2]} keys."
        )
    return causal


def flash_attention_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool = False):
    """torch's private CPU flash-attention op: ``(out, lse)`` on ``(B, H, T, h)``, or ``None``.

    The only call of ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`` in
    approxlab: a private op that can change between torch releases, so any absence or
    refusal (missing op, other device or dtype, changed signature) sends the caller to the
    public fallback in :func:`_attention_with_lse`.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(1, 1, 2, 4, dtype=torch.float64)
    >>> v = torch.tensor([[[[1.0, 0, 0, 0], [3.0, 0, 0, 0]]]], dtype=torch.float64)
    >>> found = flash_attention_cpu(q, k, v, 0.5, causal=True)
    >>> found is None or (found[0][..., 0].flatten().tolist(), [round(x, 4) for x in found[1].flatten().tolist()])
    ([1.0, 2.0], [0.0, 0.6931])
    """
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is None or q.device.type != "cpu" or q.dtype not in (torch.float32, torch.float64):
        return None
    try:
        out, lse = op(q, k, v, is_causal=causal, scale=scale)
    except (RuntimeError, TypeError):
        return None
    return out, lse


def _blocked_logsumexp(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool = False) -> torch.Tensor:
    """``logsumexp_j(scale * q_i . k_j)`` (over ``j <= i`` if ``causal``) for ``(B, H, n, h)`` inputs,
    in row blocks of ~2**22 entries."""
    rows = max(1, (1 << 22) // max(1, k.shape[-2] * q.shape[0] * q.shape[1]))
    blocks = []
    for a in range(0, q.shape[-2], rows):
        logits = scale * (q[..., a : a + rows, :] @ k.transpose(-1, -2))
        if causal:
            mask = kernels.causal_mask(logits.shape[-2], logits.shape[-1], row_offset=a, device=logits.device)
            logits = logits.masked_fill(~mask, float("-inf"))
        blocks.append(torch.logsumexp(logits, dim=-1))
    return torch.cat(blocks, dim=-1)


def _attention_with_lse(q, k, v, scale: float, need_lse: bool, causal: bool = False):
    """Fused softmax attention on ``(B, H, T, h)`` (equal head sizes): ``(out, lse or None)``.

    The private CPU flash kernel returns the row log-sum-exps beside the output; elsewhere
    (GPU, or a torch without the op) the public
    :func:`torch.nn.functional.scaled_dot_product_attention` gives the output and, when
    asked, the log-sum-exps come from a row-blocked ``logsumexp`` of the logits.
    """
    fused = flash_attention_cpu(q, k, v, scale, causal)
    if fused is not None:
        return fused[0], (fused[1] if need_lse else None)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal)
    return out, (_blocked_logsumexp(q, k, scale, causal) if need_lse else None)


_MASKS = (None, "causal", "anticausal")


def attend_with_lse(q, k, x, scale: float, key_bias=None, need_lse: bool = True, mask: str | None = None):
    r"""``(softmax_j(s_ij + b_j) x_j, logsumexp_j(s_ij + b_j))`` with :math:`s_{ij} = \text{scale}\,q_i\cdot k_j`.

    ``q: (B, n, p)``, ``k: (B, m, p)``, ``x: (B, m, c)``, ``key_bias: (B, m)`` or ``None``;
    returns ``(B, n, c)`` and ``(B, n)`` (``None`` unless ``need_lse``). A key bias rides in one extra coordinate
    (queries ``[scale q_i, 1]``, keys ``[k_j, b_j]``, scale 1). The kernel wants values of
    the head size ``h``: ``x`` is zero-padded to a multiple of ``h`` and its column chunks
    become heads of one call (``ceil(c / h)`` products with ``h`` columns each).

    ``mask`` (``n == m``): ``"causal"`` sums over :math:`j \le i` (the kernel's ``is_causal``);
    ``"anticausal"`` over :math:`j \ge i` -- the pattern of the transposed causal problem --
    which is the causal problem on both sequences reversed (:math:`i' = n-1-i`:
    :math:`j \ge i \iff j' \le i'`), so it runs on the same kernel.

    Examples
    --------
    >>> import torch
    >>> q = k = torch.zeros(1, 2, 3, dtype=torch.float64)
    >>> x = torch.tensor([[[1.0], [3.0]]], dtype=torch.float64)
    >>> out, lse = attend_with_lse(q, k, x, 1.0, mask="anticausal")  # row i averages x_j, j >= i
    >>> out.flatten().tolist(), [round(v, 4) for v in lse.flatten().tolist()]
    ([2.0, 3.0], [0.6931, 0.0])
    >>> out, _ = attend_with_lse(q, k, x, 1.0, key_bias=torch.tensor([[0.0, -float("inf")]]))  # key 1 hidden
    >>> out.flatten().tolist()
    [1.0, 1.0]
    """
    if mask == "anticausal":
        flip = (lambda t: None if t is None else t.flip(-2 if t.ndim == 3 else -1))  # (B, T, c) rows, (B, T)
        out, lse = attend_with_lse(flip(q), flip(k), flip(x), scale, flip(key_bias), need_lse, "causal")
        return flip(out), flip(lse)
    causal = mask == "causal"
    if key_bias is not None:
        q = torch.cat([q * scale, torch.ones_like(q[..., :1])], dim=-1)
        k = torch.cat([k, key_bias.unsqueeze(-1)], dim=-1)
        scale = 1.0
    h, c = q.shape[-1], x.shape[-1]
    chunks = -(-c // h)
    x = torch.nn.functional.pad(x, (0, chunks * h - c))
    values = x.reshape(*x.shape[:-1], chunks, h).transpose(-2, -3).contiguous()  # (B, chunks, m, h)
    queries = q.unsqueeze(1).expand(-1, chunks, -1, -1)
    keys = k.unsqueeze(1).expand(-1, chunks, -1, -1)
    if chunks > 1:
        queries, keys = queries.contiguous(), keys.contiguous()
    out, lse = _attention_with_lse(queries, keys, values, scale, need_lse, causal)
    out = out.transpose(-2, -3).reshape(q.shape[0], q.shape[-2], chunks * h)[..., :c]
    return out, (None if lse is None else lse[:, 0])


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    r"""Exact :math:`\operatorname{softmax}(QK^\top/\sqrt p)\,V` through torch's fused attention kernel.

    ``q: (*batch, n, p)``, ``k: (*batch, m, p)``, ``v: (*batch, m, p_v)`` (batch dims
    broadcast); returns ``(*batch, n, p_v)``. Never forms the ``n x m`` matrix on the flash
    path; agrees with ``kernels.softmax_matrix(q, k) @ v`` to rounding (tests compare both).
    ``causal=True`` (``n == m``): row i attends keys ``j <= i`` only (the kernel's ``is_causal``).

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import softmax_matrix
    >>> from approxlab.operators import softmax_attention
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(2, 16, 4, generator=g, dtype=torch.float64) for _ in range(3))
    >>> bool(torch.allclose(softmax_attention(q, k, v), softmax_matrix(q, k) @ v))
    True
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n, p = q.shape[-2], q.shape[-1]
    if v.shape[-1] == p:  # one plain call, no padding
        flat = [x.expand(*batch, *x.shape[-2:]).reshape(1, -1, *x.shape[-2:]) for x in (q, k, v)]
        out, _ = _attention_with_lse(*flat, p**-0.5, need_lse=False, causal=causal)
        return out.reshape(*batch, n, p)
    flat = [x.expand(*batch, *x.shape[-2:]).reshape(-1, *x.shape[-2:]) for x in (q, k, v)]
    out, _ = attend_with_lse(*flat, p**-0.5, need_lse=False, mask="causal" if causal else None)
    return out.reshape(*batch, n, v.shape[-1])


EXACT_KINDS = ("softmax", "scores", "kernelized")
EXACT_ALGORITHMS = ("sdpa", "blocked")


class ExactAttentionOperator(LinearOperator):
    r"""An exact attention matrix applied without forming it ``n x m``.

    Parameters
    ----------
    q : torch.Tensor
        ``(*batch, n, p)`` queries.
    k : torch.Tensor
        ``(*batch, m, p)`` keys (same batch dims, dtype and device as ``q``).
    kind : {"softmax", "scores", "kernelized"}
        Which matrix (the kinds of :func:`approxlab.attention_matrix`):

        * ``"softmax"``: :math:`D^{-1}A = \operatorname{softmax}(QK^\top/\sqrt p)`, in the log
          domain (max-subtracted), so it never overflows;
        * ``"scores"``: :math:`A = \exp(QK^\top/\sqrt p)`; raises ``OverflowError`` (as
          :func:`approxlab.kernels.score_matrix` does) when it leaves the dtype's range;
        * ``"kernelized"``: :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})` (Eq. (3) of Skyformer),
          entries in ``(0, 1]``.
    block_size : int
        Query rows per block of the ``"blocked"`` algorithm and of :meth:`to_dense`, ``>= 1``;
        memory ``O(block_size * m)`` per batch element (the last block may be shorter).
    algorithm : {"sdpa", "blocked"}
        ``"sdpa"`` (default): products through torch's fused attention kernel (flash
        attention on CPU; :func:`torch.nn.functional.scaled_dot_product_attention` elsewhere),
        memory ``O((n + m)(p + k))``. ``"blocked"``: row blocks of the explicit matrix (the
        reference the tests compare with).
    causal : bool, default False
        The causal matrix of a decoder (``n == m``): entries with key :math:`j > i` are
        masked -- :math:`-\infty` logits for ``"softmax"`` (each row renormalised over
        :math:`j \le i`), exact zeros for ``"scores"`` and ``"kernelized"``.

    Notes
    -----
    With :math:`s_{ij} = q_i\cdot k_j/\sqrt p`, :math:`\ell_i = \log D_{ii} = \log\sum_j e^{s_{ij}}`
    (row log-sum-exps, returned by the kernel beside its output) and
    :math:`a_i = \|q_i\|^2/(2\sqrt p)`, :math:`b_j = \|k_j\|^2/(2\sqrt p)` (so that
    :math:`C_{ij} = e^{s_{ij} - a_i - b_j}`, Skyformer Section 4.1 and Eq. (3)), every product
    is one attention call ``attend(queries, keys, values, bias)`` =
    :math:`\operatorname{softmax}_j(s_{ij} + \beta_j)\,x_j`, whose log-normaliser
    :math:`L_i = \log\sum_j e^{s_{ij}+\beta_j}` restores the scale in the log domain:

    * softmax: :math:`D^{-1}AX` = attend(Q, K, X); :math:`(D^{-1}A)^\top Y` =
      :math:`e^{L}\odot` attend(K, Q, Y, bias :math:`-\ell`) -- the keys play the queries and
      :math:`\ell` (computed once, then cached) enters as a bias;
    * scores: :math:`AX = e^{\ell}\odot` attend(Q, K, X); :math:`A^\top Y = e^{L}\odot` attend(K, Q, Y);
    * kernelized: :math:`CX = e^{L - a}\odot` attend(Q, K, X, bias :math:`-b`) and
      :math:`C^\top Y = e^{L - b}\odot` attend(K, Q, Y, bias :math:`-a`).

    Causal: every sum above runs over :math:`j \le i` for the products (the kernel's
    ``is_causal``) and over :math:`i \ge j` for the adjoints -- the transposed matrix is upper
    triangular, so the adjoint is *anti-causal*: it is computed as the causal problem on both
    sequences reversed (index :math:`n-1-i`), on the same kernel. :math:`\ell_i` is then the
    log-sum-exp of row :math:`i`'s kept logits.

    Each exponent is at most :math:`\log m` (or :math:`\log n`) for softmax and kernelized,
    so nothing overflows; for scores the exponent is the log row (column) sum of ``A``, and
    ``OverflowError`` is raised when that sum leaves the dtype's range (the blocked
    algorithm raises when an entry does, a subset of these cases). Each product costs
    :math:`O(nm(p + k))` time, as the blocked one, at the kernel's speed.

    ``to(dtype)`` recomputes from ``q`` and ``k`` cast to ``dtype`` (it does not cast the
    float32 matrix), so ``op.to(torch.float64)`` is the float64 exact matrix of the same
    (rounded) inputs. This is what lets
    ``spectral_error(approx.operator(), ExactAttentionOperator(q, k))`` run at ``n = 32768``.

    References
    ----------
    Chen et al. (2021), Skyformer, Section 4.1 and Eq. (3); Vaswani et al. (2017),
    scaled dot-product attention; Dao et al. (2022), FlashAttention (the log-sum-exp trick
    the kernel uses).

    Examples
    --------
    >>> import torch
    >>> from approxlab.kernels import softmax_matrix
    >>> from approxlab.operators import ExactAttentionOperator
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k = torch.randn(2, 32, 8, generator=g, dtype=torch.float64), torch.randn(2, 32, 8, generator=g, dtype=torch.float64)
    >>> op = ExactAttentionOperator(q, k)  # softmax(QK^T / sqrt p), never formed
    >>> x = torch.randn(2, 32, 3, generator=g, dtype=torch.float64)
    >>> bool(torch.allclose(op.matmat(x), softmax_matrix(q, k) @ x)), bool(torch.allclose(op.rmatmat(x), softmax_matrix(q, k).mT @ x))
    (True, True)
    """

    def __init__(self, q: torch.Tensor, k: torch.Tensor, kind: str = "softmax", block_size: int = 1024,
                 *, algorithm: str = "sdpa", causal: bool = False):
        check_qkv(q, k)
        check_choice(kind, "kind", EXACT_KINDS)
        block_size = check_int(block_size, "block_size", low=1)
        check_choice(algorithm, "algorithm", EXACT_ALGORITHMS)
        self.causal = check_causal(causal, q, k)
        self.q = q
        self.k = k
        self.kind = kind
        self.block_size = block_size
        self.algorithm = algorithm
        self.shape = (*q.shape[:-2], q.shape[-2], k.shape[-2])
        self.dtype = q.dtype
        self.device = q.device
        self._row_lse = None

    # -- the blocked reference ----------------------------------------------------------
    def _ranges(self):
        n = self.shape[-2]
        return [(start, min(start + self.block_size, n)) for start in range(0, n, self.block_size)]

    def _block(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of the matrix, ``(*batch, stop - start, m)``."""
        q_block = self.q[..., start:stop, :]
        mask = None
        if self.causal:
            mask = kernels.causal_mask(stop - start, self.shape[-1], row_offset=start, device=self.device)
        if self.kind == "softmax":
            return kernels.softmax_matrix(q_block, self.k, mask=mask)
        if self.kind == "kernelized":
            return kernels.kernelized_matrix(q_block, self.k, mask=mask)
        logits = kernels.scaled_logits(q_block, self.k)
        if mask is not None:
            logits = logits.masked_fill_(~mask, float("-inf"))
        block = torch.exp(logits)
        if not bool(torch.isfinite(block).all()):
            raise OverflowError(
                f"ExactAttentionOperator(kind='scores') overflows {self.dtype}: a logit in query rows "
                f"{start}:{stop} is {float(logits.max()):.1f}, above "
                f"log(finfo.max)={math.log(torch.finfo(self.dtype).max):.1f}. Use .to(torch.float64) "
                "or kind='softmax' (computed in the log domain)."
            )
        return block

    # -- the fused-kernel products ------------------------------------------------------
    def _flat(self, x):
        """``q, k, x`` broadcast to one batch and flattened to ``(B, ., .)``; and that batch."""
        batch = torch.broadcast_shapes(self.batch_shape, x.shape[:-2])
        return [t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:]) for t in (self.q, self.k, x)], batch

    def _row_log_sums(self, q, k, batch):
        r""":math:`\ell_i = \log D_{ii}` ``(B, n)``, from one attention call, cached per batch shape."""
        if self._row_lse is None or self._row_lse[0] != tuple(batch):
            _, lse = attend_with_lse(q, k, q.new_zeros(*k.shape[:-1], 1), q.shape[-1] ** -0.5, mask=self._mask(False))
            self._row_lse = (tuple(batch), lse)
        return self._row_lse[1]

    def _mask(self, adjoint: bool):
        """The :func:`attend_with_lse` mask of a product (``adjoint``: the transposed, anti-causal one)."""
        if not self.causal:
            return None
        return "anticausal" if adjoint else "causal"

    def _sdpa_product(self, x, adjoint: bool):
        (q, k, x), batch = self._flat(x)
        scale = q.shape[-1] ** -0.5
        first, second = (k, q) if adjoint else (q, k)
        mask = self._mask(adjoint)
        if self.kind == "softmax":
            if not adjoint:
                out, _ = attend_with_lse(q, k, x, scale, need_lse=False, mask=mask)
                return out.reshape(*batch, *out.shape[-2:])
            out, log_scale = attend_with_lse(k, q, x, scale, key_bias=-self._row_log_sums(q, k, batch), mask=mask)
        elif self.kind == "scores":
            out, log_scale = attend_with_lse(first, second, x, scale, mask=mask)
            self._check_scores(log_scale, "column" if adjoint else "row")
        else:
            first_log, second_log = kernels.log_diag_scale(first), kernels.log_diag_scale(second)
            out, log_scale = attend_with_lse(first, second, x, scale, key_bias=-second_log, mask=mask)
            log_scale = log_scale - first_log
        out = out * torch.exp(log_scale).unsqueeze(-1)
        return out.reshape(*batch, *out.shape[-2:])

    def _check_scores(self, log_sums, what):
        limit = math.log(torch.finfo(self.dtype).max)
        if bool((log_sums > limit).any()):
            raise OverflowError(
                f"ExactAttentionOperator(kind='scores') overflows {self.dtype}: the largest {what} sum of "
                f"A is exp({float(log_sums.max()):.1f}), above exp(log(finfo.max)) = exp({limit:.1f}). "
                "Use .to(torch.float64) or kind='softmax' (computed in the log domain)."
            )

    def _matmat(self, x):
        if self.algorithm == "sdpa":
            return self._sdpa_product(x, adjoint=False)
        return torch.cat([self._block(a, b) @ x for a, b in self._ranges()], dim=-2)

    def _rmatmat(self, y):
        if self.algorithm == "sdpa":
            return self._sdpa_product(y, adjoint=True)
        out = None
        for a, b in self._ranges():
            part = self._block(a, b).transpose(-1, -2) @ y[..., a:b, :]
            out = part if out is None else out + part
        return out

    def to_dense(self) -> torch.Tensor:
        """The ``(*batch, n, m)`` matrix, assembled from its row blocks."""
        return torch.cat([self._block(a, b) for a, b in self._ranges()], dim=-2)

    def to(self, dtype: torch.dtype) -> "ExactAttentionOperator":
        """The same matrix recomputed from ``q`` and ``k`` cast to ``dtype``."""
        return ExactAttentionOperator(self.q.to(dtype), self.k.to(dtype), self.kind, self.block_size,
                                      algorithm=self.algorithm, causal=self.causal)

    def __repr__(self) -> str:
        return (
            f"ExactAttentionOperator(kind={self.kind!r}, shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"block_size={self.block_size}, algorithm={self.algorithm!r}, causal={self.causal})"
        )
