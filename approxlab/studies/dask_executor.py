"""Transitional: see :mod:`approxlab.studies.engine.executors`."""
from .engine.executors import DASHBOARD_ADDRESS, SCHEDULER_TIMEOUT, with_plugins  # noqa: F401
