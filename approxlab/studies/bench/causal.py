r"""The ``causal`` part of ``approxlab bench``: the sparse and KV-cache methods against fused causal SDPA (4-D).

One cell per n (``--causal-n``; default 2048, 2896, 4096, 5792, 8192; ``--quick``: 128, 256, 512) and policy
(:func:`cell_methods`): Q, K, V of 3 heads, head dimension 64, float32, standard normal entries (seeded per n, so
every cell of one n times the same tensors), a budget of :math:`b` = ``--causal-budget`` keys per query (128;
``--quick``: 16). Each cell times torch's causal ``scaled_dot_product_attention`` on its fused kernel
(:func:`~.baseline.torch_sdpa`: one 4-D call, the three heads as ``(1, 3, n, 64)``) and its one policy in turn
(:func:`~.timing.measure_interleaved`, on the bench's ``--threads``, one by default), so each ratio policy /
causal SDPA is measured in one run against the baseline on the same tensors. The policies come from the registry
(:func:`policies`); a cell's ``method`` is ``<form>/<method>``:

* ``causal/<method>``: ``approximate(method, q, k, v, num_features=b, causal=True)`` for the per-query
  selection methods with a causal form of their own (:data:`SELECTION_METHODS`) and every causal-only
  method (the decode-time cache policies and the sparse-prefill patterns -- MInference, XAttention,
  FlexPrefill, DuoAttention -- ``register(..., causal="only")``). A step its authors run once per model,
  offline (:data:`OFFLINE`: DuoAttention's split of the heads, learned in the paper) runs once per cell before the
  timed calls, on the cell's own tensors (the split DuoAttention's online form would find there), and the timed
  calls are given its result, as the method runs at inference; the step's seconds are the row's ``offline_s``,
  said in the summary beside the ratio, which does not contain them;
* ``kv-cache/<method>``: :func:`approxlab.kv_cache_attention` with the context the first half of the
  window, for every method registered with a compression step (``compress=``) or a cache scorer
  (``score=``), so a policy registered later is timed without a change here.

A policy that raises is its cell's one failed row (``failed`` 1, the error on stderr); the other cells are timed.
Torch's causal SDPA on its unfused math path (the 3-D call that was the part's baseline before, :data:`MATH_PATH`)
is a cell of its own per n, timed in turn with the fused baseline, so the summary says by how much that baseline
overstated causal SDPA's time at each n. Each method's growth exponent in n is fitted to its median times
(:func:`~.growth.growth_exponent`, with its 95% interval), and :data:`TARGETS` are marked met or not, with the
reason where not, in ``summary.md`` (:func:`causal_lines`; the baseline's time at each n is the median over its
cells). See :mod:`approxlab.studies.bench`.

Re-timing one method
--------------------
A cell is the unit of resume: the bench computes the cells its results table lacks and keeps the others. To time
one method again (after a change to it), drop its cells from the saved table and rerun the run's command (the
same options, so the same config hash); only those cells are computed, each again against the fused baseline::

    from approxlab.studies.engine.store import read_results, write_table
    table = read_results("figures/bench/results.csv")
    again = (table["part"] == "causal") & table["method"].isin(["causal/vattention", "kv-cache/vattention"])
    write_table(table[~again], "figures/bench/results.csv", ("part", "n", "method"))

A table saved before the part had one cell per policy holds one cell per n of method ``policies`` (every policy
timed in it): :func:`causal_lines` leaves those rows out and says so; drop them the same way (``table["method"] ==
"policies"``) and rerun to time the policies in their own cells.
"""

from __future__ import annotations

import math
import sys

import torch

from ..engine.failures import METHOD_ERRORS, method_status
from .baseline import torch_sdpa
from .offline import OFFLINE, offline_lines, offline_step
from .growth import growth_exponent
from .timing import measure_interleaved

__all__ = ["SELECTION_METHODS", "TARGETS", "OFFLINE", "SCORER_TARGET", "PREFILL_TARGET", "EXPONENT_TARGETS",
           "EXPONENT_REASONS", "HEADS", "HEAD_DIM", "BASELINE", "target", "policies", "cell_methods", "causal_qkv",
           "causal_rows", "causal_lines"]

HEADS, HEAD_DIM = 3, 64
"""The heads and head dimension of the part's Q, K, V."""

SELECTION_METHODS = ("topk", "topp", "quest", "vattention", "magicpig")
"""Per-query selection and sampling methods timed in their own causal form beside the cache policies."""

