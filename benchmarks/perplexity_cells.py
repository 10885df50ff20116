"""CPU seconds of the perplexity study's clean-input cells and single-layer depth cells at the declared grid's n.

The declared grid (``approxlab perplexity``'s full grid: SmolLM2-135M, n = 512, the KV cache's context of 384 and
continuation of 128, 30 layers) on its first window, one thread. Clean cells (``clean_errors.csv``): the control and
every method of the grid at the middle budget (64; a method that ignores d at its only one), in the whole window and
the KV cache, in the order the study runs them (so the first cell of a setting computes what the window's cells
share). Depth cells (``perplexity.csv.gz``, one layer replaced): ``--depth-methods`` at the middle budget at each
declared depth that the grid's ``layers`` do not already hold (8, 15, 22, 29: layer 0 is the grid's first layer). Before anything is timed the model, the window's clean q, k, v and the hidden states entering each
depth are loaded (the study loads them once per window, process and depth). Each cell's process CPU seconds
(``time.process_time``) are printed as a JSON line; ``--report`` turns the lines of two labels into the markdown
table of ``benchmarks/results/perplexity_clean_cells.md``, with the declared grid's cell counts and the projected
CPU-hours (each setting's mean seconds x its number of cells).

Run from the repository root, the code before and after a change in turn (``PYTHONPATH`` naming each checkout)::

    PYTHONPATH=/tmp/pplcells-before nice -n 5 python3 benchmarks/perplexity_cells.py --label before >> times.jsonl
    PYTHONPATH=. nice -n 5 python3 benchmarks/perplexity_cells.py --label after >> times.jsonl
    PYTHONPATH=. python3 benchmarks/perplexity_cells.py --report times.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def _cpu(function, *args):
    start = time.process_time()
    function(*args)
    return time.process_time() - start


def _chosen(config, method, budget):
    from approxlab.studies.perplexity.grid import method_features

    features = method_features(config, method) if method != config["control"] else config["num_features"][:1]
    return budget if budget in features else features[0]


def measure(label: str, methods, depth_methods, budget: int) -> None:
    from approxlab.studies.perplexity import cells, clean, grid

    torch.set_num_threads(1)
    config = grid.build_config(num_layers=30, **({"methods": methods} if methods else {}))
    window = grid.window_ids(config)[0]
    chosen = [c for c in clean.clean_cells(config, {}) if c["window"] == window
              and c["num_features"] == _chosen(config, c["method"], budget)]
    clean.clean_inputs(chosen[0])  # the window's capture, shared by its cells (not a cell's)
    for cell in chosen:
        seconds = _cpu(clean.compute_clean, cell)
        print(json.dumps({"label": label, "table": "clean", "setting": cell["setting"], "method": cell["method"],
                          "num_features": cell["num_features"], "cpu_seconds": seconds,
                          "load": os.getloadavg()[0]}), flush=True)
    depths = [layers for layers in config["depths"] if layers not in config["layers"]]
    depth = [c for c in grid.decoder_cells(config, {}) if c["window"] == window and c["layers"] in depths
             and c["method"] in depth_methods and c["num_features"] == _chosen(config, c["method"], budget)]
    for cell in depth:  # the hidden states entering the layer: once per window and depth
        cells._forward(cell, cells.decoder_model(cell), cells.window_inputs(cell), cells.replaced_layers(cell))
    for cell in depth:
        seconds = _cpu(cells.compute_decoder, cell)
        print(json.dumps({"label": label, "table": "depth", "setting": cell["layers"], "method": cell["method"],
                          "num_features": cell["num_features"], "cpu_seconds": seconds,
                          "load": os.getloadavg()[0]}), flush=True)


def _counts() -> dict:
    """The declared grid's cells: clean cells per setting, single-layer depth cells."""
    from approxlab.studies.perplexity import clean, grid

    config = grid.build_config(num_layers=30)
    found = {}
    for cell in clean.clean_cells(config, {}):
        found[("clean", cell["setting"])] = found.get(("clean", cell["setting"]), 0) + 1
    depths = [layers for layers in config["depths"] if layers not in config["layers"]]  # layer 0: the grid's own
    found[("depth", ", ".join(depths))] = sum(c["layers"] in depths for c in grid.decoder_cells(config, {}))
    return found


def report(path: str) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    labels = list(dict.fromkeys(row["label"] for row in rows))
    counts = _counts()
    print(f"| cells | declared | {' | '.join(f'{lab}: mean CPU s (median; n)' for lab in labels)} | "
          f"{' | '.join(f'{lab}: projected CPU-h' for lab in labels)} |")
    print("|---|---|" + "---|" * (2 * len(labels)))
    totals = dict.fromkeys(labels, 0.0)
    for (table, setting), count in counts.items():
        means, hours = [], []
        for label in labels:
            found = [r["cpu_seconds"] for r in rows if r["label"] == label and r["table"] == table
                     and r["setting"] in setting.split(", ")]
            mean = statistics.fmean(found)
            totals[label] += mean * count / 3600
            means.append(f"{mean:.2f} ({statistics.median(found):.2f}; {len(found)})")
            hours.append(f"{mean * count / 3600:.2f}")
        print(f"| {table} ({setting}) | {count} | {' | '.join(means)} | {' | '.join(hours)} |")
    print(f"| all | {sum(counts.values())} | {' | '.join('' for _ in labels)} | "
          f"{' | '.join(f'{totals[lab]:.2f}' for lab in labels)} |")
    loads = [r["load"] for r in rows]
    print(f"\n1-minute load average while the cells ran: {min(loads):.1f} to {max(loads):.1f}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--methods", nargs="*", default=None, help="methods of the clean cells (default: the grid's)")
    parser.add_argument("--depth-methods", nargs="*", default=["performer", "snapkv"])
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--report", metavar="JSONL", help="print the table of the JSON lines in this file")
    args = parser.parse_args()
    if args.report:
        report(args.report)
    else:
        measure(args.label, args.methods, args.depth_methods, args.budget)


if __name__ == "__main__":
    main()
