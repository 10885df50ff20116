"""What one shared exact prefill costs against a model run per cell, on the packaged SmolLM2 at long context.

    PYTHONPATH=$PWD nice -n 10 python3 benchmarks/long_prefill.py            # 2,048 and 4,096 tokens
    PYTHONPATH=$PWD nice -n 10 python3 benchmarks/long_prefill.py --lengths 2048 --budgets 0.5

One torch thread. For each length: a pass-key sequence (WikiText-2 test filler, the key at depth 0.5, the
question and the key: :func:`approxlab.studies.perplexity.passkey.passkey_sequence`); the context ends where
the question starts. Timed: :func:`approxlab.patching.exact_prefill` over the context; the unpatched
continuation (it also captures the clean inputs every policy's clean-input error reads); then each policy and
compression ratio's :meth:`~approxlab.patching.ExactPrefill.continue_with` (compression, teacher-forced pass,
greedy answer, both errors). For comparison, one cell of the per-cell path (``patch_attention`` in the KV-cache
setting over the whole sequence with ``record_inputs=True``, then ``patch.errors()``, as the perplexity study's
long cells run) for SnapKV at the first ratio, and the largest difference of its scored NLL from the engine's.

Writes ``benchmarks/results/long_prefill.csv`` (one row per timed step: ``length``, ``step``, ``method``,
``ratio``, ``num_features``, ``wall_s``, ``cpu_s``, ``max_abs_nll_diff``, ``correct``) and prints it. The
machine's 1-minute load average is printed before each length: on a shared machine wall seconds vary with it,
thread CPU seconds much less.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pandas as pd
import torch

POLICIES = ("streaming-llm", "snapkv", "h2o", "knorm", "tova", "expected-attention", "ada-snapkv", "pyramidkv")
OUT = Path(__file__).resolve().parent / "results" / "long_prefill.csv"


def timed(function):
    """``(result, wall seconds, thread CPU seconds)`` of ``function()``."""
    wall, cpu = time.perf_counter(), time.thread_time()
    result = function()
    return result, time.perf_counter() - wall, time.thread_time() - cpu


def sequence(loaded, tokens, length):
    """``(ids (1, length), context length, answer length)``: the pass key at depth 0.5 of the first window."""
    from approxlab.data import windows
    from approxlab.studies.perplexity.passkey import passkey_sequence

    ids, (first, stop), question = passkey_sequence(loaded.tokenizer, windows(tokens, length)[0], length=length,
                                                    depth=0.5, key=40076)
    return ids, question, stop - first


def per_cell(model, ids, context, budget):
    """The per-cell path's scored NLL (predictions from the continuation's positions) for SnapKV."""
    from approxlab.patching import patch_attention, token_nll

    with patch_attention(model, "snapkv", num_features=budget, context_length=context, record_inputs=True,
                         generator=torch.Generator().manual_seed(0)) as patch:
        nll = token_nll(model, ids)
    patch.errors()
    return nll[:, context:]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.9],
                        help="compression ratios r: b = int(n_c (1 - r)) context tokens kept per KV head")
    parser.add_argument("--no-per-cell", action="store_true", help="skip the per-cell comparison")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from approxlab.data import SMOLLM2_CHECKPOINT, load_model, wikitext_token_ids
    from approxlab.patching import exact_prefill

    loaded = load_model("pretrained", checkpoint=SMOLLM2_CHECKPOINT)
    model = loaded.model.eval()
    tokens = wikitext_token_ids(loaded.tokenizer)
    rows = []
    for length in args.lengths:
        print(f"length {length}: load average {os.getloadavg()[0]:.2f}", flush=True)
        ids, context, answer = sequence(loaded, tokens, length)
        row = {"length": length, "context": context, "continuation": length - context}
        prefill, wall, cpu = timed(lambda: exact_prefill(model, ids[:, :context]))
        rows.append({**row, "step": "prefill", "method": "unpatched", "wall_s": wall, "cpu_s": cpu})
        reference, wall, cpu = timed(lambda: prefill.unpatched(ids[:, context:], answer_length=answer))
        rows.append({**row, "step": "continuation", "method": "unpatched", "wall_s": wall, "cpu_s": cpu,
                     "correct": bool(reference.correct.all())})
        for ratio in args.budgets:
            budget = int(context * (1 - ratio))
            for method in POLICIES:
                found, wall, cpu = timed(lambda: prefill.continue_with(
                    method, num_features=budget, continuation_ids=ids[:, context:], answer_length=answer,
                    generator=torch.Generator().manual_seed(0), on_failure="record"))
                rows.append({**row, "step": "continuation", "method": method, "ratio": ratio, "num_features": budget,
                             "wall_s": wall, "cpu_s": cpu, "correct": bool(found.correct.all()),
                             "status": found.status})
                print(rows[-1], flush=True)
        if not args.no_per_cell:
            ratio = args.budgets[0]
            budget = int(context * (1 - ratio))
            nll, wall, cpu = timed(lambda: per_cell(model, ids, context, budget))
            engine = prefill.continue_with("snapkv", num_features=budget, continuation_ids=ids[:, context:],
                                           answer_length=answer, generator=torch.Generator().manual_seed(0))
            difference = float((engine.nll[:, 1:] - nll).abs().max())
            rows.append({**row, "step": "per-cell", "method": "snapkv", "ratio": ratio, "num_features": budget,
                         "wall_s": wall, "cpu_s": cpu, "max_abs_nll_diff": difference})
            print(rows[-1], flush=True)
        del prefill
    frame = pd.DataFrame(rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(OUT, index=False, float_format="%.4g")
    print(frame.to_string(index=False))


if __name__ == "__main__":
    main()
