"""Transitional: the runner's names, now in :mod:`approxlab.studies.engine`."""
from ..errors import StudyError  # noqa: F401
from .engine import ProgressLog, cell_key, cell_seed, config_hash, run_cells, saved_config  # noqa: F401
from .engine.progress import progress_bar as _progress_bar  # noqa: F401
