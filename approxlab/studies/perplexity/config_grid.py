r"""The perplexity study's premise declarations: the fixed-budget design (computed by :mod:`.configs`: one budget, the
grid's middle, and per method the configurations that change its error at that budget), the depths (single layers
replaced one at a time), their options (``--depths``, ``--config-methods``), checks and config entries, and the
names of the replaced layers they share with :mod:`.grid` (``--layer-settings``).

A configuration is a dict of the method's own options; ``seed`` is not an option but names a draw (the cell's
random streams come from its key, which holds the configuration's label).
"""

from __future__ import annotations

import argparse

from ...errors import UsageError
from .. import checks
from .. import options as shared
from ..declaration import Option
from ..option_types import names_among

__all__ = ["ALL_LAYERS", "CONFIGURATIONS", "PREMISE_OPTIONS", "config_label", "declared_configs", "spread_depths",
           "layer_settings", "layer_label", "resolve_layers", "check_premise_grid", "premise_config", "budgets_of_ratios",
           "ratio_of"]

ALL_LAYERS = "all"
_SETTING_NAMES = ("first", "middle", "last", ALL_LAYERS)

_SEEDS = [{"seed": s} for s in range(5)]

CONFIGURATIONS = {
    "snapkv": [{"window": 8, "kernel_size": 5}, {"window": 16, "kernel_size": 5}, {"window": 32, "kernel_size": 1},
               {"window": 32, "kernel_size": 5}, {"window": 32, "kernel_size": 15}],
    "streaming-llm": [{"sinks": s} for s in (0, 1, 4, 16, 32)],
    "h2o": [{"recent_size": r} for r in (1, 8, 16, 32, 56)],
    "quest": [{"page_size": p} for p in (4, 8, 16, 32, 64)],
    "expected-attention": [{"n_sink": 0}, {"n_sink": 4}, {"n_sink": 16}, {"n_sink": 4, "n_future_positions": 64},
                           {"n_sink": 4, "n_future_positions": 2048}],
    "cur": [{"num_sinks": 4, "local_window_size": 16}, {"num_sinks": 0, "local_window_size": 16},
            {"num_sinks": 16, "local_window_size": 16}, {"num_sinks": 4, "local_window_size": 0},
            {"num_sinks": 4, "local_window_size": 32}],
    "compactor": [{"sink_size_start": 8, "blending": 0.35}, {"sink_size_start": 0, "blending": 0.35},
                  {"sink_size_start": 32, "blending": 0.35}, {"sink_size_start": 8, "blending": 0.0},
                  {"sink_size_start": 8, "blending": 1.0}],
    "random": _SEEDS,
    "performer": _SEEDS,
}
"""Per method, the configurations run at the grid's middle budget (64 in the full grid; each method's default is
among them where it has one): SnapKV's observation window and pooling kernel; StreamingLLM's sinks (the rest of :math:`b` the most recent
tokens); H2O's recent share (its default half of :math:`b`, 32, among them); Quest's page size; Expected Attention's sinks and future positions averaged over; CUR's
sinks and local window; Compactor's sinks and its blending of leverage and attention scores; five draws of the
random cache policy and of Performer's features."""


def config_label(options: dict) -> str:
    """A configuration's readable label, its options in order: ``{"window": 16, "kernel_size": 7}`` ->
    ``"window=16, kernel_size=7"``.

    Examples
    --------
    >>> config_label({"window": 16, "kernel_size": 7}), config_label({"seed": 3})
    ('window=16, kernel_size=7', 'seed=3')
    """
    return ", ".join(f"{name}={value}" for name, value in options.items())




