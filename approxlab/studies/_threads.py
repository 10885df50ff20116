"""Transitional: see :mod:`approxlab.studies.engine.environment`."""
from .engine.environment import DEFAULT_THREADS, THREAD_VARIABLES, requested_threads, study_threads  # noqa: F401
