"""How long a cell, or a part of one, took: :class:`Stopwatch`, the one timer of the studies' cells.

A cell's row records the wall seconds it took (``seconds``), and where the study asks for it the CPU seconds of
the thread that computed it (``cpu_seconds``). A comparison of timings (the perplexity study's cost of a patched
forward pass) is read on one clock, :meth:`Stopwatch.steady_clock`: this thread's CPU time when torch computes
in it alone, which other processes on a shared machine do not inflate, else the wall clock.

Public API::

    Stopwatch()                      # started when made
    .seconds(clock=WALL) -> float    # since it started, on the wall clock or this thread's CPU clock
    .times() -> {"seconds", "cpu_seconds"}
    Stopwatch.steady_clock() -> str  # THREAD_CPU with one torch thread, else WALL
    WALL, THREAD_CPU
"""

from __future__ import annotations

import time

__all__ = ["Stopwatch", "WALL", "THREAD_CPU"]

WALL = "wall seconds"
"""The wall clock, :func:`time.perf_counter`."""

THREAD_CPU = "thread CPU seconds"
"""The CPU time of the calling thread, :func:`time.thread_time`."""

_CLOCKS = {WALL: time.perf_counter, THREAD_CPU: time.thread_time}


class Stopwatch:
    """Seconds since it was made, on the wall clock and on the calling thread's CPU clock.

    Both clocks are read when it is made, the wall clock first; :meth:`seconds` reads one of them again,
    :meth:`times` both (in the same order).

    Examples
    --------
    >>> watch = Stopwatch()
    >>> sum(range(10_000))
    49995000
    >>> times = watch.times()
    >>> sorted(times), times["seconds"] >= 0.0, times["cpu_seconds"] >= 0.0
    (['cpu_seconds', 'seconds'], True, True)
    >>> watch.seconds() >= times["seconds"], watch.seconds(THREAD_CPU) >= times["cpu_seconds"]
    (True, True)
    >>> Stopwatch.steady_clock() in (WALL, THREAD_CPU)
    True
    """

    def __init__(self):
        self._started = {WALL: time.perf_counter(), THREAD_CPU: time.thread_time()}

    def seconds(self, clock: str = WALL) -> float:
        """The seconds since it started on ``clock``: :data:`WALL` (default) or :data:`THREAD_CPU`."""
        if clock not in _CLOCKS:
            raise ValueError(f"`clock` must be {WALL!r} or {THREAD_CPU!r}; got {clock!r}.")
        return _CLOCKS[clock]() - self._started[clock]

    def times(self) -> dict:
        """``{"seconds": wall seconds, "cpu_seconds": this thread's CPU seconds}`` since it started: the timing
        columns of a cell's row."""
        wall, cpu = time.perf_counter(), time.thread_time()
        return {"seconds": wall - self._started[WALL], "cpu_seconds": cpu - self._started[THREAD_CPU]}

    @staticmethod
    def steady_clock() -> str:
        """The clock timings that are compared with each other are read on: :data:`THREAD_CPU` when torch
        computes in this thread alone (robust to other processes on the machine), else :data:`WALL` (torch's other
        threads compute outside this thread's CPU time)."""
        import torch

        return THREAD_CPU if torch.get_num_threads() == 1 else WALL
