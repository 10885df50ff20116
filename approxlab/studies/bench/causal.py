r"""The ``causal`` part of ``approxlab bench``: the sparse and KV-cache methods against causal SDPA.

One cell per n (``--causal-n``; default 2048, 2896, 4096, 5792, 8192; ``--quick``: 128, 256, 512): Q, K, V of 3
heads, head dimension 64, float32, standard normal entries (seeded per n), a budget of
:math:`b` = ``--causal-budget`` keys per query (128; ``--quick``: 16). Torch's causal
``scaled_dot_product_attention`` on its fused kernel (:func:`~.baseline.torch_sdpa`: one 4-D call, the
three heads as ``(1, 3, n, 64)``) and every policy are timed in turn in that cell
(:func:`~.timing.measure_interleaved`, on the bench's ``--threads``, one by default), so each ratio
policy / causal SDPA is measured in one run. The policies come from the registry (:func:`policies`):

* ``causal/<method>``: ``approximate(method, q, k, v, num_features=b, causal=True)`` for the per-query
  selection methods with a causal form of their own (:data:`SELECTION_METHODS`) and every causal-only
  method (the decode-time cache policies, ``register(..., causal="only")``);
* ``kv-cache/<method>``: :func:`approxlab.kv_cache_attention` with the context the first half of the
  window, for every method registered with a compression step (``compress=``) or a cache scorer
  (``score=``), so a policy registered later is timed without a change here.

Each method's growth exponent in n is fitted to its median times (:func:`~.growth.growth_exponent`, with
its 95% interval), and :data:`TARGETS` are marked met or not, with the reason where not, in ``summary.md``
(:func:`causal_lines`). See :mod:`approxlab.studies.bench`.
"""

from __future__ import annotations

import math
import sys

import torch

from ..engine.failures import METHOD_ERRORS, method_status
from .baseline import torch_sdpa
from .growth import growth_exponent
from .timing import measure_interleaved

__all__ = ["SELECTION_METHODS", "TARGETS", "EXPONENT_TARGETS", "HEADS", "HEAD_DIM", "policies", "causal_rows",
           "causal_lines"]

HEADS, HEAD_DIM = 3, 64
"""The heads and head dimension of the part's Q, K, V."""

SELECTION_METHODS = ("topk", "topp", "quest", "vattention", "magicpig")
"""Per-query selection and sampling methods timed in their own causal form beside the cache policies."""

TARGETS = {"streaming-llm": 1.0, "topk": 5.0, "topp": 5.0, "vattention": 5.0}
"""Largest time / causal SDPA per method in its causal form, at the largest n; every other policy (h2o, quest,
snapkv, any cache policy
or scorer registered later): :data:`DEFAULT_TARGET`."""

DEFAULT_TARGET = 3.0

EXPONENT_TARGETS = {"streaming-llm": 1.1, "quest": 1.1, "h2o": 1.1}
"""Largest growth exponent in n at fixed b (a cost linear in n)."""

SDPA = "torch-sdpa-causal"


def policies() -> list[tuple[str, str]]:
    """``(form, method)`` of every policy the part times, from the registry (see the module docstring)."""
    from ...methods import available, get

    found = []
    for name in available():
        spec = get(name)
        if name in SELECTION_METHODS or spec.causal_only:
            found.append(("causal", name))
        if getattr(spec, "compress", None) is not None or getattr(spec, "score", None) is not None:
            found.append(("kv-cache", name))
    return found


def _call(form: str, method: str, q, k, v, budget: int):
    from ...attention import approximate
    from ...kv_cache import kv_cache_attention

    generator = torch.Generator().manual_seed(0)
    if form == "causal":
        return lambda: approximate(method, q, k, v, num_features=budget, causal=True, generator=generator).output
    context = q.shape[-2] // 2
    return lambda: kv_cache_attention(method, q, k, v, context_length=context, num_features=min(budget, context),
                                      generator=generator).output


def causal_rows(cell: dict) -> list[dict]:
    """Rows of one ``causal`` cell (one n): causal SDPA, then ``<form>/<method>`` with ``ratio_vs_sdpa``."""
    from ..engine.keys import cell_seed

    config, n, device = cell["config"], cell["n"], cell["device"]
    budget = min(int(config["causal_budget"]), n)
    generator = torch.Generator().manual_seed(cell_seed("causal", n, base_seed=config["seed"]))
    q, k, v = (torch.randn(HEADS, n, HEAD_DIM, generator=generator).to(device) for _ in range(3))
    sdpa = lambda: torch_sdpa(q, k, v, causal=True)  # noqa: E731 (on the fused kernel: one 4-D call)
    sdpa()  # the warm-up call; a policy's warm-up call is also its check
    common = {"heads": HEADS, "p": HEAD_DIM, "num_features": budget, "compute_dtype": "float32"}
    timed, failed = [], []
    for form, method in policies():
        function = _call(form, method, q, k, v, budget)
        try:
            function()
            timed.append(((form, method), function))
        except METHOD_ERRORS as error:  # the method's failure: a failed row (the error on stderr, as the
            # forward part says it), the others are timed
            print(f"approxlab bench: {form}/{method} failed at n={n}: {method_status(method, error)}",
                  file=sys.stderr)
            failed.append({"algorithm": f"{form}/{method}", **common, "failed": 1.0})
    base, *measured = measure_interleaved([sdpa, *(function for _, function in timed)],
                                          repeats=int(config["repeats"]), warmup=0, device=device)
    rows = [{"algorithm": SDPA, **common, **base.as_row()}]
    for ((form, method), _), m in zip(timed, measured):
        rows.append({"algorithm": f"{form}/{method}", **common, **m.as_row(), "ratio_vs_sdpa": m.wall_s / base.wall_s,
                     "cpu_ratio_vs_sdpa": m.cpu_s / base.cpu_s})
    return rows + failed


