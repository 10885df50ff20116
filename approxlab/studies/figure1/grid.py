"""Figure 1's grid: the full and ``--quick`` grids, the config the options make, the checks before a run."""

from __future__ import annotations

import argparse

from .. import checks
from ...errors import UsageError
from ..declaration import Option
from ..inputs.wikitext import DENSE_MAX_N, draw_windows
from ..options import (CHECKPOINT, CONDITIONS_OPTION, METHODS, N, NUM_FEATURES, POSITIONS, SEEDS, WINDOWS, Flatten,
                       grid, names_among, nonnegative_int, positive_int)
from .stats import PAPER_METHODS

__all__ = ["EXTRA_METHODS", "FULL_GRID", "QUICK_GRID", "DTYPES", "OPTIONS", "configure", "build_config", "window_ids",
           "check", "run_info", "settings"]

EXTRA_METHODS = ("performer-lra", "yoso", "spectral-shifting", "nystrom", "linformer",
                 "hyperattention", "kdeformer", "polynomial", "topk", "topp", "quest")
r"""Methods added to the comparison (drawn as secondary curves). ``performer-lra`` is Performer as the
Skyformer authors' code feeds it (:mod:`approxlab.methods.performer_lra`), to compare with the paper's
Performer curve. The KV-cache policies (``streaming-llm``, ``h2o``, ``snapkv``) are causal-only and have no
place in this study of bidirectional attention. ``polynomial`` is a small-budget probe here: its degree is the
largest :math:`g` with :math:`\binom{p+g}{g} \le d`, so at d <= 256 it has degree 1 (d >= p + 1) or degree 0
(the mean of V); :func:`check_polynomial_features` refuses a d whose features do not fit."""

FULL_GRID = {
    "conditions": ["initialized", "pretrained"],
    "n": [512, 1024, 2048, 4096],
    "num_features": [16, 32, 64, 128, 256],
    "methods": list(PAPER_METHODS + EXTRA_METHODS),
    "dtypes": ["float64", "float32"],
    "windows": 4,
    "seeds": 3,
}
"""The full grid (overridable from the command line)."""

QUICK_GRID = {**FULL_GRID, "n": [256, 512], "num_features": [16, 64, 128], "dtypes": ["float64"], "windows": 1,
              "seeds": 1}
"""``--quick``: a smoke run of under 30 s on an idle 2-core machine (float64 only; ``--dtypes`` adds float32). Its
lengths are 256 and 512 tokens: every method, both conditions and the paper's smallest budget and 64 and 128 at a
cost a CI job can afford (at n = 512 and 1,024 the fifteen methods alone took 25 s); only n = 512 meets the
paper's curves. Every d is below every n: at d = n = 256 Informer and top-k are exact, their errors of about 1e-14
stretched the figure over 15 decades and the claims' gaps divided by them (:func:`.stats.degenerate_lengths`). One
window decides no claim: the summary says what the run shows and what it cannot decide."""

DTYPES = ("float64", "float32")

OPTIONS = (
    METHODS, CONDITIONS_OPTION, N, NUM_FEATURES, WINDOWS, SEEDS.but(help="seeds per randomized method"),
    Option(("--dtypes",), "dtypes", "precisions of the approximations, a grid axis",
           type=names_among(DTYPES, "precisions"), nargs="+", action=Flatten, metavar="DTYPES"),
    POSITIONS,
    CHECKPOINT.but(help="BERT-family checkpoint (Hub id with network, local folder always), with its tokenizer; "
                        "the initialized condition takes its config and tokenizer (default: bert-base config / "
                        "all-MiniLM-L6-v2, offline)"),
    Option(("--layer",), "layer", "attention layer: 0 (default, the paper's: the input embedding through layer 0's "
           "projections) or L > 0 (the real hidden states entering layer L)", type=nonnegative_int, default=0),
    Option(("--matrix-free-above",), "matrix_free_above", "n above which exact attention is applied in row blocks "
           "(never n x n in memory) and the statistical dimension is estimated matrix-free (default "
           f"{DENSE_MAX_N})", type=positive_int, default=DENSE_MAX_N, grid=False),
    Option(("--stat-heads",), "stat_heads", "heads whose statistical dimension is computed (default 2)",
           type=positive_int, default=2),
)
"""The options of ``approxlab figure1`` besides the common ones (most from the shared set)."""


