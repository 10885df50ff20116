"""What one long-context sequence costs: the policies' continuations one by one against batched per ratio.

    PYTHONPATH=$PWD nice -n 10 python3 benchmarks/long_context_sequence.py                  # 2,048 tokens, r = 0.875
    PYTHONPATH=$PWD nice -n 10 python3 benchmarks/long_context_sequence.py --lengths 4096 --modes batch
    PYTHONPATH=$PWD python3 benchmarks/long_context_sequence.py --ratios 0.5 0.75 0.875 0.95 --modes unshared batch \
        --out /tmp/shared.csv                                        # what sharing across the ratios saves

One torch thread. For each length: the long-context study's own sequence of the first text (its ``--ruler-tasks``
task, the needle at depth 0.5: :func:`approxlab.studies.long_context.cells.sequence`), then
:func:`approxlab.patching.sweep_policies` over every cache policy of the registry at the given compression ratios,
once per mode: ``alone`` (``batch=False``: one continuation per policy and ratio, the path of the run committed in
``figures/long_context``), ``batch`` (``batch=True``: the policies of a ratio in one batched continuation) and
``unshared`` (batched, ``share=False``: each policy's scores and H2O's column sums computed again at every ratio,
not once for all ratios). Each
mode runs its own prefill, key-token forward and unpatched continuation, so its total is a whole sequence's at
these ratios.

Writes ``benchmarks/results/long_context_sequence.csv``, one row per length and mode: ``policies``, ``ratios``,
``continuations``, the sweep's thread CPU and wall seconds (``cpu_s``, ``wall_s``), its parts in wall seconds
(``prefill_s``, ``key_token_s``, ``unpatched_s``, ``continuations_s``: the policy rows' seconds summed),
``max_abs_difference`` (the largest difference of the policy rows' answer log-probability, Delta NLL and mean
errors from the first mode's) and ``same_correct`` (every exact match the same), and the 1-minute load average.
On a shared machine wall seconds vary with the load; thread CPU seconds much less.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from pathlib import Path

import pandas as pd
import torch

OUT = Path(__file__).resolve().parent / "results" / "long_context_sequence.csv"
COLUMNS = ("answer_logprob", "delta_all", "clean_spectral_mean", "patched_spectral_mean")


def measure(length: int, ratios: list, modes: list, task: str) -> list[dict]:
    """One row per mode for the first text's sequence at ``length`` tokens."""
    cells = importlib.import_module("approxlab.studies.long_context.cells")
    grid = importlib.import_module("approxlab.studies.long_context.grid")
    from approxlab.patching import sweep_policies

    config = grid.build_config(lengths=[length])
    cell = {"task": task, "length": length, "text": 0, "depth": 0.5, "checkpoint": config["checkpoint"],
            "base_seed": 0, "cache_dir": None, "data_dir": None, "device": "cpu"}
    found = cells.sequence(cell)
    loaded = cells._model(cell["checkpoint"], None, "cpu")
    context, policies = found.question_start, list(config["policies"])
    rows, first = [], None
    for mode in modes:
        load = os.getloadavg()[0]
        wall, cpu = time.perf_counter(), time.thread_time()
        results, _ = sweep_policies(loaded, found.ids[:, :context], found.continuation, methods=policies,
                                    ratios=ratios, answer_length=found.answer_length,
                                    short_context=config["short_context"][str(length)], seed=1, batch=mode != "alone",
                                    share=mode != "unshared")
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        first = first or results
        exact = results[0]
        rows.append({"length": length, "mode": mode, "task": task, "context_length": context,
                     "continuation_length": int(found.continuation.shape[1]), "policies": len(policies),
                     "ratios": ",".join(map(str, ratios)), "continuations": len(results) - 1, "cpu_s": cpu,
                     "wall_s": wall, "prefill_s": exact["prefill_seconds"], "key_token_s": exact["key_token_seconds"],
                     "unpatched_s": exact["seconds"], "continuations_s": sum(r["seconds"] for r in results[1:]),
                     "max_abs_difference": max(abs(a[c] - b[c]) for a, b in zip(first[1:], results[1:])
                                               for c in COLUMNS if a["status"] == b["status"] == "ok"),
                     "same_correct": all(a["correct"] == b["correct"] for a, b in zip(first, results)),
                     "failures": sum(r["status"] != "ok" for r in results), "load_average": load})
        print(pd.DataFrame(rows[-1:]).to_string(index=False), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.875])
    parser.add_argument("--modes", nargs="+", choices=("alone", "batch", "unshared"), default=["alone", "batch"])
    parser.add_argument("--task", default="single-needle")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [row for length in args.lengths for row in measure(length, args.ratios, args.modes, args.task)]
    table = pd.DataFrame(rows)
    if args.out.is_file():  # other lengths and modes measured before are kept
        kept = pd.read_csv(args.out)
        table = pd.concat([kept.merge(table[["length", "mode"]], how="left", indicator=True)
                          .query("_merge == 'left_only'").drop(columns="_merge"), table], ignore_index=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