def _verdict(form: str, method: str, ratios: dict, exponent) -> str:
    """``met``, or ``not met`` with the reason, for the targets of ``method`` in ``form``: the ratio at the largest
    n (smaller n show the per-call overhead), the growth exponent of the causal forms."""
    limit = TARGETS.get(method, DEFAULT_TARGET) if form == "causal" else DEFAULT_TARGET
    largest = max(ratios)
    reasons = [f"{ratios[largest]:.2f}x at n = {largest} (target <= {limit:g}x)"] if ratios[largest] > limit else []
    bound = EXPONENT_TARGETS.get(method) if form == "causal" else None
    if bound is not None:
        if exponent is None:
            reasons.append("growth exponent not measured (fewer than two n)")
        elif exponent.exponent > bound:
            reasons.append(f"growth exponent {exponent.exponent:.2f} (target <= {bound:g})")
    return "met" if not reasons else "not met: " + "; ".join(reasons)


def causal_lines(wide) -> list[str]:
    """The "Causal forms against causal SDPA" section of ``summary.md``: ratios, exponents, targets."""
    rows = wide[wide["part"] == "causal"]
    if rows.empty or "wall_s" not in rows:
        return []
    failed = rows[rows["failed"] == 1] if "failed" in rows else rows.iloc[:0]
    rows = rows.drop(failed.index)
    ns = sorted({int(n) for n in rows["n"]})
    budget = int(rows["num_features"].max()) if "num_features" in rows else "?"
    lines = ["## Causal forms against causal SDPA", "",
             f"Q, K, V of {HEADS} heads, head dimension {HEAD_DIM}, float32, budget b = {budget}; each policy and "
             "torch's causal SDPA timed in turn in one run (median wall time). Targets: streaming-llm <= 1x causal "
             "SDPA; h2o, quest, snapkv, magicpig and any cache policy (and every KV-cache form) <= 3x; topk, topp and "
             "vattention (oracles: every logit first) <= 5x, at the "
             "largest n (smaller n show the per-call overhead); growth exponent <= 1.1 for the causal forms of "
             "streaming-llm, quest and h2o (its 95% interval beside it). The KV-cache forms compress the first half "
             "of the window once (the prefill's attention: quadratic in n, like SDPA).", "",
             "| policy | time / causal SDPA at n = " + ", ".join(str(n) for n in ns) + " | growth exponent [95%] | "
             "target |", "|---|---|---|---|"]
    sdpa = rows[rows["algorithm"] == SDPA].groupby("n")["wall_s"].median()
    if len(sdpa) > 1:
        fit = growth_exponent(sdpa.index.to_numpy(), sdpa.to_numpy())
        lines.append(f"| causal SDPA | — | {_fit_text(fit)} | — |")
    for algorithm in sorted(set(rows["algorithm"]) - {SDPA}):
        sub = rows[rows["algorithm"] == algorithm].groupby("n")
        ratios = {int(n): float(r) for n, r in sub["ratio_vs_sdpa"].median().items()}
        times = sub["wall_s"].median()
        fit = growth_exponent(times.index.to_numpy(), times.to_numpy()) if len(times) > 1 else None
        shown = ", ".join(f"{ratios[n]:.2f}" if n in ratios else "—" for n in ns)
        form, method = algorithm.split("/", 1)
        lines.append(f"| `{algorithm}` | {shown} | {_fit_text(fit)} | {_verdict(form, method, ratios, fit)} |")
    for algorithm, group in failed.groupby("algorithm", sort=True):
        lines.append(f"| `{algorithm}` | failed at n = {', '.join(str(int(n)) for n in sorted(group['n']))} (the "
                     "error is on the run's stderr) | — | not measured |")
    return lines + [""]


def _fit_text(fit) -> str:
    if fit is None:
        return "—"
    return f"{fit.exponent:.2f}" + ("" if math.isnan(fit.low) else f" [{fit.low:.2f}, {fit.high:.2f}]")
