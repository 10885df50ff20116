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


def main(argv=None) -> None:
    from approxlab.studies.bench.causal import causal_lines, causal_rows, cell_methods

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    config = {"causal_budget": args.budget, "seed": 0, "repeats": args.repeats}
    rows = []
    for n in args.lengths:
        print(f"n = {n}: 1-minute load average {os.getloadavg()[0]:.1f}", flush=True)
        for name in cell_methods(METHODS):
            cell = {"config": config, "n": n, "method": name, "device": "cpu"}
            rows += [{"part": "causal", "n": n, "method": name, **row} for row in causal_rows(cell)]
        pd.DataFrame(rows).to_csv(args.out / "causal_prefill.csv", index=False)
    lines = causal_lines(pd.DataFrame(rows), planned=args.lengths)
    command = "PYTHONPATH=$PWD nice -n 10 python3 benchmarks/causal_prefill.py" + (
        "" if args.lengths == [2048, 4096, 8192] else " --lengths " + " ".join(map(str, args.lengths)))
    header = ["# Sparse prefill and output-aware cache policies against fused causal SDPA", "",
              f"Written by `{command}` (one torch thread, {args.repeats} rounds, torch {torch.__version__}, "
              f"{platform.machine()}, {os.cpu_count()} cores): the bench's causal part "
              f"(`approxlab.studies.bench.causal`) for {', '.join(f'`{m}`' for m in METHODS)} only. Every method "
              "here evaluates its kept entries by a dense masked softmax in row blocks (the authors' kernels' "
              "skipping of the dropped blocks is not modelled), so a sparse-prefill pattern's time is that of dense "
              "causal attention plus its estimate.", ""]
    (args.out / "causal_prefill.md").write_text("\n".join(header + lines).rstrip() + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
