"""The perplexity study's grid: the full and ``--quick`` grids, the options, the config, the checks and the cells.

The long-context settings' names, options, cells and checks are in :mod:`.long_grid` (re-exported here).
"""

from __future__ import annotations

import argparse

from ...errors import UsageError
from .. import checks
from .. import options as shared
from ..declaration import Option
from ..inputs.wikitext import draw_windows
from .long_grid import (LONG_KEY, LONG_KV, LONG_OPTIONS, LONG_WHOLE, UNPATCHED, check_long, default_long_methods,
                        long_cells, long_lengths)
from .config_grid import (ALL_LAYERS, CONFIGURATIONS, PREMISE_OPTIONS, budgets_of_ratios, check_premise_grid,
                          layer_label, layer_settings, premise_config, ratio_of, resolve_layers)
from .references import check_reference

__all__ = ["DEFAULT_CHECKPOINT", "ENCODER_CHECKPOINT", "METHODS", "ENCODER_METHODS", "CONTROL", "FULL_GRID",
           "QUICK_GRID", "OPTIONS", "WHOLE", "KV_CACHE", "ALL_LAYERS", "LONG_WHOLE", "LONG_KV", "UNPATCHED", "LONG_KEY",
           "long_cells", "long_lengths", "layer_label", "ignores_features",
           "configure", "build_config", "window_ids", "method_features", "baseline_cells", "decoder_cells",
           "encoder_cells", "decoder_common", "cost_cells", "long_study_cells", "reference_cells", "check", "run_info"]

DEFAULT_CHECKPOINT = "HuggingFaceTB/SmolLM2-135M-Instruct"
ENCODER_CHECKPOINT = "sentence-transformers/all-MiniLM-L6-v2"

CONTROL = "exact"
"""Run beside the methods in every setting: exact attention through the patch (its change in log-perplexity is
the floor of the measurement: the model's own SDPA kernel against approxlab's)."""


def _registered(encoder: bool) -> tuple:
    from ...methods import available, get

    names = [m for m in available() if m != CONTROL]
    if encoder:
        return tuple(m for m in names if get(m).causal != "only")
    return tuple(m for m in names if get(m).causal in (True, "only", "mask-renormalise"))


METHODS = _registered(encoder=False)
"""Every registered method with a causal form but ``exact`` (the control, run in every setting): their own
(``causal=True``), the causal-only ones (the cache policies, CriticalKV and CAOTE among them, and the sparse-prefill
patterns MInference, XAttention, FlexPrefill and DuoAttention, which run over the whole window in every setting),
and ``"mask-renormalise"`` (the Nystrom family, reported apart from the decoder claims); read from the registry, so
a method registered later joins the default grid (a saved run extends into it: ``methods`` grows)."""

ENCODER_METHODS = _registered(encoder=True)
"""Every registered method that runs without a causal mask (the cache policies are causal only)."""

WHOLE, KV_CACHE = "whole", "kv-cache"
KV_GROUPING = "kv-head"
"""The KV-cache setting's kept sets on a grouped-query model: b context tokens per layer and KV head (the query
heads' scores averaged, as kvpress does; ``patch_attention(..., grouping=...)``). Runs before it held a set per
query head (``"query-head"``), which a config without ``kv_grouping`` means."""

FULL_GRID = {
    "n": [512],
    "context": 384,
    "continuation": 128,
    "layer_settings": ["first", ALL_LAYERS],
    "num_features": [16, 32, 64, 128, 256],
    "methods": list(METHODS),
    "encoder_methods": list(ENCODER_METHODS),
    "windows": 12,
    "compare_with": [],
    "long_n": [2048],
    "long_methods": None,
    "long_features": [64, 256],
    "long_windows": 3,
    "long_depths": [0.25, 0.75],
    "depths": None,
    "config_methods": list(CONFIGURATIONS),
    "ratios": None,
}
"""The full grid, declared before its run: 12 windows, 5 budgets, the first layer alone, every layer, the KV cache;
one layer alone at each of ``depths`` (None: five spread over the model, :func:`.config_grid.spread_depths`: 0, 8,
15, 22, 29 of SmolLM2's 30 layers); the fixed-budget configurations of ``config_methods``
(:data:`.config_grid.CONFIGURATIONS`) at the grid's middle budget (64);
the long-context settings at 2,048 tokens (3 windows x 2 depths of the pass key, 2 budgets, the decoder-valid
methods but the two simulations of :data:`.long_grid.LONG_SIMULATIONS`; ``long_methods`` None: that default,
resolved in the config). Its estimated cost is in docs/studies/perplexity.rst."""

