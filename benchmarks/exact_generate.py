"""The long-context study's exact model, checked without approxlab's engine: transformers' own ``generate()``.

    PYTHONPATH=$PWD python3 benchmarks/exact_generate.py           # text 0 at 3 depths (4096, 8192); text 4 at 0.5
    PYTHONPATH=$PWD python3 benchmarks/exact_generate.py --sequences single-needle:8192:1:0.5

``approxlab long-context`` scores the unpatched model through :func:`approxlab.patching.exact_prefill` (one
prefill, then the question and a greedy answer on its cache). Where that model misses its needles, the miss
could be the engine's. This script builds the same sequences (``approxlab.studies.long_context.cells.sequence``:
the same WikiText-2 window, needle, depth and seeds) and asks the checkpoint's ``LlamaForCausalLM.generate`` for a
greedy answer to the question, nothing of approxlab's between the tokens and the model. Beside each it puts the
study's own exact-match verdict for that sequence where ``--results`` holds it (default: the committed
``figures/long_context`` and ``figures/long_context-gate-8192``). Writes
``benchmarks/results/exact_generate.md``.
"""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

import pandas as pd
import torch

from approxlab.data import SMOLLM2_CHECKPOINT, load_model
from approxlab.studies.engine import has_results, read_results

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "exact_generate.md"
RESULTS = [ROOT / "figures" / folder / "results.csv.gz" for folder in ("long_context", "long_context-gate-8192")]
DEFAULT = [*(f"single-needle:{n}:0:{d}" for n in (4096, 8192) for d in (0.1, 0.5, 0.9)), "single-needle:8192:4:0.5"]


def _spec(text: str) -> dict:
    try:
        task, length, window, depth = text.split(":")
        return {"task": task, "length": int(length), "text": int(window), "depth": float(depth)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"TASK:LENGTH:TEXT:DEPTH (e.g. single-needle:8192:0:0.5), got {text!r}")


def _study_verdict(results: pd.DataFrame | None, spec: dict) -> str:
    if results is None:
        return "-"
    row = results[(results["method"] == "unpatched") & (results["task"] == spec["task"])
                  & (results["length"] == spec["length"]) & (results["text"] == spec["text"])
                  & (results["depth"] == spec["depth"])]
    return "-" if row.empty else ("right" if bool(row["correct"].iloc[0]) else "wrong")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=_spec, nargs="+", default=[_spec(s) for s in DEFAULT],
                        metavar="TASK:LENGTH:TEXT:DEPTH")
    parser.add_argument("--results", type=Path, nargs="+", default=RESULTS,
                        help="the study's results.csv.gz files (their exact model's verdicts; missing ones skipped)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cells = importlib.import_module("approxlab.studies.long_context.cells")
    found = [read_results(path) for path in args.results if has_results(path)]  # whole, or one file a length
    results = pd.concat(found, ignore_index=True) if found else None
    loaded = load_model("pretrained", checkpoint=SMOLLM2_CHECKPOINT, lm_head=True)
    lines = ["| task | length | text | depth | answer | generate() gives | right | approxlab's exact model | seconds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for spec in args.sequences:
        cell = {**spec, "checkpoint": SMOLLM2_CHECKPOINT, "cache_dir": None, "data_dir": None, "device": "cpu",
                "base_seed": 0}
        found = cells.sequence(cell)
        question = found.ids[:, :found.ids.shape[1] - found.answer_length]
        start = time.perf_counter()
        with torch.no_grad():
            out = loaded.model.generate(question, max_new_tokens=found.answer_length, do_sample=False)
        seconds = time.perf_counter() - start
        generated = out[0, question.shape[1]:]
        right = generated.tolist() == found.ids[0, question.shape[1]:].tolist()
        text = repr(loaded.tokenizer.decode(generated)).replace("|", "\\|")  # a table cell
        lines.append(f"| {spec['task']} | {spec['length']} | {spec['text']} | {spec['depth']:g} | {found.answer} | "
                     f"{text} | {'yes' if right else 'no'} | {_study_verdict(results, spec)} | {seconds:.0f} |")
        print(lines[-1], flush=True)
    body = "\n".join([f"# The exact model through transformers' generate() ({SMOLLM2_CHECKPOINT})", "",
                      "`PYTHONPATH=$PWD python3 benchmarks/exact_generate.py` (greedy, the answer's token count; "
                      f"torch {torch.__version__}, {args.threads} thread(s)).", "", *lines, ""])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(body)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
