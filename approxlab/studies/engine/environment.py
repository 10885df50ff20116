"""The environment a study computes in: its thread count, and no progress bar but approxlab's.

Threads
-------
How many threads a study computes with: one per process unless the user asks for more.

``approxlab <study>`` runs torch with ``--threads N`` when given, else ``$OMP_NUM_THREADS``, else
``$MKL_NUM_THREADS`` (the variables torch itself reads, in its order), else **one thread** -- in
its own process and in every worker process of a local Dask cluster (``--workers``), whose
BLAS libraries read the same variables when they start. The count is recorded as ``threads``
in the run's ``config.json``.

Why one: the cells of a study are many small dense products and factorizations (n = 512 to
4,096), and on a 2-core machine shared with other work torch's default (a thread per core) is
several times slower than one thread -- its threads wait for each other whenever one of them
is descheduled. Measured with ``bash benchmarks/threads.sh`` (``approxlab figure1 --quick``,
warm caches) on a 2-core machine shared with other jobs:

* load average 15.9 to 22.6: 372.7 s with one thread; with two threads the same run had not
  finished after 1,203 s and was stopped (more than 3.2 times slower; the two runs were not
  interleaved, and the load rose from 15.9 to about 22 between them);
* an earlier measurement on the same machine, loaded (load not recorded), of
  ``approxlab figure1 --quick``: 38.5 s with ``OMP_NUM_THREADS=1``, 178 s with torch's default.

* idle (load 0.7 to 0.9, ``REPS=1 bash benchmarks/threads.sh``): 59.1 s with one thread, 44.7 s
  with two -- a single process gains 1.32 times from the second core when nothing else runs.

One stays the default: it loses at most that factor on an idle machine and wins more than 3.2
times on a loaded one, and a run with ``--workers 2`` (two one-thread processes) uses both cores
anyway. On a machine you know to be idle, pass ``--threads 2`` (or ``--workers 2``).

The count is bounded by :func:`max_threads`: :data:`THREADS_PER_CPU` per CPU this process may run
on (its affinity mask). More threads than cores only take turns on the same cores, and a count in
the thousands is not a setting but a typo that takes the process down (``torch.set_num_threads``
overflows above 2**31 - 1; at 100,000 OpenMP fails to allocate the threads' stacks, or the process
crashes at exit), so a larger ``--threads`` or thread variable is refused in one line.

A Dask cluster started elsewhere (``--scheduler``) keeps its workers' own setting (Dask's
nanny starts them with one thread each). Used as a library, approxlab never changes torch's
thread count; :func:`study_threads` sets it for a run and restores it afterwards.

Progress bars of other libraries
--------------------------------
Third-party progress bars off while a study runs, so that approxlab's own bar is the only one.

Loading a model draws bars of other libraries on stderr, between the lines of approxlab's
progress: transformers ("Loading weights", "Converting and de-quantizing GGUF tensors"),
huggingface_hub (downloads), datasets and any tqdm bar of a library inside a Dask worker.
:func:`third_party_bars_off` turns them off for a block and restores every setting after it:

* in this process, through the libraries' own switches (``huggingface_hub.utils``'s
  ``disable_progress_bars``, which transformers imported later in the block also starts from,
  and ``transformers.utils.logging``'s ``disable_progress_bar``); transformers' GGUF conversion,
  whose bar has no switch, is silenced where approxlab calls it (:mod:`approxlab.data.gguf`);
* in the processes started in the block (the workers of ``--workers``), through the variables
  those libraries read when they start: ``HF_HUB_DISABLE_PROGRESS_BARS``,
  ``HF_DATASETS_DISABLE_PROGRESS_BARS`` and ``TQDM_DISABLE`` (tqdm's default for ``disable``).

approxlab's own bar (:mod:`approxlab.studies.engine.progress`) passes ``disable`` explicitly and
is not affected; ``--no-progress`` turns it off too. Used as a library, approxlab changes none of
these settings except around its own model loading (:func:`approxlab.data.load_model`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

from ...errors import UsageError

__all__ = ["release_memory", "DEFAULT_THREADS", "THREADS_PER_CPU", "THREADS_ALLOWED", "THREAD_VARIABLES", "WORKER_VARIABLES",
           "max_threads", "requested_threads", "study_threads", "third_party_bars_off", "restored_environ",
           "WORKER_UNSET"]


@contextlib.contextmanager
def restored_environ(names):
    """The variables ``names`` of ``os.environ`` as they were before the block (set or unset)."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


