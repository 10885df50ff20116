"""How the local cluster's workers take a stop: :class:`QuietStop`.

The workers of ``--workers`` share the user's terminal. Ctrl-C there reaches every process of the run, and a stop
(Ctrl-C, ``SIGTERM``) cancels the cells still running, so without this plugin each worker would print what Dask
makes of it after the runner's own line that every finished cell is saved: a ``KeyboardInterrupt`` traceback from
the worker's event loop, ``Async instruction for <Task cancelled ...> ended with CancelledError`` per running
cell, and a heartbeat's ``CommClosedError`` traceback when the scheduler closes while a cell still runs. The runner
in the main process coordinates the stop and reports every failure of a cell itself (the cell's exception, a
worker killed), so none of these tells the user anything. This module imports ``distributed`` (a Dask plugin must
inherit its base class); the executor imports it only when it starts a local cluster.
"""

from __future__ import annotations

import logging
import signal
import threading

from distributed.comm import CommClosedError
from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["QuietStop"]

CANCELLATION_LOGGER = "distributed.worker.state_machine"
"""The worker's task-state log: below ERROR it says only that a cancelled task ended with ``CancelledError``."""

WORKER_LOGGER = "distributed.worker"
"""The worker's own log, whose heartbeat reports a closed scheduler as an ERROR with its traceback."""


class _LostScheduler(logging.Filter):
    """Drops a record that carries a :class:`~distributed.comm.CommClosedError`: a local worker loses its
    scheduler (which lives in the run's own process) only when the run closes the cluster."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], CommClosedError))


class QuietStop(WorkerPlugin):
    """A worker plugin for the local cluster: ``SIGINT`` ignored in the worker's process, the cancellation log at
    ERROR (:data:`CANCELLATION_LOGGER`), and a lost scheduler's records dropped (:data:`WORKER_LOGGER`).

    Registered on the local cluster only (``--workers``): the workers of a running scheduler (``--scheduler``) are
    their owner's, and log and take signals as set there.
    """

    def setup(self, worker) -> None:
        if threading.current_thread() is threading.main_thread():  # the loop of a nanny's worker process
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        logging.getLogger(CANCELLATION_LOGGER).setLevel(logging.ERROR)
        worker_log = logging.getLogger(WORKER_LOGGER)
        if not any(isinstance(existing, _LostScheduler) for existing in worker_log.filters):
            worker_log.addFilter(_LostScheduler())
