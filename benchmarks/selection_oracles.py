"""The causal selection oracles (top-k, top-p) and Quest against torch's fused causal SDPA on the same tensors.

One process, one thread, Q/K/V of 3 heads of width 64 in float32 (standard normal, seeded), a budget of 128 keys
per query, n = 2048, 4096, 8192 (``--n`` to change): for each n, causal SDPA as one 4-D call
(:func:`approxlab.studies.bench.baseline.torch_sdpa`) and ``approximate(method, ..., causal=True).output`` are each
timed best of 3 after one warm-up call, in wall and in process CPU seconds (the steadier reading on a shared
machine), and printed as ratios with the 1-minute load average. The full bench (``approxlab bench --parts causal``)
times every policy in turn with medians; this script is the quick check of the three methods.

Run: ``nice -n 5 python3 benchmarks/selection_oracles.py`` from the repository root (``PYTHONPATH=.``).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import approxlab
from approxlab.studies.bench.baseline import torch_sdpa

METHODS = ("topk", "topp", "quest")


def best_of(function, repeats: int = 3) -> tuple[float, float]:
    """The least wall and the least process CPU seconds of ``repeats`` calls after one warm-up call."""
    function()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        function()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--budget", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("n | method | wall s | CPU s | wall / SDPA | CPU / SDPA | load (1 min)")
    for n in args.n:
        generator = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(3, n, 64, generator=generator) for _ in range(3))
        base_wall, base_cpu = best_of(lambda: torch_sdpa(q, k, v, causal=True))
        print(f"{n} | fused causal SDPA (4-D) | {base_wall:.4f} | {base_cpu:.4f} | 1 | 1 | {os.getloadavg()[0]:.1f}")
        for method in METHODS:
            wall, cpu = best_of(lambda: approxlab.approximate(method, q, k, v, num_features=args.budget,
                                                              causal=True).output)
            print(f"{n} | {method} | {wall:.4f} | {cpu:.4f} | {wall / base_wall:.2f} | {cpu / base_cpu:.2f} | "
                  f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