def configure(args) -> dict:
    """The grid-defining configuration (saved and hashed in ``config.json``) of the parsed options.

    ``args`` holds ``quick`` and the options of :data:`~approxlab.studies.figure1.STUDY` (missing ones
    take their defaults): the grid overrides; ``dtypes`` (float64 and float32 by default; errors
    are always measured in float64); ``positions``; ``checkpoint`` (None: the offline defaults);
    ``layer`` (0, the paper's setting: the input embedding projected by layer 0's W_Q, W_K, W_V;
    ``L > 0``: the hidden states entering layer L); ``stat_heads`` (heads whose statistical dimension
    is computed); ``window_seed``, ``base_seed``, ``model_seed`` (0 unless given in code).
    """
    value = lambda name, default=None: getattr(args, name, default)  # noqa: E731
    chosen = grid(QUICK_GRID if value("quick", False) else FULL_GRID, args, OPTIONS)
    chosen["dtypes"] = sorted(set(chosen["dtypes"]), reverse=True)  # float64 first
    positions, layer, checkpoint = value("positions") or "interpolate", int(value("layer") or 0), value("checkpoint")
    inputs = ("X = LayerNorm(word + position + type embedding) of BERT, layer-0 W_Q, W_K, W_V" if layer == 0 else
              f"X = the hidden states entering layer {layer} (the model run up to it), its W_Q, W_K, W_V")
    return {
        "study": "figure1",
        "paper": "Skyformer (Chen et al., NeurIPS 2021), Section 4.5, Figure 1",
        **chosen,
        "mode": "embedding" if layer == 0 else "hidden",
        "positions": positions,
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "inputs": f"{inputs}; positions beyond the 512-row table: {positions}",
        "layer": layer,
        "window_pool": 64,
        "window_seed": int(value("window_seed", 0)),
        "base_seed": int(value("base_seed", 0)),
        "model_seed": int(value("model_seed", 0)),
        "deterministic_methods": "run once with seed 0",
        "error": "spectral norm per head of the (n, p_v) output difference, float64; "
                 "rows hold every head's error (error_heads) and their mean/std/min/max",
        "panel_stats": {"window": "first", "heads": list(range(int(value("stat_heads") or 2))), "lambda_scale": 0.1},
    }


def build_config(*, quick: bool = False, **values) -> dict:
    """:func:`configure` from keyword values (``build_config(n=[512], windows=2)``), for code and tests."""
    return configure(argparse.Namespace(quick=quick, **values))


def window_ids(config: dict, n: int | None = None) -> list[int]:
    """The windows of the grid at length ``n``: ``config["windows"]`` ids drawn without replacement
    with a generator seeded by ``config["window_seed"]``, sorted.

    The pool is the first ``window_pool * 4096`` tokens (262,144 of Wikitext-2's 273,178):
    ``window_pool`` windows for every ``n <= 4096`` (the same ids for all of them), and the
    ``window_pool * 4096 // n`` windows that fit in it for longer ``n`` (16 at n = 16384).
    """
    pool = config["window_pool"]
    if n is not None and n > 4096:
        pool = max(1, pool * 4096 // n)
    return draw_windows(pool, config["windows"], config["window_seed"])


def check(args, config: dict) -> None:
    """The model, the windows, the heads and every method at every (n, d) of the grid, before a cell runs."""
    models = checks.check_model(args, config["conditions"], layer=config["layer"], encoder_only=True)
    checks.check_windows(args, {n: window_ids(config, n) for n in config["n"]}, windows=config["windows"])
    checks.check_heads("--stat-heads", len(config["panel_stats"]["heads"]), config["conditions"],
                       checkpoint=args.checkpoint)
    # every method at every (n, d) of the grid, or a one-line refusal: never a thinner figure
    checks.check_num_features("--num-features", max(config["num_features"]), config["methods"], config["n"])
    if "polynomial" in config["methods"]:
        check_polynomial_features(config, models)


def check_polynomial_features(config: dict, models: dict) -> None:
    r"""``polynomial`` fits in memory at every (condition, n, d) of the grid, or a one-line refusal.

    Its degree is the largest :math:`g` with :math:`\binom{p+g}{g} \le d` (the features of one token), and
    it refuses more than :data:`~approxlab.methods.polynomial.MAX_FEATURE_ENTRIES` feature entries,
    heads :math:`\times\, 2n \times \binom{p+g}{g}` for a window: checked here against each condition's
    heads and head width (``models``: ``{condition: ModelInfo}``), before any cell runs.
    """
    from ...methods.polynomial import MAX_FEATURE_ENTRIES, num_polynomial_features

    for condition, info in models.items():
        heads, p = int(info.num_heads), int(info.head_dim)
        for n in config["n"]:
            fits = 0  # the highest degree whose features fit at this n
            while heads * 2 * n * num_polynomial_features(p, fits + 1) <= MAX_FEATURE_ENTRIES:
                fits += 1
            limit = num_polynomial_features(p, fits + 1) - 1
            if max(config["num_features"]) > limit:
                raise UsageError("--num-features", f"at most {limit} for polynomial at n={n} (the {condition} model "
                                 f"has {heads} heads of width {p}: degree {fits + 1} needs "
                                 f"{num_polynomial_features(p, fits + 1)} features a token, more than "
                                 f"{MAX_FEATURE_ENTRIES} entries in all)", max(config["num_features"]))


def run_info(args, config: dict) -> dict:
    """What ``config.json`` records beside the common run information: the models and ``--matrix-free-above``."""
    from ...data.qkv import resolve_checkpoint

    return {"matrix_free_above": args.matrix_free_above,
            "checkpoints": {c: resolve_checkpoint(c, args.checkpoint) for c in config["conditions"]}}


def settings(args) -> dict:
    """Run settings the cells need: ``dense_max_n`` (``--matrix-free-above``)."""
    return {"dense_max_n": getattr(args, "matrix_free_above", DENSE_MAX_N)}
