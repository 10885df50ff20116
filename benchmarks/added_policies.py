"""What a sequence's added policies cost on one shared prefill against a prefill each.

    PYTHONPATH=$PWD python3 benchmarks/added_policies.py                        # 2,048 and 8,192 tokens
    PYTHONPATH=$PWD python3 benchmarks/added_policies.py --lengths 4096 --policies criticalkv caote h2o

One torch thread. For each length: the long-context study's sequence of the first text (single needle at depth
0.5, :func:`approxlab.studies.long_context.cells.sequence`) and its cells of the policies added to a saved run
(``figures/long_context`` added CriticalKV and CAOTE), at the study's four compression ratios, computed twice by
:func:`approxlab.studies.long_context.cells.compute_added`: ``together`` (the sequence's cells in one call, as the
study's grouped step runs them: one prefill, key-token forward and unpatched continuation for all of them) and
``alone`` (one call per cell, each with its own prefill: what the study did before its added step was grouped).

Writes ``benchmarks/results/added_policies.csv``, one row per length and mode: ``policies``, thread CPU and wall
seconds (``cpu_s``, ``wall_s``), ``same_rows`` (every row of ``added.csv`` and ``added_layers.csv`` equal to the
first mode's, bit for bit) and the 1-minute load average. On a shared machine wall seconds vary with the load;
thread CPU seconds much less.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from pathlib import Path

import pandas as pd
import torch

OUT = Path(__file__).resolve().parent / "results" / "added_policies.csv"


def measure(length: int, policies: list) -> list[dict]:
    """One row per mode for the first text's single needle at ``length`` tokens."""
    cells = importlib.import_module("approxlab.studies.long_context.cells")
    grid = importlib.import_module("approxlab.studies.long_context.grid")
    config = grid.build_config(lengths=[length])
    base = {"task": "single-needle", "length": length, "text": 0, "depth": 0.5, "checkpoint": config["checkpoint"],
            "base_seed": 0, "cache_dir": None, "data_dir": None, "device": "cpu",
            "short_context": config["short_context"][str(length)], "ratios": tuple(config["ratios"])}
    added = [{**base, "policy": name, "policies": (name,)} for name in policies]
    cells.sequence(base)  # the model and the corpus loaded before the clocks start
    rows, first = [], None
    for mode in ("together", "alone"):
        load = os.getloadavg()[0]
        wall, cpu = time.perf_counter(), time.thread_time()
        found = cells.compute_added(added) if mode == "together" else [cells.compute_added([c])[0] for c in added]
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        first = found if first is None else first
        rows.append({"length": length, "mode": mode, "policies": " ".join(policies), "cpu_s": round(cpu, 2),
                     "wall_s": round(wall, 2), "same_rows": _without_seconds(found) == _without_seconds(first),
                     "load_1min": round(load, 2)})
        print(rows[-1], flush=True)
    return rows


def _without_seconds(found: list) -> list:
    """The cells' rows but their ``seconds`` (a clock, not a result)."""
    return [{table: [{k: v for k, v in row.items() if k != "seconds"} for row in rows] for table, rows in cell.items()}
            for cell in found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--policies", nargs="+", default=["criticalkv", "caote"])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [row for length in args.lengths for row in measure(length, args.policies)]
    pd.DataFrame(rows).to_csv(args.out, index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
