r"""Singular-value decay of attention matrices and of their approximations.

Regenerates, on BERT Q/K/V of WikiText-2, the singular-value distribution of Skyformer
Appendix B (Figure 4: "the singular values decay fast and thus justify the low-rank
approximation") together with the spectrum comparison of the spectral-shifting paper
(Verma, Figure 2: the spectral-shifting approximation "has no long tail, so it is not a low
rank matrix"), and tests Skyformer's claim (Section 1, Section 4.1) that the un-normalised
scores have "extremely large condition numbers due to fast singular value decay" while the
Gaussian kernel's normalisation gives "a more reasonable condition number".

For each case (condition, layer, n) and each head of each window, the singular values
:math:`\sigma_i/\sigma_1` (all of them) of

* ``scores``: :math:`A = \exp(QK^\top/\sqrt p)`, formed as :math:`\exp(QK^\top/\sqrt p - \max)`
  (a positive rescaling: the ratios are unchanged, nothing overflows);
* ``softmax``: :math:`D^{-1}A`;
* ``kernelized``: :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})` (Skyformer Eq. (3));
* ``completion``: the eigenvalues of the PSD completion
  :math:`\bar C = \kappa([Q;K]/p^{1/4}, [Q;K]/p^{1/4})` (Skyformer Eq. (4), ``2n x 2n``);
* ``output``: :math:`D^{-1}AV` (``n x p_v``; what Skyformer's Figure 4 shows);
* the dense matrices of ``skyformer`` (approximates :math:`C`), ``nystromformer`` and
  ``spectral-shifting`` (approximate :math:`D^{-1}A`) at ``d = 64``,

all in float64. Per matrix the table also holds the numerical rank at ``1e-6``, the stable
rank, the effective rank, :math:`d_{stat}(\lambda)` at :math:`\lambda = \epsilon\sigma_1` for
:math:`\epsilon \in \{0.1, 0.01\}` (for :math:`\bar C` the statistical dimension of Skyformer
Theorem 2 with :math:`\lambda = \epsilon\|\bar C\|`), the 2-norm condition number (``inf``
where numerically singular: :math:`\sigma_{\min} \le \max(n,k)\,\varepsilon_{64}\,\sigma_1`,
never a rounding-noise number like 1e+81) and the decay rate (least-squares slope of
:math:`\ln\sigma_i` over the first 64 indices). All measures come from one SVD per matrix
(:func:`approxlab.metrics.spectrum_measures`, one SVD per matrix; :mod:`.spectra`).

Q/K/V. ``n = 512``: ``mode="hidden"`` (the hidden state entering the layer, with BERT's position
embeddings). ``n = 2048``: ``mode="embedding"``: BERT's input embedding
:math:`\mathrm{LayerNorm}(E_{word} + E_{position} + E_{type})` projected by *that layer's*
:math:`W_Q, W_K, W_V` -- the setting of Skyformer's Figure 1, since hidden states do not exist
beyond 512 positions. Positions beyond the 512-row table follow ``--positions`` (default
``interpolate``: the table resampled linearly to n rows; ``copy``: Longformer's repetition;
``none``: no positions, the previous inputs -- see :func:`approxlab.data.qkv.position_embeddings`).
``--checkpoint`` picks the BERT-family model (:func:`approxlab.data.load_model`).

Noise floor. The spectra are computed in float64 by an SVD (eigendecomposition for
:math:`\bar C`), whose singular values carry an absolute error of about
:math:`\max(n,k)\,\varepsilon_{64}\,\sigma_1`. Ratios :math:`\sigma_i/\sigma_1` below the
panel's floor :math:`2n\,\varepsilon_{64}` (the largest matrix of the panel is the
:math:`2n\times 2n` completion) are rounding noise: the figure draws that floor and nothing
below it (:func:`~.spectra.noise_floor`). Layers first / middle / last are ``0``,
``L // 2`` and ``L - 1`` (initialized BERT: 0, 6, 11; pretrained MiniLM-L6: 0, 3, 5); ``--layers``
also takes indices.

The declaration :data:`STUDY`: the grid (:mod:`.grid`, hashed in config.json); one cell per
(condition, layer, n, window) writing both tables (:mod:`.spectra`): ``results.csv`` with one row per
head x matrix, and ``spectra.csv.gz`` with, per cell x matrix x index, the mean / min / max over heads of
:math:`\log_{10}(\sigma_i/\sigma_1)`; the report (:mod:`.figures`, :mod:`.summary`) reads only those
files and writes ``sv_decay.png/.pdf`` and ``summary.md``. Ratios below ``1e-20`` are stored as
``-20`` (numerically zero in float64).

``--quick``: n = 512, first layer only, 1 window, 2 heads; ``approxlab-results/sv-decay-quick/``
unless ``--out`` is given.

References
----------
Chen, Zeng, Ji, Yang. *Skyformer*. NeurIPS 2021. Section 1, Section 4.1 (Eqs. (3)-(4)),
Theorem 2, Appendix B (Figure 4).

Verma. *Beyond Nyströmformer -- Approximation of self-attention by Spectral Shifting*.
Section 6, Figure 2.

Roy and Vetterli (2007), effective rank; Golub and Van Loan, *Matrix Computations*, 5.4.1.
"""

from __future__ import annotations

from ..declaration import Figure, Step, Study, Summary, Table
from .figures import plot
from .grid import FULL_GRID, OPTIONS, QUICK_GRID, build_config, cells, check, configure, window_ids
from .spectra import (APPROXIMATIONS, EXACT_MATRICES, MATRICES, SPECTRA, attention_spectra, compute_cell,
                      layer_index, noise_floor, spectrum_measures)
from .summary import TITLE, conditioning_by_length, sections, summarize

__all__ = ["STUDY", "OPTIONS", "FULL_GRID", "QUICK_GRID", "MATRICES", "EXACT_MATRICES", "APPROXIMATIONS",
           "spectrum_measures", "layer_index", "noise_floor", "attention_spectra", "build_config", "configure",
           "window_ids", "compute_cell", "plot", "summarize", "conditioning_by_length"]

KEY = ("condition", "layer", "n", "window")

STUDY = Study(
    name="sv-decay",
    description="Singular-value decay of BERT attention matrices on Wikitext-2 (companion to Skyformer Appendix B).",
    full=FULL_GRID, quick=QUICK_GRID, configure=configure, options=OPTIONS, check=check,
    steps=(Step((Table("results.csv", KEY, required=KEY), Table(SPECTRA, KEY)), compute_cell, cells),),
    figures=(Figure("sv_decay", plot),),
    summary=Summary(TITLE, (sections,), generated=False),
    grows=("windows", "n", "layers", "conditions", "heads", "modes"),
)
"""The singular-value decay study, declared: ``approxlab sv-decay``."""
