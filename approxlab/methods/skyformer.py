r"""Skyformer: Nyström on the PSD completion of the kernelized scores (Skyformer Eqs. (4)-(6)).

Target: kernelized attention :math:`CV`, :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})`
(Eq. (3) of Skyformer). ``num_features`` is the number ``d`` of sampled columns of the
``2n x 2n`` completion, ``1 <= d <= 2n``.
"""

from __future__ import annotations

from .. import sketch
from ._base import Approximation, method


@method(
    "skyformer",
    target="kernelized",
    features="sampled columns d of the 2n x 2n completion (Eq. (5))",
    max_features=lambda n: 2 * n,
)
def skyformer(
    q,
    k,
    v,
    *,
    num_features,
    generator=None,
    core="pinv",
    gamma=0.1,
    num_iter=6,
    init="identity",
    columns=None,
):
    r"""Skyformer's modified Nyström approximation of kernelized attention :math:`CV`.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, m, p)``, ``(*batch, m, p_v)``.
    num_features : int
        ``d``, sampled columns of the completion, ``1 <= d <= n + m``.
    generator : torch.Generator, optional
        CPU generator for the column sample.
    core : {"pinv", "schulz"}
        ``"pinv"`` (default): the exact, rank-thresholded pseudo-inverse of
        :math:`M = S^\top\bar CS` (Eq. (5); what Theorem 2 bounds and what Figure 1 plots).
        ``"schulz"``: the paper's practical core (Section 4.4, Lemma 3),
        :math:`(M+\gamma I)^{-1}` by ``num_iter`` Schulz steps on
        :math:`D_M^{-1/2}(M+\gamma I)D_M^{-1/2}`; see :func:`approxlab.sketch.nystrom_core`.
    gamma : float
        :math:`\gamma > 0` for ``core="schulz"`` (default 0.1).
    num_iter : int
        Schulz iterations for ``core="schulz"`` (default 6).
    init : {"identity", "nystromformer", "official"}
        Schulz start for ``core="schulz"``; ``"identity"`` (default) converges by Lemma 3.
    columns : torch.Tensor, optional
        ``(d,)`` or ``(*batch, d)`` explicit indices into the ``n + m`` rows of
        :math:`[Q; K]` (``d`` must equal ``num_features``); no random draw then.

    Returns
    -------
    Approximation
        ``output`` :math:`\tilde CV`, operator ``ProductOperator(left @ core, right)`` (see
        :func:`approxlab.sketch.skeleton_attention`);
        ``info``: ``columns`` ``(*batch, d)``, ``core_block`` :math:`M`,
        ``core_condition_number``, ``core_rank`` (and Schulz residuals for ``"schulz"``).

    Notes
    -----
    With :math:`X = [Q; K]/p^{1/4}` (``2n x p``), :math:`\bar C = \kappa(X, X)` is PSD
    (Eq. (4)) and

    .. math::

        \tilde C = (I, 0)\,\bar CS(S^\top\bar CS)^+S^\top\bar C\,(0, I)^\top
                 = \kappa(Q', X_S)\,M^+\,\kappa(X_S, K')   \qquad \text{(Eqs. (5)-(6))},

    computed as ``(left @ core) @ (right @ v)`` (core kept factored) in :math:`O(ndp + nd\,p_v + d^3)`, never
    ``n x n``. By Appendix D, :math:`\|C - \tilde C\| \le \|\bar C - \tilde{\bar C}\|`, and
    Theorem 2 bounds the latter by :math:`\lambda` once ``d`` exceeds
    :math:`\tfrac{28}{3}\,\tfrac{2d_{stat}}{\beta}\log\tfrac{4n}{\delta}` (uniform columns).
    Columns are sampled without replacement (distinct rows of :math:`[Q;K]`); repeats can
    be passed explicitly and change nothing.

    References
    ----------
    Chen et al. (2021), Skyformer, Eqs. (3)-(6), Theorem 2, Lemma 3, Section 4.4.
    """
    sketch.check_core_options(core=core, gamma=gamma, num_iter=num_iter, init=init)
    landmarks, columns = sketch.completion_landmarks(q, k, num_features, generator=generator, columns=columns)
    skeleton = sketch.gaussian_skeleton(q, k, landmarks, landmarks, normalized=False)
    core_factors, info = sketch.nystrom_core(
        skeleton.block, core=core, gamma=gamma, num_iter=num_iter, init=init
    )
    output, operator, extra = sketch.skeleton_attention(skeleton, core_factors, v)
    info.update(extra)
    info["columns"] = columns
    return Approximation("skyformer", "kernelized", output, operator, info)


SKYFORMER = skyformer
