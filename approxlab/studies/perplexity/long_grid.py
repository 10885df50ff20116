"""The perplexity study's long-context settings in its grid: their names and key, options, cells and checks.

Two settings at each ``--long-n`` length (a pass key hidden in WikiText-2, :mod:`.long`): ``long-whole`` (every
prediction of the sequence) and ``long-kv`` (the KV cache compressed to a budget), each run unpatched, with the
control and with each ``--long-methods`` method (default :func:`default_long_methods`) at each ``--long-features``
budget, over ``--long-windows`` windows and the pass key's depths. :mod:`.grid` declares their values in the
study's full and ``--quick`` grids and re-exports every name here.

Public API::

    LONG_WHOLE, LONG_KV, UNPATCHED, LONG_KEY
    LONG_OPTIONS                                       # --long-n, --long-methods, --long-features, --long-windows
    LONG_SIMULATIONS                                   # left out of the default --long-methods
    long_lengths(text) -> list                         # the type of --long-n
    default_long_methods(methods) -> list              # the decoder-valid methods but the simulations
    long_cells(config, common, methods, features_of) -> list of dict
    check_long(args, config, info)                     # against the model's context and the corpus
"""

from __future__ import annotations

from ...errors import UsageError
from .. import options as shared
from ..declaration import Option
from ..inputs.long_methods import LONG_SIMULATIONS

__all__ = ["LONG_WHOLE", "LONG_KV", "UNPATCHED", "LONG_KEY", "LONG_OPTIONS", "LONG_SIMULATIONS", "long_lengths",
           "default_long_methods", "long_cells", "check_long"]

LONG_WHOLE, LONG_KV = "long-whole", "long-kv"
UNPATCHED = "unpatched"
LONG_KEY = ("setting", "long_n", "method", "num_features", "window", "depth")


def default_long_methods(methods) -> list:
    """The long-context methods by default: the decoder-valid ``methods`` (not ``mask-renormalise``, whose
    landmarks see later tokens) but :data:`LONG_SIMULATIONS`."""
    from ...methods import get

    return [m for m in methods if get(m).causal != "mask-renormalise" and m not in LONG_SIMULATIONS]


def long_lengths(text: str) -> list:
    """``--long-n``: lengths >= 1, comma-separated, or 0 (none)."""
    if str(text).strip() in ("0", ""):  # "" : the empty list, checked again after parsing
        return []
    return shared.int_list(text)


LONG_OPTIONS = (
    Option(("--long-n",), "long_n", "tokens of the long-context sequences (a pass key in WikiText-2), comma-separated; "
           "0: no long-context settings", type=long_lengths, nargs="+", action=shared.Flatten,
           metavar="N"),
    shared.METHODS.but(flags=("--long-methods",), dest="long_methods", help="methods of the long-context settings, "
                       "comma-separated (default: the decoder-valid --methods but the simulations "
                       f"{', '.join(LONG_SIMULATIONS)})"),
    Option(("--long-features",), "long_features", "budgets of the long-context settings, comma-separated", type=shared.int_list, nargs="+", action=shared.Flatten, metavar="D"),
    Option(("--long-windows",), "long_windows", "WikiText-2 windows of the long-context settings",
           type=shared.positive_int, metavar="N"),
)
"""The options of the long-context settings (in the study's options between ``--continuation`` and
``--compare-with``)."""


def long_cells(config: dict, common: dict, methods, features_of) -> list[dict]:
    """One cell per long setting x method x d x window x depth; the unpatched model and the control first."""
    if not config.get("long_n"):
        return []
    cells = []
    for length, setting in [(n, s) for n in config["long_n"] for s in (LONG_WHOLE, LONG_KV)]:
        runs = [(UNPATCHED, 0), (config["control"], config["long_features"][0])]
        runs += [(m, d) for m in methods for d in features_of(m)]
        for method, d in runs:
            for window in range(config["long_windows"]):
                for depth in config["long_depths"]:
                    cells.append({"setting": setting, "long_n": length, "method": method, "num_features": d,
                                  "window": window, "depth": depth, **common})
    return cells


def check_long(args, config: dict, info) -> None:
    """The long-context settings against the decoder (``info``, its :class:`~approxlab.data.ModelInfo`) and the
    corpus: the longest sequence within the model's context, every budget below half the shortest sequence, and
    ``--long-windows`` windows of the longest in the corpus, ``--long-methods`` decoder-valid. Nothing to check
    without ``long_n``."""
    from ...data import corpus_window_count
    from ...methods import get

    if not config.get("long_n"):
        return
    for method in config.get("long_methods") or ():
        if get(method).causal not in (True, "only"):
            raise UsageError("--long-methods", "decoder-valid methods (a causal form of their own or a cache policy's; "
                             "not mask-renormalise, whose landmarks see later tokens)", repr(method))
    longest, shortest = max(config["long_n"]), min(config["long_n"])
    if longest > info.max_positions:
        raise UsageError("--long-n", f"at most the model's context, {info.max_positions} tokens", longest)
    if max(config["long_features"]) >= shortest // 2:
        raise UsageError("--long-features", f"budgets below half the shortest long sequence ({shortest} tokens)",
                         max(config["long_features"]))
    long = corpus_window_count("pretrained", longest, checkpoint=config["checkpoint"], data_dir=args.data_dir,
                               cache_dir=args.cache_dir)
    if long < config["long_windows"]:
        raise UsageError("--long-windows", f"at most the corpus's {long} windows of {longest} tokens",
                         config["long_windows"])