QUICK_GRID = {**FULL_GRID, "n": [64], "context": 48, "continuation": 16, "layer_settings": ["middle", ALL_LAYERS],
              "num_features": [8, 32], "methods": ["performer", "streaming-llm"], "encoder_methods": ["nystromformer"],
              "windows": 1, "long_n": [96], "long_features": [8], "long_windows": 1, "long_depths": [0.5],
              "long_methods": None, "depths": ["last"], "config_methods": ["streaming-llm"]}
"""``--quick``: a smoke run for the test suite (seconds once the model is converted)."""

OPTIONS = (
    shared.CHECKPOINT.but(default=DEFAULT_CHECKPOINT, help="the causal language model (Hub id with network, local "
                          "folder or .gguf file; default the packaged SmolLM2-135M-Instruct, 4-bit GGUF, offline)"),
    shared.METHODS.but(help=f"methods with a causal form for the decoder, comma-separated ({CONTROL} always runs as the "
                            "control)"),
    Option(("--encoder-methods",), "encoder_methods", "methods for the encoder (all-MiniLM-L6-v2), comma-separated", type=shared.method_list, nargs="+", action=shared.Flatten,
           metavar="NAMES"),
    shared.NUM_FEATURES.but(help="numbers of features d, in the KV-cache setting the budget d (tokens kept per KV head), "
                                 "comma-separated"),
    shared.WINDOWS.but(help="WikiText-2 windows, the units of every interval"),
    Option(("--layer-settings",), "layer_settings", "which layers are replaced in the whole-window setting, one "
           "setting each: layer indices or first, middle, last (one layer at a time), all (every layer together); "
           "comma-separated", type=layer_settings, nargs="+", action=shared.Flatten,
           metavar="LAYERS"),
    shared.N.but(help="tokens of a window in the whole-window setting, and of the encoder's windows: one length"),
    Option(("--context",), "context", "KV-cache setting: tokens of the context n_c, whose cache the method "
           "compresses", type=shared.positive_int, metavar="N"),
    Option(("--continuation",), "continuation", "KV-cache setting: tokens after the context, scored",
           type=shared.positive_int, metavar="N"),
    *PREMISE_OPTIONS,
    *LONG_OPTIONS,
    Option(("--compare-with",), "compare_with", "result folders of approxlab figure1 or decoder runs whose error "
           "rankings claim (p3) compares with the perplexity ranking (comma- or space-separated)",
           type=shared.str_list, nargs="+", action=shared.Flatten, metavar="FOLDERS"),
)
"""The options of ``approxlab perplexity`` besides the common ones."""

_GRID_OPTIONS = ("n", "context", "continuation", "layer_settings", "depths", "config_methods", "ratios", "num_features",
                 "methods", "encoder_methods", "windows", "compare_with", "long_n", "long_methods", "long_features",
                 "long_windows")


def ignores_features(method: str) -> bool:
    """The method takes no budget (its registration says its features are "ignored"): it runs at one d."""
    from ...methods import get

    return get(method).features.startswith("ignored")


