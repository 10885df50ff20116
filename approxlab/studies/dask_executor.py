"""The Dask executor of :func:`approxlab.studies.runner.run_cells` (``--scheduler`` / ``--workers``).

Cells are submitted to a running scheduler or to a local cluster of single-threaded worker
processes, gathered as they complete (the runner makes each one durable before the next is
reported), and resubmitted when a worker dies. The local cluster serves Dask's pages on a free
loopback port (:data:`DASHBOARD_ADDRESS`), never the fixed 8787, and its teardown is quiet; a
user's ``--plugin`` modules are imported in every worker (:func:`with_plugins`).
"""

from __future__ import annotations

import contextlib
import functools
import logging

__all__ = ["DASHBOARD_ADDRESS", "SCHEDULER_TIMEOUT", "run_dask", "with_plugins"]

DASHBOARD_ADDRESS = "127.0.0.1:0"
"""Where the local cluster's scheduler serves its HTTP pages: a free port on the loopback
interface. Dask's scheduler always starts this server (``dashboard_address=None`` still binds
the fixed port 8787, and warns, or fails, when another program holds it); port 0 lets the
operating system choose a free one, and 127.0.0.1 keeps it off the network."""

SCHEDULER_TIMEOUT = "10s"
"""How long :func:`~approxlab.studies.runner.run_cells` waits for a Dask scheduler to answer."""


def run_dask(todo, compute, finished, scheduler, workers, max_resubmits: int = 2):
    """Submit the cells to Dask, gather as completed, resubmit cells of killed workers."""
    from distributed import Client, KilledWorker, LocalCluster, as_completed

    cluster = None
    if scheduler is not None:
        try:
            client = Client(scheduler, timeout=SCHEDULER_TIMEOUT)
        except (OSError, TimeoutError) as error:  # reachable port, but no Dask scheduler answering
            from .runner import StudyError

            raise StudyError(f"--scheduler: the address of a running Dask scheduler, got {scheduler!r} "
                             f"({type(error).__name__}: {error})") from None
    else:
        cluster = LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=DASHBOARD_ADDRESS
        )
        client = Client(cluster)
    try:
        pending = {}
        for key, cell in todo:
            future = client.submit(compute, cell, pure=False)
            pending[future] = (key, cell, 0)
        completed = as_completed(list(pending))
        for future in completed:
            key, cell, attempts = pending.pop(future)
            try:
                rows = future.result()
            except KilledWorker:
                # Dask already retried on other workers; give the cell a few fresh chances.
                if attempts >= max_resubmits:
                    raise
                retry = client.submit(compute, cell, pure=False)
                pending[retry] = (key, cell, attempts + 1)
                completed.add(retry)
                continue
            finished(key, cell, rows)
    finally:
        for future in list(pending):
            future.cancel()
        with _quiet_teardown():
            client.close()
            if cluster is not None:
                cluster.close()


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
    (``--plugin``, :func:`approxlab.methods.plugin_modules`): how a Dask worker learns the user's methods."""
    from ..methods import plugin_modules

    modules = plugin_modules()
    return functools.partial(_compute_with_plugins, modules, compute) if modules else compute


def _compute_with_plugins(modules, compute, cell):
    """Import ``modules`` (once per process: later imports are a dictionary lookup), then ``compute(cell)``."""
    from ..methods import load_plugin

    for module in modules:
        try:
            load_plugin(module)
        except ImportError as error:
            from .runner import StudyError

            raise StudyError(f"--plugin: {module!r} could not be imported on a Dask worker ({error}); it must be "
                             "importable there too (the workers' PYTHONPATH).") from None
    return compute(cell)
