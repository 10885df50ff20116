"""The long-context study's cell: one sequence, one exact prefill, every policy at every compression ratio.

``results.csv`` gets the unpatched model's row and one row per policy and ratio
(:func:`approxlab.patching.sweep_policies`), with the sequence's lengths; ``layers.csv`` one row per policy, ratio
and layer (each layer's clean- and patched-input spectral error, median over heads).
"""

from __future__ import annotations

import functools

import torch

from ...patching import sweep_policies
from ..engine.keys import cell_seed
from .grid import KEY

__all__ = ["RESULTS", "LAYERS", "sequence", "compute_sequence"]

RESULTS, LAYERS = "results.csv", "layers.csv"


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
    ``length`` tokens, the asked needle at ``depth``, keys and values drawn from the cell's seed."""
    from ...data import windows
    from ...tasks.ruler import ruler_sequence

    loaded = _model(cell["checkpoint"], cell["cache_dir"], cell["device"])
    filler = windows(_token_ids(cell["checkpoint"], cell["data_dir"], cell["cache_dir"]), cell["length"])[cell["text"]]
    seed = cell_seed(*(cell[c] for c in KEY), "sequence", base_seed=cell["base_seed"])
    return ruler_sequence(cell["task"], loaded.tokenizer, filler, length=cell["length"], depth=cell["depth"],
                          generator=torch.Generator().manual_seed(seed))


def compute_sequence(cell: dict) -> dict:
    """One sequence: its rows of ``results.csv`` and ``layers.csv``."""
    loaded = _model(cell["checkpoint"], cell["cache_dir"], cell["device"])
    found = sequence(cell)
    context = found.question_start
    rows, layers = sweep_policies(loaded, found.ids[:, :context], found.continuation, methods=list(cell["policies"]),
                                  ratios=list(cell["ratios"]), answer_length=found.answer_length,
                                  short_context=cell["short_context"],
                                  seed=cell_seed(*(cell[c] for c in KEY), "policies", base_seed=cell["base_seed"]))
    lengths = {"context_length": context, "continuation_length": found.ids.shape[1] - context,
               "answer_tokens": found.answer_length}
    return {RESULTS: [{**row, **lengths} for row in rows], LAYERS: layers}
