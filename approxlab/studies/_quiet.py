"""Transitional: see :mod:`approxlab.studies.engine.environment`."""
from .engine.environment import WORKER_VARIABLES, third_party_bars_off  # noqa: F401