def declared_configs(methods, num_features) -> dict:
    """The config's ``configs`` entry: ``{"budget": the middle of num_features, "methods": {method: its
    configurations}}`` for ``methods`` among :data:`CONFIGURATIONS`.

    Examples
    --------
    >>> declared_configs(["streaming-llm"], [16, 32, 64, 128, 256])["budget"]
    64
    """
    return {"budget": int(num_features[len(num_features) // 2]), "methods": {m: CONFIGURATIONS[m] for m in methods}}


def spread_depths(num_layers: int) -> list[int]:
    r"""Five layers spread over a model of :math:`L` layers: :math:`\min(L - 1, \operatorname{round}(iL/4))`,
    :math:`i = 0, \dots, 4` (Python's rounding, half to even), each once.

    Examples
    --------
    >>> spread_depths(30), spread_depths(2)
    ([0, 8, 15, 22, 29], [0, 1])
    """
    return list(dict.fromkeys(min(num_layers - 1, round(i * num_layers / 4)) for i in range(5)))


def layer_settings(text: str) -> list:
    """``--layer-settings``, ``--depths``: layer indices, first, middle, last or all (every layer replaced together).

    Examples
    --------
    >>> layer_settings("0,middle,all")
    [0, 'middle', 'all']
    """
    try:
        names = shared.str_list(text)
    except argparse.ArgumentTypeError:
        names = []
    chosen = [int(x) if x.isdigit() else x for x in names]
    if not chosen or not all(isinstance(x, int) or x in _SETTING_NAMES for x in chosen):
        raise argparse.ArgumentTypeError(f"comma-separated layer indices >= 0, first, middle, last or all, "
                                         f"got {text!r}")
    return chosen


def layer_label(layer) -> str:
    """``"layer 15"``, or ``"all"``: the value of the ``layers`` column.

    Examples
    --------
    >>> layer_label(15), layer_label("all")
    ('layer 15', 'all')
    """
    return ALL_LAYERS if layer == ALL_LAYERS else f"layer {int(layer)}"


def resolve_layers(settings, num_layers: int, flag: str = "--layer-settings") -> list[str]:
    """The ``layers`` labels of ``settings`` in a model of ``num_layers`` layers (first, middle, last resolved),
    each once, or the error naming ``flag``.

    Examples
    --------
    >>> resolve_layers(["first", "middle", 0, "all"], 30)
    ['layer 0', 'layer 15', 'all']
    """
    names = {"first": 0, "middle": num_layers // 2, "last": num_layers - 1}
    labels = []
    for setting in settings:
        layer = names.get(setting, setting)
        if layer != ALL_LAYERS and not 0 <= int(layer) < num_layers:
            raise UsageError(flag, f"layer indices in 0..{num_layers - 1} (the model has {num_layers} "
                             "layers), first, middle, last or all", ",".join(map(str, settings)))
        if layer_label(layer) not in labels:
            labels.append(layer_label(layer))
    return labels


PREMISE_OPTIONS = (
    Option(("--depths",), "depths", "the whole-window setting's single layers replaced one at a time, besides "
           "--layer-settings: layer indices or first, middle, last; comma-separated", type=layer_settings,
           nargs="+", action=shared.Flatten, metavar="LAYERS"),
    Option(("--ratios",), "ratios", "the budgets as compression ratios (kvpress's: the fraction of the KV-cache "
           "setting's context removed, in [0, 1)) in place of --num-features: each keeps b = max(1, int(n_c (1 - r))) "
           "of the n_c context tokens, the budget d of every setting; comma-separated",
           type=shared.ratio_list, nargs="+", action=shared.Flatten, metavar="R"),
    Option(("--config-methods",), "config_methods", "methods of the fixed-budget design (configs.csv), each with "
           "its declared configurations at the middle budget; comma-separated",
           type=names_among(CONFIGURATIONS, "methods with declared configurations"), nargs="+",
           action=shared.Flatten, metavar="NAMES"),
)
"""The premise's options of ``approxlab perplexity`` (in :data:`.grid.OPTIONS`)."""


def check_premise_grid(grid: dict, args=None) -> None:
    """The premise's entries of a grid (``depths``, ``config_methods``, ``ratios``) as the command line checks them:
    depths are single layers; ``--ratios`` replaces ``--num-features`` (``args``: the options given), and its budgets
    (:func:`budgets_of_ratios`) are distinct.

    Examples
    --------
    >>> check_premise_grid({"depths": [0, "last"], "config_methods": ["h2o"], "ratios": None})
    """
    if ALL_LAYERS in (grid["depths"] or ()):
        raise UsageError("--depths", "single layers: layer indices, first, middle or last", ALL_LAYERS)
    if grid.get("ratios") and getattr(args, "num_features", None):
        raise UsageError("--ratios", "either --ratios or --num-features (the same budgets stated two ways), not both",
                         f"--ratios {','.join(map(str, grid['ratios']))} --num-features "
                         f"{','.join(map(str, args.num_features))}")
    if grid.get("ratios"):
        budgets_of_ratios(grid["ratios"], grid["context"])


def budgets_of_ratios(ratios, context: int) -> dict:
    r"""``{b: r}``: the budget each compression ratio keeps of the KV-cache setting's ``context`` tokens, by kvpress's
    rule :math:`b = \max(1, \lfloor n_c (1 - r) \rfloor)` (:func:`approxlab.studies.checks.ratio_budgets`), in
    increasing b; the error naming ``--ratios`` where two ratios keep the same count.

    Examples
    --------
    >>> budgets_of_ratios([0.5, 0.75, 0.9], 384)
    {38: 0.9, 96: 0.75, 192: 0.5}
    """
    return checks.ratio_budgets(ratios, context, "--ratios")


def ratio_of(config: dict, budget: int) -> dict:
    """``{"compression_ratio": r}``: the ratio a config's budget was given as (``--ratios``), or ``{}`` for a config
    of counts (``--num-features``): the column a results table carries beside ``num_features``.

    Examples
    --------
    >>> ratio_of({"ratios": {"192": 0.5}}, 192), ratio_of({}, 64)
    ({'compression_ratio': 0.5}, {})
    """
    ratios = config.get("ratios")
    return {} if not ratios else {"compression_ratio": float(ratios[str(int(budget))])}


def premise_config(grid: dict, num_layers: int) -> dict:
    """The config's premise entries, taken out of ``grid``: ``depths`` (labels; None in the grid: five spread over
    the model, :func:`spread_depths`), ``configs`` (:func:`declared_configs` at the grid's middle budget) and, where
    ``ratios`` were given, ``ratios`` (``{str(b): r}``, :func:`budgets_of_ratios`; ``grid["num_features"]`` set to
    their budgets; absent otherwise, so a config of counts is as it was before the option).

    Examples
    --------
    >>> grid = {"depths": None, "config_methods": ["h2o"], "num_features": [16, 32, 64, 128, 256], "ratios": None,
    ...         "context": 384}
    >>> found = premise_config(grid, 30)
    >>> found["depths"], found["configs"]["budget"], sorted(grid)
    (['layer 0', 'layer 8', 'layer 15', 'layer 22', 'layer 29'], 64, ['context', 'num_features'])
    >>> premise_config({**grid, "depths": [0], "config_methods": [], "ratios": [0.5, 0.75]}, 30)["ratios"]
    {'96': 0.75, '192': 0.5}
    """
    ratios = grid.pop("ratios", None)
    found = {}
    if ratios:  # the budgets given as ratios: their kept counts are the grid's num_features
        kept = budgets_of_ratios(ratios, grid["context"])
        grid["num_features"] = list(kept)
        found = {"ratios": {str(b): r for b, r in kept.items()}}
    depths = grid.pop("depths")
    depths = resolve_layers(spread_depths(num_layers) if depths is None else depths, num_layers, "--depths")
    return {"depths": depths, "configs": declared_configs(grid.pop("config_methods"), grid["num_features"]), **found}
