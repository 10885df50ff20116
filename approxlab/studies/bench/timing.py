"""Timing and memory of measured calls, shared by the benchmark's parts.

:func:`measure` times one callable (warm-up calls, then the median of timed calls, with the
process RSS sampled in a background thread); :func:`measure_interleaved` times several in
turn (A, B, C, A, B, C, ...), so that a drift of the machine's speed reaches each alike and the
ratio of their medians is what it claims to be. On a GPU every timed call is bracketed by
``torch.cuda.synchronize()``. See :mod:`approxlab.studies.bench`, "Timing" and "Peak memory".

Before its timed calls each measurement collects the garbage (so that neither the RSS it starts
from nor a collector pause in a timed call belongs to earlier work). A full collection walks every
object the process holds (0.2-0.4 s in a test run that has imported the whole library), so
:func:`collected` does it once and then freezes the survivors (:func:`gc.freeze`): the collections
of the measurements inside it walk only what was allocated since, and the heap is unfrozen on exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import resource
import sys
import threading
import time

import torch

__all__ = ["Measurement", "collected", "measure", "measure_interleaved"]


def _rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _ru_maxrss_bytes() -> int:
    # Linux reports kilobytes, macOS bytes.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


@dataclasses.dataclass
class Measurement:
    """Time and memory of one measured call (see :mod:`approxlab.studies.bench`, "Timing" and "Peak memory").

    Attributes
    ----------
    wall_s, cpu_s : float
        Median wall-clock and process CPU seconds over ``repeats`` timed calls (after
        ``warmup`` untimed ones); on a GPU each timed call is bracketed by
        ``torch.cuda.synchronize()``.
    wall_min_s, wall_max_s : float
        Fastest and slowest timed call.
    repeats, warmup : int
    rss_before_mb, peak_rss_mb, ru_maxrss_mb : float
        Process RSS before the timed calls, sampled peak RSS during them, high-water mark (MiB).
    gpu_peak_mb : float or None
        ``torch.cuda.max_memory_allocated`` over the timed calls (MiB); ``None`` on CPU.
    load_average : float
        1-minute load average of the machine when the calls ended.
    """

    wall_s: float
    cpu_s: float
    wall_min_s: float
    wall_max_s: float
    repeats: int
    warmup: int
    rss_before_mb: float
    peak_rss_mb: float
    ru_maxrss_mb: float
    gpu_peak_mb: float | None
    load_average: float

    def as_row(self) -> dict:
        return {key: value for key, value in dataclasses.asdict(self).items() if value is not None}


@contextlib.contextmanager
def collected():
    """Collect the garbage; inside, later collections skip what survived it (it is not garbage of the timed calls).

    The survivors are frozen (:func:`gc.freeze`) and unfrozen on exit. Where the heap is frozen
    already (inside another ``collected()``, or by the caller's own :func:`gc.freeze`) it only
    collects what is not frozen and leaves the freezing as it was.

    Examples
    --------
    >>> import gc
    >>> from approxlab.studies.bench.timing import collected
    >>> with collected():
    ...     gc.get_freeze_count() > 0
    True
    >>> gc.get_freeze_count()
    0
    """
    gc.collect()
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _synchronize(device) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure(function, *args, repeats: int = 1, warmup: int = 0, device=None, interval: float = 0.002, **kwargs):
    """Run ``function(*args, **kwargs)`` ``warmup`` times untimed, then ``repeats`` times timed;
    return ``(last result, Measurement)`` with median times.

    ``device``: where the work runs; for CUDA every timed call is preceded and followed by
    ``torch.cuda.synchronize()`` (kernel launches are asynchronous, so without it a timer
    measures launches), and the peak GPU memory is ``torch.cuda.max_memory_allocated``
    after ``reset_peak_memory_stats``. The process RSS is sampled every ``interval`` seconds
    by a daemon thread (``psutil``) on every device.
    """
    import statistics

    cuda = device is not None and torch.device(device).type == "cuda"
    result = None
    for _ in range(warmup):
        result = function(*args, **kwargs)
    _synchronize(device)
    gc.collect()  # inside collected(), only what was allocated since
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    before = _rss_bytes()
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            stop.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    walls, cpus = [], []
    try:
        for _ in range(max(1, repeats)):
            _synchronize(device)
            wall, cpu = time.perf_counter(), time.process_time()
            result = function(*args, **kwargs)
            _synchronize(device)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    finally:
        stop.set()
        thread.join()
    peak[0] = max(peak[0], _rss_bytes())
    mib = 2.0**20
    return result, Measurement(
        wall_s=statistics.median(walls), cpu_s=statistics.median(cpus), wall_min_s=min(walls),
        wall_max_s=max(walls), repeats=len(walls), warmup=warmup, rss_before_mb=before / mib,
        peak_rss_mb=peak[0] / mib, ru_maxrss_mb=_ru_maxrss_bytes() / mib,
        gpu_peak_mb=torch.cuda.max_memory_allocated(device) / mib if cuda else None,
        load_average=os.getloadavg()[0],
    )


def measure_interleaved(functions, *, repeats: int = 5, warmup: int = 1, device=None):
    """:func:`measure` of several no-argument ``functions``, timed in turn (A, B, C, A, B, C, ...).

    A drift of the machine's speed (another process, frequency, the RSS sampler) then reaches
    every function alike, so the ratio of their medians is what it claims to be. Returns one
    :class:`Measurement` per function: median, fastest and slowest of its ``repeats`` calls, the
    RSS before its first timed call and the highest peak over its calls.
    """
    import statistics

    for function in functions:
        for _ in range(warmup):
            function()
    with collected():
        rounds = [[measure(function, device=device)[1] for function in functions] for _ in range(max(1, repeats))]
    measurements = []
    for calls in zip(*rounds):
        walls = [m.wall_s for m in calls]
        gpu = [m.gpu_peak_mb for m in calls if m.gpu_peak_mb is not None]
        measurements.append(dataclasses.replace(
            calls[-1], wall_s=statistics.median(walls), cpu_s=statistics.median(m.cpu_s for m in calls),
            wall_min_s=min(walls), wall_max_s=max(walls), repeats=len(calls), warmup=warmup,
            rss_before_mb=calls[0].rss_before_mb, peak_rss_mb=max(m.peak_rss_mb for m in calls),
            gpu_peak_mb=max(gpu) if gpu else None))
    return measurements
