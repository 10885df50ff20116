"""The adaptive budgets' earlier import path, kept: the code is in :mod:`approxlab.cache` (its docstring is the
field's map), whose names these are."""

from .cache import adakv_keep, attend_kept, compose_scores, pyramid_budgets, with_sink_and_window

__all__ = ["adakv_keep", "attend_kept", "pyramid_budgets", "compose_scores", "with_sink_and_window"]
