r"""What a patched layer leaves behind: one :class:`LayerCall` per run of the method, and the errors of
its output against exact attention on the same inputs (:func:`output_errors`).

Three measures of the error of an attention output :math:`\tilde O` against the exact :math:`O`, both
``(*batch, r, p_v)`` (``r`` query rows of one sequence and head):

.. math::

    \frac{\|\tilde O - O\|_2}{\|O\|_2}, \qquad \frac{\|\tilde O - O\|_F}{\|O\|_F}, \qquad
    \max_i \frac{\|\tilde o_i - o_i\|_2}{\|o_i\|_2}

-- the relative spectral norm (Skyformer's Figure 1 measure, :func:`approxlab.metrics.spectral_error`),
the relative Frobenius norm (what sparse-attention-hub logs) and the worst query's relative
:math:`\ell_2` error (a row the model may depend on alone). All three in float64.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from ..attention import approximate, exact_attention
from ..kernels import causal_mask
from ..metrics import spectral_error

__all__ = ["LayerCall", "output_errors", "dense_errors", "attention_measures", "ERROR_MEASURES", "ATTENTION_MEASURES"]

ERROR_MEASURES = ("spectral", "frobenius", "worst_query")
"""The keys of :func:`output_errors`."""


def output_errors(approx: torch.Tensor, exact: torch.Tensor) -> dict[str, torch.Tensor]:
    r"""Relative spectral, Frobenius and worst-query errors of an attention output, per batch element.

    Parameters
    ----------
    approx, exact : torch.Tensor
        ``(*batch, r, p_v)``: approximate and exact outputs of ``r`` queries.

    Returns
    -------
    dict of str to torch.Tensor
        ``"spectral"``, ``"frobenius"``, ``"worst_query"``: float64 tensors of shape ``(*batch,)``
        (see the module docstring). A query row whose exact output is 0 counts as error 0 where the
        approximation is 0 too and ``inf`` otherwise (relative to nothing); an ``exact`` of norm 0
        is a ``ValueError`` (the relative errors are undefined).

    Examples
    --------
    >>> import torch
    >>> from approxlab.patching import output_errors
    >>> exact = torch.eye(2, dtype=torch.float64).unsqueeze(0)  # (1, 2, 2): two queries
    >>> approx = torch.tensor([[[1.0, 0.0], [0.0, 0.5]]], dtype=torch.float64)
    >>> {name: round(float(value), 4) for name, value in output_errors(approx, exact).items()}
    {'spectral': 0.5, 'frobenius': 0.3536, 'worst_query': 0.5}
    """
    for name, x in (("approx", approx), ("exact", exact)):
        if not isinstance(x, torch.Tensor) or x.ndim < 2 or not x.is_floating_point():
            raise TypeError(f"`{name}` must be a floating torch.Tensor (*batch, r, p_v); got "
                            f"{type(x).__name__ if not isinstance(x, torch.Tensor) else tuple(x.shape)}.")
    if approx.shape != exact.shape:
        raise ValueError(f"`approx` and `exact` must have the same shape (*batch, r, p_v); got "
                         f"{tuple(approx.shape)} and {tuple(exact.shape)}.")
    approx, exact = approx.to(torch.float64), exact.to(torch.float64)
    difference = approx - exact
    exact_norm = torch.linalg.matrix_norm(exact)
    if bool((exact_norm == 0).any()):
        raise ValueError(f"`exact` is 0 in {int((exact_norm == 0).sum())} batch element(s): its relative errors "
                         "are undefined.")
    return {"spectral": torch.as_tensor(spectral_error(approx, exact, relative=True), dtype=torch.float64),
            **dense_errors(difference, exact_norm, torch.linalg.vector_norm(exact, dim=-1))}


def dense_errors(difference: torch.Tensor, exact_norm: torch.Tensor, row_norms: torch.Tensor) -> dict:
    r"""The Frobenius and worst-query errors of :func:`output_errors` from the float64 difference
    :math:`\tilde O - O` ``(*batch, r, p_v)`` and the exact output's norms: ``exact_norm`` :math:`\|O\|_F`
    ``(*batch,)`` and ``row_norms`` :math:`\|o_i\|_2` ``(*batch, r)`` (for a caller that keeps them across
    outputs). A row with :math:`o_i = 0` counts as 0 where its difference is 0 and ``inf`` otherwise.

    Examples
    --------
    >>> import torch
    >>> from approxlab.patching.records import dense_errors
    >>> d = torch.tensor([[[0.0, 0.0], [0.0, -0.5]]], dtype=torch.float64)
    >>> {k: round(float(v), 4) for k, v in dense_errors(d, torch.tensor([2 ** 0.5]), torch.ones(1, 2)).items()}
    {'frobenius': 0.3536, 'worst_query': 0.5}
    """
    rows = torch.linalg.vector_norm(difference, dim=-1)
    ratios = torch.where(row_norms > 0, rows / row_norms.clamp_min(torch.finfo(torch.float64).tiny),
                         torch.where(rows > 0, torch.inf, 0.0))
    return {"frobenius": torch.linalg.matrix_norm(difference) / exact_norm, "worst_query": ratios.amax(dim=-1)}


ATTENTION_MEASURES = ("total_variation", "kept_mass")
"""The keys of :func:`attention_measures`."""

_BLOCK_ELEMENTS = 1 << 16
"""Scores per block of query rows in :func:`attention_measures`: 512 KiB in float64, so that a block's few arrays
stay in cache (a whole ``(S, H, r, m)`` temporary per step costs more than the arithmetic)."""


def attention_measures(result, q: torch.Tensor, k: torch.Tensor, rows: tuple, causal, key_mask=None) -> dict:
    r"""How a method's attention weights differ from exact attention's on the same inputs, per sequence and head.

    With :math:`A` the exact (softmax) attention matrix and :math:`\tilde A` the method's (``result.matrix()``),
    over the query rows ``rows``:

    * ``total_variation``: :math:`\frac{1}{r}\sum_i \tfrac12 \sum_j |\tilde a_{ij} - a_{ij}|`, the rows' mean
      total variation distance (0: the same weights; 1: disjoint supports);
    * ``kept_mass``: :math:`\frac{1}{r}\sum_i \sum_{j:\,\tilde a_{ij} \ne 0} a_{ij}`, the exact attention mass
      on the keys the method kept -- only for a sparse :math:`\tilde A` (some visible key given weight 0),
      NaN otherwise.

    Returns ``{name: float64 (S, H)}``; NaN tensors where the method gives no matrix (``NotImplementedError``)
    or one of another shape.

    Examples
    --------
    >>> import torch
    >>> import approxlab
    >>> from approxlab.patching.records import attention_measures
    >>> q = k = torch.eye(4, dtype=torch.float64).reshape(1, 1, 4, 4)
    >>> result = approxlab.approximate("topk", q, k, k, num_features=1)
    >>> found = attention_measures(result, q, k, (0, 4), False)
    >>> round(float(found["kept_mass"]), 4), round(float(found["total_variation"]), 4)  # e^0.5 / (e^0.5 + 3) kept
    (0.3547, 0.6453)
    """
    q, k = q.detach().to(torch.float64), k.detach().to(torch.float64)
    first, stop = rows
    shape = (*q.shape[:-2],)
    empty = {name: torch.full(shape, float("nan"), dtype=torch.float64) for name in ATTENTION_MEASURES}
    try:
        approx = result.matrix()
    except (NotImplementedError, RuntimeError, ValueError):
        return empty
    approx = approx.detach()
    m = k.shape[-2]
    if approx.shape[-1] != m or approx.shape[-2] not in (stop - first, q.shape[-2]):
        return empty
    offset = first if approx.shape[-2] == stop - first else 0  # approx holds rows offset, offset + 1, ...
    scores = (q[..., first:stop, :] @ k.transpose(-1, -2)).div_(q.shape[-1] ** 0.5)  # one product: its round-off
    batch = torch.broadcast_shapes(scores.shape[:-2], approx.shape[:-2])
    r = stop - first
    # One sequence and head at a time, in blocks of query rows: every array but ``scores`` is a block's, and a
    # row's softmax and sums are those of the whole matrix, bit for bit.
    scores = scores.expand(*batch, r, m).reshape(-1, r, m)
    weights = approx.expand(*batch, *approx.shape[-2:]).reshape(-1, approx.shape[-2], m)  # cast to float64 on use
    keys = None if key_mask is None else key_mask.expand(*batch, m).reshape(-1, m)
    block = max(1, _BLOCK_ELEMENTS // m)
    blocks = [(start, min(stop, start + block)) for start in range(first, max(stop, first + 1), block)]
    hidden = {start: ~causal_mask(end - start, m, row_offset=start, device=scores.device) if causal else None
              for start, end in blocks}
    variation = torch.empty(scores.shape[:-1], dtype=torch.float64)
    mass, sparse = torch.empty_like(variation), torch.zeros(scores.shape[0], dtype=torch.bool)
    for b, (start, end) in itertools.product(range(scores.shape[0]), blocks):
        rows_of = slice(start - first, end - first)
        logits = scores[b, rows_of]
        masked = hidden[start] if keys is None else (~keys[b] if hidden[start] is None else hidden[start] | ~keys[b])
        if masked is not None:
            logits.masked_fill_(masked, float("-inf"))
        exact = torch.softmax(logits, dim=-1)
        block_weights = weights[b, start - offset:end - offset]
        kept = block_weights != 0
        variation[b, rows_of] = torch.sub(block_weights, exact, out=logits).abs_().sum(dim=-1)
        mass[b, rows_of] = exact.mul_(kept).sum(dim=-1)  # exact is 0 on the keys not visible
        dropped = kept.logical_not_() if masked is None else kept.logical_not_().logical_and_(~masked)
        sparse[b] = dropped.any()
    total_variation = (0.5 * variation.mean(dim=-1)).reshape(batch)
    mass = mass.mean(dim=-1).reshape(batch)
    return {"total_variation": total_variation.expand(shape).clone(),
            "kept_mass": torch.where(sparse.reshape(batch).expand(shape), mass.expand(shape), float("nan"))}


@dataclass
class LayerCall:
    r"""One run of the method in a patched layer (one forward pass through it).

    Attributes
    ----------
    layer : int
        The layer's index.
    call : int
        Its runs before this one in the block (0 for the first forward pass).
    rows : tuple of int
        ``(first, stop)``: the query positions the method computed (``(0, n)`` for a whole window; in the
        KV-cache setting the continuation's positions).
    info : dict
        The method's ``Approximation.info`` (core conditioning, sampled columns, kept mass, ...).
    causal : bool or str
        What ``causal=`` the method ran with (``False`` in an encoder).
    inputs : tuple of torch.Tensor or None
        With ``record_inputs=True``: the ``(q, k, v)`` the method received, ``(S, H, m, p)``,
        ``(S, H, m, p)``, ``(S, H, m, p_v)`` -- RoPE applied, key/value heads repeated to the ``H`` query
        heads, ``q`` rescaled to the :math:`1/\sqrt p` convention -- detached. ``None`` otherwise.
    output : torch.Tensor or None
        With ``record_inputs=True``: the method's output rows ``rows``, ``(S, H, stop - first, p_v)``.
    key_mask : torch.Tensor or None
        The padding mask passed to the method, ``(S, 1, m)`` bool (None: no padding).
    attention : dict or None
        With ``record_attention=True``: :func:`attention_measures` of the run, float64 ``(S, H)`` each.

    Examples
    --------
    >>> import torch
    >>> from approxlab.patching import LayerCall
    >>> q = k = v = torch.eye(2, dtype=torch.float64).reshape(1, 1, 2, 2)
    >>> call = LayerCall(layer=0, call=0, rows=(0, 2), info={}, causal=False, inputs=(q, k, v), output=0.9 * v)
    >>> round(float(call.errors()["spectral"]), 4)  # 0.9 v against softmax(q k^T / sqrt 2) v
    0.5605
    """

    layer: int
    call: int
    rows: tuple[int, int]
    info: dict
    causal: bool | str
    inputs: tuple | None = None
    output: torch.Tensor | None = None
    key_mask: torch.Tensor | None = field(default=None, repr=False)
    attention: dict | None = field(default=None, repr=False)

    def exact_output(self) -> torch.Tensor:
        """Exact (softmax) attention on :attr:`inputs`, rows :attr:`rows`, in float64 ``(S, H, r, p_v)``."""
        if self.inputs is None:
            raise ValueError(f"layer {self.layer}'s inputs were not recorded: pass record_inputs=True to "
                             "patch_attention; got a record without inputs.")
        q, k, v = (x.to(torch.float64) for x in self.inputs)
        if self.causal:  # True or "mask-renormalise": the reference is exact causal attention
            exact = exact_attention(q, k, v, causal=True)
        elif self.key_mask is not None:
            exact = approximate("exact", q, k, v, num_features=1, key_mask=self.key_mask).output
        else:
            exact = exact_attention(q, k, v)
        return exact[..., self.rows[0]:self.rows[1], :]

    def errors(self) -> dict[str, torch.Tensor]:
        """:func:`output_errors` of :attr:`output` against :meth:`exact_output`: float64 ``(S, H)`` each."""
        exact = self.exact_output()
        return output_errors(self.output, exact)