DEFAULT_THREADS = 1
"""Threads per process when neither ``--threads`` nor a thread variable is set."""

THREADS_PER_CPU = 4
"""The most threads per CPU a run may ask for (:func:`max_threads`)."""

THREADS_ALLOWED = (f"an integer from 1 to {{limit}} (at most {THREADS_PER_CPU} threads per CPU this process may run "
                   "on: more only take turns on the same cores)")
"""The allowed values of a thread count, in the words of its one-line error (``limit``: :func:`max_threads`)."""


def max_threads() -> int:
    """The largest thread count a run may ask for: :data:`THREADS_PER_CPU` times the CPUs this process may run on.

    The CPUs are those of the process's affinity mask (``os.sched_getaffinity``; a container or
    ``taskset`` limits them), else ``os.cpu_count()``.

    Examples
    --------
    >>> max_threads() >= THREADS_PER_CPU
    True
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    return THREADS_PER_CPU * max(1, cpus)


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""The environment variables that set the thread count, in the order torch reads them."""

_WORKER_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
"""What a local Dask worker process is started with (``distributed.nanny.pre-spawn-environ``)."""

WORKER_UNSET = ("MALLOC_TRIM_THRESHOLD_",)
"""What Dask's nanny would set for a worker process and a local cluster of a study leaves unset.

Dask starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (to hand freed memory back to the system
early). Setting any of glibc's malloc thresholds switches off its dynamic mmap threshold, so every
allocation above 128 KiB is a fresh ``mmap`` whose pages are faulted in and zeroed on first touch and
unmapped on free: a study cell allocates and frees its ``(S, H, n, n)`` attention blocks and float64
copies layer after layer, and under that setting the same cell cost 2.3x the CPU time (one perplexity
clean-input cell at n = 512, SnapKV whole window: 3.6-3.9 thread CPU-s in a Dask worker against
1.55-1.8 in this process; 1.58-2.0 in a worker with the variable unset; no other change). The numbers
computed are the same: only where memory comes from differs."""


