r"""Skyformer's modified Nyström on the raw softmax scores, then row normalisation (Figure 1).

Target: softmax attention :math:`D^{-1}AV`, :math:`A = \exp(QK^\top/\sqrt p)`. This is the
"Skyformer" curve of Skyformer's Figure 1: "first approximate A, then approximate D, as
Performer does". ``num_features`` is the number ``d`` of sampled columns of the
``2n x 2n`` completion of :math:`[Q; K]`, ``1 <= d <= 2n``.
"""

from __future__ import annotations

from ..linalg.cores import DEFAULT_CORE, DEFAULT_GAMMA, DEFAULT_INIT, DEFAULT_NUM_ITER
from ._base import method
from .skyformer import completion_nystrom, draw_completion_columns

__all__ = ["skyformer_softmax", "SKYFORMER_SOFTMAX"]


@method(
    "skyformer-softmax",
    target="softmax",
    features="sampled columns d of the completion of [Q; K]",
    max_features=lambda n, m: n + m,
    draw=draw_completion_columns,
    causal="mask-renormalise",
    differentiable=True,
)
def skyformer_softmax(q, k, v, *, num_features, generator=None, core=DEFAULT_CORE, gamma=DEFAULT_GAMMA,
                      num_iter=DEFAULT_NUM_ITER, init=DEFAULT_INIT, columns=None, key_mask=None, draw=None,
                      diagnostics=True, sampling="uniform"):
    r"""Eq. (5) of Skyformer on the completion :math:`\bar A` of the raw scores, row-normalised.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``, ``(*batch, m, p_v)``.
    num_features : int
        ``d``, sampled columns of the completion, ``1 <= d <= n + m``.
    generator : torch.Generator, optional
        CPU generator for the column sample.
    core, gamma, num_iter, init, columns, key_mask, draw, diagnostics
        As for :func:`approxlab.methods.skyformer.skyformer` (default ``core="pinv"``); the draw is
        ``{"columns": (*batch, d)}``, ``d`` distinct rows of :math:`[Q; K]` drawn uniformly
        (:func:`~approxlab.methods.skyformer.draw_completion_columns`).
    sampling : {"uniform", "rpcholesky"}
        ``"rpcholesky"``: the ``d`` rows are RPCholesky's pivots on the completion :math:`\bar A` of the
        scores, the PSD matrix whose Nyström approximation this method forms (Lemma 1; Algorithm 1 of
        Chen, Epperly, Tropp and Webber 2024; :func:`~approxlab.methods.skyformer.rpcholesky_completion_columns`),
        and the draw is ``{"pivot_uniforms": (*batch, d)}``.

    Returns
    -------
    Approximation
        ``output`` :math:`\tilde D^{-1}\tilde AV`; operator
        ``Diagonal(1/row_sums) @ ProductOperator(left @ core, right)``; ``info``: ``columns``,
        ``core_block`` (the Gaussian core :math:`M = S^\top\bar CS`), ``core_condition_number``,
        ``core_rank``, ``row_sums``, ``min_abs_row_sum``, ``num_nonpositive_row_sums``.

    Notes
    -----
    With :math:`X = [Q; K]`, :math:`\bar A = \exp(XX^\top/\sqrt p) = \bar D^{1/2}\bar C\bar D^{1/2}`
    (Lemma 1, Eq. (1)) is PSD, and its Nyström approximation with columns ``S`` is

    .. math::

        \tilde{\bar A} = \bar AS(S^\top\bar AS)^+S^\top\bar A
                       = \bar D^{1/2}\,\bar CS(S^\top\bar CS)^+S^\top\bar C\,\bar D^{1/2}
                       = \bar D^{1/2}\,\tilde{\bar C}\,\bar D^{1/2},

    because :math:`\bar D^{1/2}S = SD_S^{1/2}` and the Nyström approximation of a PSD matrix
    does not change when the sampled columns are rescaled (same column space of
    :math:`B^\top S`). So :math:`\tilde A = D_Q^{1/2}\tilde CD_K^{1/2}` with the *same*
    :math:`\tilde C` as :func:`~approxlab.methods.skyformer.skyformer`, and
    :math:`\tilde D = \operatorname{diag}(\tilde A\mathbf 1)` (the Figure 1 caption). In
    :math:`\tilde D^{-1}\tilde A` the factor :math:`D_Q^{1/2}` cancels and
    :math:`D_K^{1/2}` may be divided by its largest entry, so every factor is computed
    bounded by 1 (:func:`approxlab.methods.skyformer.gaussian_skeleton`): no ``exp`` of a positive
    number is ever formed, and float32 logits of :math:`\pm 80` stay finite.

    **Failure mode.** :math:`\tilde A` is not entrywise positive, so an approximate row sum
    can be negative or zero; this is the method's real weakness (Skyformer's remark that
    Nyström on :math:`\bar A` inherits its conditioning). Row sums are not clamped: a
    negative one flips the sign of that output row, an exact zero gives ``inf`` (and
    :func:`approxlab.approximate` raises ``FloatingPointError``); ``info`` records the
    smallest :math:`|\tilde D_{ii}|` (in the rescaled units where each row of ``left``
    peaks at 1) and the number of non-positive row sums.

    References
    ----------
    Chen et al. (2021), Skyformer, Lemma 1, Eqs. (4)-(6), Section 4.1, Figure 1.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.metrics import spectral_error
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> exact = approxlab.exact_attention(q, k, v)
    >>> approx = approxlab.approximate("skyformer-softmax", q, k, v, num_features=64)  # all 2n columns
    >>> bool((spectral_error(approx.output, exact, relative=True) < 1e-12).all())
    True
    """
    return completion_nystrom(q, k, v, num_features=num_features, normalized=True, generator=generator, core=core,
                              gamma=gamma, num_iter=num_iter, init=init, columns=columns, key_mask=key_mask,
                              draw=draw, diagnostics=diagnostics, sampling=sampling)


SKYFORMER_SOFTMAX = skyformer_softmax
__test__ = {"skyformer_softmax": skyformer_softmax.function}  # doctest skips a MethodSpec: run its function's examples
