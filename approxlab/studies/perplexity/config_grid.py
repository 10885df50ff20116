r"""The perplexity study's added declarations: the fixed-budget design (computed by :mod:`.configs`: one budget, the
grid's middle, and per method the configurations that change its error at that budget) and the default depths.

A configuration is a dict of the method's own options; ``seed`` is not an option but names a draw (the cell's
random streams come from its key, which holds the configuration's label).
"""

from __future__ import annotations

__all__ = ["CONFIGURATIONS", "config_label", "declared_configs", "spread_depths"]

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
