"""MagicPIG and vAttention in their causal form against torch's fused causal SDPA on the same tensors.

One process, one thread, Q/K/V of 3 heads of width 64 in float32 (standard normal, seeded), a budget of 128
(``num_features``: MagicPIG's hash tables, vAttention's keys kept exactly per query), the methods' other options
at the library's defaults (vAttention's draw capped at ``MAX_SAMPLES`` = 512 variates per query), n = 2048, 4096,
8192 (``--n`` to change): for each n, causal SDPA as one 4-D call
(:func:`approxlab.studies.bench.baseline.torch_sdpa`) and each ``approximate(method, ..., causal=True,
generator=...).output`` (the draw included) are timed in turn (SDPA, MagicPIG, vAttention, SDPA, ...: a drift of
the machine's speed reaches each alike), best of 3 rounds after one warm-up call, in wall and in process CPU
seconds (the steadier reading on a shared machine), and printed as ratios with the target (5x at the largest n),
whether it is met (in CPU time), and the 1-minute load average.

Run: ``nice -n 5 python3 benchmarks/sampling_methods.py`` from the repository root (``PYTHONPATH=.``).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import approxlab
from approxlab.studies.bench.baseline import torch_sdpa

METHODS = ("magicpig", "vattention")
TARGET = 5.0


def best_in_turn(functions, repeats: int = 3) -> list[tuple[float, float]]:
    """The least wall and the least process CPU seconds of each of ``functions``, called in turn ``repeats`` times
    after one warm-up call each."""
    for function in functions:
        function()
    walls, cpus = [[] for _ in functions], [[] for _ in functions]
    for _ in range(repeats):
        for index, function in enumerate(functions):
            wall, cpu = time.perf_counter(), time.process_time()
            function()
            walls[index].append(time.perf_counter() - wall)
            cpus[index].append(time.process_time() - cpu)
    return [(min(wall), min(cpu)) for wall, cpu in zip(walls, cpus)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    largest = max(args.n)
    print("n | method | wall s | CPU s | wall / SDPA | CPU / SDPA | target | met | load (1 min)")
    print("---|---|---|---|---|---|---|---|---")
    for n in args.n:
        generator = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(3, n, 64, generator=generator) for _ in range(3))
        calls = [lambda: torch_sdpa(q, k, v, causal=True)]
        calls += [lambda method=method: approxlab.approximate(method, q, k, v, num_features=args.budget, causal=True,
                                                              generator=torch.Generator().manual_seed(0)).output
                  for method in args.methods]
        load = os.getloadavg()[0]
        (base_wall, base_cpu), *timed = best_in_turn(calls)
        print(f"{n} | fused causal SDPA (4-D) | {base_wall:.4f} | {base_cpu:.4f} | 1 | 1 | — | — | {load:.1f}")
        for method, (wall, cpu) in zip(args.methods, timed):
            target = f"<= {TARGET:g}x" if n == largest else "—"
            met = ("met" if cpu / base_cpu <= TARGET else "not met") if n == largest else "—"
            print(f"{n} | {method} | {wall:.4f} | {cpu:.4f} | {wall / base_wall:.2f} | {cpu / base_cpu:.2f} | "
                  f"{target} | {met} | {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