def _grid(quick: bool, args, checked=()) -> dict:
    from ...methods import get

    grid = shared.grid(QUICK_GRID if quick else FULL_GRID, args, OPTIONS)
    grid["n"] = shared.one_value("--n", grid["n"])
    for option in ("methods", "encoder_methods", "long_methods"):
        if CONTROL in (grid[option] or ()):
            flag = "--" + option.replace("_", "-")
            raise UsageError(flag, f"methods other than {CONTROL!r}, which always runs as the control",
                             ",".join(grid[option]))
    for method in grid["methods"]:
        if get(method).causal is False:
            raise UsageError("--methods", "methods with a causal form (their own, mask-renormalise, or a cache "
                             "policy's)", repr(method))
    for method in grid["encoder_methods"]:
        if get(method).causal == "only":
            raise UsageError("--encoder-methods", "methods that run without a causal mask (not the cache policies)",
                             repr(method))
    if grid["context"] < 2 or grid["continuation"] < 2:
        raise UsageError("--context" if grid["context"] < 2 else "--continuation", "at least 2 tokens",
                         min(grid["context"], grid["continuation"]))
    if grid["long_methods"] is None:
        grid["long_methods"] = default_long_methods(grid["methods"])
    check_premise_grid(grid, args)
    if grid["ratios"]:  # the budgets given as compression ratios: their kept counts
        grid["num_features"] = list(budgets_of_ratios(grid["ratios"], grid["context"]))
    for name in ("methods", "encoder_methods", "compare_with", "layer_settings", "long_methods", "depths",
                 "config_methods"):
        if grid[name] is not None:
            grid[name] = list(dict.fromkeys(grid[name]))  # a repeated entry is one setting
    if grid["compare_with"] and all(s == ALL_LAYERS for s in grid["layer_settings"]):
        raise UsageError("--compare-with", "a run with a single-layer --layer-settings (claim (p3) compares a run "
                         "that replaces one layer at a time; 'all' is not compared)",
                         f"--layer-settings {','.join(map(str, grid['layer_settings']))}")
    for folder in grid["compare_with"]:
        if folder not in checked:  # a folder the saved run already read is in its references.csv
            check_reference(folder, budgets=grid["num_features"])
    return grid


