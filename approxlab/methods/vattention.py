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
from ._row_topk import row_topk
from ._selection import sparse_approximation
from ._weighted_keys import BlockLogits, row_block, stack_rows, weighted_output
from .draws import DrawEntry, check_draw

__all__ = ["vattention", "VATTENTION", "sample_size", "draw_uniforms", "draw_width", "MAX_SAMPLES"]


MAX_SAMPLES = 512
r"""Default ``max_samples`` of :func:`vattention`: the most tail samples a query draws, so a generator draws
:math:`O(n \min(m, 512))` variates (``(*batch, n, min(m, 512))``) instead of :math:`O(nm)`; a query whose sample
size exceeds it attends its tail exactly (no error; the guarantee holds). With :math:`m \le 512` the draw is the
former one, variate for variate. Before, the default was None (no cap but the tail's size): the ``(*batch, n, m)``
float64 uniforms of that draw alone cost about 4x fused causal SDPA at :math:`n = m = 8192` (one thread;
``benchmarks/results/sampling_methods.md``). sparse-attention-hub's ``AdaptiveSamplingMasker`` clamps each query's
budget to :math:`[1, N_T]` and draws exactly :math:`\sum_i b_i` indices (``torch.randint``) once the budgets are
known, with no cap of its own; a draw fixed before the sample sizes are known (one that can be handed over and
shared, :func:`draw_uniforms`) needs a width, and this is it. A result computed with the uncapped draw is
reproduced with ``max_samples=None`` (the decoder study passes it, for its committed cells at n = 768 to 4,096:
``approxlab.studies.decoder.cells.METHOD_OPTIONS``)."""

DENSE_SAMPLES = 8
""":meth:`_Blocks._sampled_sum` reads the samples out by a GEMM over every key when they number at least
``1 / DENSE_SAMPLES`` of the row block's ``(H, r, w)`` weights."""


