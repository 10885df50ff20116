"""The causal selection oracles (top-k, top-p) and Quest against torch's fused causal SDPA, timed as the bench does.

One process, one thread, Q/K/V of 3 heads of width 64 in float32 (standard normal, seeded), a budget of 128 keys
per query, n = 4096, 8192 (``--n`` to change): for each n and method, causal SDPA as one 4-D call
(:func:`approxlab.studies.bench.baseline.torch_sdpa`) and ``approximate(method, ..., causal=True).output`` are
timed in turn by :func:`approxlab.studies.bench.timing.measure_interleaved` (one warm-up call each, then ``--repeats``
rounds; median wall and process CPU seconds), as a cell of ``approxlab bench``'s causal part times them
(:func:`approxlab.studies.bench.causal.causal_rows`). Printed as ratios with the 1-minute load average; on a shared
machine the CPU-time ratio is the steadier reading.

Run: ``nice -n 5 python3 benchmarks/selection_oracles.py`` from the repository root (``PYTHONPATH=.``); with another
checkout's ``approxlab/`` first on ``PYTHONPATH`` it times that code (the before/after table of
``benchmarks/results/selection_oracles.md``). ``--row-topk`` also times the row selection alone
(:func:`approxlab.methods._row_topk.row_topk` against ``torch.topk``, 510 rows of ``w`` standard normal logits) and
the in-place normaliser of such a block (``_logsumexp_``, after a copy of the block, against the copy alone and
``torch.logsumexp``); ``--profile`` prints the cProfile of one ``topk`` call at the largest n (CPU time).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import approxlab
from approxlab.studies.bench.baseline import torch_sdpa
from approxlab.studies.bench.timing import measure_interleaved

METHODS = ("topk", "topp", "quest")


def time_cells(ns, methods, budget: int, repeats: int) -> None:
    """One line per (n, method): the policy's and causal SDPA's median wall and CPU seconds, and their ratios."""
    print("n | method | wall s | SDPA wall s | wall / SDPA | CPU s | SDPA CPU s | CPU / SDPA | load (1 min)")
    print("---|---|---|---|---|---|---|---|---")
    for n in ns:
        generator = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(3, n, 64, generator=generator) for _ in range(3))
        for method in methods:
            base, measured = measure_interleaved(
                [lambda: torch_sdpa(q, k, v, causal=True),
                 lambda: approxlab.approximate(method, q, k, v, num_features=budget, causal=True).output],
                repeats=repeats, warmup=1)
            print(f"{n} | {method} | {measured.wall_s:.4f} | {base.wall_s:.4f} | {measured.wall_s / base.wall_s:.2f} | "
                  f"{measured.cpu_s:.4f} | {base.cpu_s:.4f} | {measured.cpu_s / base.cpu_s:.2f} | "
                  f"{os.getloadavg()[0]:.1f}", flush=True)


def time_row_topk(widths, budget: int, repeats: int) -> None:
    """The least process CPU milliseconds of ``repeats`` calls of ``row_topk`` and ``torch.topk`` per width."""
    from approxlab.methods._row_topk import row_topk
    from approxlab.methods._selection import _logsumexp_

    print("w | row_topk CPU ms | torch.topk CPU ms")
    print("---|---|---")
    for w in widths:
        x = torch.randn(3, 170, w, generator=torch.Generator().manual_seed(w))
        least = [_least(function, repeats) for function in (lambda: row_topk(x, budget), lambda: x.topk(budget, dim=-1))]
        print(f"{w} | {least[0] * 1e3:.2f} | {least[1] * 1e3:.2f}", flush=True)
    x = torch.randn(3, 170, max(widths), generator=torch.Generator().manual_seed(0))
    buffer, peak = torch.empty_like(x), x.amax(-1, keepdim=True)
    calls = {"copy": lambda: buffer.copy_(x), "copy, then _logsumexp_": lambda: _logsumexp_(buffer.copy_(x), peak),
             "torch.logsumexp": lambda: torch.logsumexp(x, dim=-1)}
    for name, function in calls.items():
        print(f"normaliser of {tuple(x.shape)}: {name} {_least(function, repeats) * 1e3:.2f} ms CPU", flush=True)


def _least(function, repeats: int) -> float:
    """The least process CPU seconds of ``repeats`` calls after one warm-up call."""
    function()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        function()
        times.append(time.process_time() - start)
    return min(times)


def profile_call(n: int, budget: int) -> None:
    """The cProfile (CPU time) of one causal ``topk`` call at ``n``, its 15 costliest functions by own time."""
    import cProfile
    import pstats

    generator = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(3, n, 64, generator=generator) for _ in range(3))
    call = lambda: approxlab.approximate("topk", q, k, v, num_features=budget, causal=True).output  # noqa: E731
    call()
    profiler = cProfile.Profile(time.process_time)
    profiler.runcall(call)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--methods", nargs="*", default=list(METHODS), help="none: no cells")
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--row-topk", type=int, nargs="*", default=None, metavar="W",
                        help="also time row_topk alone at these widths (none given: 2048 4096 8192)")
    parser.add_argument("--profile", action="store_true", help="the cProfile of one topk call at the largest n")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, approxlab from "
          f"{os.path.dirname(approxlab.__file__)}")
    if args.methods:
        time_cells(args.n, args.methods, args.budget, args.repeats)
    if args.row_topk is not None:
        time_row_topk(args.row_topk or [2048, 4096, 8192], args.budget, max(args.repeats, 9))
    if args.profile:
        profile_call(max(args.n), args.budget)


if __name__ == "__main__":
    main()
