"""The decoder study's grid: full and ``--quick`` grids, the methods' causal forms, the layers, the checks."""

from __future__ import annotations

import argparse

from ...assumptions import HEAVY_PER_ROW, RANK_MAX_N
from ...errors import UsageError
from ...methods import get
from .. import checks
from .. import options as shared
from ..declaration import Option
from ..inputs.wikitext import draw_windows, method_seeds

__all__ = ["DEFAULT_CHECKPOINT", "METHODS", "FULL_GRID", "QUICK_GRID", "OPTIONS", "causal_form", "default_layers",
           "configure", "build_config", "window_ids", "make_cells", "check", "run_info"]

DEFAULT_CHECKPOINT = "HuggingFaceTB/SmolLM2-135M-Instruct"
METHODS = ("performer", "informer", "skyformer-softmax", "nystromformer", "nystrom", "spectral-shifting")
"""The built-in methods with a causal form (their own, or the mask-renormalise variant)."""

FULL_GRID = {
    "conditions": ["pretrained", "initialized"],
    "n": [512, 1024, 2048, 4096, 8192],
    "layers": None,  # first, middle, last of the model
    "num_features": [16, 32, 64, 128, 256],
    "methods": list(METHODS),
    "windows": 3,
    "seeds": 1,
}
QUICK_GRID = {**FULL_GRID, "n": [256, 512], "num_features": [16, 64], "windows": 1, "layers": "first-last"}
"""``--quick``: a CI smoke run (about a minute on 2 cores once the model is converted)."""

WINDOW_KEY = ("condition", "layer", "window")
ASSUMPTION_KEY = ("condition", "n", "layer", "window")
RESULT_KEY = ("condition", "n", "layer", "window", "method")
NEAR_ZERO_ROW = 1e-3
"""A masked row sum is near zero when ``|sum| <= NEAR_ZERO_ROW * median |sums|`` of its head."""


OPTIONS = (
    shared.CHECKPOINT.but(default=DEFAULT_CHECKPOINT, help="a causal decoder (Hub id with network, local folder or "
                          ".gguf file; default the packaged SmolLM2-135M-Instruct, 4-bit GGUF, offline)"),
    shared.LAYERS.but(help="layers: indices, first, middle, last (comma-separated), or all (default: first, "
                           "middle and last; --quick: first and last)"),
    shared.METHODS.but(help=f"methods with a causal form, comma-separated (default {','.join(METHODS)})"),
    shared.CONDITIONS_OPTION, shared.N, shared.NUM_FEATURES, shared.WINDOWS,
    shared.SEEDS.but(help="seeds per randomized method"),
    Option(("--rank-max-n",), "rank_max_n", f"largest n with a numerical rank (dense SVD per head; default "
           f"{RANK_MAX_N})", type=shared.nonnegative_int, default=RANK_MAX_N),
)
"""The options of ``approxlab decoder`` besides the common ones (all but ``--rank-max-n`` from the shared set)."""


def causal_form(method: str):
    """The ``causal=`` a method runs with here: ``True`` (its own form) or ``"mask-renormalise"``.

    Raises
    ------
    UsageError
        The method has neither (the message lists the methods that have one).
    """
    from ...methods import available, causal_support, get

    if method not in available():
        raise UsageError("--methods", f"registered method names among {available()}", repr(method))
    form = get(method).causal
    if form is False:
        usable = causal_support(True) + causal_support("mask-renormalise")
        raise UsageError("--methods", f"methods with a causal form (causal=True or 'mask-renormalise') among "
                                      f"{usable}", repr(method))
    return form