def draw_uniforms(q, k, *, num_features, generator=None, max_samples=MAX_SAMPLES, **options):
    r"""The random draw of :func:`vattention`: ``{"uniform": (*batch, n, w) float64}``, i.i.d. uniform on [0, 1),
    :math:`w = \min(m, \text{max\_samples})` (:func:`draw_width`; ``m`` when ``max_samples`` is None;
    ``max_samples`` defaults to :data:`MAX_SAMPLES`, 512).

    Query :math:`i`'s ``r``-th tail sample is the tail key of rank :math:`\lfloor N_T u_{ir}\rfloor` (keys in
    increasing position); a query never draws more than :math:`\min(N_T - 1, w)` samples (when its sample size
    reaches :math:`N_T` or exceeds :math:`w` its tail is attended exactly), so :math:`w` variates per query are
    enough. Drawn on the CPU in float64 (memory :math:`O(nw)`), then moved to ``q.device``; the other
    ``options`` are ignored (the sample sizes depend on the data, the variates do not). With :math:`m \le w`
    the draw is ``(*batch, n, m)``, the variates drawn before ``max_samples`` existed (and with
    ``max_samples=None`` for any ``m``).

    Examples
    --------
    >>> import torch
    >>> from approxlab.methods.vattention import draw_uniforms
    >>> q = k = torch.zeros(2, 16, 4, dtype=torch.float64)
    >>> draw_uniforms(q, k, num_features=4, generator=torch.Generator().manual_seed(0))["uniform"].shape
    torch.Size([2, 16, 16])
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    width = draw_width(k.shape[-2], max_samples)
    uniform = torch.rand(*batch, q.shape[-2], width, generator=as_generator(generator), dtype=torch.float64)
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
               max_samples=MAX_SAMPLES, draw=None, key_mask=None, causal=False):
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
    max_samples : int or None, default 512
        The most tail samples a query draws (``>= 1``; :data:`MAX_SAMPLES`): a query whose sample size
        :math:`b_i` exceeds it attends its tail exactly, as one whose :math:`b_i` reaches the tail's size does
        (no error; the guarantee holds). None: no cap but the tail's size (the draw then holds ``m`` variates per
        query: the default before 512, which the results computed then need to re-derive at ``m > 512``).
    draw : dict, optional
        ``{"uniform": (*batch, n, min(m, max_samples))}`` from :func:`draw_uniforms`, used instead of
        ``generator``. Under the default ``max_samples``, a draw of ``m`` variates per query (made with
        ``max_samples=None``) is read as the uncapped draw it is.
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
        ``exact_tail`` bool where it is (the sample size reached the tail's size or exceeded ``max_samples``),
        ``required`` float64 the sample size :func:`sample_size` asked for.

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
    :math:`o` are computed here from every logit (an oracle budget, as the top-k oracle); vAttention
    estimates them from a base sample of the tail (the hub's ``base_rate_sampling``), which the guarantee then
    assumes accurate. The hub's budget, :math:`(\Phi^{-1}(1-\delta)\,\hat\sigma N_T/(\epsilon\hat D))^2` with
    :math:`\hat\sigma` the standard deviation of the sampled :math:`w_j`, controls the relative error of the
    denominator alone; the one here controls the output's. Both scale as :math:`\epsilon^{-2}`.

    **Checked** over many seeds (``tests/test_vattention.py``): the fraction of queries with
    :math:`\|\tilde o_i - o_i\| > \epsilon\|o_i\|` stays below :math:`\delta` within a binomial tolerance, on
    peaked and flat attention, with a mutation row in ``tests/mutation_check.py``.

    **The algorithm** (in the inputs' dtype: float32 unless they are float64). Per row block, one product gives
    the logits against the keys the block can see; the fixed keys are the sinks, the window and the largest
    logits (:func:`~approxlab.methods._row_topk.row_topk`, ``torch.topk``'s keys); the weights overwrite the
    logits; the tail statistics :math:`\sum_T w_j x_j` and :math:`\sum_T w_j^2 x_j` for
    :math:`x_j = (u_j, \|u_j\|^2, 1)` come from two products, and :math:`\sum_F w_j x_j` from a weighted sum over
    the fixed keys, where :math:`u_j = (v_j - c)/s` with :math:`c` the keys' mean value and :math:`s` the
    largest :math:`|v_j - c|` entry (:math:`\operatorname{tr}\Sigma/\|o\|^2` does not depend on them; the shift
    keeps :math:`\sum w^2\|u - o\|^2` from cancelling in float32). A row whose tail is attended whole has
    output :math:`o`; only the rows that sample read their draws and their tail keys by rank. The operator is
    formed on request, from the same blocks. The float64 implementation that formed every statistic densely in
    float64 is the reference of ``tests/test_sampling_fast_paths.py``: the same fixed keys, tails, samples and
    outputs on the same draw, to float32 rounding (to 1e-12 in float64). **Cost**: the logits and two products
    with the values, :math:`O(nmp)` each (causally half), the top-k selection, and the samples
    :math:`O(n \max_i b_i)`; ``benchmarks/sampling_methods.py`` times the causal form against torch's fused
    causal SDPA (its results in ``benchmarks/results/sampling_methods.md``).

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
    width = draw_width(k.shape[-2], max_samples)
    if max_samples == MAX_SAMPLES and _uncapped(draw, k.shape[-2]):
        width = k.shape[-2]  # a draw made with max_samples=None, handed over under the default: read as made
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if draw is None:
        draw = draw_uniforms(q, k, num_features=num_features, generator=generator, max_samples=max_samples)
    else:
        layout = {"uniform": DrawEntry((*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], width),
                                       "(*batch, n, min(m, max_samples))")}
        draw = check_draw("vattention", draw, layout, device=q.device)
    dtype = q.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = (x.to(compute).expand(*batch, *x.shape[-2:]).reshape(-1, *x.shape[-2:]) for x in (q, k, v))
    mask = None if key_mask is None else key_mask.expand(*batch, k.shape[-2]).reshape(-1, k.shape[-2])
    uniform = draw["uniform"].expand(*batch, *draw["uniform"].shape[-2:]).reshape(-1, q.shape[-2], width)
    plan = _Blocks(q, k, v, mask, uniform, heavy=num_features, sink=sink, window=window, causal=bool(causal),
                   epsilon=epsilon, delta=delta)
    outputs, stats = [], []
    for start, stop in plan.blocks():
        output, info, _ = plan.run(start, stop)
        outputs.append(output)
        stats.append(info)

    def record():
        blocks = [plan.run(start, stop, coefficients=True)[2] for start, stop in plan.blocks()]
        indices, weights = stack_rows([weighted_output(block, v[..., :block.shape[-1], :])[1:] for block in blocks],
                                      dtype)
        return indices.view(*batch, *indices.shape[-2:]), weights.view(*batch, *weights.shape[-2:])

    info = {key: torch.cat([row[key] for row in stats], dim=-1).view(*batch, q.shape[-2])
            for key in ("fixed", "tail", "samples", "exact_tail", "required")}
    output = torch.cat(outputs, dim=-2)
    return sparse_approximation("vattention", output.view(*batch, *output.shape[-2:]).to(dtype), k.shape[-2],
                                record, info)


def _uncapped(draw, m: int) -> bool:
    """Whether ``draw`` holds the uncapped uniforms, ``m`` per query (``max_samples=None``), for ``m`` keys."""
    uniform = draw.get("uniform") if isinstance(draw, dict) else None
    return torch.is_tensor(uniform) and uniform.dim() >= 2 and uniform.shape[-1] == m and m > MAX_SAMPLES


def draw_width(m: int, max_samples) -> int:
    """The variates a query draws: ``min(m, max_samples)`` (``m`` when ``max_samples`` is None).

    Examples
    --------
    >>> from approxlab.methods.vattention import draw_width
    >>> draw_width(8192, 512), draw_width(256, 512), draw_width(8192, None)
    (512, 256, 8192)
    """
    return m if max_samples is None else min(m, check_int(max_samples, "max_samples", low=1))


class _Blocks:
    r"""vAttention's row blocks over ``(B, n, p)``, ``(B, m, p)``, ``(B, m, p_v)`` (the batch flattened): each
    block's logits in the compute dtype, its fixed keys, the tail statistics by two products with the values and
    one weighted sum over the fixed keys, and the samples (Notes of :func:`vattention`)."""

    def __init__(self, q, k, v, mask, uniform, *, heavy, sink, window, causal, epsilon, delta):
        self.q, self.k, self.v, self.mask, self.uniform = q, k, v, mask, uniform
        self.heavy, self.sink, self.window, self.causal = heavy, sink, window, causal
        self.epsilon, self.delta = epsilon, delta
        # the statistics' values: (v - c) / s with c the keys' mean value and s the largest |v - c| (the trace is
        # invariant to c, and to s up to the factor s^2 that |o| carries too), then |.|^2 and 1 beside them
        centre = v.mean(-2, keepdim=True)
        scale = (v - centre).abs().amax((-2, -1), keepdim=True).clamp(min=torch.finfo(v.dtype).tiny)
        unit = (v - centre) / scale
        self.centre, self.scale = centre, scale
        self.columns = torch.cat([unit, (unit * unit).sum(-1, keepdim=True), torch.ones_like(unit[..., :1])], -1)
        self.rows = row_block(q.shape[0], k.shape[-2])
        self.logits = {reuse: BlockLogits(q, k, self.rows, reuse=reuse) for reuse in (True, False)}
        self.squares = torch.empty(q.shape[0] * min(self.rows, q.shape[-2]) * k.shape[-2], dtype=q.dtype,
                                   device=q.device)

    def blocks(self):
        n = self.q.shape[-2]
        return [(start, min(start + self.rows, n)) for start in range(0, n, self.rows)]

    def run(self, start: int, stop: int, *, coefficients: bool = False):
        """``(output (B, r, p_v), info, coefficients (B, r, w) or None)`` of rows ``start:stop``."""
        q, k = self.q, self.k
        heads, rows, m = q.shape[0], stop - start, k.shape[-2]
        width = min(m, stop) if self.causal else m
        logits = self.logits[not coefficients](start, stop, width)
        positions = torch.arange(start, stop, device=q.device).unsqueeze(-1)
        if self.causal and start < width:
            logits[..., start:].masked_fill_(torch.arange(start, width, device=q.device) > positions, float("-inf"))
        if self.mask is not None:
            logits.masked_fill_(~self.mask[..., None, :width], float("-inf"))
        fixed, peak = self._fixed(logits, positions, width)
        weights = logits.sub_(peak).exp_()  # in place: w_ij = exp(s_ij - max_l s_il), 0 where invisible
        # an empty slot (-1) points at the row's first fixed key (scattering its own weight again is harmless)
        first = torch.gather(fixed, -1, (fixed >= 0).to(torch.int8).argmax(-1, keepdim=True))
        slots = torch.where(fixed >= 0, fixed, first).clamp(min=0)
        slot_weights = torch.gather(weights, -1, slots)
        fixed_weights = slot_weights * (fixed >= 0)
        tail_weights = weights.scatter_(-1, slots, 0.0)  # in place: the weights of the tail keys only
        columns = self.columns[..., :width, :]
        tail = tail_weights @ columns  # sum_T w_j x_j, x = (unit, |unit|^2, 1)
        squares = torch.mul(tail_weights, tail_weights, out=self.squares[:tail_weights.numel()].view_as(tail_weights))
        squared = squares @ columns  # sum_T w_j^2 x_j
        fixed_sum = torch.nn.functional.embedding_bag(
            (slots + torch.arange(heads, device=q.device).view(-1, 1, 1) * m).view(-1, fixed.shape[-1]),
            self.columns.reshape(-1, self.columns.shape[-1])[:heads * m], mode="sum",
            per_sample_weights=fixed_weights.view(-1, fixed.shape[-1])).view(heads, rows, -1)
        every = fixed_sum + tail
        denominator = every[..., -1]
        safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
        output = every[..., :-2] / safe.unsqueeze(-1)  # o in the statistics' units
        visible = self._visible_counts(start, stop, width)
        size = visible - (fixed >= 0).sum(-1)
        # tr(Sigma) = N_T sum_T w_j^2 |x_j - o|^2 - |sum_T w_j (x_j - o)|^2
        spread = squared[..., -2] - 2 * (squared[..., :-2] * output).sum(-1) + squared[..., -1] * (output * output
                                                                                                     ).sum(-1)
        mean = tail[..., :-2] - tail[..., -1:] * output
        trace = (size * spread - (mean * mean).sum(-1)).clamp(min=0.0)
        norm = (output + self.centre / self.scale).norm(dim=-1)  # |o| / s: o = s * (o in units) + c
        required = sample_size(trace.double(), safe.double(), norm.double(), epsilon=self.epsilon, delta=self.delta)
        needed = torch.nan_to_num(required, nan=float("inf")).clamp(min=1)
        exact_tail = (needed >= size) | (needed > self.uniform.shape[-1])
        samples = torch.where(exact_tail, torch.zeros_like(size), needed.nan_to_num(posinf=0).long())
        result = self.scale * output + self.centre  # exact attention where the tail is attended whole
        info = {"fixed": (fixed >= 0).sum(-1), "tail": size, "samples": samples, "exact_tail": exact_tail & (size > 0),
                "required": required}
        dense = None
        if coefficients:
            dense = weights.clone().masked_fill_(~exact_tail.unsqueeze(-1), 0.0)
            dense.scatter_(-1, slots, slot_weights)  # the fixed keys
        chosen = samples.nonzero(as_tuple=True)
        if chosen[0].numel():
            keys, scale = self._draw(chosen, start, samples, size, slots, positions, width)
            drawn = weights[chosen].gather(-1, keys) * scale
            numerator = self.scale[chosen[0], 0] * fixed_sum[chosen][..., :-2] + self.centre[chosen[0], 0] * \
                fixed_sum[chosen][..., -1:] + self._sampled_sum(chosen, keys, drawn, heads, rows, width)
            result[chosen] = numerator / (fixed_sum[chosen][..., -1] + drawn.sum(-1)).unsqueeze(-1)
            if dense is not None:
                dense[chosen] = dense[chosen].scatter_add(-1, keys, drawn)
        return torch.where(denominator.unsqueeze(-1) > 0, result, torch.zeros_like(result)), info, dense

    def _sampled_sum(self, chosen, keys, drawn, heads: int, rows: int, width: int) -> torch.Tensor:
        r"""``(S, p_v)``: :math:`\sum_b w_b v_{j_b}` over each chosen row's samples ``keys`` ``(S, b)`` with weights
        ``drawn`` (0 on the padding).

        Where the samples are many (:math:`S b \ge H r w / ` :data:`DENSE_SAMPLES`), their weights are summed per key
        (a key drawn twice counts twice) into ``(H, r, w)`` and read out by one product per head with its values;
        otherwise the values are gathered, ``(S, b, p_v)``, and summed. The same sum to rounding: the first costs
        :math:`O(H r w p_v)` flops of a GEMM, the second :math:`O(S b p_v)` elementwise reads and products, which
        at the KV cache's dense tails (b near w) cost several times the GEMM
        (``benchmarks/results/perplexity_clean_cells.md``)."""
        if keys.numel() * DENSE_SAMPLES >= heads * rows * width:
            sampled = torch.zeros(heads, rows, width, dtype=drawn.dtype, device=drawn.device)
            sampled[chosen] = torch.zeros(keys.shape[0], width, dtype=drawn.dtype,
                                          device=drawn.device).scatter_add_(-1, keys, drawn)
            return torch.bmm(sampled, self.v[:, :width])[chosen]
        return (drawn.unsqueeze(-1) * self.v[chosen[0].unsqueeze(-1), keys]).sum(-2)

    def _fixed(self, logits, positions, width):
        """``(fixed (B, r, s), peak (B, r, 1))``: each row's fixed keys (sinks, window, then its ``heavy`` largest
        other logits; -1 on a slot without a visible key) and its largest logit (0 where it sees none)."""
        offsets = torch.arange(self.sink + self.window, device=logits.device)
        local = torch.where(offsets < self.sink, offsets, positions - (offsets - self.sink))  # (r, sink + window)
        local = local.masked_fill((local < 0) | (local >= width) | ((offsets >= self.sink) & (local < self.sink)), -1)
        local = local.expand(logits.shape[0], *local.shape)
        near = torch.gather(logits, -1, local.clamp(min=0)).masked_fill(local < 0, float("-inf"))
        local = local.masked_fill(~torch.isfinite(near), -1)
        ranked = logits
        if local.shape[-1]:
            ranked = logits.clone().scatter_(-1, local.clamp(min=0), float("-inf"))
        values, top = row_topk(ranked, min(self.heavy, width), sorted=False)  # the set: its order is not used
        top = top.masked_fill(~torch.isfinite(values), -1)
        peak = values.amax(-1, keepdim=True)
        if local.shape[-1]:
            peak = torch.maximum(peak, near.amax(-1, keepdim=True))
        peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
        return torch.cat([local, top], dim=-1), peak

    def _visible_counts(self, start, stop, width):
        """``(B, r)`` the keys each row sees."""
        positions = torch.arange(start, stop, device=self.q.device)
        if self.mask is None:
            counts = (positions + 1).clamp(max=width) if self.causal else torch.full_like(positions, width)
            return counts.expand(self.q.shape[0], stop - start)
        seen = self.mask[..., :width].long().cumsum(-1)
        return seen[..., positions.clamp(max=width - 1)] if self.causal else seen[..., -1:].expand(-1, stop - start)

    def _draw(self, chosen, start, samples, size, slots, positions, width):
        """The sampled tail keys ``(S, b)`` of the rows ``chosen`` (each padded past its samples by its first key,
        weight 0) and the weights ``N_T / b`` ``(S, b)`` (0 on the padding)."""
        count = samples[chosen]
        most = int(count.max())
        uniform = self.uniform[chosen[0], chosen[1] + start, :most]
        rank = (uniform * size[chosen].unsqueeze(-1)).long()
        tail = torch.ones(count.shape[0], width, dtype=torch.bool, device=count.device)
        if self.causal:
            tail &= torch.arange(width, device=count.device) <= positions[chosen[1]]
        if self.mask is not None:
            tail &= self.mask[chosen[0], :width]
        tail.scatter_(-1, slots[chosen], False)
        # the (rank + 1)-th tail key of each row: the tail keys in increasing order come first in a stable sort of
        # "not in the tail" (the rank is below the tail's size; a rank past it reads the last key, as before)
        order = torch.sort(tail.logical_not().to(torch.uint8), dim=-1, stable=True).indices
        keys = torch.where(rank < tail.sum(-1, keepdim=True), order.gather(-1, rank.clamp(max=width - 1)), width - 1)
        used = torch.arange(most, device=count.device) < count.unsqueeze(-1)
        scale = (size[chosen].double() / count).unsqueeze(-1) * used
        return torch.where(used, keys, keys[..., :1]), scale.to(self.q.dtype)


VATTENTION = vattention
__test__ = {"vattention": vattention.function}  # doctest skips a MethodSpec: run its function's examples
