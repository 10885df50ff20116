r"""The perplexity study's fixed-budget design: configurations of a method that change its error, not its budget.

Across budgets a method's error and its loss both fall with :math:`b`, so their rank correlation tests
monotonicity in :math:`b` as much as the premise. ``configs.csv`` holds the design where the two disagree: the
KV-cache setting, every layer compressed, one budget :math:`b` (tokens kept per KV head and layer) for every
configuration, and per method at least five configurations that change which tokens are kept -- or which random
draw is taken -- at that budget (:data:`CONFIGURATIONS`). Each cell records what a ``perplexity.csv.gz`` cell records
(the continuation's NLL, the errors on the patched run's own, drifting inputs) and the same errors on the unpatched
model's inputs (:func:`.clean.clean_run`), prefixed ``clean_``.

A configuration is a dict of the method's own options; ``seed`` is not an option but names a draw: the cell's
random streams come from its key, which holds the configuration's label, so ``seed=0`` .. ``seed=4`` are five
independent draws of a randomized method at the same budget.
"""

from __future__ import annotations

from .cells import decoder_run
from .clean import CLEAN_INPUTS, clean_run
from .config_grid import config_label, ratio_of
from .grid import ALL_LAYERS, KV_CACHE, decoder_common, window_ids

__all__ = ["CONFIG_KEY", "compute_config", "config_cells"]

CONFIG_KEY = ("setting", "layers", "method", "config", "num_features", "window")


def compute_config(cell: dict) -> list[dict]:
    """``configs.csv``: the cell's patched run (``nll``, the drifting errors) and its layers on clean inputs
    (``clean_`` columns), with common random numbers from the cell's key."""
    key = tuple(cell[c] for c in CONFIG_KEY)
    row, _ = decoder_run(cell, key)
    clean = clean_run(cell, key)
    clean.pop("error_inputs")
    seconds = {name: row.pop(name) + clean.pop(name) for name in ("seconds", "cpu_seconds")}
    return [{**row, "clean_inputs": CLEAN_INPUTS, **{f"clean_{name}": value for name, value in clean.items()},
             **seconds}]


def config_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per method x configuration x window of ``config["configs"]`` (the KV cache, every layer, its
    budget), window by window (each window's capture serves its cells)."""
    design = config.get("configs") or {"budget": None, "methods": {}}
    common = decoder_common(config, settings)
    return [{"setting": KV_CACHE, "layers": ALL_LAYERS, "method": method, "config": config_label(options),
             "num_features": design["budget"], "window": window, **ratio_of(config, design["budget"]),
             "options": {k: v for k, v in options.items() if k != "seed"}, **common}
            for window in window_ids(config) for method, configurations in design["methods"].items()
            for options in configurations]
