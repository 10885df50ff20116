"""The decoder study's grid: full and ``--quick`` grids, the methods' causal forms, the layers, the checks.

The KV-cache setting's values, options and defaults at other lengths are in :mod:`.kv_setting` (re-exported
here).
"""

from __future__ import annotations

import argparse

from ...assumptions import HEAVY_PER_ROW, RANK_MAX_N, SORTLSH_HASHES
from ...errors import UsageError
from ...methods import get
from ...methods.hyperattention import DEFAULT_BLOCK_SIZE
from .. import checks
from .. import options as shared
from ..declaration import Option
from ..inputs.wikitext import draw_windows, method_seeds
from .kv_setting import KV_FULL, KV_KEY, KV_OPTIONS, KV_QUICK, KV_RATIOS, kv_defaults, ratio_budgets

__all__ = ["DEFAULT_CHECKPOINT", "METHODS", "FULL_GRID", "QUICK_GRID", "OPTIONS", "EPSILON", "PERFORMER_SCALE",
           "WINDOW_POOL", "WINDOW_KEY", "ASSUMPTION_KEY", "RESULT_KEY", "KV_KEY", "causal_form", "default_layers",
           "kv_defaults", "configure", "build_config", "window_ids", "make_cells", "budgets", "check", "run_info"]

DEFAULT_CHECKPOINT = "HuggingFaceTB/SmolLM2-135M-Instruct"
REFERENCES = ("exact",)
"""Causal softmax methods that are references, not approximations (exact attention itself)."""


def _methods() -> tuple[str, ...]:
    from ...methods.registry import BUILTINS

    return tuple(name for name in BUILTINS if name not in REFERENCES and get(name).target == "softmax"
                 and (get(name).causal in (True, "mask-renormalise") or get(name).causal_only))


METHODS = _methods()
"""Every built-in approximation of softmax attention with a causal form, read from the registry: its own
(``causal=True``), the causal-only cache policies (``causal="only"``: every registered ``score``/``compress`` policy,
h2o, snapkv and kvpress's scorers) and the evaluation variant ``causal="mask-renormalise"`` (``exact``, and
``kernelized``/``yoso-e``, exact attention of other kernels, are references, not approximations)."""

FULL_GRID = {
    "conditions": ["pretrained", "initialized"],
    "n": [768, 1024, 2048, 4096],
    "layers": None,  # first, middle, last of the model
    "num_features": [16, 32, 64, 128, 256],
    "methods": list(METHODS),
    "windows": 3,
    "seeds": 1,
    **KV_FULL,  # the KV-cache setting (kv_setting.py): context 1536, continuation 512, budgets 16 to 1024
}
"""The full grid. Four lengths from 768 (the smallest n whose top unmasked block, n/2 columns, holds more than
one sortLSH block of 256 keys, so that sortLSH's kappa is defined at every n) to 4096; 3 windows, the
independent units of every interval; the KV-cache setting on the first 2048 tokens of each window."""

QUICK_GRID = {**FULL_GRID, "n": [256, 512], "num_features": [16, 64], "windows": 1, "layers": "first-last",
              **KV_QUICK}
"""``--quick``: a CI smoke run (one window: its verdicts are inconclusive by design)."""

EPSILON = 0.1
r"""The relative error :math:`\varepsilon` of the sampling criterion: uniform sampling of a block needs
:math:`m = (c/r)\,\alpha/\varepsilon^2` columns (:func:`approxlab.assumptions.uniform_samples_needed`)."""

PERFORMER_SCALE = 0.25
"""The logit-scale control of Performer: Q and K multiplied by this (divided by 4), logits by its square."""

WINDOW_POOL = 32
"""Disjoint windows of ``max(n)`` tokens the windows are drawn from (the first ``WINDOW_POOL`` of the corpus)."""

WINDOW_KEY = ("condition", "layer", "window")
ASSUMPTION_KEY = ("condition", "n", "layer", "window")
RESULT_KEY = ("condition", "n", "layer", "window", "method")

OPTIONS = (
    shared.CHECKPOINT.but(default=DEFAULT_CHECKPOINT, help="a causal decoder (Hub id with network, local folder or "
                          ".gguf file; default the packaged SmolLM2-135M-Instruct, 4-bit GGUF, offline); layers "
                          "with a sliding window shorter than max(n) are refused"),
    shared.LAYERS.but(help="layers: indices, first, middle, last (comma-separated), or all (default: first, "
                           "middle and last; --quick: first and last)"),
    shared.METHODS.but(help="methods with a causal form, comma-separated"),
    shared.CONDITIONS_OPTION, shared.N, shared.NUM_FEATURES,
    shared.WINDOWS.but(help=f"number of WikiText-2 windows, at most {WINDOW_POOL} (the pool they are drawn from; "
                            "a larger count is refused)"),
    shared.SEEDS.but(help="seeds per randomized method"),
    *KV_OPTIONS,
    KV_RATIOS,
    Option(("--rank-max-n",), "rank_max_n", f"largest n with a numerical rank (dense SVD per head; default "
           f"{RANK_MAX_N})", type=shared.nonnegative_int, default=RANK_MAX_N),
)
"""The options of ``approxlab decoder`` besides the common ones (the first eight from the shared set)."""


