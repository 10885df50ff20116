"""The long-context study's cell: one sequence, one exact prefill, every policy at every compression ratio.

``results.csv.gz`` gets the unpatched model's row and one row per policy and ratio
(:func:`approxlab.patching.sweep_policies`), with the sequence's lengths; ``layers.csv`` one row per policy, ratio
and layer (each layer's clean- and patched-input spectral error, median over heads). A policy added to a saved run
(``added_policies``) runs in cells of its own, one per sequence and policy (:func:`compute_added`: ``added.csv`` and
``added_layers.csv``, the same columns and the key's ``policy``), on the same sequences and seeds; a sequence's added
policies are computed together, on one prefill recomputed for them, equal to the saved one. ``whole.csv`` and
``whole_layers.csv``: the whole-sequence setting, one cell per sequence, method and ratio (:func:`compute_whole`; a
sequence's cells computed together, on its reference computed once). ``sharing.csv``, one cell per length run
first: what sharing the prefill's column sums saves (:func:`compute_sharing`).

The added and whole-sequence steps declare ``group=KEY`` (:class:`~approxlab.studies.declaration.Step`): the cells
of one sequence still to compute reach ``compute`` as one list, on one worker.
"""

from __future__ import annotations

import functools

import torch

from ...patching import sweep_policies
from ..engine.keys import cell_seed
from .grid import KEY, split_task

__all__ = ["RESULTS", "LAYERS", "SHARING", "ADDED", "ADDED_LAYERS", "SHARED_POLICIES", "sequence", "compute_sequence",
           "compute_added", "compute_whole", "WHOLE", "WHOLE_LAYERS", "sharing_cells", "compute_sharing"]

RESULTS, LAYERS, SHARING = "results.csv.gz", "layers.csv", "sharing.csv"
WHOLE, WHOLE_LAYERS = "whole.csv", "whole_layers.csv"
"""The whole-sequence setting's rows (:func:`compute_whole`): the columns of a policy's row in ``results.csv.gz``."""
ADDED, ADDED_LAYERS = "added.csv", "added_layers.csv"
"""The rows of the policies added to a saved run (:func:`compute_added`), beside ``results.csv.gz`` and
``layers.csv``."""


@functools.lru_cache(maxsize=1)
def _model(checkpoint, cache_dir, device):
    from ...data import load_model

    return load_model("pretrained", checkpoint=checkpoint, cache_dir=cache_dir, device=device)


@functools.lru_cache(maxsize=1)
def _token_ids(checkpoint, data_dir, cache_dir):
    from ...data import wikitext_token_ids

    return wikitext_token_ids(_model(checkpoint, cache_dir, "cpu").tokenizer, data_dir=data_dir, cache_dir=cache_dir)


def sequence(cell: dict):
    """The cell's :class:`~approxlab.tasks.ruler.NeedleSequence`: its task on WikiText-2 window ``text`` of
    ``length`` tokens (a ``TASK@noise`` on RULER's noise haystack, :func:`.grid.split_task`), the asked needle at
    ``depth``, keys and values drawn from the cell's seed."""
    from ...data import windows
    from ...tasks.ruler import noise_haystack, ruler_sequence

    loaded = _model(cell["checkpoint"], cell["cache_dir"], cell["device"])
    task, haystack = split_task(cell["task"])
    if haystack == "noise":
        filler = noise_haystack(loaded.tokenizer, cell["length"])
    else:
        filler = windows(_token_ids(cell["checkpoint"], cell["data_dir"], cell["cache_dir"]),
                         cell["length"])[cell["text"]]
    seed = cell_seed(*(cell[c] for c in KEY), "sequence", base_seed=cell["base_seed"])
    return ruler_sequence(task, loaded.tokenizer, filler, length=cell["length"], depth=cell["depth"],
                          generator=torch.Generator().manual_seed(seed))


def compute_sequence(cell: dict, *, batch: bool = True) -> dict:
    """One sequence: its rows of ``results.csv.gz`` and ``layers.csv``, every policy of ``cell["policies"]`` on one
    exact prefill (``batch``: as :func:`~approxlab.patching.sweep_policies`)."""
    loaded = _model(cell["checkpoint"], cell["cache_dir"], cell["device"])
    found = sequence(cell)
    context = found.question_start
    rows, layers = sweep_policies(loaded, found.ids[:, :context], found.continuation, methods=list(cell["policies"]),
                                  ratios=list(cell["ratios"]), answer_length=found.answer_length,
                                  short_context=cell["short_context"], batch=batch,
                                  seed=cell_seed(*(cell[c] for c in KEY), "policies", base_seed=cell["base_seed"]))
    lengths = {"context_length": context, "continuation_length": found.ids.shape[1] - context,
               "answer_tokens": found.answer_length}
    return {RESULTS: [{**row, **lengths} for row in rows], LAYERS: layers}


