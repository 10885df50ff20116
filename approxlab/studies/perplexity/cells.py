r"""The perplexity study's cells: the unpatched model's log-likelihood, a patched forward pass of the decoder, one
of the encoder, and the cost of a patched forward pass.

Every cell runs the model on one WikiText-2 window (:func:`window_tokens`) and takes its randomness from its
key (:func:`~approxlab.studies.engine.cell_seed`). A patched cell records, for every replaced layer, the
relative spectral, Frobenius and worst-query errors of the layer's output against exact attention on the
inputs that layer received in that run (:meth:`approxlab.patching.AttentionPatch.errors`): with every layer
replaced those are the patched model's own inputs, which drift from the unpatched model's. With one layer K > 0
replaced in the whole window, the layers below K are the unpatched model's for every method and budget: their
output is captured once per window and layer (:mod:`approxlab.patching.prefix`) and a cell runs layers K .. only,
with the same values as the whole pass (the first cell of a window and layer counts the capture in its seconds).

A method that fails (any exception it raises: ``FloatingPointError`` for a non-finite output, a plugin's own
error, ...; :mod:`approxlab.studies.engine.failures`) gives ``inf`` log-likelihood, errors and seconds and a
``status`` naming the error, and the run goes on to its report; warnings are counted.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch

from ...errors import UsageError
from ...patching import patch_attention, token_nll
from ..engine.clock import Stopwatch
from ..engine.failures import METHOD_ERRORS, method_status
from ..engine.keys import cell_seed
from .grid import ALL_LAYERS, KV_CACHE, KV_GROUPING, WHOLE

__all__ = ["BASELINE_KEY", "DECODER_KEY", "PATCHED", "ENCODER_KEY", "COST_KEY", "MEASURES", "decoder_model", "encoder_model",
           "window_tokens", "window_inputs", "compute_baseline", "compute_decoder", "decoder_run", "run_patch", "ratio_column",
           "patch_options", "replaced_layers", "measured", "warning_columns", "compute_encoder", "compute_cost"]

BASELINE_KEY = ("setting", "window")
DECODER_KEY = ("setting", "layers", "method", "num_features", "window")
PATCHED = "perplexity.csv.gz"
"""The patched runs' table: one row per :data:`DECODER_KEY` cell, gzip-compressed (4.0 MB as text at the full grid)."""
ENCODER_KEY = ("method", "num_features", "window")
COST_KEY = ("method",)
MEASURES = ("spectral", "frobenius", "worst_query")
"""The error measures of :func:`approxlab.patching.output_errors`, relative, per layer and head."""

def decoder_model(cell):
    """The cell's decoder (:func:`approxlab.data.load_model`), built once per process."""
    return _model(cell["checkpoint"], cell["cache_dir"], cell["device"])


def encoder_model(cell):
    """The encoder, all-MiniLM-L6-v2 as approxlab ships it, built once per process."""
    return _model(None, None, cell["device"])


@functools.lru_cache(maxsize=2)
def _model(checkpoint, cache_dir, device):
    from ...data import load_model

    return load_model("pretrained", checkpoint=checkpoint, cache_dir=cache_dir, device=device)


@functools.lru_cache(maxsize=4)
def _token_ids(checkpoint, data_dir, cache_dir, encoder: bool):
    from ...data import wikitext_token_ids

    cell = {"checkpoint": checkpoint, "cache_dir": cache_dir, "device": "cpu"}
    loaded = encoder_model(cell) if encoder else decoder_model(cell)
    return wikitext_token_ids(loaded.tokenizer, data_dir=data_dir, cache_dir=cache_dir)


def window_tokens(cell, *, encoder: bool = False) -> torch.Tensor:
    """``(1, tokens)``: window ``cell["window"]`` of WikiText-2 in the model's own tokens.

    The decoder's windows hold ``window_tokens`` tokens (the whole-window setting reads their first ``n``);
    the encoder's hold ``n`` word pieces of its own tokenizer (no [CLS]/[SEP]).
    """
    from ...data import windows

    ids = _token_ids(cell["checkpoint"], cell["data_dir"], cell["cache_dir"], encoder)
    length = cell["n"] if encoder else cell["window_tokens"]
    return windows(ids, length)[cell["window"]].unsqueeze(0).clone()


