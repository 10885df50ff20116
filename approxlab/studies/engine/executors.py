"""Where cells run: in this process, or on Dask (``--scheduler`` / ``--workers``).

:class:`Executor` is entered once per run. In-process, cells run one after the other. On Dask, cells
are submitted to a running scheduler or to a local cluster of single-threaded worker processes
(started on the first cell there is to compute, and shared by every step of the run), gathered as
they complete (the runner makes each one durable before the next is reported), and resubmitted
when a worker dies. The local cluster serves Dask's pages on a free loopback port
(:data:`DASHBOARD_ADDRESS`), never the fixed 8787, and its teardown and a stopped run's workers
are quiet (:class:`~approxlab.studies.engine.quiet_workers.QuietStop`); after each finished cell, a
stop signal whose exception Python swallowed stops the run
(:func:`~approxlab.studies.engine.stopping.raise_if_stopped`); a user's ``--plugin`` modules are
imported in every worker (:func:`with_plugins`), and after each cell a worker hands the memory it freed
back to the system (:func:`~approxlab.studies.engine.environment.release_memory`).
"""

from __future__ import annotations

import contextlib
import functools
import logging

from ...errors import StudyError
from .stopping import raise_if_stopped

__all__ = ["DASHBOARD_ADDRESS", "SCHEDULER_TIMEOUT", "Executor", "with_plugins"]

DASHBOARD_ADDRESS = "127.0.0.1:0"
"""Where the local cluster's scheduler serves its HTTP pages: a free port on the loopback
interface. Dask's scheduler always starts this server (``dashboard_address=None`` still binds
the fixed port 8787, and warns, or fails, when another program holds it); port 0 lets the
operating system choose a free one, and 127.0.0.1 keeps it off the network."""

SCHEDULER_TIMEOUT = "10s"
"""How long the runner waits for a Dask scheduler to answer."""


class Executor:
    """Runs ``todo`` cells with ``compute`` and reports each to ``finished(key, cell, result)``.

    Parameters
    ----------
    scheduler : str, optional
        Address of a running Dask scheduler.
    workers : int, optional
        Start a local Dask cluster of this many single-threaded processes.
    max_resubmits : int
        Fresh attempts a cell gets after Dask gave up on it (``KilledWorker``).
    """

    def __init__(self, scheduler=None, workers=None, max_resubmits: int = 2):
        self.scheduler, self.workers, self.max_resubmits = scheduler, workers, max_resubmits
        self.client = self.cluster = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.client is not None:
            with _quiet_teardown():
                self.client.close()
                if self.cluster is not None:
                    self.cluster.close()
        return False

    @property
    def dask(self) -> bool:
        return self.scheduler is not None or self.workers is not None

    def run(self, todo, compute, finished) -> None:
        if not todo:
            return
        if not self.dask:
            for key, cell in todo:
                finished(key, cell, compute(cell))
                raise_if_stopped()
            return
        self._run_dask(todo, functools.partial(_trimmed, with_plugins(compute)), finished)

    def _connect(self):
        from distributed import Client, LocalCluster

        if self.client is not None:
            return self.client
        if self.scheduler is not None:
            try:
                self.client = Client(self.scheduler, timeout=SCHEDULER_TIMEOUT)
            except (OSError, TimeoutError) as error:  # reachable port, but no Dask scheduler answering
                raise StudyError(f"--scheduler: the address of a running Dask scheduler, got {self.scheduler!r} "
                                 f"({type(error).__name__}: {error})") from None
        else:
            from .quiet_workers import QuietStop

            self.cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                        dashboard_address=DASHBOARD_ADDRESS)
            self.client = Client(self.cluster)
            self.client.register_plugin(QuietStop(), name="approxlab-quiet-stop")
        return self.client

    def _run_dask(self, todo, compute, finished) -> None:
        """Submit the cells, gather as completed, resubmit cells of killed workers."""
        from distributed import KilledWorker, as_completed

        client = self._connect()
        pending = {}
        try:
            for key, cell in todo:
                pending[client.submit(compute, cell, pure=False)] = (key, cell, 0)
            completed = as_completed(list(pending))
            for future in completed:
                key, cell, attempts = pending.pop(future)
                try:
                    rows = future.result()
                except KilledWorker:
                    # Dask already retried on other workers; give the cell a few fresh chances.
                    if attempts >= self.max_resubmits:
                        raise
                    retry = client.submit(compute, cell, pure=False)
                    pending[retry] = (key, cell, attempts + 1)
                    completed.add(retry)
                    continue
                finished(key, cell, rows)
                raise_if_stopped()
        finally:
            for future in list(pending):
                future.cancel()


@contextlib.contextmanager
def _quiet_teardown():
    """Dask's log records below ERROR while the client and the local cluster shut down.

    Every result is on disk by then; what Dask reports at that point is its own teardown
    (``Worker process still alive after 4.0 seconds, killing`` when a loaded machine is slow to
    stop a worker process), which a normal run must not print. Errors still show."""
    logger = logging.getLogger("distributed")
    level = logger.level
    logger.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        logger.setLevel(level)


def with_plugins(compute):
    """``compute`` preceded, in whichever process runs it, by importing this process's plugin modules
    (``--plugin``, :func:`approxlab.methods.plugin_modules`): how a Dask worker learns the user's methods
    and studies."""
    from ...methods import plugin_modules

    modules = plugin_modules()
    return functools.partial(_compute_with_plugins, modules, compute) if modules else compute


def _trimmed(compute, cell):
    """``compute(cell)``, then the worker's freed memory handed back to the system
    (:func:`~approxlab.studies.engine.environment.release_memory`): a long run's workers stay below Dask's pause
    threshold."""
    from .environment import release_memory

    try:
        return compute(cell)
    finally:
        release_memory()


def _compute_with_plugins(modules, compute, cell):
    """Import ``modules`` (once per process: later imports are a dictionary lookup), then ``compute(cell)``."""
    from ...methods import load_plugin

    for module in modules:
        try:
            load_plugin(module)
        except ImportError as error:
            raise StudyError(f"--plugin: {module!r} could not be imported on a Dask worker ({error}); it must be "
                             "importable there too (the workers' PYTHONPATH).") from None
    return compute(cell)