TARGETS = {"streaming-llm": 0.5, "quest": 2.0, "topk": 3.0, "topp": 3.0, "magicpig": 5.0, "vattention": 5.0}
"""Largest time / fused causal SDPA (4-D) per method, in its causal and its KV-cache form, at the largest n (8,192
in the full grid): the cost each method's paper or published kernel sets (a selection oracle's blocked pass with a
running top-k and a sparse PV; Quest's page bounds once per page; MagicPIG's LSH tables and vAttention's sampled
columns built once per prefill). Every other method with a cache scorer (``score=``: the cache policies, H2O,
SnapKV, CriticalKV and CAOTE among them, and any registered later): :data:`SCORER_TARGET`; a sparse-prefill pattern
(causal-only, neither a scorer nor a compression step: MInference, XAttention, FlexPrefill, DuoAttention):
:data:`PREFILL_TARGET`; any other: :data:`DEFAULT_TARGET`."""

SCORER_TARGET = 1.5
"""A cache policy's score, compression and attention together: at most this times fused causal SDPA."""

PREFILL_TARGET = 1.0
"""A sparse-prefill pattern's estimate and its sparse attention together: at most fused causal SDPA's time, the
reason such a method exists (its papers report speed-ups over dense flash attention from 8k-32k tokens on)."""

DEFAULT_TARGET = 3.0


def target(method: str) -> float:
    """The largest time / fused causal SDPA (4-D) of ``method`` at the largest n (:data:`TARGETS`)."""
    from ...methods import get

    if method in TARGETS:
        return TARGETS[method]
    spec = get(method)
    if getattr(spec, "score", None) is not None:
        return SCORER_TARGET
    if spec.causal_only and getattr(spec, "compress", None) is None:
        return PREFILL_TARGET
    return DEFAULT_TARGET


EXPONENT_TARGETS = {"streaming-llm": 1.1, "quest": 1.1, "h2o": 1.1}
r"""Largest growth exponent in n at fixed b (a cost linear in n) of the causal forms, judged on the exponent of the
median wall times (:func:`~.growth.growth_exponent`); a verdict "not met" gives the exponent of the median CPU times
beside it (a process that waits for a core on a loaded machine accrues wall time, not CPU time, so the larger n,
timed under more load, can steepen the wall-time exponent alone) and the method's reason from
:data:`EXPONENT_REASONS` where it has one.

StreamingLLM (the sinks and a window of :math:`b - s` keys per row) and H2O (a cache of :math:`b` keys updated once
per token) cost :math:`O(nbp)`. Quest does not: each query scores every page of its past, :math:`\lceil i/S\rceil`
upper bounds of :math:`p` products each (Algorithm 1 of the paper; the authors' kernel scores all
:math:`\lceil n/S\rceil` pages at each decode step), :math:`O(n^2p/S)` in all beside the :math:`O(nbp)` of its
attention, so its exponent tends to 2; how much of its time that part takes at each n is measured in
``benchmarks/causal_growth.py``."""

EXPONENT_REASONS = {"quest": "page scoring O(n^2 p / page) by design"}
"""Why a method's published algorithm grows faster than :data:`EXPONENT_TARGETS` allows: said with its "not met"
(the rule is kept, not relaxed)."""

BASELINE = "fused causal SDPA (4-D)"
"""How the summary names the baseline of every ratio of the part."""

SDPA = "torch-sdpa-causal"
"""The part's baseline: torch's causal SDPA on its fused kernel (:func:`~.baseline.torch_sdpa`)."""

MATH_PATH = "torch-sdpa-causal-math"
"""Torch's causal SDPA on its unfused math path, the 3-D ``(heads, n, p)`` call that was the part's baseline
before it went through :func:`~.baseline.torch_sdpa`: a cell of its own per n, timed in turn with it so that the
summary says how much the former baseline overstated (no target; no policy is compared with it)."""

FORMER_CELLS = "policies"
"""The ``method`` of the part's former cells, one per n timing every policy in turn (see the module docstring)."""


