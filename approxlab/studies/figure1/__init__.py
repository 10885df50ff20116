r"""Skyformer Figure 1: spectral-norm error of approximate attention outputs.

Regenerates Figure 1 of Skyformer (Chen et al., NeurIPS 2021, Section 4.5): for Q, K, V
obtained by embedding Wikitext-2 text into an *initialized* and a *pretrained* BERT-style
model, the spectral norm :math:`\|\tilde O - O\|_2` of the difference between an
approximate attention output :math:`\tilde O` and exact softmax attention
:math:`O = D^{-1}AV`, against the number of features ``d``, for several sequence lengths.

The declaration :data:`STUDY`, over the shared engine (``approxlab figure1``):

1. **grid** -- :func:`~approxlab.studies.figure1.grid.configure` (:mod:`.grid`); saved in
   ``config.json`` (hashed).
2. **cells** -- three steps (:mod:`.cells`), resumable, in-process or on Dask: the tidy tables
   ``results.csv.bz2``, ``conditioning.csv`` and ``windows.csv``.
3. **report** -- from those files only: ``panel_stats.csv`` and ``verdicts.csv`` (:mod:`.stats`,
   on :mod:`approxlab.stats` and the claims engine), ``paper_comparison.csv`` (:mod:`.paper`),
   ``figure1.png/.pdf`` (the paper's four methods) and ``figure1-extra.png/.pdf`` (every other
   method of the run, built-in or registered with :func:`approxlab.methods.register` /
   ``--plugin``, with the same y-limits per panel; :mod:`.figures`) and ``summary.md``
   (:mod:`.summary`, :mod:`.discussion`); ``--plot-only`` redraws them.

Grid (full run)
---------------
conditions {initialized, pretrained} x n {512, 1024, 2048, 4096} x num_features
{16, 32, 64, 128, 256} x methods (the paper's four: skyformer-softmax, nystromformer,
performer, informer; eleven extra: performer-lra, yoso, spectral-shifting, nystrom, linformer, hyperattention,
kdeformer, polynomial, topk, topp, quest; the causal-only KV-cache policies streaming-llm, h2o and snapkv
are not in it) x dtypes
{float64, float32} x 4 windows x 3 seeds. Deterministic methods (``MethodSpec.randomized`` False) run once, with seed 0.
Windows are drawn once, reproducibly (``window_seed``), from the first ``window_pool``
windows of each length (Wikitext-2 test has 66 disjoint windows of 4096 tokens, so every
id is valid for every n <= 4096), the same ids for every n <= 4096 and condition; longer n
draw from the windows that fit in the same 262,144 tokens (:func:`~approxlab.studies.figure1.grid.window_ids`). Q/K/V come
from :func:`approxlab.data.get_qkv` in ``"embedding"`` mode at layer 0: X is BERT's whole input
embedding, LayerNorm(word + position + type). Beyond BERT's 512 positions the table is extended
as ``--positions`` says: ``interpolate`` (default; the table resampled linearly to n rows, every
position distinct — Position Interpolation, Chen et al. 2023; ViT fine-tuning), ``copy``
(Longformer, Beltagy et al. 2020, §5: the table repeated every 512 positions) or ``none``
(no positions: rows of Q fixed by token identity, rank of A at most the number of distinct
tokens). ``--checkpoint`` picks the BERT-family model (see :func:`approxlab.data.load_model`).

``--quick``: n {256, 512}, d {16, 64, 128} (every d below every n), 1 window, 1 seed, float64. Output: ``--out``,
by default ``approxlab-results/figure1`` in the current directory (``figure1-quick`` with
``--quick``, so a smoke run never resumes into the full run); the committed run in
``figures/figure1/`` is rewritten only with ``--out figures/figure1``.

Tables
------
``results.csv.bz2`` (bzip2-compressed: 11 MB as text at the default grid): one row per condition x n x dtype x
window x method x num_features x seed.
The error is computed per attention head (spectral norm of the ``(n, p_v)`` difference, in
float64); a row stores every head's error (``error_heads``, space-separated) and its mean,
std, min and max over the heads (``error_*``), the same for the relative error
:math:`\|\tilde O - O\|_2/\|O\|_2` (``relative_error_*``), the blow-up counts
(``error_blowups``: heads whose error exceeds ``BLOWUP_FACTOR`` = 10 times
:math:`\|O\|_2`; ``near_zero_rows``: rows of :math:`\tilde A\mathbf 1` with
:math:`|(\tilde A\mathbf 1)_i| \le` ``NEAR_ZERO_ROW`` = 1e-3 times the head's median
:math:`|(\tilde A\mathbf 1)_j|`, summed over heads, for methods that report their row sums,
``row_sums_reported``), the checkpoint, the wall time, the number of warnings the method
raised and a ``status`` ("ok", or the error that stopped the method, whose errors are then ``inf``).

``windows.csv``: one row per condition x n x window: distinct tokens, distinct rows of Q
(head 0), the numerical rank of A (head 0; singular values above ``n * eps64 * sigma_1``, from an
LU factorisation of A: :func:`approxlab.metrics.numerical_rank_lu`) and the wall time of these
diagnostics (``seconds``; the factorisation is nearly all of it).

``panel_stats.csv``, ``verdicts.csv`` (median and mean) and ``paper_comparison.csv``: written by
the report step from ``results.csv.bz2`` (:mod:`.stats`, :mod:`.paper`).

``conditioning.csv``: one row per condition x n x num_features, on the first window:
the statistical dimension :math:`d_{stat}(\lambda) = \operatorname{tr}\bar C(\bar C+\lambda I)^{-1}`
of the PSD completion :math:`\bar C = \kappa([Q;K]/p^{1/4})` (Skyformer Eq. (4), Theorem 2)
with :math:`\lambda = 0.1\|\bar C\|_2` for the heads in ``panel_stats.heads`` (an
eigendecomposition of a ``2n x 2n`` matrix per head; the subset keeps n = 4096 affordable),
and the condition number of the sampled core reported by ``skyformer-softmax`` (seed 0,
all heads), when the method reports one.

Cells and caching
-----------------
A runner cell is (condition, n, window, method); it returns the rows of all its
num_features x seeds. Cells are ordered so that those sharing a window are adjacent,
and the window's Q/K/V, exact output and its norms are kept in a per-process LRU cache
(:func:`reference`), so an in-process run computes each once and a Dask worker at most
once per window it sees. Where the grid holds ``topk`` or ``topp`` (float64, up to
``--matrix-free-above``), the exact output comes from the same pass over the logits as their
shared key ranking (:func:`approxlab.methods.rank_keys` given ``v``), not a second one.
Each approximation's generator is seeded with
:func:`~approxlab.studies.runner.cell_seed` of (condition, n, window, method, d, seed),
so results do not depend on run order or executor.

References
----------
Chen, Zeng, Ji, Yang. *Skyformer: Remodel Self-Attention with Gaussian Kernel and Nystrom
Method*. NeurIPS 2021. Section 4.5 and Figure 1; Eqs. (3)-(5); Theorem 2.
"""

