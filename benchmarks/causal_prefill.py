"""Sparse prefill and the output-aware cache policies against fused causal SDPA (4-D), by the bench's causal part.

    PYTHONPATH=$PWD nice -n 10 python3 benchmarks/causal_prefill.py                  # n = 2,048, 4,096, 8,192
    PYTHONPATH=$PWD nice -n 10 python3 benchmarks/causal_prefill.py --lengths 256 512 --out /tmp/check

For each n, the cells of ``approxlab bench --parts causal`` (:func:`approxlab.studies.bench.causal.causal_rows`)
of :data:`METHODS` (:func:`~approxlab.studies.bench.causal.cell_methods`): Q, K, V of 3 heads of width 64,
float32, standard normal (seeded per n as the bench seeds them), a budget of b = 128 keys per query; torch's fused
causal SDPA timed in turn with its unfused math path, and with each policy, in one run per cell (the median of
``--repeats`` rounds), on one torch thread, the 1-minute load average recorded with each measurement. The summary
is the bench's own causal section (:func:`~approxlab.studies.bench.causal.causal_lines`): each policy's ratio to
fused causal SDPA per n, its target at the largest n (sparse prefill <= 1x,
:data:`~approxlab.studies.bench.causal.PREFILL_TARGET`; a cache policy's score, compression and attention <= 1.5x,
:data:`~approxlab.studies.bench.causal.SCORER_TARGET`), met or not.

Then, on the same tensors, what the sparse-prefill cells contain (:func:`prefill_lines`): DuoAttention's attention
with its head split given (as at inference, the split fixed offline) and the split alone (:func:`duo_head_split` on
these inputs), each timed in turn with fused causal SDPA; and the share of the causal blocks XAttention and
FlexPrefill keep.

Writes ``benchmarks/results/causal_prefill.csv`` (the rows, rewritten after each n) and ``causal_prefill.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

import pandas as pd
import torch

METHODS = ("minference", "xattention", "flexprefill", "duo-attention", "criticalkv", "caote")
OUT = Path(__file__).resolve().parent / "results"


def prefill_lines(lengths, budget: int, repeats: int) -> list[str]:
    """The "Inside the sparse-prefill cells" section: DuoAttention with its split given and the split alone against
    fused causal SDPA, and the kept share of the causal blocks of XAttention and FlexPrefill, per n."""
    from approxlab import approximate
    from approxlab.methods.duo_attention import DEFAULT_SINKS, duo_head_split
    from approxlab.studies.bench.baseline import torch_sdpa
    from approxlab.studies.bench.causal import HEAD_DIM, HEADS
    from approxlab.studies.bench.timing import measure_interleaved
    from approxlab.studies.engine.keys import cell_seed

    lines = ["## Inside the sparse-prefill cells", "",
             "On each n's tensors of the cells above (b = %d). DuoAttention: the `causal/duo-attention` cell finds its "
             "head split on its own inputs (every head's fused causal attention and log-normalisers, then each head's "
             "streaming attention); at inference the split is fixed offline, so its attention with the split given "
             "(here the one `duo_head_split` finds, half the heads rounded: 2 of 3 retrieval heads) and the split "
             "alone are timed in turn with fused causal SDPA (median of %d rounds). Kept share: the kept blocks over "
             "the causal blocks (those on or below the block diagonal), mean over heads." % (budget, repeats), "",
             "| n | fused causal SDPA (4-D), s | DuoAttention, split given / SDPA | the split alone / SDPA | "
             "XAttention kept share | FlexPrefill kept share (query-aware heads) |", "|---|---|---|---|---|---|"]
    for n in lengths:
        generator = torch.Generator().manual_seed(cell_seed("causal", n, base_seed=0))
        q, k, v = (torch.randn(HEADS, n, HEAD_DIM, generator=generator) for _ in range(3))
        sinks = min(DEFAULT_SINKS, budget - 1)
        split = duo_head_split(q, k, sinks=sinks, window=budget - sinks)
        given = lambda: approximate("duo-attention", q, k, v, num_features=budget, causal=True,  # noqa: E731
                                    retrieval_heads=split).output
        alone = lambda: duo_head_split(q, k, sinks=sinks, window=budget - sinks)  # noqa: E731
        sdpa = lambda: torch_sdpa(q, k, v, causal=True)  # noqa: E731
        base, with_split, split_only = measure_interleaved([sdpa, given, alone], repeats=repeats, warmup=1)
        shares = []
        for name in ("xattention", "flexprefill"):
            info = approximate(name, q, k, v, num_features=budget, causal=True).info
            blocks = info["blocks"].shape[-1]
            shares.append(float(info["blocks"].sum((-1, -2)).double().mean()) / (blocks * (blocks + 1) / 2))
        aware = int(info["query_aware"].sum())
        lines.append(f"| {n} | {base.wall_s:.4f} | {with_split.wall_s / base.wall_s:.2f} | "
                     f"{split_only.wall_s / base.wall_s:.2f} | {shares[0]:.3f} | {shares[1]:.3f} "
                     f"({aware} of {HEADS}) |")
        print(lines[-1], flush=True)
    return lines


def main(argv=None) -> None:
    from approxlab.studies.bench.causal import causal_lines, causal_rows, cell_methods

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS,
                        help="the methods timed (default: all of METHODS)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    config = {"causal_budget": args.budget, "seed": 0, "repeats": args.repeats}
    rows = []
    for n in args.lengths:
        print(f"n = {n}: 1-minute load average {os.getloadavg()[0]:.1f}", flush=True)
        for name in cell_methods(args.methods):
            cell = {"config": config, "n": n, "method": name, "device": "cpu"}
            rows += [{"part": "causal", "n": n, "method": name, **row} for row in causal_rows(cell)]
        pd.DataFrame(rows).to_csv(args.out / "causal_prefill.csv", index=False)
    lines = causal_lines(pd.DataFrame(rows), planned=args.lengths)
    lines += ["", *prefill_lines(args.lengths, args.budget, args.repeats)]
    command = "PYTHONPATH=$PWD nice -n 10 python3 benchmarks/causal_prefill.py" + (
        "" if args.lengths == [2048, 4096, 8192] else " --lengths " + " ".join(map(str, args.lengths))) + (
        "" if args.methods == list(METHODS) else " --methods " + " ".join(args.methods))
    header = ["# Sparse prefill and output-aware cache policies against fused causal SDPA", "",
              f"Written by `{command}` (one torch thread, {args.repeats} rounds, torch {torch.__version__}, "
              f"{platform.machine()}, {os.cpu_count()} cores): the bench's causal part "
              f"(`approxlab.studies.bench.causal`) for {', '.join(f'`{m}`' for m in args.methods)} only. The "
              "sparse-prefill patterns form the logits of their kept blocks, columns and diagonals only "
              "(`approxlab.methods._sparse_attention`), dense heads on the fused kernel; each time is the pattern's "
              "estimate and its sparse attention together.", ""]
    (args.out / "causal_prefill.md").write_text("\n".join(header + lines).rstrip() + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
