r"""The ``causal`` part's offline steps: work a method's authors do once per model, not once per prefill.

DuoAttention learns its split of the heads into retrieval and streaming heads once per model, offline (Section 3
of Xiao et al., ICLR 2025), and runs with that split at inference. The bench runs such a step once per cell of
the method's causal form, before the timed calls, on the cell's own tensors, and gives its result to the timed
calls, so the ratio times the method as it runs at inference; the step's wall seconds are the policy row's
``offline_s`` and a line of ``summary.md`` (:func:`offline_lines`), not part of the ratio. See
:mod:`approxlab.studies.bench.causal`.
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple

__all__ = ["OfflineStep", "OFFLINE", "offline_step", "offline_lines"]


class OfflineStep(NamedTuple):
    """``run(q, k, v, budget) -> options`` of the timed call, and what the step is, in the summary's words."""

    run: Callable[..., dict]
    what: str


def _duo_split(q, k, v, budget: int) -> dict:
    """DuoAttention's offline step: the head split its online form finds on these inputs (``info``'s
    ``retrieval_heads`` of one call without a split)."""
    from ...attention import approximate

    return {"retrieval_heads": approximate("duo-attention", q, k, v, num_features=budget, causal=True)
            .info["retrieval_heads"]}


OFFLINE = {"duo-attention": OfflineStep(_duo_split, "DuoAttention: the split of the heads, here the split its "
                                                    "online form finds on the cell's tensors")}
"""Per method, the step its authors run once per model, offline (:class:`OfflineStep`)."""


def offline_step(form: str, method: str, q, k, v, budget: int) -> tuple[dict, dict]:
    """``(options, columns)``: the options :data:`OFFLINE` gives the timed calls of ``form/method`` and the row's
    ``offline_s`` (both empty for a method without an offline step or outside its causal form).

    Examples
    --------
    >>> offline_step("causal", "streaming-llm", None, None, None, 8)
    ({}, {})
    """
    step = OFFLINE.get(method) if form == "causal" else None
    if step is None:
        return {}, {}
    start = time.perf_counter()
    options = step.run(q, k, v, budget)
    return options, {"offline_s": time.perf_counter() - start}


def offline_lines(rows, sdpa) -> list[str]:
    """What the offline steps took, outside the ratios: per policy, its seconds at each n and as a multiple of
    the baseline's median time there (``sdpa``: seconds by n)."""
    if "offline_s" not in rows or rows["offline_s"].isna().all():
        return []
    lines = []
    for algorithm, group in rows[rows["offline_s"].notna()].groupby("algorithm", sort=True):
        seconds = group.groupby("n")["offline_s"].median()
        shown = ", ".join(f"{seconds[n]:.3f} s ({seconds[n] / sdpa[n]:.2f}x)" if n in sdpa
                          else f"{seconds[n]:.3f} s" for n in seconds.index)
        what = OFFLINE[algorithm.split("/", 1)[-1]].what
        lines.append(f"`{algorithm}` is timed with the result of the step its authors run once per model, offline "
                     f"({what}), run once per cell before the timed calls and not in its ratio; that step took "
                     f"{shown} of the baseline at n = {', '.join(str(int(n)) for n in seconds.index)}.")
    return lines + [""]
