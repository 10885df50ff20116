"""Progress of a run on stderr: a tqdm bar on a terminal, otherwise a line at every tenth of the cells and at
least every :data:`HEARTBEAT_SECONDS` while cells finish. Both estimate the remaining time per unit of the cells'
declared cost (:attr:`~approxlab.studies.declaration.Step.cost`), not per cell.

Public API::

    progress_bar(total, initial, progress, description, work=None)   # a tqdm bar, a ProgressLog or a disabled bar
    advance(bar, cost=1.0)                                           # one finished cell
    ProgressLog(total, initial=0, description="", stream=None, heartbeat=HEARTBEAT_SECONDS, work=None)
    CostBar(total, initial=0, description="", work=None, disable=False, file=None)
    HEARTBEAT_SECONDS
"""

from __future__ import annotations

import sys
import time

__all__ = ["progress_bar", "advance", "ProgressLog", "CostBar", "HEARTBEAT_SECONDS"]

HEARTBEAT_SECONDS = 600.0
"""The longest a log goes without a line while cells finish: a run whose tenth of the cells takes hours (a
long-context grid at 8,192 tokens, minutes a cell) still says every ten minutes that it advances."""


def progress_bar(total, initial, progress, description, work=None):
    """A tqdm bar on a terminal (:class:`CostBar`), a :class:`ProgressLog` otherwise, a disabled bar without
    ``progress``; ``work``: the summed cost of the ``total - initial`` cells to compute (default: one a cell)."""
    if progress and not sys.stderr.isatty():
        return ProgressLog(total, initial, description, work=work)
    return CostBar(total, initial, description, work=work, disable=not progress)


def advance(bar, cost: float = 1.0) -> None:
    """Count one finished cell of relative expected time ``cost``."""
    bar.update(1, cost)


class CostBar:
    """A tqdm bar whose fill and remaining time follow the cost of the cells computed (a long-context sequence's
    tokens), with the count of cells beside: ``results.csv.gz:  38%|███▊      | [1:02:11<1:41:30, 640/810 cells]``.
    A bar that counted cells would promise a run's 8,192-token cells at the pace of its 4,096-token ones.

    Parameters are those of :class:`ProgressLog`; ``disable``: draw nothing; ``file``: tqdm's (default stderr).
    """

    FORMAT = "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]"

    def __init__(self, total: int, initial: int = 0, description: str = "", work: float | None = None,
                 disable: bool = False, file=None):
        from tqdm.auto import tqdm

        self.total, self.done = int(total), int(initial)
        work = float(self.total - self.done if work is None else work)
        self.bar = tqdm(total=work if work > 0 else 1, initial=0 if work > 0 else 1, desc=description,
                        bar_format=self.FORMAT, postfix=self._cells(), disable=disable, file=file)

    def _cells(self) -> str:
        return f"{self.done}/{self.total} cells"

    def update(self, count: int = 1, cost: float | None = None) -> None:
        """``count`` more cells finished, of summed cost ``cost`` (default: one a cell)."""
        self.done += count
        self.bar.set_postfix_str(self._cells(), refresh=False)
        self.bar.update(count if cost is None else float(cost))

    def close(self) -> None:
        self.bar.close()


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressLog:
    """Progress for a stderr that is not a terminal: one line at every tenth of the cells, and at a finished cell
    at least ``heartbeat`` seconds after the last line.

    ``figure1/results.csv: 12/120 cells done (10%), elapsed 0:00:31, remaining ~0:04:39``: the
    remaining time extrapolates the time of the cells finished in this run, per unit of their cost where the
    step declares one (:attr:`~approxlab.studies.declaration.Step.cost`: a long-context sequence's tokens, so that
    a run at 4,096 tokens does not promise its 8,192-token cells at the same pace), per cell otherwise. A line is
    written
    when the run starts (``0/120 cells done, 120 to compute``; a resumed run: ``13/120 cells done (13
    saved before this run), 107 to compute``), whenever the count of finished cells crosses a multiple
    of ``ceil(total / 10)``, when a cell finishes ``heartbeat`` seconds or more after the last line, and at the
    end. Same ``update``/``close`` interface as tqdm.

    Parameters
    ----------
    total : int
        Cells of the grid.
    initial : int
        Cells already done (resumed).
    description : str
        Prefix of every line (``<output folder>/<table>``).
    stream : file, optional
        Where to write (default ``sys.stderr`` at the time of each line).
    heartbeat : float
        Seconds after which a finished cell writes a line even between two tenths (:data:`HEARTBEAT_SECONDS`).
    work : float, optional
        The summed cost of the ``total - initial`` cells to compute, in the units of ``update``'s ``cost``
        (default: one a cell).
    """

    def __init__(self, total: int, initial: int = 0, description: str = "", stream=None,
                 heartbeat: float = HEARTBEAT_SECONDS, work: float | None = None):
        self.total, self.initial, self.done = int(total), int(initial), int(initial)
        self.work = float(self.total - self.initial if work is None else work)
        self.worked = 0.0
        self.description = description
        self.stream = stream
        self.step = max(1, -(-self.total // 10))
        self.start = self.last = time.monotonic()
        self.heartbeat = float(heartbeat)
        self.closed = False
        resumed = f" ({self.initial} saved before this run)" if self.initial else ""
        self._write(f"{self.done}/{self.total} cells done{resumed}, {self.total - self.done} to compute")

    def _write(self, text: str) -> None:
        print(f"{self.description}: {text}" if self.description else text, file=self.stream or sys.stderr,
              flush=True)
        self.last = time.monotonic()

    def line(self) -> str:
        """The current state: done/total, percentage, elapsed and estimated remaining time."""
        elapsed = time.monotonic() - self.start
        percent = 100 * self.done // self.total if self.total else 100
        text = f"{self.done}/{self.total} cells done ({percent}%), elapsed {_clock(elapsed)}"
        if self.done > self.initial and self.done < self.total and self.worked > 0:
            remaining = elapsed / self.worked * max(self.work - self.worked, 0.0)
            text += f", remaining ~{_clock(remaining)}"
        return text

    def update(self, count: int = 1, cost: float | None = None) -> None:
        """``count`` more cells finished, of summed cost ``cost`` (default: one a cell)."""
        before, self.done = self.done, self.done + count
        self.worked += count if cost is None else float(cost)
        if (self.done // self.step > before // self.step or self.done == self.total
                or time.monotonic() - self.last >= self.heartbeat):
            self._write(self.line())

    def close(self) -> None:
        if not self.closed and self.done < self.total and self.done > self.initial:
            self._write(self.line() + " (stopped)")
        self.closed = True