def default_layers(num_layers: int, which="first-middle-last") -> list[int]:
    """``[0, num_layers // 2, num_layers - 1]`` (or first and last), without repeats."""
    chosen = [0, num_layers // 2, num_layers - 1] if which == "first-middle-last" else [0, num_layers - 1]
    return sorted(set(chosen))


_GRID_OPTIONS = ("conditions", "n", "num_features", "methods", "windows", "seeds")


def _grid(quick, args) -> dict:
    grid = shared.grid(QUICK_GRID if quick else FULL_GRID, args, OPTIONS)
    for method in grid["methods"]:
        causal_form(method)
    if min(grid["n"]) < 4:
        raise UsageError("--n", "lengths of at least 4 tokens (the causal recursion halves them)", grid["n"])
    checks.check_num_features("--num-features", max(grid["num_features"]), grid["methods"], grid["n"])  # no d left out
    return grid


def build_config(*, layers, quick: bool = False, conditions=None, n=None, num_features=None, methods=None,
                 windows=None, seeds=None, checkpoint=DEFAULT_CHECKPOINT, heavy: int = HEAVY_PER_ROW,
                 rank_max_n: int = RANK_MAX_N, window_pool: int = 32, window_seed: int = 0, base_seed: int = 0,
                 model_seed: int = 0) -> dict:
    """The grid-defining configuration (saved and hashed in ``config.json``).

    Parameters
    ----------
    layers : list of int
        Attention layers (resolved from the model by :func:`run`: :func:`default_layers`).
    quick : bool
        Start from :data:`QUICK_GRID` instead of :data:`FULL_GRID`.
    conditions, n, num_features, methods, windows, seeds
        Overrides of the grid (``None``: keep).
    checkpoint : str
        The decoder (Hub id, local folder or GGUF file; default the packaged SmolLM2).
    heavy, rank_max_n
        Of :func:`approxlab.assumptions.measure_assumptions`.
    window_pool, window_seed, base_seed, model_seed : int
        The windows drawn from (of ``max(n)`` tokens) and the seeds of the window draw, of the
        approximations' generators (:func:`~approxlab.studies.engine.cell_seed`) and of the
        initialized model.

    Examples
    --------
    >>> config = build_config(layers=[0, 29], quick=True)
    >>> config["n"], config["causal_forms"]["performer"], config["causal_forms"]["nystromformer"]
    ([256, 512], True, 'mask-renormalise')
    """
    grid = _grid(quick, argparse.Namespace(conditions=conditions, n=n, num_features=num_features, methods=methods,
                                           windows=windows, seeds=seeds))
    grid["layers"] = sorted({int(layer) for layer in layers})
    return {
        "study": "decoder",
        **grid,
        "checkpoint": str(checkpoint),
        "causal_forms": {m: causal_form(m) for m in grid["methods"]},
        "mode": "hidden",
        "reference": "exact causal softmax attention, float64 (exact_attention(..., causal=True))",
        "dtype": "float64",
        "windows_are": f"the first n tokens of windows of max(n) = {max(grid['n'])} tokens",
        "window_pool": int(window_pool), "window_seed": int(window_seed), "base_seed": int(base_seed),
        "model_seed": int(model_seed), "heavy": int(heavy), "rank_max_n": int(rank_max_n),
        "error": "spectral norm per head of the (n, p_v) difference of outputs, float64",
    }


def window_ids(config: dict) -> list[int]:
    """``config["windows"]`` ids drawn without replacement from ``range(window_pool)``, sorted."""
    return draw_windows(config["window_pool"], config["windows"], config["window_seed"])


def make_cells(config: dict, settings: dict) -> dict:
    """``{"windows": [...], "assumptions": [...], "results": [...]}``: the cells of each table,
    adjacent per condition x layer x window (which share one Q/K/V extraction)."""
    data = {"n_max": max(config["n"]), "checkpoint": config["checkpoint"], "model_seed": config["model_seed"],
            "base_seed": config["base_seed"], **settings}
    cells = {"windows": [], "assumptions": [], "results": []}
    for condition in config["conditions"]:
        for layer in config["layers"]:
            for window in window_ids(config):
                base = {"condition": condition, "layer": layer, "window": window, **data}
                cells["windows"].append(base)
                for n in config["n"]:
                    cells["assumptions"].append({**base, "n": n, "heavy": config["heavy"],
                                                 "rank_max_n": config["rank_max_n"]})
                    for method in config["methods"]:
                        features = [d for d in config["num_features"] if d <= get(method).max_features(n)]
                        if features:
                            cells["results"].append({**base, "n": n, "method": method, "num_features": features,
                                                     "seeds": method_seeds(config["seeds"], method),
                                                     "causal": config["causal_forms"][method]})
    return cells


def window_cells(config, settings):
    """The cells of ``windows.csv`` (see :func:`make_cells`)."""
    return make_cells(config, settings)["windows"]


def assumption_cells(config, settings):
    """The cells of ``assumptions.csv`` (see :func:`make_cells`)."""
    return make_cells(config, settings)["assumptions"]


def result_cells(config, settings):
    """The cells of ``results.csv`` (see :func:`make_cells`)."""
    return make_cells(config, settings)["results"]


def _layers(args, num_layers: int) -> list[int]:
    """``--layers`` as indices of a model of ``num_layers`` layers (names: first, middle, last)."""
    if args.layers == "all":
        return list(range(num_layers))
    if args.layers is None:
        return default_layers(num_layers, "first-last" if args.quick else "first-middle-last")
    names = {"first": 0, "middle": num_layers // 2, "last": num_layers - 1}
    layers = [names.get(layer, layer) for layer in args.layers]
    if any(layer >= num_layers for layer in layers):
        raise UsageError("--layers", f"layer indices in 0..{num_layers - 1} (the model has {num_layers} layers)",
                         ",".join(map(str, args.layers)))
    return layers


def configure(args) -> dict:
    """The config of the parsed options: the grid checked first (no model is read for a bad option), then the
    model (:func:`approxlab.studies.checks.check_model`) and its layers (``--layers``, else
    :func:`default_layers`)."""
    value = lambda name, default=None: default if getattr(args, name, None) is None else getattr(args, name)  # noqa
    grid = _grid(value("quick", False), args)
    args = argparse.Namespace(**{"checkpoint": DEFAULT_CHECKPOINT, "cache_dir": None, "layers": None,
                                 "quick": False, **vars(args)})
    infos = checks.check_model(args, grid["conditions"])
    layers = _layers(args, min(info.num_layers for info in infos.values()))
    return build_config(layers=layers, quick=value("quick", False), checkpoint=args.checkpoint,
                        rank_max_n=value("rank_max_n", RANK_MAX_N),
                        **{name: getattr(args, name, None) for name in _GRID_OPTIONS})


def _infos(args, config) -> dict:
    from ...data import describe_model

    return {c: describe_model(c, checkpoint=args.checkpoint, cache_dir=args.cache_dir) for c in config["conditions"]}


def check(args, config) -> None:
    """The model is causal, its context holds max(n), and the corpus holds the window pool at max(n)."""
    from ...data import CheckpointError, corpus_window_count

    infos = _infos(args, config)
    n_max = max(config["n"])
    for condition, info in infos.items():
        if not info.causal:
            raise UsageError("--checkpoint", "a causal decoder (llama, qwen2, qwen3, gpt2, gemma3)",
                             f"{args.checkpoint!r} (a bidirectional {info.model_type} model)")
        if n_max > info.max_positions:
            raise UsageError("--n", f"lengths up to the model's context, {info.max_positions}", f"{n_max}")
        try:
            available = corpus_window_count(condition, n_max, checkpoint=args.checkpoint, data_dir=args.data_dir,
                                            cache_dir=args.cache_dir)
        except CheckpointError as error:
            raise UsageError("--checkpoint", error.allowed, error.got) from None
        if available < config["window_pool"]:
            raise UsageError("--n", f"a longest length whose windows number at least {config['window_pool']} "
                                    f"(the pool the windows are drawn from; the corpus has {available} of "
                                    f"{n_max} tokens)", n_max)


def run_info(args, config) -> dict:
    """What ``config.json`` records beside the common run information: the models and their weights."""
    infos = _infos(args, config)
    return {"checkpoints": {c: info.checkpoint for c, info in infos.items()},
            "weights": {c: info.weights for c, info in infos.items()}}
