"""An orderly stop on ``SIGINT`` and ``SIGTERM``: the signal becomes :class:`Stopped`, raised where the run can unwind.

:func:`orderly_stop` installs the handlers for the length of a run. The first signal raises
:class:`Stopped` (a ``KeyboardInterrupt``) at once, so the run unwinds through the runner, which writes
its tables in its ``finally``. Python delivers a handler's exception in whatever the main thread is
running at that moment, and in a few places it cannot propagate: a garbage-collector callback
(Dask's ``GCDiagnosis``), a ``__del__``, a weak-reference callback, where Python hands it to
:func:`sys.unraisablehook` (by default a traceback on stderr) and goes on. The stop is therefore also
remembered: the executors call :func:`raise_if_stopped` after every finished cell, and the block raises
it when it ends, so a swallowed signal still stops the run, one cell later at most; and for the block
:func:`sys.unraisablehook` drops a :class:`Stopped` silently (any other exception goes to the hook
that was there before).

Public API::

    orderly_stop(), Stopped(signum), raise_if_stopped(), STOP_SIGNALS
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

__all__ = ["orderly_stop", "Stopped", "raise_if_stopped", "STOP_SIGNALS"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """The run was asked to stop by a signal (``SIGINT`` or ``SIGTERM``): ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_requested: list[int] = []
"""The signal that asked the run in progress to stop, once one has (at most one entry)."""


def raise_if_stopped() -> None:
    """Raise :class:`Stopped` if a stop signal arrived in the block of :func:`orderly_stop` (its exception
    may have been swallowed where it was first raised); nothing otherwise."""
    if _requested:
        raise Stopped(_requested[0])


@contextlib.contextmanager
def orderly_stop():
    """Turn ``SIGINT`` and ``SIGTERM`` into :class:`Stopped` (a ``KeyboardInterrupt``) for the block.

    The first signal stops the run like Ctrl-C: the exception unwinds through the runner, which
    writes its table in its ``finally``; if it was raised where Python swallows exceptions, the
    executors raise it again after the next finished cell (:func:`raise_if_stopped`), and the block
    at its end, and nothing is printed for it. Signals that follow are ignored until the block ends,
    so a second Ctrl-C or a supervisor's repeated ``SIGTERM`` cannot cut that write short (``SIGKILL``
    still can; the journal keeps the finished cells then). Outside the main thread (where Python
    cannot install handlers) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        for number in STOP_SIGNALS:
            signal.signal(number, signal.SIG_IGN)
        _requested[:] = [signum]
        raise Stopped(signum)

    def unraisable(report):
        if not isinstance(report.exc_value, Stopped):
            previous_hook(report)

    _requested.clear()
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    previous = {number: signal.signal(number, stop) for number in STOP_SIGNALS}
    try:
        yield
        raise_if_stopped()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        sys.unraisablehook = previous_hook
        _requested.clear()
