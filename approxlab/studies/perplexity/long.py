r"""The long-context settings: :math:`\Delta` log-perplexity and pass-key retrieval at ``long_n`` tokens.

A sequence (:func:`.passkey.passkey_sequence`) is a WikiText-2 window of ``long_n`` tokens (each length of the
grid) with the pass key at a depth, the question and the key. Two settings, every layer replaced:

* ``long-whole``: the method on the whole sequence (its causal form); scored: every prediction;
* ``long-kv``: the KV-cache setting with the context ending where the question starts (the method compresses
  the text holding the key; the question and the key attend to what it kept); scored: the question's and the
  key's predictions.

Each cell (``long.csv``, key :data:`LONG_KEY`) records the mean NLL of the scored predictions, the key's
summed log-probability and whether greedy decoding (teacher-forced) gives every key token, and the layers'
errors. The attention measures (total variation, kept mass) are not recorded at these lengths: in float64 over
every layer they took 60% of a 2,048-token cell (62 of 104 s), and the cheap-measure comparison is made in the
512-token settings; their columns are NaN. The unpatched model runs as the method ``"unpatched"`` on the same
sequences: its accuracy is the gate of claim (p4) (:data:`.claims.GATE`); it replaces no layer, so its error
columns are NaN (not measured), where a failed run's are ``inf``. Where the run's budgets were given as compression
ratios (``--ratios``), every row also carries ``compression_ratio``: the fraction of the long context (the tokens
before the question) that its budget d removes, :math:`1 - d / n_c` as kvpress states it (0 for the unpatched
model, which keeps every token), beside ``num_features``.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from ...patching import token_nll
from ..engine.clock import Stopwatch
from ..engine.keys import cell_seed
from ..engine.failures import METHOD_ERRORS, method_status
from .cells import _attention, _causal_form, _pooled, _unmeasured, decoder_model, warning_columns
from .grid import LONG_KEY, LONG_KV, LONG_WHOLE, UNPATCHED, long_cells
from .passkey import answer_scores, passkey_sequence

__all__ = ["LONG_WHOLE", "LONG_KV", "UNPATCHED", "LONG_KEY", "long_cells", "long_sequence", "compute_long",
           "long_frame", "long_statistics"]

def long_sequence(cell) -> tuple:
    """``(ids (1, long_n), answer (first, stop), question_start)``: the cell's sequence, its key drawn from the
    window and depth (the same for every method)."""
    from ...data import windows
    from .cells import _token_ids

    loaded = decoder_model({**cell, "device": "cpu"})
    ids = _token_ids(cell["checkpoint"], cell["data_dir"], cell["cache_dir"], False)
    filler = windows(ids, cell["long_n"])[cell["window"]]
    key = 10000 + cell_seed("passkey", cell["window"], cell["depth"], base_seed=cell["base_seed"]) % 90000
    return passkey_sequence(loaded.tokenizer, filler, length=cell["long_n"], depth=cell["depth"], key=key)


def compute_long(cell: dict) -> list[dict]:
    """One long-context cell: the scored NLL, the key's log-probability and retrieval, errors (``long.csv``)."""
    import warnings

    from ...patching import patch_attention

    watch = Stopwatch()
    model = decoder_model(cell)
    ids, answer, question = long_sequence(cell)
    first = question if cell["setting"] == LONG_KV else 0
    patch, status, caught, nll, hits = None, "ok", [], None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cell["method"] == UNPATCHED:
            nll, hits = token_nll(model, ids, hits=True)
        else:
            key = tuple(cell[c] for c in LONG_KEY)
            generator = torch.Generator().manual_seed(cell_seed(*key, base_seed=cell["base_seed"]))
            options = {"context_length": question} if cell["setting"] == LONG_KV else {}
            try:
                with patch_attention(model, cell["method"], num_features=cell["num_features"], generator=generator,
                                     record_inputs=True, **options) as patch:
                    nll, hits = token_nll(model, ids, hits=True)
            except METHOD_ERRORS as failure:  # the method's failure: a failed row
                patch, status = None, method_status(cell["method"], failure)
    errors = [] if patch is None else patch.errors()
    scores = {"answer_logprob": -math.inf, "correct": 0.0} if nll is None else answer_scores(nll, hits, answer)
    return [{"tokens": int(ids.shape[1]), "scored": int(ids.shape[1] - 1 - first),
             "nll": math.inf if nll is None else float(nll[0, first:].mean()),
             "answer_tokens": answer[1] - answer[0], **scores,
             **(_pooled(errors, patch) if cell["method"] != UNPATCHED else _unmeasured()),
             **_attention(patch), "causal": "none" if cell["method"] == UNPATCHED else _causal_form(cell, patch),
             "status": status, **warning_columns(caught), **_long_ratio(cell, question), **watch.times()}]


def _long_ratio(cell: dict, context: int) -> dict:
    """``{"compression_ratio": 1 - d / context}`` for a cell of a run whose budgets were given as ratios (0 for the
    unpatched model), else ``{}``.

    Examples
    --------
    >>> _long_ratio({"with_ratio": True, "method": "snapkv", "num_features": 256}, 2048), _long_ratio({}, 2048)
    ({'compression_ratio': 0.875}, {})
    """
    if not cell.get("with_ratio"):
        return {}
    return {"compression_ratio": 0.0 if cell["method"] == UNPATCHED else 1.0 - cell["num_features"] / context}


def long_frame(long) -> pd.DataFrame:
    """``long.csv`` with ``sequence`` (window x depth), ``delta`` (the scored mean NLL minus the unpatched model's)
    and ``delta_key`` (the key's negative log-probability minus the unpatched model's), ``ok``."""
    import numpy as np

    if long is None or long.empty:
        return long
    keys = ["setting", "long_n", "window", "depth"]
    base = long[long["method"] == UNPATCHED][[*keys, "nll", "answer_logprob"]]
    frame = long.merge(base.rename(columns={"nll": "base_nll", "answer_logprob": "base_logprob"}), on=keys,
                       how="left")
    frame["ok"] = frame["status"] == "ok"
    frame["delta"] = np.where(frame["ok"], frame["nll"] - frame["base_nll"], np.inf)
    frame["delta_key"] = np.where(frame["ok"], frame["base_logprob"] - frame["answer_logprob"], np.inf)
    frame["sequence"] = [f"{w}@{d:g}" for w, d in frame[["window", "depth"]].itertuples(index=False)]
    return frame


def long_statistics(long) -> pd.DataFrame:
    """``long_stats.csv``: per long setting x method x d, the retrieval accuracy, the mean change in the key's
    negative log-probability and in log-perplexity, and the median spectral error over sequences (NaN for the
    unpatched model, which replaces no layer)."""
    frame = long_frame(long)
    if frame is None or frame.empty:
        return pd.DataFrame(columns=["setting", "long_n", "method", "num_features", "sequences", "accuracy",
                                     "delta_key",
                                     "delta", "spectral_median", "failures"])
    ok = frame[frame["ok"]]
    by = ["setting", "long_n", "method", "num_features"]
    table = ok.groupby(by, sort=False).agg(
        sequences=("sequence", "nunique"), accuracy=("correct", "mean"), delta_key=("delta_key", "mean"),
        delta=("delta", "mean"), spectral_median=("spectral_median", "median")).reset_index()
    failures = frame.groupby(by, sort=False)["ok"].agg(lambda s: int((~s).sum()))
    table.loc[table["method"] == UNPATCHED, "spectral_median"] = math.nan  # no layer replaced: no error to measure
    return table.merge(failures.rename("failures").reset_index(), on=by)
