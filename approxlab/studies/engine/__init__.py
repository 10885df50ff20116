"""The engine of the studies: cells -> tables, resumable, in-process or on Dask.

Everything a study does not declare lives here once: the runner (:mod:`.runner`: steps of cells
into tables, resume, journal, progress), the table store (:mod:`.store`: CSV tables with their
cell manifests and journals; :mod:`.parts`: the files of a table split by a column), the
output-folder lock (:mod:`.lock`), the run record (:mod:`.record`: ``config.json`` and
``timing.json``), the executors (:mod:`.executors`: in-process or Dask), the keys and seeds of cells
(:mod:`.keys`), the environment a study computes in (:mod:`.environment`: threads, third-party
progress bars), what a method's failure inside a cell
becomes (:mod:`.failures`: a failed row, or the traceback of a bug), the timer of the cells
(:mod:`.clock`: wall and thread CPU seconds, and the clock timings are compared on) and the orderly
stop on ``SIGINT``/``SIGTERM`` (:mod:`.stopping`).
"""

from .clock import Stopwatch
from .environment import requested_threads, restored_environ, study_threads, third_party_bars_off
from .executors import DASHBOARD_ADDRESS
from .failures import METHOD_ERRORS, failure_lines, method_status
from .keys import canonical, cell_key, cell_seed, config_hash
from .lock import LOCK_NAME, OutputLockedError, output_lock, remove_stale_temp_files
from .progress import ProgressLog
from .record import append_timing, read_timing, saved_config
from .runner import CellResultError, run_cells, run_steps
from .parts import part_paths
from .store import (JOURNAL_SUFFIX, append_journal, has_results, journal_path, read_json, read_journal,
                    read_results, remove_journal, stored_as, write_table)

__all__ = ["run_steps", "run_cells", "CellResultError", "cell_key", "cell_seed", "config_hash", "canonical",
           "saved_config", "append_timing", "read_timing", "read_results", "read_json", "write_table", "has_results",
           "stored_as", "part_paths", "journal_path", "append_journal", "read_journal", "remove_journal",
           "JOURNAL_SUFFIX",
           "output_lock", "remove_stale_temp_files", "OutputLockedError", "LOCK_NAME", "ProgressLog", "DASHBOARD_ADDRESS",
           "requested_threads", "study_threads", "third_party_bars_off", "restored_environ", "METHOD_ERRORS",
           "method_status", "failure_lines", "Stopwatch"]
