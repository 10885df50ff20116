"""The benchmark's grid: the full and ``--quick`` grids, the config the options make, the cells, the checks."""

from __future__ import annotations

import os

import torch

import argparse

from ...errors import UsageError
from ...methods import available, get
from ...methods.registry import BUILTINS
from ...training import ATTENTIONS
from .. import checks, options
from ..declaration import Option
from ..option_types import int_at_least, relative_tolerance
from ..options import NUM_FEATURES, Flatten, int_list, nonnegative_int, positive_int
from .causal import cell_methods
from .ratios import RATIOS

__all__ = ["FULL_GRID", "QUICK_GRID", "PARTS", "DTYPES", "OPTIONS", "KEY_COLUMNS", "build_config", "configure",
           "build_cells", "check", "run_info"]

DTYPES = {"float32": torch.float32, "float64": torch.float64}

FULL_GRID = {
    "accuracy_n": [1024, 2048, 4096],
    "scale_n": [8192, 16384, 32768],
    "forward_n": [1024, 2048, 4096, 8192, 16384],
    "error_method": "nystromformer",
    "num_features": 64,
    # every built-in method but exact (timed always), from the registry: each approximation and each cache policy
    # (these in their causal form) is timed
    "forward_methods": [m for m in BUILTINS if m != "exact"],
    "dense_max_n": 8192,
    "source": "bert",
    "condition": "pretrained",
    "layer": 0,
    "head": 0,
    "window": 0,
    "mode": "embedding",
    "model_seed": 0,
    "tol": 1e-6,
    "max_iter": 300,
    "lanczos_block": 4,
    "compute_dtype": "float32",
    "scipy_its": 20,
    "parts": ["accuracy", "scale", "forward", "ratios", "training", "patch", "causal"],
    "seed": 0,
    "repeats": 5,
    "ratio_n": 16384,
    "spectral_ratio_n": 32768,
    "figure1_ratio_n": 4096,
    "training_n": 1024,
    "training_batch": 8,
    "training_features": 128,
    "training_threads": 1,
    "training_attentions": ["softmax", "kernelized", "skyformer", "nystromformer", "spectral-shifting", "yoso"],
    # 2048: the length of the every-layer target (ALL_LAYERS_TARGET); every cache policy of the registry is timed there
    "patch_n": [512, 2048],
    "patch_methods": ["hyperattention", "topk", "quest", *(m for m in BUILTINS if get(m).causal_only)],
    "patch_layer": None,
    # five lengths (a factor sqrt(2) apart, multiples of 16): the growth exponent's Student-t interval has 3 degrees
    # of freedom (with three lengths it had one, and a t quantile of 12.7)
    "causal_n": [2048, 2896, 4096, 5792, 8192],
    "causal_budget": 128,
}
"""The full benchmark (``python3 -m approxlab bench``; see ``benchmarks/README.md``)."""

QUICK_GRID = {
    **FULL_GRID,
    "accuracy_n": [256, 512],
    "scale_n": [1024],
    "forward_n": [256, 512, 1024],
    "dense_max_n": 1024,
    "num_features": 32,
    "repeats": 5,
    "ratio_n": 1024,
    "spectral_ratio_n": 2048,
    "figure1_ratio_n": 256,
    "training_n": 256,
    "training_batch": 4,
    "training_features": 32,
    "patch_n": [128],
    "patch_methods": ["streaming-llm"],
    "causal_n": [128, 256, 512],
    "causal_budget": 16,
}
"""``--quick``: the same measurements at small n (seconds)."""

KEY_COLUMNS = ("part", "n", "method")
PARTS = ("accuracy", "scale", "forward", "ratios", "training", "patch", "causal")
MIN_REPEATS = 5
"""Fewest timed calls of a forward-type measurement (``--repeats``): a median of fewer is one noisy call."""


repeat_count = int_at_least(MIN_REPEATS)
"""The timed calls of a measurement, an integer >= :data:`MIN_REPEATS` (argparse ``type=``)."""


def _methods() -> list[str]:
    return [m for m in available() if m != "exact"]


def _causal_methods() -> list[str]:
    """The methods a causal model can be patched with: those with a causal form."""
    return [m for m in _methods() if get(m).causal]


def _lengths(flag: str, what: str) -> Option:
    return Option((flag,), flag[2:].replace("-", "_"), f"n of the {what} part", type=int_list, nargs="+",
                  action=Flatten, metavar="N")