def causal_form(method: str):
    """The ``causal=`` a method runs with here: ``True`` (its own form, causal-only methods included) or
    ``"mask-renormalise"``.

    Raises
    ------
    UsageError
        The method has neither (the message lists the methods that have one).
    """
    from ...methods import available, causal_support

    if method not in available():
        raise UsageError("--methods", f"registered method names among {available()}", repr(method))
    spec = get(method)
    if spec.causal is True or spec.causal_only:
        return True
    if spec.causal == "mask-renormalise":
        return "mask-renormalise"
    usable = causal_support(True) + causal_support("mask-renormalise")
    raise UsageError("--methods", f"methods with a causal form (causal=True, 'only' or 'mask-renormalise') among "
                                  f"{usable}", repr(method))


def default_layers(num_layers: int, which="first-middle-last") -> list[int]:
    """``[0, num_layers // 2, num_layers - 1]`` (or first and last), without repeats."""
    chosen = [0, num_layers // 2, num_layers - 1] if which == "first-middle-last" else [0, num_layers - 1]
    return sorted(set(chosen))


_GRID_OPTIONS = ("conditions", "n", "num_features", "methods", "windows", "seeds", "kv_context", "kv_continuation",
                 "kv_budgets", "kv_ratios")


def _limit(method: str, n: int, context: int | None = None) -> int:
    spec = get(method)
    if context is not None and spec.compress is not None:
        return min(spec.max_features(n), context)
    return spec.max_features(n)


def budgets(method: str, values, n: int, *, context: int | None = None) -> list[int]:
    """The values of ``values`` that ``method`` can run with at ``n`` tokens: at most its ``max_features(n)``,
    and, in the KV-cache setting (``context``) for a method with a compression step, at most the context."""
    return [int(d) for d in values if d <= _limit(method, n, context)]


def _check_grid(grid: dict, window_pool: int) -> list[str]:
    """Refuse what no cell can run; return the grid points left out (a value above a method's limit at one n)."""
    if min(grid["n"]) < 4:
        raise UsageError("--n", "lengths of at least 4 tokens (the causal recursion halves them)", grid["n"])
    if grid["windows"] > window_pool:
        raise UsageError("--windows", f"at most {window_pool} (the pool of disjoint windows of max(n) tokens they "
                                      "are drawn from)", grid["windows"])
    n_kv = grid["kv_context"] + grid["kv_continuation"]
    if n_kv > max(grid["n"]):
        raise UsageError("--kv-context", f"a context plus continuation of at most max(n) = {max(grid['n'])} tokens "
                                         "(the KV-cache window is the first tokens of the longest window)",
                         f"{grid['kv_context']} + {grid['kv_continuation']}")
    skipped = []
    for method in grid["methods"]:
        for n in grid["n"]:
            kept = budgets(method, grid["num_features"], n)
            if not kept:
                raise UsageError("--num-features", f"at most {_limit(method, n)} for {method} at n={n} (a value "
                                                   "some method cannot use at some n is left out there and listed; "
                                                   "one that leaves a method nothing is refused)",
                                 ",".join(map(str, grid["num_features"])))
            skipped += [f"{method} at n={n}: d={d}" for d in grid["num_features"] if d not in kept]
        kept = budgets(method, grid["kv_budgets"], n_kv, context=grid["kv_context"])
        if not kept:
            raise UsageError("--kv-budgets", f"budgets every method can use in the KV-cache setting ({method} takes "
                                             f"at most {_limit(method, n_kv, grid['kv_context'])})",
                             ",".join(map(str, grid["kv_budgets"])))
        skipped += [f"{method} in the KV-cache setting: budget {b}" for b in grid["kv_budgets"] if b not in kept]
    return skipped


def _grid(quick, args) -> dict:
    base = QUICK_GRID if quick else FULL_GRID
    grid = shared.grid(base, args, OPTIONS)
    grid.update(kv_defaults(base, grid["n"], context=getattr(args, "kv_context", None),
                            continuation=getattr(args, "kv_continuation", None),
                            budgets=getattr(args, "kv_budgets", None)))
    grid["kv_budgets"] = sorted({int(b) for b in grid["kv_budgets"]})
    ratios = getattr(args, "kv_ratios", None)
    if ratios is not None:  # kvpress's way: the budgets from the ratios, the config names both
        if getattr(args, "kv_budgets", None) is not None:
            raise UsageError("--kv-ratios", "either --kv-budgets (counts) or --kv-ratios (kvpress's compression "
                                            "ratios), not both", list(ratios))
        shared.check_value(KV_RATIOS, ratios)
        budgets = ratio_budgets(ratios, grid["kv_context"])
        grid["kv_budgets"], grid["kv_ratios"] = list(budgets), list(budgets.values())
    for method in grid["methods"]:
        causal_form(method)
    return grid


def build_config(*, layers, quick: bool = False, conditions=None, n=None, num_features=None, methods=None,
                 windows=None, seeds=None, kv_context=None, kv_continuation=None, kv_budgets=None, kv_ratios=None,
                 checkpoint=DEFAULT_CHECKPOINT, heavy: int = HEAVY_PER_ROW, rank_max_n: int = RANK_MAX_N,
                 window_pool: int = WINDOW_POOL, window_seed: int = 0, base_seed: int = 0,
                 model_seed: int = 0) -> dict:
    """The grid-defining configuration (saved and hashed in ``config.json``).

    Parameters
    ----------
    layers : list of int
        Attention layers (resolved from the model by :func:`configure`: :func:`default_layers`).
    quick : bool
        Start from :data:`QUICK_GRID` instead of :data:`FULL_GRID`.
    conditions, n, num_features, methods, windows, seeds, kv_context, kv_continuation, kv_budgets
        Overrides of the grid (``None``: keep).
    kv_ratios : list of float, optional
        The KV-cache budgets as kvpress's compression ratios instead of ``kv_budgets`` (the config then holds
        both: ``kv_budgets`` their kept counts, ``kv_ratios`` the ratios, in the same order).
    checkpoint : str
        The decoder (Hub id, local folder or GGUF file; default the packaged SmolLM2).
    heavy, rank_max_n
        Of :func:`approxlab.assumptions.measure_assumptions`.
    window_pool, window_seed, base_seed, model_seed : int
        The windows drawn from (of ``max(n)`` tokens) and the seeds of the window draw, of the
        approximations' generators (:func:`~approxlab.studies.engine.cell_seed`) and of the
        initialized model.

    Raises
    ------
    UsageError
        ``windows`` above ``window_pool``; a KV-cache window longer than ``max(n)``; a method left without
        any ``num_features`` at some n, or without any KV-cache budget.

    Examples
    --------
    >>> config = build_config(layers=[0, 29], quick=True)
    >>> config["n"], config["causal_forms"]["performer"], config["causal_forms"]["h2o"]
    ([256, 512], True, True)
    >>> config["causal_forms"]["nystromformer"], config["kv_context"] + config["kv_continuation"]
    ('mask-renormalise', 256)
    """
    grid = _grid(quick, argparse.Namespace(conditions=conditions, n=n, num_features=num_features, methods=methods,
                                           windows=windows, seeds=seeds, kv_context=kv_context,
                                           kv_continuation=kv_continuation, kv_budgets=kv_budgets,
                                           kv_ratios=kv_ratios))
    skipped = _check_grid(grid, int(window_pool))
    grid["layers"] = sorted({int(layer) for layer in layers})
    return {
        "study": "decoder",
        **grid,
        "checkpoint": str(checkpoint),
        "causal_forms": {m: causal_form(m) for m in grid["methods"]},
        "skipped": skipped,
        "mode": "hidden",
        "reference": "exact causal softmax attention, float64 (exact_attention(..., causal=True))",
        "dtype": "float64",
        "windows_are": f"the first n tokens of windows of max(n) = {max(grid['n'])} tokens",
        "window_pool": int(window_pool), "window_seed": int(window_seed), "base_seed": int(base_seed),
        "model_seed": int(model_seed), "heavy": int(heavy), "rank_max_n": int(rank_max_n),
        "block_size": DEFAULT_BLOCK_SIZE, "hashes": SORTLSH_HASHES, "epsilon": EPSILON,
        "performer_scale": PERFORMER_SCALE,
        "error": "spectral norm per head of the (n, p_v) difference of outputs, float64",
    }


def window_ids(config: dict) -> list[int]:
    """``config["windows"]`` ids drawn without replacement from ``range(window_pool)``, sorted."""
    return draw_windows(config["window_pool"], config["windows"], config["window_seed"])


def make_cells(config: dict, settings: dict) -> dict:
    """The cells of each step (``windows``, ``assumptions``, ``results``, ``kv_cache``, ``performer``), adjacent
    per condition x layer x window (which share one Q/K/V extraction)."""
    data = {"n_max": max(config["n"]), "checkpoint": config["checkpoint"], "model_seed": config["model_seed"],
            "base_seed": config["base_seed"], **settings}
    n_kv = config["kv_context"] + config["kv_continuation"]
    cells = {"windows": [], "assumptions": [], "results": [], "kv_cache": [], "performer": []}
    for condition in config["conditions"]:
        for layer in config["layers"]:
            for window in window_ids(config):
                base = {"condition": condition, "layer": layer, "window": window, **data}
                cells["windows"].append(base)
                for n in config["n"]:
                    cells["assumptions"].append({**base, "n": n, "heavy": config["heavy"],
                                                 "rank_max_n": config["rank_max_n"], "block_size": config["block_size"],
                                                 "hashes": config["hashes"], "epsilon": config["epsilon"]})
                    for method in config["methods"]:
                        cells["results"].append({**base, "n": n, "method": method,
                                                 "num_features": budgets(method, config["num_features"], n),
                                                 "seeds": method_seeds(config["seeds"], method),
                                                 "causal": config["causal_forms"][method]})
                    if "performer" in config["methods"]:
                        cells["performer"].append({**base, "n": n, "scale": config["performer_scale"],
                                                   "num_features": max(budgets("performer", config["num_features"], n)),
                                                   "seeds": method_seeds(config["seeds"], "performer")})
                for method in config["methods"]:
                    kv_cell = {**base, "method": method, "n": n_kv, "context": config["kv_context"],
                               "budgets": budgets(method, config["kv_budgets"], n_kv, context=config["kv_context"]),
                               "seeds": method_seeds(config["seeds"], method)}
                    if "kv_ratios" in config:  # the budgets were given as ratios: the rows carry both
                        ratio_of = dict(zip(config["kv_budgets"], config["kv_ratios"]))
                        kv_cell["ratios"] = [ratio_of[budget] for budget in kv_cell["budgets"]]
                    cells["kv_cache"].append(kv_cell)
    return cells


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
    quick = value("quick", False)
    grid = _grid(quick, args)
    _check_grid(grid, WINDOW_POOL)
    args = argparse.Namespace(**{"checkpoint": DEFAULT_CHECKPOINT, "cache_dir": None, "layers": None,
                                 "quick": False, **vars(args)})
    infos = checks.check_model(args, grid["conditions"])
    layers = _layers(args, min(info.num_layers for info in infos.values()))
    return build_config(layers=layers, quick=quick, checkpoint=args.checkpoint,
                        rank_max_n=value("rank_max_n", RANK_MAX_N),
                        **{name: getattr(args, name, None) for name in _GRID_OPTIONS})


def _infos(args, config) -> dict:
    from ...data import describe_model

    return {c: describe_model(c, checkpoint=args.checkpoint, cache_dir=args.cache_dir) for c in config["conditions"]}


def _check_sliding_windows(args, config, model_type: str) -> None:
    """A layer whose sliding window is shorter than max(n) is refused: the study's reference is full causal
    attention, and no method here restricts itself to a window."""
    from ...data.checkpoints import load_config
    from ...data.layout import config_layout

    _, _, _, model_config, architecture, _ = load_config(args.checkpoint, None, args.cache_dir)
    count = int(model_config.num_hidden_layers)
    windows = {layer: config_layout(model_config, architecture, layer).sliding_window for layer in range(count)}
    n_max = max(config["n"])
    windowed = {layer: windows[layer] for layer in config["layers"] if windows[layer] is not None
                and windows[layer] < n_max}
    if windowed:
        full = [layer for layer in range(count) if windows[layer] is None or windows[layer] >= n_max]
        layer, window = next(iter(windowed.items()))
        raise UsageError("--layers", f"layers that attend every earlier key at n <= {n_max} (the study measures "
                                     f"against full causal attention; in this {model_type} model --checkpoint "
                                     f"{args.checkpoint}, layer {layer} attends only the last {window} keys; the "
                                     f"layers {full} are supported, or --n at most {window})",
                         ",".join(map(str, config["layers"])))


def check(args, config) -> None:
    """The model is causal, its context holds max(n), no chosen layer has a sliding window shorter than max(n), and
    the corpus holds the window pool at max(n)."""
    from ...data import CheckpointError, corpus_window_count

    infos = _infos(args, config)
    n_max = max(config["n"])
    for condition, info in infos.items():
        if not info.causal:
            raise UsageError("--checkpoint", "a causal decoder (llama, qwen2, qwen3, gpt2, gemma3)",
                             f"{args.checkpoint!r} (a bidirectional {info.model_type} model)")
        if n_max > info.max_positions:
            raise UsageError("--n", f"lengths up to the model's context, {info.max_positions}", f"{n_max}")
    _check_sliding_windows(args, config, next(iter(infos.values())).model_type)
    for condition in infos:
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