def _math_path(q, k, v):
    """The former baseline: SDPA on the 3-D ``q, k, v``, which torch sends to its math path (named explicitly,
    so that the call is the same whatever kernel a caller allows)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call():
        with sdpa_kernel(SDPBackend.MATH):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    return call


def policies(methods=None) -> list[tuple[str, str]]:
    """``(form, method)`` of every policy the part times, from the registry (see the module docstring); only those
    of ``methods`` when given."""
    from ...methods import available, get

    found = []
    for name in available() if methods is None else [m for m in available() if m in methods]:
        spec = get(name)
        if name in SELECTION_METHODS or spec.causal_only:
            found.append(("causal", name))
        if getattr(spec, "compress", None) is not None or getattr(spec, "score", None) is not None:
            found.append(("kv-cache", name))
    return found


def _call(form: str, method: str, q, k, v, budget: int, **options):
    from ...attention import approximate
    from ...cache import kv_cache_attention
    from ...methods import get
    from ...cache._scores import model_inputs

    generator = torch.Generator().manual_seed(0)
    rope = model_inputs(get(method), {})  # random Q/K/V carry no RoPE: said to a RoPE-aware policy
    if form == "causal":
        return lambda: approximate(method, q, k, v, num_features=budget, causal=True, generator=generator,
                                   **rope, **options).output
    context = q.shape[-2] // 2
    return lambda: kv_cache_attention(method, q, k, v, context_length=context, num_features=min(budget, context),
                                      generator=generator, **rope).output


def cell_methods(methods=None) -> list[str]:
    """The ``method`` of each cell of one n, in the order they run: :data:`MATH_PATH`, then ``<form>/<method>`` of
    every policy (:func:`policies`; those of ``methods`` only, when given).

    Examples
    --------
    >>> cell_methods(["streaming-llm"])
    ['torch-sdpa-causal-math', 'causal/streaming-llm', 'kv-cache/streaming-llm']
    """
    return [MATH_PATH, *(f"{form}/{method}" for form, method in policies(methods))]


def causal_qkv(config: dict, n: int) -> tuple:
    """The part's Q, K, V at length ``n``, each ``(HEADS, n, HEAD_DIM)`` standard normal, seeded per n (every cell
    of one n times the same tensors)."""
    from ..engine.keys import cell_seed

    generator = torch.Generator().manual_seed(cell_seed("causal", n, base_seed=config["seed"]))
    return tuple(torch.randn(HEADS, n, HEAD_DIM, generator=generator) for _ in range(3))


def causal_rows(cell: dict) -> list[dict]:
    """Rows of one ``causal`` cell (one n, one of :func:`cell_methods`): causal SDPA, then the cell's policy
    ``<form>/<method>`` (or :data:`MATH_PATH`) with ``ratio_vs_sdpa`` and ``cpu_ratio_vs_sdpa``; a policy that
    raises: its one failed row."""
    config, n, device, name = cell["config"], cell["n"], cell["device"], cell["method"]
    budget = min(int(config["causal_budget"]), n)
    q, k, v = (x.to(device) for x in causal_qkv(config, n))
    sdpa = lambda: torch_sdpa(q, k, v, causal=True)  # noqa: E731 (on the fused kernel: one 4-D call)
    common = {"heads": HEADS, "p": HEAD_DIM, "num_features": budget, "compute_dtype": "float32"}
    offline = {}
    try:
        if name == MATH_PATH:
            function = _math_path(q, k, v)
        else:
            form, method = name.split("/", 1)
            options, offline = offline_step(form, method, q, k, v, budget)
            function = _call(form, method, q, k, v, budget, **options)
        sdpa()  # the warm-up call; the policy's warm-up call is also its check
        function()
    except METHOD_ERRORS as error:  # the method's failure: the cell's failed row (the error on stderr, as the
        # forward part says it)
        print(f"approxlab bench: {name} failed at n={n}: {method_status(name.split('/', 1)[-1], error)}",
              file=sys.stderr)
        return [{"algorithm": name, **common, "failed": 1.0}]
    base, measured = measure_interleaved([sdpa, function], repeats=int(config["repeats"]), warmup=0, device=device)
    return [{"algorithm": SDPA, **common, **base.as_row()},
            {"algorithm": name, **common, **measured.as_row(), "ratio_vs_sdpa": measured.wall_s / base.wall_s,
             "cpu_ratio_vs_sdpa": measured.cpu_s / base.cpu_s, **offline}]


def _verdict(form: str, method: str, ratios: dict, exponent, cpu_exponent=None) -> str:
    """``met``, or ``not met`` with the reason, for the targets of ``method`` in ``form``: the ratio at the largest
    n (smaller n show the per-call overhead), the growth exponent of the causal forms (of the median wall times;
    ``cpu_exponent``, that of the median CPU times, is said beside a miss, with :data:`EXPONENT_REASONS`)."""
    limit = target(method)
    largest = max(ratios)
    reasons = [f"{ratios[largest]:.2f}x at n = {largest} (target <= {limit:g}x)"] if ratios[largest] > limit else []
    bound = EXPONENT_TARGETS.get(method) if form == "causal" else None
    if bound is not None:
        if exponent is None:
            reasons.append("growth exponent not measured (fewer than two n)")
        elif exponent.exponent > bound:
            cpu = "" if cpu_exponent is None else f"; {_fit_text(cpu_exponent)} in CPU time"
            why = f": {EXPONENT_REASONS[method]}" if method in EXPONENT_REASONS else ""
            reasons.append(f"growth exponent {exponent.exponent:.2f} (target <= {bound:g}{cpu}){why}")
    return "met" if not reasons else "not met: " + "; ".join(reasons)


def causal_lines(wide, planned=None) -> list[str]:
    """The "Causal forms against fused causal SDPA (4-D)" section of ``summary.md``: each policy's ratio at every n,
    its target at the largest n and whether it is met, its growth exponent; then what the former baseline (the
    unfused math path) overstated.

    ``planned``: the n of the run's grid (``config["causal_n"]``). A run stopped before its largest n judges no
    target (its largest n measured is not the one the targets are set at) and says which n are left to resume.
    """
    rows = wide[wide["part"] == "causal"]
    former = rows[rows["method"] == FORMER_CELLS] if "method" in rows else rows.iloc[:0]
    rows = rows.drop(former.index)
    if rows.empty or "wall_s" not in rows:
        return [f"## Causal forms against {BASELINE}", "", *_former_cells_lines(former)] if len(former) else []
    failed = rows[rows["failed"] == 1] if "failed" in rows else rows.iloc[:0]
    rows = rows.drop(failed.index)
    ns = sorted({int(n) for n in rows["n"]})
    left = sorted({int(n) for n in planned or ()} - set(ns))
    budget = int(rows["num_features"].max()) if "num_features" in rows else "?"
    named = "; ".join(f"{', '.join(sorted(m for m in TARGETS if TARGETS[m] == bound))} <= {bound:g}x"
                      for bound in sorted(set(TARGETS.values())))
    exponents = ", ".join(sorted(EXPONENT_TARGETS))
    lines = [f"## Causal forms against {BASELINE}", "",
             f"Q, K, V of {HEADS} heads, head dimension {HEAD_DIM}, float32, budget b = {budget}. Every ratio is time / "
             f"{BASELINE}: torch's `scaled_dot_product_attention(..., is_causal=True)` as one `(1, {HEADS}, n, "
             f"{HEAD_DIM})` call, its fused flash kernel, on the same tensors as the policies; each policy and the "
             "baseline timed in turn in one run (median wall time). Targets at the largest n (smaller n show the "
             f"per-call overhead), in the causal and the KV-cache form: {named}; every other cache policy "
             f"(score, compression and attention) <= {SCORER_TARGET:g}x; every sparse-prefill pattern (estimate and "
             f"attention) <= {PREFILL_TARGET:g}x; growth exponent <= "
             f"{max(EXPONENT_TARGETS.values()):g} for the causal forms of {exponents} (of the median wall times, the "
             "exponent's 95% interval beside it; a miss also says the exponent of the median CPU times, which a "
             "loaded machine disturbs less, and the method's reason where its published algorithm is not linear in "
             "n). The KV-cache forms compress the first half of the window once (the prefill's attention: "
             "quadratic in n, like SDPA).", "",
             *([f"**A partial run**: n = {', '.join(map(str, left))} of its grid not measured yet (the same "
                "command resumes it); no target is judged below the grid's largest n.", ""] if left else []),
             *_former_cells_lines(former),
             f"| policy | time / {BASELINE} at n = " + ", ".join(str(n) for n in ns) + f" | at n = {ns[-1]}: ratio "
             "(target) | the same in CPU time | growth exponent [95%] | met |", "|---|---|---|---|---|---|"]
    sdpa = rows[rows["algorithm"] == SDPA].groupby("n")["wall_s"].median()
    if len(sdpa):
        fit = growth_exponent(sdpa.index.to_numpy(), sdpa.to_numpy()) if len(sdpa) > 1 else None
        lines.append(f"| {BASELINE}, seconds | " + ", ".join(f"{sdpa[n]:.4f}" if n in sdpa else "—" for n in ns)
                     + f" | — | — | {_fit_text(fit)} | — |")
    verdicts = {}
    for algorithm in sorted(set(rows["algorithm"]) - {SDPA, MATH_PATH}):
        sub = rows[rows["algorithm"] == algorithm].groupby("n")
        ratios = {int(n): float(r) for n, r in sub["ratio_vs_sdpa"].median().items()}
        times = sub["wall_s"].median()
        fit = growth_exponent(times.index.to_numpy(), times.to_numpy()) if len(times) > 1 else None
        cpu_times = sub["cpu_s"].median() if "cpu_s" in rows else times.iloc[:0]
        cpu_times = cpu_times[cpu_times > 0]  # NaN or no CPU time: no fit
        cpu_fit = growth_exponent(cpu_times.index.to_numpy(), cpu_times.to_numpy()) if len(cpu_times) > 1 else None
        shown = ", ".join(f"{ratios[n]:.2f}" if n in ratios else "—" for n in ns)
        form, method = algorithm.split("/", 1)
        largest = max(ratios)
        cpu = sub["cpu_ratio_vs_sdpa"].median().get(largest, math.nan) if "cpu_ratio_vs_sdpa" in rows else math.nan
        verdicts[algorithm] = _verdict(form, method, ratios, fit, cpu_fit) if not left else "not judged (partial run)"
        lines.append(f"| `{algorithm}` | {shown} | {ratios[largest]:.2f} (<= {target(method):g}x"
                     f"{'' if largest == ns[-1] else f', at n = {largest}'}) | "
                     f"{'—' if math.isnan(cpu) else f'{cpu:.2f}'} | {_fit_text(fit)} | {verdicts[algorithm]} |")
    for algorithm, group in failed.groupby("algorithm", sort=True):
        lines.append(f"| `{algorithm}` | failed at n = {', '.join(str(int(n)) for n in sorted(group['n']))} (the "
                     "error is on the run's stderr) | — | — | — | not measured |")
    if not left:
        missed = [algorithm for algorithm, verdict in verdicts.items() if verdict != "met"]
        lines += ["", f"Met: {len(verdicts) - len(missed)} of {len(verdicts)} policies; not met: "
                  + (", ".join(f"`{algorithm}`" for algorithm in missed) or "none") + "."]
    return lines + ["", *offline_lines(rows, sdpa), *_load_lines(rows, ns), *_former_baseline_lines(rows, ns)]


def _former_cells_lines(former) -> list[str]:
    """The note on the rows of a table saved with the part's former cells (:data:`FORMER_CELLS`), left out."""
    if not len(former):
        return []
    return [f"Left out: the rows of the former cells (method `{FORMER_CELLS}`, every policy timed in one cell per n) "
            f"at n = {', '.join(str(int(n)) for n in sorted(set(former['n'])))}; drop them from results.csv and "
            "rerun the same command to time each policy in its own cell (the docstring of "
            "`approxlab.studies.bench.causal` says how).", ""]