OPTIONS = (
    Option(("--parts",), "parts", "which parts to run", nargs="+", choices=PARTS),
    _lengths("--accuracy-n", "accuracy"), _lengths("--scale-n", "scale"), _lengths("--forward-n", "forward"),
    Option(("--error-method",), "error_method", "approximation whose spectral error is computed", choices=available),
    NUM_FEATURES.but(help="num_features of every approximation (one value; at most every n of the parts: a larger "
                          "value is refused, not lowered)"),
    Option(("--forward-methods",), "forward_methods", "methods of the forward part (exact is always run)", nargs="+",
           choices=_methods),
    Option(("--dense-max-n",), "dense_max_n", "largest n for dense exact attention", type=positive_int),
    Option(("--source",), "source", "Q/K/V source", choices=("bert", "synthetic")),
    Option(("--condition",), "condition", "BERT condition", choices=("initialized", "pretrained")),
    Option(("--head",), "head", "attention head", type=nonnegative_int),
    Option(("--tol",), "tol", "relative tolerance of the matrix-free routes, in (0, 1)", type=relative_tolerance),
    Option(("--lanczos-block",), "lanczos_block", "vectors per block Lanczos pass", type=positive_int),
    Option(("--compute-dtype",), "compute_dtype", "dtype of the logits in the fused passes", choices=sorted(DTYPES)),
    Option(("--training-n",), "training_n", "sequence length of the training part", type=positive_int),
    Option(("--training-batch",), "training_batch", "sequences per batch of the training part", type=positive_int),
    Option(("--training-features",), "training_features", "num_features of the attentions in the training part",
           type=positive_int),
    Option(("--training-threads",), "training_threads", "torch threads of the training part's steps (default: "
           "--threads when given, else 1, as the studies train, whatever $OMP_NUM_THREADS says)", type=positive_int),
    _lengths("--patch-n", "patch"),
    Option(("--patch-methods",), "patch_methods", "methods of the patch part, each patching one layer of the decoder "
           "in its causal form", nargs="+", choices=_causal_methods),
    Option(("--patch-layer",), "patch_layer", "the layer the patch part patches (default: the middle one)",
           type=nonnegative_int),
    _lengths("--causal-n", "causal"),
    Option(("--causal-budget",), "causal_budget", "keys per query b of the causal part's policies",
           type=positive_int),
    Option(("--repeats",), "repeats", f"timed calls per forward-type measurement (median; an integer >= "
           f"{MIN_REPEATS}), after one warm-up", type=repeat_count),
)
"""The options of ``approxlab bench`` besides the common ones."""


def configure(args) -> dict:
    """The grid of the parsed options: :data:`FULL_GRID` (or :data:`QUICK_GRID`) with the options given.

    ``training_threads`` is ``--training-threads``, else the common ``--threads`` when it was given
    (``args.threads_source == "--threads"``); a thread count from ``$OMP_NUM_THREADS`` or the default
    leaves the training part at its own default, one thread.
    """
    config = options.grid(QUICK_GRID if getattr(args, "quick", False) else FULL_GRID, args, OPTIONS)
    config["num_features"] = options.one_value("--num-features", config["num_features"])
    if getattr(args, "training_threads", None) is None and getattr(args, "threads_source", None) == "--threads":
        config["training_threads"] = args.threads
    for key in ("accuracy_n", "scale_n", "forward_n", "patch_n", "causal_n"):
        bad = [n for n in config[key] if int(n) < 2]
        if bad:
            raise UsageError(f"--{key.replace('_', '-')}", "integers >= 2", bad)
    if int(config["training_n"]) < 2:
        raise UsageError("--training-n", "an integer >= 2", config["training_n"])
    return config


def build_config(*, quick: bool = False, **overrides) -> dict:
    """The benchmark grid: :data:`FULL_GRID` (or :data:`QUICK_GRID`) with ``overrides`` (None: keep), checked."""
    unknown = set(overrides) - set(FULL_GRID)
    if unknown:
        raise TypeError(f"unknown bench setting(s) {sorted(unknown)}; known: {sorted(FULL_GRID)}.")
    return configure(argparse.Namespace(quick=quick, **overrides))