def compute_added(cells: list) -> list:
    """One sequence's cells of the policies added to a saved run (cells that differ only by ``policy``): one exact
    prefill for all of them, then each policy's continuations alone (``batch=False``: the rows of a cell computed on
    its own, bit for bit). Per cell, its rows of ``added.csv`` and ``added_layers.csv`` (those of
    :func:`compute_sequence` but the unpatched model's, which ``results.csv.gz`` holds)."""
    found = compute_sequence({**cells[0], "policies": tuple(cell["policy"] for cell in cells)}, batch=False)
    return [{ADDED: [row for row in found[RESULTS] if row["method"] == cell["policy"]],
             ADDED_LAYERS: [row for row in found[LAYERS] if row["method"] == cell["policy"]]} for cell in cells]


def compute_whole(cells: list) -> list:
    """One sequence's cells of the whole-sequence setting (cells that differ by ``method`` and
    ``compression_ratio``): the sequence's reference (:class:`~approxlab.patching.WholeSequence`) once, then per
    cell one method at one ratio over the whole sequence (every layer replaced): its row of ``whole.csv`` (a policy
    row's columns, :meth:`~approxlab.patching.WholeSequence.run`) and of ``whole_layers.csv``; every generator seeded
    from the sequence alone (every method draws the same streams)."""
    from ...patching import WholeSequence

    cell = cells[0]
    found = sequence(cell)
    whole = WholeSequence(_model(cell["checkpoint"], cell["cache_dir"], cell["device"]),
                          found.ids[:, :found.question_start], found.continuation, answer_length=found.answer_length,
                          short_context=cell["short_context"])
    context = whole.reference.context_length
    lengths = {"context_length": context, "continuation_length": int(whole.ids.shape[1]) - context,
               "answer_tokens": whole.reference.answer_length}
    seed = cell_seed(*(cell[c] for c in KEY), "whole", base_seed=cell["base_seed"])
    results = []
    for each in cells:  # the sequence's methods and ratios
        row, layers = whole.run(each["method"], each["compression_ratio"], seed=seed)
        results.append({WHOLE: [{**row, **lengths}], WHOLE_LAYERS: layers})
    return results


SHARED_POLICIES = ("h2o", "observed-attention")
"""The policies whose scores read the prefill's attention column sums (shared across them and every ratio)."""


def sharing_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per length: the cost of the shared column sums against recomputing them, on the first text's
    single-needle sequence (depth 0.5), where the run has those policies."""
    chosen = [name for name in SHARED_POLICIES if name in config["policies"]]
    if not chosen:
        return []
    return [{"length": length, "task": "single-needle", "text": 0, "depth": 0.5,
             "short_context": config["short_context"][str(length)], "ratios": tuple(config["ratios"]),
             "policies": tuple(chosen), "checkpoint": config["checkpoint"], "base_seed": config["base_seed"],
             **settings} for length in config["lengths"]]


def compute_sharing(cell: dict) -> list[dict]:
    """``sharing.csv``: the seconds of the column-sum policies' continuations with the sums shared and recomputed,
    and the largest difference between the two runs' scores (0: the same, bit for bit)."""
    import time

    loaded = _model(cell["checkpoint"], cell["cache_dir"], cell["device"])
    found = sequence(cell)
    context = found.question_start
    runs = {}
    for share in (True, False):
        start = time.perf_counter()
        rows, _ = sweep_policies(loaded, found.ids[:, :context], found.continuation, methods=list(cell["policies"]),
                                 ratios=list(cell["ratios"]), answer_length=found.answer_length,
                                 short_context=cell["short_context"], share=share)
        spent = rows[0]["prefill_seconds"] + rows[0]["key_token_seconds"] + rows[0]["seconds"]
        runs[share] = (rows[1:], time.perf_counter() - start - spent)
    columns = ("answer_logprob", "delta_all", "clean_spectral_mean", "patched_spectral_mean")
    difference = max(abs(a[c] - b[c]) for a, b in zip(runs[True][0], runs[False][0]) for c in columns)
    return [{"shared": share, "policies": ",".join(cell["policies"]), "continuations": len(rows),
             "seconds": seconds, "seconds_per_continuation": seconds / len(rows), "max_abs_difference": difference}
            for share, (rows, seconds) in runs.items()]
