r"""YOSO-E: the expectation of YOSO-m over hashes (Zeng et al., 2021), computed exactly.

The reference that YOSO-m (:mod:`approxlab.methods.yoso`) converges to as the number of hashes
grows; target ``"yoso"``. ``num_features`` is accepted and ignored.
"""

from __future__ import annotations

import torch.nn.functional as F

from .. import lsh
from .._validation import check_bool, check_int
from ..operators import DenseOperator
from ._base import Approximation, method
from .yoso import MAX_HASHES

__all__ = ["yoso_e", "YOSO_E"]


@method(
    "yoso-e",
    target="yoso",
    features="ignored (exact expectation)",
    max_features=lambda n: MAX_HASHES,
    randomized=False,
)
def yoso_e(q, k, v, *, num_features=None, generator=None, tau=8, normalize_output=False):
    r"""YOSO-E attention :math:`\bigl(1 - \arccos(\hat Q\hat K^\top)/\pi\bigr)^{\circ\tau} V`.

    Parameters
    ----------
    q, k : torch.Tensor
        ``(*batch, n, p)`` and ``(*batch, n_k, p)``; rows are :math:`\ell_2`-normalised first.
    v : torch.Tensor
        ``(*batch, n_k, p_v)``.
    num_features, generator
        Accepted and ignored (deterministic), so YOSO-E runs through the same grids as YOSO-m;
        ``num_features`` may be up to the YOSO-m maximum.
    tau : int, default 8
        Hyperplanes per hash of the YOSO-m this is the expectation of, ``1 <= tau <= 30``.
    normalize_output : bool, default False
        If True, :math:`\ell_2`-normalise each output row (N-YOSO, YOSO Section 3.1); zero rows
        stay zero. The operator is the unnormalised matrix either way.

    Returns
    -------
    Approximation
        ``output`` ``(*batch, n, p_v)``; ``operator()`` a dense ``(*batch, n, n_k)`` operator;
        ``info``: ``tau``, ``normalize_output``.

    Notes
    -----
    :math:`\mathbb E[\mathcal B(Q,K)_{ij}] = (1 - \arccos(\hat Q_i^\top\hat K_j)/\pi)^\tau` is the
    collision probability of ``tau`` concatenated hyperplane hashes (YOSO Section 3.1, the display
    after Eq. (2); Charikar, 2002). The cosine is clamped to ``[-1, 1]`` before ``arccos``. This forms
    the dense ``n x n_k`` matrix: :math:`O(n n_k p)` time and :math:`O(n n_k)` memory, as the paper
    notes for YOSO-E ("directly computing the expectation involves a :math:`O(n^2)` cost", Section 4.1).
    Entries lie in ``[0, 1]``; nothing can overflow.

    References
    ----------
    .. [1] Z. Zeng, Y. Xiong, S. N. Ravi, S. Acharya, G. Fung, V. Singh. "You Only Sample (Almost)
       Once: Linear Cost Self-Attention Via Bernoulli Sampling." ICML 2021.
    .. [2] M. S. Charikar. "Similarity estimation techniques from rounding algorithms." STOC 2002.
    """
    tau = check_int(tau, "tau", low=1, high=lsh.MAX_TAU)
    check_bool(normalize_output, "normalize_output")
    cosine = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)
    matrix = lsh.collision_probability(cosine, tau)
    output = matrix @ v
    if normalize_output:
        output = F.normalize(output, dim=-1)
    info = {"tau": tau, "normalize_output": normalize_output}
    return Approximation("yoso-e", "yoso", output, DenseOperator(matrix), info)


YOSO_E = yoso_e