def build_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per (part, n, method), in the order they run (small n first); the causal part's methods are its
    policies, each ``<form>/<method>``, and its math path (:func:`~.causal.cell_methods`)."""
    common = {"config": config, **settings}
    cells = []
    if "accuracy" in config["parts"]:
        cells += [{"part": "accuracy", "n": int(n), "method": config["error_method"], **common}
                  for n in config["accuracy_n"]]
    if "scale" in config["parts"]:
        cells += [{"part": "scale", "n": int(n), "method": config["error_method"], **common}
                  for n in config["scale_n"]]
    if "forward" in config["parts"]:
        for n in config["forward_n"]:
            for method in ["exact", *config["forward_methods"]]:
                cells.append({"part": "forward", "n": int(n), "method": method, **common})
    if "ratios" in config["parts"]:
        cells += [{"part": "ratios", "n": int(config[key]), "method": name, **common}
                  for name, key in RATIOS.items()
                  if not (name == "figure1-cell" and config["source"] == "synthetic")]
    if "training" in config["parts"]:
        cells.append({"part": "training", "n": int(config["training_n"]), "method": "training-step", **common})
    if "patch" in config["parts"]:
        cells += [{"part": "patch", "n": int(n), "method": method, **common}
                  for n in config["patch_n"] for method in config["patch_methods"]]
    if "causal" in config["parts"]:
        cells += [{"part": "causal", "n": int(n), "method": name, **common}
                  for n in config["causal_n"] for name in cell_methods()]
    return cells


def check(args, config) -> None:
    """Lengths, head and num_features of ``config`` fit the data and the methods (before computing)."""
    # the cells hand min(d, n) to every method: a larger d is refused, never lowered
    ratio_n = [config["spectral_ratio_n"]] if "ratios" in config["parts"] else []
    checks.check_num_features("--num-features", config["num_features"], [config["error_method"]],
                              [*config["accuracy_n"], *config["scale_n"], *ratio_n], at_most_n=True)
    checks.check_num_features("--num-features", config["num_features"], config["forward_methods"], config["forward_n"],
                              at_most_n=True)
    training = [ATTENTIONS[a] for a in config["training_attentions"]] if "training" in config["parts"] else []
    checks.check_num_features("--training-features", config["training_features"], training, [config["training_n"]],
                              at_most_n=True)
    if config["source"] == "bert":
        for option in ("--accuracy-n", "--scale-n", "--forward-n"):
            ns = config[option[2:].replace("-", "_")]
            checks.check_windows(args, {int(n): [config["window"]] for n in ns}, n_option=option)
        checks.check_heads("--head", config["head"], [config["condition"]], index=True)
    elif config["head"] != 0:
        raise UsageError("--head", "0 (the synthetic source has one head)", config["head"])
    if "causal" in config["parts"]:
        _check_causal_budget(config)
    if "patch" in config["parts"]:
        checks.check_num_features("--num-features", config["num_features"], config["patch_methods"], config["patch_n"],
                                  at_most_n=True)
        _check_decoder(config)


def _check_causal_budget(config: dict) -> None:
    """``--causal-budget`` fits every ``--causal-n``: the KV-cache form of the causal part compresses the first half
    of the window (:func:`~.causal.policies`), so a budget above half the smallest n would be lowered to that half."""
    shortest = min(int(n) for n in config["causal_n"])
    if config["causal_budget"] > shortest // 2:
        raise UsageError("--causal-budget", f"at most {shortest // 2}: the context the KV-cache policies compress is "
                         f"the first half of the smallest --causal-n ({shortest}), and a larger budget would be "
                         "lowered to it", config["causal_budget"])


def _check_decoder(config: dict) -> None:
    """The patch part's decoder can be loaded, has the layer ``--patch-layer`` names and takes windows of
    ``--patch-n`` tokens (its context; WikiText-2 holds far more)."""
    from ...data import SMOLLM2_CHECKPOINT, CheckpointError, describe_model
    from .patched import SYNTHETIC_LAYERS, SYNTHETIC_POSITIONS

    if config["source"] == "synthetic":
        layers, positions, what = SYNTHETIC_LAYERS, SYNTHETIC_POSITIONS, "the synthetic decoder"
    else:
        try:
            info = describe_model("pretrained", checkpoint=SMOLLM2_CHECKPOINT)
        except CheckpointError as error:
            raise UsageError("--parts", f"parts without patch, or SmolLM2 {error.allowed} (the patch part's decoder)",
                             error.got) from None
        layers, positions, what = info.num_layers, info.max_positions, "SmolLM2"
    if config["patch_layer"] is not None and not 0 <= config["patch_layer"] < layers:
        raise UsageError("--patch-layer", f"a layer index in 0..{layers - 1} ({what} has {layers} layers)",
                         config["patch_layer"])
    if max(config["patch_n"]) > positions:
        raise UsageError("--patch-n", f"lengths of at most {positions} ({what}'s context)", max(config["patch_n"]))


def run_info(args, config) -> dict:
    """What ``config.json`` records beside the common run information: the machine (and the GPU, on CUDA)."""
    return {"machine": _machine(getattr(args, "device", "cpu"))}


def _machine(device: str = "cpu") -> str:
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = ""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        gpu = f"{torch.cuda.get_device_name(torch.device(device))} (CUDA {torch.version.cuda}), "
    return (f"{gpu}{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__} with "
            f"{torch.get_num_threads()} threads, Python {platform.python_version()}")