from __future__ import annotations

from ..declaration import Figure, Product, Step, Study, Summary, Table
from .cells import compute_cell, compute_panel, compute_window
from .cells import approximation_cells, panel_cells, window_cells
from .figures import figure_groups, plot
from .grid import (EXTRA_METHODS, FULL_GRID, OPTIONS, QUICK_GRID, build_config, check, configure, run_info, settings,
                   window_ids)
from .paper import paper_comparison
from . import stats
from .stats import (BLOWUP_FACTOR, BOOTSTRAP, CLAIMS, NEAR_ZERO_ROW, PAPER_METHODS, THRESHOLDS, VERDICT_COLUMNS,
                    head_errors, panel_statistics, precision_table, verdicts)
from .summary import TITLE, sections, summarize

__all__ = ["STUDY", "PAPER_METHODS", "EXTRA_METHODS", "FULL_GRID", "QUICK_GRID", "OPTIONS", "build_config",
           "configure", "window_ids", "compute_cell", "compute_panel", "compute_window", "plot", "figure_groups",
           "summarize", "panel_statistics", "head_errors", "precision_table", "verdicts", "CLAIMS", "THRESHOLDS",
           "BOOTSTRAP", "VERDICT_COLUMNS", "BLOWUP_FACTOR", "NEAR_ZERO_ROW"]

RESULTS_TABLE = Table(stats.RESULTS, ("condition", "n", "dtype", "window", "method"),
                required=("condition", "n", "window", "method", "num_features", "seed", "status", "error_mean"))
CONDITIONING = Table("conditioning.csv", ("condition", "n"), optional=True)
WINDOWS = Table("windows.csv", ("condition", "n", "window"), optional=True)


def _panel_stats(saved):
    return panel_statistics(saved.table(stats.RESULTS))


def _paper_comparison(saved):
    return paper_comparison(saved.product("panel_stats.csv"))


def _verdicts(saved):
    return verdicts(saved.config, saved.table(stats.RESULTS))


STUDY = Study(
    name="figure1",
    description="Skyformer Figure 1: spectral-norm error of approximate attention outputs (BERT Q/K/V, Wikitext-2).",
    full=FULL_GRID, quick=QUICK_GRID, configure=configure, options=OPTIONS,
    steps=(Step((RESULTS_TABLE,), compute_cell, approximation_cells),
           Step((CONDITIONING,), compute_panel, panel_cells),  # the statistical dimension and core conditioning
           Step((WINDOWS,), compute_window, window_cells)),
    check=check, settings=settings, run_info=run_info, claims=CLAIMS,
    products=(Product("panel_stats.csv", _panel_stats), Product("paper_comparison.csv", _paper_comparison),
              Product("verdicts.csv", _verdicts)),
    figures=(Figure("figure1", plot),),
    summary=Summary(TITLE, (sections,)),
    grows=("windows", "methods", "n", "conditions", "dtypes"),
)
"""Skyformer Figure 1, declared: ``approxlab figure1``."""
