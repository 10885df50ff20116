r"""vAttention: exact attention on the top keys, a uniform sample of the rest, its size set from (epsilon, delta).

Desai et al. (2025) observe that top-k attention is accurate when a row's mass sits on a few keys and uniform
sampling when it is spread, and combine them: each query attends its sinks, local window and largest logits
exactly, and estimates the remaining tail's contribution from a uniform sample whose size is chosen, per
query, so that the output's relative error is at most :math:`\epsilon` with probability :math:`1-\delta`.
"""

from __future__ import annotations

import math

import torch

from .._validation import as_generator, check_int, check_positive_float
from ._base import method
from ._masking import check_key_mask
from ._selection import logit_blocks
from ._weighted_keys import assemble, fixed_keys, row_weights, weighted_output
from .draws import DrawEntry, check_draw

__all__ = ["vattention", "VATTENTION", "sample_size", "draw_uniforms"]


def draw_uniforms(q, k, *, num_features, generator=None, **options):
    r"""The random draw of :func:`vattention`: ``{"uniform": (*batch, n, m) float64}``, i.i.d. uniform on [0, 1).

    Query :math:`i`'s ``r``-th tail sample is the tail key of rank :math:`\lfloor N_T u_{ir}\rfloor` (keys in
    increasing position); a query never draws more than :math:`N_T < m` samples (at :math:`b \ge N_T` its tail
    is attended exactly), so ``m`` variates per query are enough. Drawn on the CPU in float64 (memory
    :math:`O(nm)`), then moved to ``q.device``; ``options`` are ignored (the sample sizes depend on the data,
    the variates do not).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.vattention import draw_uniforms
    >>> q = k = torch.zeros(2, 16, 4, dtype=torch.float64)
    >>> draw_uniforms(q, k, num_features=4, generator=torch.Generator().manual_seed(0))["uniform"].shape
    torch.Size([2, 16, 16])
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    uniform = torch.rand(*batch, q.shape[-2], k.shape[-2], generator=as_generator(generator), dtype=torch.float64)
    return {"uniform": uniform.to(q.device)}


def sample_size(trace_covariance: torch.Tensor, denominator: torch.Tensor, output_norm: torch.Tensor, *,
                epsilon: float, delta: float) -> torch.Tensor:
    r"""The tail sample size :math:`b_i = \lceil z_\delta^2\,\operatorname{tr}\Sigma_i / (\epsilon D_i\|o_i\|)^2\rceil`.

    Parameters
    ----------
    trace_covariance, denominator, output_norm : torch.Tensor
        ``(*batch, n)`` float64: :math:`\operatorname{tr}\Sigma_i`, :math:`D_i` and :math:`\|o_i\|_2` of the
        Notes of :func:`vattention`.
    epsilon, delta : float
        The relative error and the failure probability.

    Returns
    -------
    torch.Tensor
        ``(*batch, n)`` float64, :math:`b_i` (``inf`` where :math:`\|o_i\| = 0`: no relative guarantee is
        possible, the caller attends the tail exactly).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.vattention import sample_size
    >>> one = torch.ones(1, dtype=torch.float64)
    >>> sample_size(one, one, one, epsilon=0.1, delta=0.1)  # (1 + sqrt(2 log 10))^2 / 0.01 = 990.5...
    tensor([991.], dtype=torch.float64)
    """
    z = 1.0 + math.sqrt(2.0 * math.log(1.0 / delta))
    return torch.ceil(z * z * trace_covariance / (epsilon * denominator * output_norm) ** 2)


@method("vattention", target="softmax", features="keys kept exactly per query (the largest logits), "
        "besides a sampled tail sized by (epsilon, delta)", randomized=True, draw=draw_uniforms, causal=True)
def vattention(q, k, v, *, num_features, generator=None, epsilon=0.3, delta=0.1, sink=0, window=0,
               draw=None, key_mask=None, causal=False):
    r"""vAttention: top-k plus a uniform sample of the tail with an :math:`(\epsilon, \delta)` guarantee per query.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``, ``(*batch, m, p_v)``.
    num_features : int
        The keys of largest logit attended exactly per query, besides sinks and window (``1 <= k <= m``).
    generator : torch.Generator, optional
        CPU generator for the tail samples (:func:`draw_uniforms`: uniform variates drawn in float64 on the
        CPU, so float32 and float64 inputs draw the same keys).
    epsilon : float, default 0.3
        The relative :math:`\ell_2` error allowed per query, ``0 < epsilon`` (the largest value of the hub's
        search grid, 0.05 to 0.3).
    delta : float, default 0.1
        The probability allowed to exceed it, ``0 < delta < 1``.
    sink : int, default 0
        Keys ``0 .. sink - 1`` attended exactly by every query (attention sinks).
    window : int, default 0
        Keys :math:`i - \text{window} < j \le i` attended exactly by query :math:`i` (the local window).
    draw : dict, optional
        ``{"uniform": (*batch, n, m)}`` from :func:`draw_uniforms`, used instead of ``generator``.
    key_mask : torch.Tensor, optional
        ``(*batch, m)`` bool, True on keys that may be attended.
    causal : bool, default False
        Query :math:`i` attends keys :math:`j \le i` only (fixed set, tail and sample all causal).

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a :class:`~approxlab.operators.RowSparseOperator` (a
        sampled key drawn twice counts twice); ``info``: ``fixed`` ``(*batch, n)`` the keys attended exactly,
        ``tail`` the other visible keys, ``samples`` the tail draws (0 where the tail is attended exactly),
        ``exact_tail`` bool where it is (the sample size reached the tail's size), ``required`` float64 the
        sample size :func:`sample_size` asked for.

    Notes
    -----
    Let :math:`w_j = e^{s_{ij} - \max_l s_{il}}` (query :math:`i` fixed), :math:`F` the fixed keys, :math:`T`
    the tail (:math:`N_T = |T|`), :math:`D = \sum_j w_j`, :math:`o = \sum_j w_j v_j / D`. Draw
    :math:`J_1,\dots,J_b` uniformly from :math:`T` with replacement and estimate numerator and denominator
    (the estimator of vAttention, Desai et al. 2025, Sec. 4, and of sparse-attention-hub's
    ``AdaptiveSamplingMasker``, whose mask weights the sampled keys by :math:`N_T/b`):

    .. math::

        \tilde o = \frac{\sum_{j\in F} w_j v_j + \frac{N_T}{b}\sum_{r=1}^b w_{J_r} v_{J_r}}
                        {\sum_{j\in F} w_j + \frac{N_T}{b}\sum_{r=1}^b w_{J_r}}.

    **The error, exactly.** With :math:`Z_r = N_T w_{J_r}(v_{J_r} - o)` (i.i.d., mean
    :math:`\mu = \sum_{j\in T} w_j (v_j - o)`), :math:`\tilde o - o = (\bar Z - \mu)/\tilde D`, because
    :math:`\sum_j w_j (v_j - o) = 0`. :math:`\bar Z - \mu` has covariance :math:`\Sigma/b`,
    :math:`\operatorname{tr}\Sigma = N_T\sum_{j\in T} w_j^2\|v_j - o\|^2 - \|\mu\|^2`.

    **The sample size** (:func:`sample_size`). By the central limit theorem :math:`\bar Z - \mu` is close to
    :math:`g\sim\mathcal N(0,\Sigma/b)`, and Gaussian concentration of the 1-Lipschitz
    :math:`\|\cdot\|` (with :math:`\mathbb E\|g\|\le\sqrt{\operatorname{tr}\Sigma/b}` and
    :math:`\|\Sigma\|_2 \le \operatorname{tr}\Sigma`) gives
    :math:`P\big(\|g\| > z_\delta\sqrt{\operatorname{tr}\Sigma/b}\big)\le\delta` for
    :math:`z_\delta = 1 + \sqrt{2\ln(1/\delta)}`. So

    .. math::

        b \ge \frac{z_\delta^2\,\operatorname{tr}\Sigma}{\epsilon^2 D^2\|o\|^2}
        \quad\Longrightarrow\quad
        P\big(\|\tilde o - o\| > \epsilon\|o\|\big) \lesssim \delta,

    to first order in :math:`b^{-1/2}` (:math:`\tilde D = D` up to a relative error of the same order). When
    :math:`b \ge N_T` the tail is attended exactly instead (no error), as is a tail of one key; a longer tail with
    :math:`\operatorname{tr}\Sigma = 0` needs one draw. :math:`\operatorname{tr}\Sigma`, :math:`D` and
    :math:`o` are computed here from every logit in float64 (an oracle budget, as the top-k oracle); vAttention
    estimates them from a base sample of the tail (the hub's ``base_rate_sampling``), which the guarantee then
    assumes accurate. The hub's budget, :math:`(\Phi^{-1}(1-\delta)\,\hat\sigma N_T/(\epsilon\hat D))^2` with
    :math:`\hat\sigma` the standard deviation of the sampled :math:`w_j`, controls the relative error of the
    denominator alone; the one here controls the output's. Both scale as :math:`\epsilon^{-2}`.

    **Checked** over many seeds (``tests/test_vattention.py``): the fraction of queries with
    :math:`\|\tilde o_i - o_i\| > \epsilon\|o_i\|` stays below :math:`\delta` within a binomial tolerance, on
    peaked and flat attention, with a mutation row in ``tests/mutation_check.py``.

    **Cost**: all :math:`nm` logits in row blocks (as the top-k oracle), the statistics :math:`O(nmp_v)`, the
    samples :math:`O(n\max_i b_i)` per block.

    References
    ----------
    A. Desai, K. K. Agrawal, S. Yang, A. Cuadron, L. G. Schroeder, M. Zaharia, J. E. Gonzalez, I. Stoica,
    "vAttention: Verified Sparse Attention" (2025), arXiv:2510.05688.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 256, 16, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("vattention", q, k, v, num_features=16, epsilon=0.3, delta=0.1,
    ...                                generator=torch.Generator().manual_seed(1))
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> relative = (approx.output - exact).norm(dim=-1) / exact.norm(dim=-1)
    >>> bool((relative > 0.3).double().mean() <= 0.1)
    True
    """
    key_mask = check_key_mask(key_mask, k)
    epsilon = check_positive_float(epsilon, "epsilon")
    delta = check_positive_float(delta, "delta")
    if delta >= 1:
        raise ValueError(f"`delta` must be a probability in (0, 1); got {delta!r}.")
    sink = check_int(sink, "sink", low=0)
    window = check_int(window, "window", low=0)
    if draw is None:
        draw = draw_uniforms(q, k, num_features=num_features, generator=generator)
    else:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        layout = {"uniform": DrawEntry((*batch, q.shape[-2], k.shape[-2]), "(*batch, n, m)")}
        draw = check_draw("vattention", draw, layout, device=q.device)
    dtype = q.dtype
    q, k, v = q.double(), k.double(), v.double()
    v = v.expand(*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]), *v.shape[-2:])
    # the budget is invariant to the scale of v: its statistics use v / max|v| (no under- or overflow of v^2)
    unit = v / v.abs().amax((-2, -1), keepdim=True).clamp(min=torch.finfo(torch.float64).tiny)
    blocks, stats = [], []
    for start, stop, logits in logit_blocks(q, k, causal=bool(causal), key_mask=key_mask):
        fixed = fixed_keys(logits, start, heavy=num_features, sink=sink, window=window)
        tail = torch.isfinite(logits) & ~fixed
        weights = row_weights(logits)
        tail_weights = weights * tail
        denominator = weights.sum(-1)
        safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
        output = (weights @ unit) / safe.unsqueeze(-1)
        size = tail.sum(-1)
        # tr(Sigma) = N_T sum_T w_j^2 |v_j - o|^2 - |mu|^2,  mu = sum_T w_j (v_j - o)
        squared = tail_weights * tail_weights
        spread = (squared @ (unit * unit).sum(-1, keepdim=True)).squeeze(-1) \
            - 2 * ((squared @ unit) * output).sum(-1) + squared.sum(-1) * (output * output).sum(-1)
        mean = tail_weights @ unit - tail_weights.sum(-1, keepdim=True) * output
        trace = (size * spread - (mean * mean).sum(-1)).clamp(min=0.0)
        required = sample_size(trace, safe, output.norm(dim=-1), epsilon=epsilon, delta=delta)
        needed = torch.nan_to_num(required, nan=float("inf")).clamp(min=1)  # a tail with tr(Sigma) = 0: one draw
        exact_tail = needed >= size
        samples = torch.where(exact_tail, torch.zeros_like(size), needed.nan_to_num(posinf=0).long())
        coefficients = weights * (fixed | (tail & exact_tail.unsqueeze(-1)))
        width = int(samples.max()) if samples.numel() else 0
        if width:
            uniform = draw["uniform"][..., start:stop, :width].double().expand(*samples.shape, width)
            rank = (uniform * size.unsqueeze(-1)).long().clamp(max=logits.shape[-1] - 1)
            order = torch.argsort((~tail).to(torch.int8), dim=-1, stable=True)  # tail keys first, ascending
            drawn = torch.gather(order, -1, rank)
            used = torch.arange(width, device=logits.device) < samples.unsqueeze(-1)
            scale = size.double() / samples.clamp(min=1)
            contribution = torch.gather(weights, -1, drawn) * scale.unsqueeze(-1) * used
            coefficients = coefficients.scatter_add(-1, drawn, contribution)
        blocks.append(weighted_output(coefficients, v))
        stats.append((fixed.sum(-1), size, samples, exact_tail & (size > 0), required))
    info = {key: torch.cat([row[index] for row in stats], dim=-1)
            for index, key in enumerate(("fixed", "tail", "samples", "exact_tail", "required"))}
    return assemble("vattention", blocks, k.shape[-2], dtype, info)


VATTENTION = vattention
__test__ = {"vattention": vattention.function}  # doctest skips a MethodSpec: run its function's examples
