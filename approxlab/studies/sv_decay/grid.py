"""The singular-value study's grid: full and ``--quick`` grids, the config the options make, the checks."""

from __future__ import annotations

import argparse

from ...errors import UsageError
from .. import checks
from ..declaration import Option
from ..inputs.wikitext import draw_windows, num_layers
from ..options import (CHECKPOINT, CONDITIONS_OPTION, LAYERS, METHODS, N, NUM_FEATURES, POSITIONS, REMOVED_IN,
                       WINDOWS, grid, one_value, positive_int)
from .spectra import APPROXIMATIONS

__all__ = ["FULL_GRID", "QUICK_GRID", "OPTIONS", "configure", "build_config", "window_ids", "cells", "check"]

FULL_GRID = {
    "conditions": ["initialized", "pretrained"],
    "layers": ["first", "middle", "last"],
    "n": [512, 2048],
    "windows": 4,
    "heads": {"512": 12, "2048": 3},
    "approximations": list(APPROXIMATIONS),
    "num_features": 64,
}
"""The full grid. ``windows``: 4 per case, the count the conditioning claim's power calculation asked for (2
left it undecided: no interval in 3-8% of the resamples). ``heads``: the first that many heads per n (all 12 at 512; 3 at 2048,
where one head costs seven 2048 x 2048 SVDs and a 4096 x 4096 eigendecomposition)."""

QUICK_GRID = {**FULL_GRID, "layers": ["first"], "n": [512], "windows": 1, "heads": {"512": 2}}
"""``--quick``: a smoke run (about a minute on 2 CPU cores)."""

OPTIONS = (
    CONDITIONS_OPTION, LAYERS.but(help="layers: first, middle, last or indices, comma-separated"),
    N, WINDOWS, Option(("--heads",), "heads", "first H heads, per n", type=positive_int),
    METHODS.but(help="approximations whose dense matrix is analysed (registered method names, comma-separated; "
                     f"default {','.join(APPROXIMATIONS)})", deprecated={"--approximations": REMOVED_IN}),
    NUM_FEATURES.but(help="d of the approximations (one value; at most every n: a larger d is refused, not lowered)"),
    POSITIONS.but(help="positions beyond BERT's 512-row table in the embedding-mode cells (n > 512): interpolate "
                       "(default), copy (Longformer), none"),
    CHECKPOINT.but(help="BERT-family checkpoint (Hub id with network, local folder always); the initialized "
                        "condition takes its config and tokenizer (default: the offline defaults)"),
)
"""The options of ``approxlab sv-decay`` besides the common ones (all but ``--heads`` from the shared set)."""


def configure(args) -> dict:
    """The grid-defining configuration (saved and hashed in ``config.json``) of the parsed options.

    ``heads`` (an int) sets the number of heads for every n; ``methods`` are the approximations whose
    ``.matrix()`` is analysed; ``positions`` applies to the embedding-mode cells (n > 512; hidden cells
    always carry BERT's positions); ``checkpoint`` is the BERT-family model (None: the offline defaults).
    """
    value = lambda name, default=None: getattr(args, name, default)  # noqa: E731
    base = {key: (dict(item) if isinstance(item, dict) else item)
            for key, item in (QUICK_GRID if value("quick", False) else FULL_GRID).items()}
    chosen = {**grid(base, args, OPTIONS), "heads": base["heads"]}  # --heads sets every n's count, below
    if value("methods") is not None:
        chosen["approximations"] = list(value("methods"))
    if value("num_features") is not None:
        chosen["num_features"] = one_value("--num-features", value("num_features"))
    if chosen["layers"] == "all":
        raise UsageError("--layers", "layer indices or first, middle, last (the two conditions' models have "
                                     "different numbers of layers)", "all")
    if min(chosen["n"]) < 2:
        raise UsageError("--n", "lengths of at least 2 tokens", chosen["n"])
    positions, checkpoint, heads = value("positions") or "interpolate", value("checkpoint"), value("heads")
    default_heads = min(chosen["heads"].values()) if chosen["heads"] else 12
    chosen["heads"] = {str(x): int(heads) if heads is not None else int(chosen["heads"].get(str(x), default_heads))
                       for x in chosen["n"]}
    return {
        "study": "sv-decay",
        "paper": "Skyformer Appendix B (Figure 4) and Sections 1/4.1; spectral shifting (Verma) Figure 2",
        **chosen,
        "modes": {str(x): ("hidden" if x <= 512 else "embedding") for x in chosen["n"]},
        "positions": positions,
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "noise_floor": "2 n eps64 (sigma_i / sigma_1 below it is not drawn)",
        "dtype": "float64",
        "rtol_numerical_rank": 1e-6,
        "statistical_dimension_eps": [0.1, 0.01],
        "decay_fit_indices": 64,
        "window_pool": 64,
        "window_seed": int(value("window_seed", 0)),
        "model_seed": int(value("model_seed", 0)),
        "base_seed": int(value("base_seed", 0)),
    }


def build_config(*, quick: bool = False, approximations=None, **values) -> dict:
    """:func:`configure` from keyword values (``approximations``: the methods), for code and tests."""
    return configure(argparse.Namespace(quick=quick, methods=approximations, **values))


def window_ids(config: dict) -> list[int]:
    """The windows of the grid (the same ids at every n)."""
    return draw_windows(config["window_pool"], config["windows"], config["window_seed"])


def cells(config: dict, settings: dict) -> list[dict]:
    """One cell per (condition, layer, n, window)."""
    return [{"condition": condition, "layer": layer, "n": n, "window": window, "mode": config["modes"][str(n)],
             "heads": config["heads"][str(n)], "approximations": list(config["approximations"]),
             "num_features": config["num_features"], "model_seed": config["model_seed"],
             "base_seed": config["base_seed"], "positions": config.get("positions", "none"),
             "checkpoint": config.get("checkpoint"), **settings}
            for condition in config["conditions"] for layer in config["layers"] for n in config["n"]
            for window in window_ids(config)]


def check(args, config: dict) -> None:
    """The model, the layers, the windows at every n and the heads, before a cell runs."""
    checks.check_num_features("--num-features", config["num_features"], config["approximations"], config["n"],
                              at_most_n=True)  # the cells compute min(d, n): a larger d is refused, not lowered
    checks.check_model(args, config["conditions"], encoder_only=True)
    for condition in config["conditions"]:
        count = num_layers(condition, config["checkpoint"])
        bad = [layer for layer in config["layers"] if isinstance(layer, int) and layer >= count]
        if bad:
            raise UsageError("--layers", f"layer indices in 0..{count - 1} or first, middle, last (the {condition} "
                                         f"model has {count} layers)", ",".join(map(str, config["layers"])))
    checks.check_windows(args, {n: window_ids(config) for n in config["n"]}, windows=config["windows"])
    checks.check_heads("--heads", max(config["heads"].values()), config["conditions"], checkpoint=args.checkpoint)