def _scored(nll: torch.Tensor, cell) -> torch.Tensor:
    """The scored predictions: all of the whole window, those made at the continuation's positions."""
    return nll[:, cell["context"]:] if cell["setting"] == KV_CACHE else nll


def window_inputs(cell) -> torch.Tensor:
    """``(1, n)``: the tokens the cell's model runs on (the first ``n`` of the window in the whole-window setting,
    the whole window in the KV-cache setting)."""
    ids = window_tokens(cell)
    return ids[:, :cell["n"]] if cell["setting"] == WHOLE else ids


def compute_baseline(cell: dict) -> list[dict]:
    """The unpatched model's mean negative log-likelihood (nats per token) of the window's scored tokens."""
    watch = Stopwatch()
    ids = window_inputs(cell)
    try:
        nll = _scored(token_nll(decoder_model(cell), ids), cell)
    except ValueError as error:  # no output head: said about the option that named the model
        raise UsageError("--checkpoint", "a causal language model with its output head (or tied embeddings)",
                         f"{cell['checkpoint']!r} ({error})") from None
    return [{"tokens": int(ids.shape[1]), "scored": int(nll.numel()), "nll": float(nll.mean()),
             "distinct_tokens": int(ids.unique().numel()), "seconds": watch.seconds()}]


def run_patch(cell, key, use, **patch_options):
    """``use(patch)`` for a patch of the cell's method (the cell's budget and options, its random streams from
    ``key``): (its result, the patch, status, warnings caught); a method's failure gives (None, None, its status,
    warnings)."""
    generator = torch.Generator().manual_seed(cell_seed(*key, base_seed=cell["base_seed"]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            patch = patch_attention(patch_options.pop("model"), cell["method"], num_features=cell["num_features"],
                                    generator=generator, record_inputs=True, **patch_options,
                                    **cell.get("options", {}))
            return use(patch), patch, "ok", caught
        except METHOD_ERRORS as failure:  # the method's failure: a failed row
            return None, None, method_status(cell["method"], failure), caught


def _inside(patch, forward):
    with patch:
        return forward()


def replaced_layers(cell) -> list[int]:
    """The layers the cell replaces: every layer, or the one its ``layers`` names."""
    return (list(range(cell["num_layers"])) if cell["layers"] == ALL_LAYERS
            else [int(cell["layers"].split()[-1])])


def patch_options(cell, model) -> dict:
    """What :func:`run_patch` passes :func:`approxlab.patch_attention` for the cell: its layers, the attention
    measures, the KV-cache setting."""
    options = {"model": model, "layers": None if cell["layers"] == ALL_LAYERS else replaced_layers(cell),
               "record_attention": True}
    if cell["setting"] == KV_CACHE:
        options.update(context_length=cell["context"], grouping=KV_GROUPING)
    return options


def _layer_rows(errors, patch, layers) -> list[dict]:
    """Per replaced layer: the median, mean and max over heads of each relative error measure (``errors``: the
    rows of :meth:`~approxlab.patching.AttentionPatch.errors`)."""
    if patch is None:
        return [{"layer": layer, **{f"{m}_{s}": math.inf for m in MEASURES for s in ("median", "mean", "max")}}
                for layer in layers]
    rows = []
    for layer in layers:
        found = [row for row in errors if row["layer"] == layer]
        values = {m: torch.tensor([row[m] for row in found], dtype=torch.float64) for m in MEASURES}
        rows.append({"layer": layer, **{f"{m}_{s}": float(getattr(values[m], s)()) for m in MEASURES
                                        for s in ("median", "mean", "max")}})
    return rows


def _pooled(errors, patch) -> dict:
    """Each measure's median and max over every replaced layer and head of a run; ``inf`` for a failed run."""
    if patch is None:
        return {f"{m}_{s}": math.inf for m in MEASURES for s in ("median", "max")}
    values = {m: torch.tensor([row[m] for row in errors], dtype=torch.float64) for m in MEASURES}
    return {**{f"{m}_median": float(values[m].median()) for m in MEASURES},
            **{f"{m}_max": float(values[m].max()) for m in MEASURES}}


def _unmeasured() -> dict:
    """Each measure's median and max as NaN: a run that replaced no layer (the unpatched model) has no error to
    measure, which is not a failure (``inf``, :func:`_pooled`)."""
    return {f"{m}_{s}": math.nan for m in MEASURES for s in ("median", "max")}


def warning_columns(caught) -> dict:
    kinds = sorted({w.category.__name__ for w in caught})
    return {"num_warnings": len(caught), "warnings": ";".join(kinds) if kinds else "none"}


def compute_decoder(cell: dict) -> dict:
    """A patched forward pass: ``perplexity.csv.gz`` (one row) and ``layer_errors.csv`` (one row per replaced layer)."""
    row, layer_rows = decoder_run(cell, tuple(cell[c] for c in DECODER_KEY))
    return {PATCHED: [row], "layer_errors.csv": layer_rows}


def decoder_run(cell: dict, key: tuple) -> tuple[dict, list[dict]]:
    """The patched forward pass of :func:`compute_decoder` (its random streams from ``key``): its row and its rows
    per replaced layer."""
    watch = Stopwatch()
    model = decoder_model(cell)
    ids = window_inputs(cell)
    layers = replaced_layers(cell)
    forward = _forward(cell, model, ids, layers)
    nll, patch, status, caught = run_patch(cell, key, lambda patch: _inside(patch, forward),
                                           **patch_options(cell, model))
    scored = None if nll is None else _scored(nll, cell)
    errors = [] if patch is None else patch.errors()
    row = {"scored": int(ids.shape[1] - 1 - (cell["context"] if cell["setting"] == KV_CACHE else 0)),
           "nll": math.inf if scored is None else float(scored.mean()), "replaced": len(layers),
           "error_inputs": "the patched run's own (drifting)" if len(layers) > 1 else "the unpatched model's",
           **measured(errors, patch), "causal": _causal_form(cell, patch), "status": status,
           **warning_columns(caught), **ratio_column(cell), **watch.times()}
    return row, _layer_rows(errors, patch, layers)


def ratio_column(cell) -> dict:
    """``{"compression_ratio": r}`` where the cell's budget was given as a ratio (``--ratios``), else ``{}``: a
    results row carries both the ratio and its kept count ``num_features``.

    Examples
    --------
    >>> ratio_column({"num_features": 192, "compression_ratio": 0.5}), ratio_column({"num_features": 64})
    ({'compression_ratio': 0.5}, {})
    """
    return {"compression_ratio": cell["compression_ratio"]} if "compression_ratio" in cell else {}


def _forward(cell, model, ids, layers):
    """The cell's forward pass: the whole model, or with one layer K > 0 replaced in the whole window, layers K ..
    only from the unpatched hidden states entering K (:func:`approxlab.patching.prefix.token_nll_from`; equal to
    the whole pass, shared by every method and budget of the window: :func:`_layer_input`)."""
    from ...patching.prefix import token_nll_from

    if cell["setting"] != WHOLE or len(layers) != 1 or layers[0] == 0:
        return lambda: token_nll(model, ids)
    hidden = _layer_input(cell["checkpoint"], cell["cache_dir"], cell["device"], tuple(ids[0].tolist()), layers[0])
    return lambda: token_nll_from(model, ids, layer=layers[0], hidden=hidden)


@functools.lru_cache(maxsize=64)
def _layer_input(checkpoint, cache_dir, device, ids: tuple, layer: int) -> torch.Tensor:
    """The unpatched model's hidden states entering ``layer`` on ``ids``, captured once per window and layer and
    process (64 kept: 12 windows x 5 depths of the full grid; 1.2 MB each at 512 tokens)."""
    from ...patching.prefix import layer_inputs

    cell = {"checkpoint": checkpoint, "cache_dir": cache_dir, "device": device}
    return layer_inputs(decoder_model(cell), torch.tensor([ids]), [layer])[layer]


def measured(errors, patch) -> dict:
    """A run's pooled error measures (:func:`_pooled`) and attention measures (:func:`_attention`)."""
    return {**_pooled(errors, patch), **_attention(patch)}


def _attention(patch) -> dict:
    """The median over replaced layers and heads of each run's attention measures
    (:func:`approxlab.patching.records.attention_measures`; NaN where the method gives no matrix)."""
    from ...patching.records import ATTENTION_MEASURES

    found = {}
    for name in ATTENTION_MEASURES:
        values = torch.cat([call.attention[name].flatten() for call in (patch.calls if patch else [])
                            if call.attention is not None] or [torch.full((1,), math.nan, dtype=torch.float64)])
        found[f"{name}_median"] = float(values.nanmedian()) if bool(values.isfinite().any()) else math.nan
    return found


def _causal_form(cell, patch) -> str:
    """The causal form the method ran with (``True``, ``"mask-renormalise"``, ...), from the patch or the registry."""
    from ...methods import get

    return str(patch.causal) if patch is not None else str(get(cell["method"]).causal)


@functools.lru_cache(maxsize=2)
def _exact_embedding(window: int, n: int, checkpoint, data_dir, cache_dir, device) -> torch.Tensor:
    cell = {"window": window, "n": n, "checkpoint": checkpoint, "data_dir": data_dir, "cache_dir": cache_dir,
            "device": device}
    with torch.no_grad():
        return _embedding(encoder_model(cell), window_tokens(cell, encoder=True))


def _embedding(loaded, ids) -> torch.Tensor:
    """The mean-pooled last hidden state (all-MiniLM-L6-v2's sentence embedding before its normalisation), float64."""
    with torch.no_grad():
        hidden = loaded.model(input_ids=ids.to(loaded.model.device)).last_hidden_state
    return hidden.to(torch.float64).mean(dim=1).squeeze(0).cpu()


def compute_encoder(cell: dict) -> list[dict]:
    """Every layer of the encoder replaced: one minus the cosine similarity of the mean-pooled embedding to the
    exact model's (``cosine_distance``), and the errors pooled over layers and heads."""
    watch = Stopwatch()
    loaded = encoder_model(cell)
    ids = window_tokens(cell, encoder=True)
    exact = _exact_embedding(cell["window"], cell["n"], cell["checkpoint"], cell["data_dir"], cell["cache_dir"],
                             cell["device"])
    key = tuple(cell[c] for c in ENCODER_KEY)
    embedding, patch, status, caught = run_patch(
        cell, key, lambda patch: _inside(patch, lambda: _embedding(loaded, ids)), model=loaded, layers=None)
    distance = math.inf if embedding is None else 1.0 - float(torch.nn.functional.cosine_similarity(embedding, exact,
                                                                                                     dim=0))
    errors = [] if patch is None else patch.errors()
    return [{"cosine_distance": distance, "replaced": int(loaded.model.config.num_hidden_layers),
             **_pooled(errors, patch), "status": status, **warning_columns(caught), **ratio_column(cell),
             **watch.times()}]


def compute_cost(cell: dict) -> list[dict]:
    """The cost of a patched forward pass against its parts (:func:`.cost.patched_forward_cost`); a method that
    fails has ``inf`` seconds and ratio and a ``status`` naming its error."""
    from .cost import COST_PARTS, patched_forward_cost

    ids = window_tokens(cell)[:, :cell["n"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            found = patched_forward_cost(decoder_model(cell), cell["method"], ids, layer=cell["layer"],
                                         num_features=cell["cost_features"], repeats=cell["repeats"],
                                         seed=cell_seed(cell["method"], "cost", base_seed=cell["base_seed"]))
            status = "ok"
        except METHOD_ERRORS as failure:  # the method's failure: a failed row
            found = {**dict.fromkeys((*COST_PARTS, "overhead", "ratio"), math.inf), "clock": Stopwatch.steady_clock(),
                     "repeats": cell["repeats"]}
            status = method_status(cell["method"], failure)
    named = {f"{part}_seconds" if part in COST_PARTS + ("overhead",) else part: value for part, value in found.items()}
    return [{"layer": cell["layer"], "num_features": cell["cost_features"], "tokens": int(ids.shape[1]), **named,
             "status": status, **ratio_column(cell)}]