def _load_lines(rows, ns) -> list[str]:
    """The machine's 1-minute load average while each n was measured: on a shared machine every wall time is
    inflated, the more so the higher the load, and the CPU-time ratios are the steadier reading."""
    if "load_average" not in rows or rows["load_average"].isna().all():
        return []
    load = rows.groupby("n")["load_average"].agg(["min", "max"])
    return ["1-minute load average during these measurements: " + ", ".join(
        f"{load.loc[n, 'min']:.1f}-{load.loc[n, 'max']:.1f} at n = {n}" for n in ns if n in load.index)
        + " (with the load above the machine's cores every wall time is inflated, the baseline's and the policies' "
          "alike but not equally: the ratios in CPU time are the steadier reading).", ""]


def _former_baseline_lines(rows, ns) -> list[str]:
    """What the former baseline (torch's unfused math path on 3-D inputs) overstated, measured beside the fused
    call in the same run: its time over the fused baseline's per n."""
    math_path = rows[rows["algorithm"] == MATH_PATH].groupby("n")
    if not len(math_path):
        return []
    ratios = math_path["ratio_vs_sdpa"].median()
    seconds = math_path["wall_s"].median()
    cpu = math_path["cpu_ratio_vs_sdpa"].median() if "cpu_ratio_vs_sdpa" in rows else {}
    return ["### Changes: the former baseline", "",
            f"The part's baseline was formerly torch's causal SDPA on 3-D `({HEADS}, n, {HEAD_DIM})` inputs, "
            "which torch sends to its unfused math path (it forms the n x n logits). Timed in turn with the "
            f"{BASELINE} in this run, that call took " + ", ".join(
                f"{seconds[n]:.4f} s ({ratios[n]:.2f}x{f'; {cpu[n]:.2f}x in CPU time' if n in cpu else ''}) at n = {n}"
                for n in ns if n in ratios)
            + ". The former run's baseline overstated causal SDPA's time by these factors, and its ratios "
            "understated every policy's cost by the same factors (a policy at 1x of the former baseline is at "
            f"{min(ratios):.1f}-{max(ratios):.1f}x of the fused kernel).", ""]


def _fit_text(fit) -> str:
    if fit is None:
        return "—"
    return f"{fit.exponent:.2f}" + ("" if math.isnan(fit.low) else f" [{fit.low:.2f}, {fit.high:.2f}]")