def release_memory() -> bool:
    """Hand the memory this process has freed back to the system: glibc's ``malloc_trim(0)``, after each cell of a
    local Dask worker (:class:`~approxlab.studies.engine.executors.Executor`). True where it ran; False where the C
    library has no such call (not glibc: nothing to do).

    With :data:`WORKER_UNSET` (glibc's dynamic thresholds kept, for speed) a worker keeps the heap its cells freed,
    fragmented, and its resident memory creeps up cell after cell: a long-context worker went from about 7 GB to
    Dask's 9.4 GB pause threshold within an hour, where it stalls. Trimming once per cell costs one walk of the heap
    and keeps it bounded: four 1,024-token long-context cells in one process, resident memory after each 1.64,
    1.70, 1.73, 1.85 GB untrimmed; 1.07 GB after each trim (2.16 GB before it), the cells' seconds the same to the
    machine's noise."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim``, or None."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def requested_threads(option: int | None = None, environ=None) -> tuple[int, str]:
    """The thread count of a run and where it comes from.

    Parameters
    ----------
    option : int, optional
        ``--threads``; wins over the environment.
    environ : mapping, optional
        Default :data:`os.environ`.

    Returns
    -------
    (int, str)
        The count and its source: ``"--threads"``, ``"$OMP_NUM_THREADS"``, ``"$MKL_NUM_THREADS"``
        or ``"default"`` (:data:`DEFAULT_THREADS`).

    Raises
    ------
    approxlab.errors.UsageError
        If the count that decides is not an integer from 1 to :func:`max_threads` (of a thread
        variable, an OpenMP list such as ``"4,2"`` counts by its first entry, as OpenMP does).

    Examples
    --------
    >>> requested_threads(None, {})
    (1, 'default')
    >>> requested_threads(None, {"OMP_NUM_THREADS": "2"})
    (2, '$OMP_NUM_THREADS')
    >>> requested_threads(4, {"OMP_NUM_THREADS": "2"})
    (4, '--threads')
    """
    limit = max_threads()
    if option is not None:
        if isinstance(option, bool) or not isinstance(option, int) or not 1 <= option <= limit:
            raise UsageError("--threads", THREADS_ALLOWED.format(limit=limit), repr(option))
        return int(option), "--threads"
    environ = os.environ if environ is None else environ
    for name in THREAD_VARIABLES:
        text = str(environ.get(name, "")).strip()
        if not text:
            continue
        first = text.split(",")[0].strip()
        if not first.isdigit() or not 1 <= int(first) <= limit:
            raise UsageError(f"${name}", f"{THREADS_ALLOWED.format(limit=limit)}, the threads of each process (or "
                                         f"unset: {DEFAULT_THREADS})", repr(text))
        return int(first), f"${name}"
    return DEFAULT_THREADS, "default"


@contextlib.contextmanager
def study_threads(count: int, *, local_workers: bool = False):
    """torch, and numpy's BLAS, compute with ``count`` threads in this process for the block (restored after).

    numpy's BLAS (OpenBLAS in numpy's wheels) otherwise starts a thread per CPU, and a study's reports multiply
    many small matrices (the claims' bootstrap ranks, ``(resamples, points)`` against ``(points, points)``): with
    its two threads waiting on one another on a 2-core machine whose cores were busy, such products took 18-29
    times their single-threaded time (on idle cores, half of it: ``benchmarks/results/report_threads.md``). The
    limit is set through threadpoolctl.

    With ``local_workers``, the worker processes a local Dask cluster starts in the block get
    the same count through the thread variables (``distributed.nanny.pre-spawn-environ``, which
    Dask's nanny writes into its own process's environment before it starts a worker; those
    variables are restored here afterwards), and start without the variables of :data:`WORKER_UNSET`.
    """
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        with threadpool_limits(limits=count, user_api="blas"):
            if local_workers:
                with _worker_threads(count):
                    yield
            else:
                yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _worker_threads(count: int):
    import dask
    import distributed  # noqa: F401 - registers the distributed.* configuration defaults

    settings = {f"distributed.nanny.pre-spawn-environ.{name}": count for name in _WORKER_THREAD_VARIABLES}
    settings.update({f"distributed.nanny.pre-spawn-environ.{name}": None for name in WORKER_UNSET})  # None: unset
    with dask.config.set(settings):
        with restored_environ({*dask.config.get("distributed.nanny.pre-spawn-environ"), "PYTHONHASHSEED"}):
            yield

WORKER_VARIABLES = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
}
"""The environment of a process started while the bars are off (read by each library at import)."""


@contextlib.contextmanager
def third_party_bars_off():
    """Bars of transformers, huggingface_hub, datasets and worker-side tqdm off for the block.

    Examples
    --------
    >>> from huggingface_hub.utils import are_progress_bars_disabled
    >>> with third_party_bars_off():
    ...     are_progress_bars_disabled()
    True
    """
    # Imported before the variables are set, which they read once: this process keeps its settings.
    import huggingface_hub.constants  # noqa: F401
    import tqdm  # noqa: F401

    with _hub_and_transformers_off(), _environment(WORKER_VARIABLES):
        yield


@contextlib.contextmanager
def _environment(values: dict):
    with restored_environ(values):
        os.environ.update(values)
        yield


def _transformers_logging():
    """transformers' logging module if transformers is imported (importing it costs seconds), else None."""
    return sys.modules.get("transformers.utils.logging")


@contextlib.contextmanager
def _hub_and_transformers_off():
    from huggingface_hub import utils as hub

    hub_was_on = not hub.are_progress_bars_disabled()
    before = _transformers_logging()
    transformers_was_on = hub_was_on if before is None else before.is_progress_bar_enabled()
    hub.disable_progress_bars()  # transformers imported in the block starts with its bars off too
    if before is not None:
        before.disable_progress_bar()
    try:
        yield
    finally:
        after = _transformers_logging()
        if after is not None and transformers_was_on:
            after.enable_progress_bar()  # turns huggingface_hub's bars on as well
        if hub_was_on:
            hub.enable_progress_bars()
        else:
            hub.disable_progress_bars()