def build_config(*, num_layers: int, quick: bool = False, window_pool: int = 64, window_seed: int = 0,
                 base_seed: int = 0, checkpoint=DEFAULT_CHECKPOINT, cost_repeats: int = 3, checked_references=(),
                 **values) -> dict:
    """The grid-defining config (saved and hashed in ``config.json``).

    ``values``: overrides of the grid (``n``, ``context``, ``continuation``, ``layer_settings``,
    ``num_features``, ``methods``, ``encoder_methods``, ``windows``, ``compare_with``), checked as the command
    line checks them; ``num_layers`` resolves first, middle and last.

    Examples
    --------
    >>> config = build_config(num_layers=30)
    >>> config["layers"], config["window_tokens"], config["windows"]
    (['layer 0', 'all'], 512, 12)
    """
    grid = _grid(quick, argparse.Namespace(**{name: values.get(name) for name in _GRID_OPTIONS}), checked_references)
    layers = resolve_layers(grid.pop("layer_settings"), num_layers)
    premise = premise_config(grid, num_layers)
    return {
        "study": "perplexity", **grid, "layers": layers, **premise, "num_layers": int(num_layers), "control": CONTROL,
        "checkpoint": str(checkpoint), "encoder_checkpoint": ENCODER_CHECKPOINT,
        "window_tokens": max(grid["n"], grid["context"] + grid["continuation"]),
        "window_pool": int(window_pool), "window_seed": int(window_seed), "base_seed": int(base_seed),
        "cost_repeats": int(cost_repeats), "kv_grouping": KV_GROUPING,
        "cost_features": grid["num_features"][len(grid["num_features"]) // 2],
        "scored": {WHOLE: "every prediction of the first n tokens (n - 1 per window)",
                   KV_CACHE: "the predictions made at the continuation's positions (continuation - 1 per window)"},
    }


def _describe(checkpoint, cache_dir):
    """The model's :class:`~approxlab.data.ModelInfo` from its config (its weights are checked when a cell loads
    them: a broken file is then the data layer's one-line error)."""
    from ...data import CheckpointError, describe_model

    try:
        return describe_model("pretrained", checkpoint=checkpoint, cache_dir=cache_dir)
    except CheckpointError as error:
        raise UsageError("--checkpoint", error.allowed, error.got) from None


def configure(args) -> dict:
    """The config of the parsed options: the grid checked first, then the model (whose layers name first, middle and
    last)."""
    quick = bool(getattr(args, "quick", False))
    saved = _saved_references(args)
    if getattr(args, "compare_with", None) is None and saved:
        args = argparse.Namespace(**{**vars(args), "compare_with": saved})
    _grid(quick, args, saved)  # a bad option is refused before any model is read
    args = argparse.Namespace(**{"checkpoint": DEFAULT_CHECKPOINT, "cache_dir": None, **vars(args)})
    info = _describe(args.checkpoint, args.cache_dir)
    if not info.causal:
        raise UsageError("--checkpoint", "a causal language model (llama, qwen2, qwen3, gpt2, gemma3)",
                         f"{args.checkpoint!r} (a bidirectional {info.model_type} model)")
    return build_config(num_layers=info.num_layers, quick=quick, checkpoint=args.checkpoint, checked_references=saved,
                        **{name: getattr(args, name, None) for name in _GRID_OPTIONS})


def _saved_references(args) -> list:
    """The ``--compare-with`` folders of the run saved in ``--out``: a comparison belongs to the report, so a rerun
    without the option keeps them (nothing computed is invalidated, nothing is read again); ``--restart`` drops
    them."""
    import pathlib

    from ..engine.store import read_json

    out = getattr(args, "out", None)
    if out is None or getattr(args, "restart", False):
        return []
    try:
        record = read_json(pathlib.Path(out) / "config.json")
    except (OSError, ValueError):
        return []
    found = record.get("config", {}).get("compare_with", []) if isinstance(record, dict) else []
    return [str(folder) for folder in found] if isinstance(found, list) else []


def window_ids(config: dict) -> list[int]:
    """``config["windows"]`` ids drawn from the first ``window_pool`` windows (a prefix of one permutation)."""
    return draw_windows(config["window_pool"], config["windows"], config["window_seed"])


def method_features(config: dict, method: str) -> list[int]:
    """The d a method runs at: every d of the grid, or the smallest alone when it ignores d."""
    return config["num_features"][:1] if ignores_features(method) else list(config["num_features"])


def decoder_common(config: dict, settings: dict) -> dict:
    """What every cell of the decoder and encoder needs besides its key: the model, the lengths, the seed, where the
    data and the model are."""
    return {"checkpoint": config["checkpoint"], "encoder_checkpoint": config["encoder_checkpoint"],
            "n": config["n"], "context": config["context"], "window_tokens": config["window_tokens"],
            "base_seed": config["base_seed"], "num_layers": config["num_layers"], "data_dir": settings.get("data_dir"),
            "cache_dir": settings.get("cache_dir"), "device": settings.get("device", "cpu")}


def baseline_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per setting x window: the unpatched model's log-likelihood of the scored tokens."""
    common = decoder_common(config, settings)
    return [{"setting": setting, "window": window, **common}
            for window in window_ids(config) for setting in (WHOLE, KV_CACHE)]


def decoder_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per setting x replaced layers x method x d x window (the control first, at the first d); the
    single layers of ``depths`` not in ``layers`` last."""
    common = decoder_common(config, settings)
    cells = []
    depths = [layers for layers in config.get("depths", []) if layers not in config["layers"]]
    plan = [(WHOLE, layers) for layers in config["layers"]] + [(KV_CACHE, ALL_LAYERS)] + [(WHOLE, d) for d in depths]
    for setting, layers in plan:
        for method in [config["control"], *config["methods"]]:
            features = config["num_features"][:1] if method == config["control"] else method_features(config, method)
            for d in features:
                for window in window_ids(config):
                    cells.append({"setting": setting, "layers": layers, "method": method, "num_features": d,
                                  "window": window, **ratio_of(config, d), **common})
    return cells


def encoder_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per method x d x window of the encoder (every layer replaced)."""
    common = decoder_common(config, settings)
    return [{"method": method, "num_features": d, "window": window, **ratio_of(config, d), **common}
            for method in [config["control"], *config["encoder_methods"]]
            for d in (config["num_features"][:1] if method == config["control"] else method_features(config, method))
            for window in window_ids(config)]


def cost_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per decoder method: the cost of a patched forward pass (:mod:`.cost`) at ``cost_features`` (with
    ``ratios``, its compression ratio too, carried by ``cost.csv``)."""
    common = decoder_common(config, settings)
    return [{"method": method, "window": window_ids(config)[0], "repeats": config["cost_repeats"],
             "layer": config["num_layers"] // 2, "cost_features": config["cost_features"],
             **ratio_of(config, config["cost_features"]), **common} for method in config["methods"]]


def long_study_cells(config: dict, settings: dict) -> list[dict]:
    """The long-context cells (:func:`.long_grid.long_cells`): ``long_methods`` (a config without them, saved before
    the option: every decoder-valid method, not ``mask-renormalise``) at ``long_features`` (a method that ignores d
    at the first)."""
    from ...methods import get

    methods = config.get("long_methods")
    if methods is None:
        methods = [m for m in config["methods"] if get(m).causal != "mask-renormalise"]
    features = config.get("long_features") or [1]
    common = {**decoder_common(config, settings), **({"with_ratio": True} if config.get("ratios") else {})}
    return long_cells(config, common, methods, lambda m: features[:1] if ignores_features(m) else list(features))


def reference_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per ``--compare-with`` folder: its error ranking, read once and kept in this run's folder."""
    return [{"reference": folder, "n": config["n"], "num_layers": config["num_layers"]}
            for folder in config["compare_with"]]


def check(args, config: dict) -> None:
    """Against the data and models: windows in the corpus, every d allowed, the compared folders readable."""
    from ...data import CheckpointError, corpus_window_count

    info = _describe(config["checkpoint"], args.cache_dir)
    if config["window_tokens"] > info.max_positions:
        raise UsageError("--n" if config["n"] == config["window_tokens"] else "--context",
                         f"windows up to the model's context, {info.max_positions} tokens (n, and the context plus "
                         "the continuation)", config["window_tokens"])
    encoder = _describe(None, None)
    if config["n"] > encoder.max_positions:
        raise UsageError("--n", f"at most {encoder.max_positions} tokens (the encoder's positions)", config["n"])
    try:
        available = corpus_window_count("pretrained", config["window_tokens"], checkpoint=config["checkpoint"],
                                        data_dir=args.data_dir, cache_dir=args.cache_dir)
    except CheckpointError as error:
        raise UsageError("--checkpoint", error.allowed, error.got) from None
    if available < config["window_pool"]:
        raise UsageError("--n", f"windows the corpus holds {config['window_pool']} of (it has {available} of "
                         f"{config['window_tokens']} tokens)", config["window_tokens"])
    checks.check_windows(args, {config["n"]: window_ids(config)}, windows=config["windows"])
    checks.check_num_features("--num-features", max(config["num_features"]),
                              [m for m in config["methods"] if not ignores_features(m)], [config["n"]])
    checks.check_num_features("--num-features", max(config["num_features"]),
                              [m for m in config["encoder_methods"] if not ignores_features(m)], [config["n"]])
    check_long(args, config, info)
    if max(config["num_features"]) > config["context"]:
        raise UsageError("--num-features", f"budgets at most the context, {config['context']} tokens",
                         max(config["num_features"]))


def run_info(args, config: dict) -> dict:
    """What ``config.json`` records beside the common run information: the models' weights."""
    decoder, encoder = _describe(config["checkpoint"], args.cache_dir), _describe(None, None)
    return {"weights": {"decoder": decoder.weights, "encoder": encoder.weights},
            "checkpoints": {"decoder": decoder.checkpoint, "encoder": encoder.checkpoint}}
