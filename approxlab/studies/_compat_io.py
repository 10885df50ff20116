"""Transitional."""
from .._io import atomic_write_text, write_csv_atomic  # noqa: F401
from .engine.store import has_results, read_json, read_results, write_table  # noqa: F401
