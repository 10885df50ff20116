"""How the causal forms of StreamingLLM, H2O and Quest grow with n at a fixed budget, against fused causal SDPA.

The calls of ``approxlab bench --parts causal`` (:func:`approxlab.studies.bench.causal._call`): Q/K/V of 3 heads of
width 64 in float32 (standard normal, seeded by n), a budget of 128 keys, at n = 2048, 2896, 4096, 5792, 8192
(``--n``), each policy in its causal form, timed in turn with causal SDPA as one 4-D call
(:func:`approxlab.studies.bench.baseline.torch_sdpa`) in one process on one thread
(:func:`approxlab.studies.bench.timing.measure_interleaved`: one warm-up call each, then the median of ``--repeats``
rounds, in wall and in process CPU seconds). Then each policy's growth exponent in n
(:func:`approxlab.studies.bench.growth.growth_exponent`: the least-squares slope of log time on log n, with its 95%
interval) fitted to the median wall times and to the median CPU times, the latter the steadier reading on a shared
machine (a process waiting for a core accrues wall time, not CPU time). Last, Quest's page scoring (its bounds and
each query's top pages, quadratic in n by design) against its whole call at each n: the cumulative time of its
``chosen`` step under ``cProfile`` over ``--repeats`` calls (``--no-split`` leaves it out).

Run: ``nice -n 5 python3 benchmarks/causal_growth.py`` from the repository root (``PYTHONPATH=.``); to time an older
tree, put its ``approxlab/`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats

import torch

from approxlab.studies.bench.baseline import torch_sdpa
from approxlab.studies.bench.causal import HEAD_DIM, HEADS, _call
from approxlab.studies.bench.growth import growth_exponent
from approxlab.studies.bench.timing import measure_interleaved

METHODS = ("streaming-llm", "h2o", "quest")
SDPA = "fused causal SDPA (4-D)"


def fit_text(ns, seconds) -> str:
    fit = growth_exponent(ns, seconds)
    return f"{fit.exponent:.2f} [{fit.low:.2f}, {fit.high:.2f}]" if fit.points > 2 else f"{fit.exponent:.2f}"


def page_scoring_share(n: int, budget: int, repeats: int) -> tuple[float, float]:
    """Seconds of Quest's causal call and of its page scoring (the ``chosen`` step of ``approxlab.methods.quest``)
    over ``repeats`` calls under ``cProfile``."""
    generator = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(HEADS, n, HEAD_DIM, generator=generator) for _ in range(3))
    call = _call("causal", "quest", q, k, v, min(budget, n))
    call()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(repeats):
        call()
    profile.disable()
    stats = pstats.Stats(profile).stats
    total = sum(entry[3] for key, entry in stats.items() if key[2] == "<lambda>" and "causal.py" in key[0])
    scoring = sum(entry[3] for key, entry in stats.items() if key[2] == "chosen" and key[0].endswith("quest.py"))
    return total, scoring


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[2048, 2896, 4096, 5792, 8192])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-split", action="store_true", help="leave out Quest's page-scoring share")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = [SDPA, *(f"causal/{method}" for method in args.methods)]
    times = {name: {} for name in names}
    print("n | policy | wall s | CPU s | wall / SDPA | CPU / SDPA | load (1 min)")
    print("---|---|---|---|---|---|---")
    for n in args.n:
        generator = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(HEADS, n, HEAD_DIM, generator=generator) for _ in range(3))
        calls = [lambda: torch_sdpa(q, k, v, causal=True),
                 *(_call("causal", method, q, k, v, min(args.budget, n)) for method in args.methods)]
        measured = measure_interleaved(calls, repeats=args.repeats)
        for name, m in zip(names, measured):
            times[name][n] = (m.wall_s, m.cpu_s)
            print(f"{n} | {name} | {m.wall_s:.4f} | {m.cpu_s:.4f} | {m.wall_s / measured[0].wall_s:.2f} | "
                  f"{m.cpu_s / measured[0].cpu_s:.2f} | {m.load_average:.1f}", flush=True)
    print()
    print("policy | growth exponent of the median wall time [95%] | of the median CPU time [95%]")
    print("---|---|---")
    for name in names:
        ns = sorted(times[name])
        print(f"{name} | {fit_text(ns, [times[name][n][0] for n in ns])} | "
              f"{fit_text(ns, [times[name][n][1] for n in ns])}")
    if "quest" in args.methods and not args.no_split:
        print("\nn | Quest's causal call, s (cProfile, all calls) | its page scoring, s | share")
        print("---|---|---|---")
        for n in args.n:
            total, scoring = page_scoring_share(n, args.budget, args.repeats)
            print(f"{n} | {total:.4f} | {scoring:.4f} | {scoring / total:.2f}", flush=True)
    print(f"\n1-minute load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
