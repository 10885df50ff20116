"""A method that fails inside a cell: failed rows naming its error, and the sweep goes on to its report.

A study's cell computes the methods of its grid and catches what a method raises, so that one failing
method gives rows whose ``status`` names the error (with ``inf`` errors) while the sweep goes on and
the report shows the failure. Every exception a method raises is its failure, whether the method is a
built-in or registered from outside approxlab (:func:`approxlab.methods.register`, ``--plugin``, an entry
point): a numerical failure (``ArithmeticError``, e.g. ``FloatingPointError`` for a non-finite output,
``torch.linalg.LinAlgError``), approxlab's check of its result (:class:`~approxlab.errors.MethodResultError`:
an output of the wrong shape, dtype or device), any other exception, and ``sys.exit`` (``SystemExit``),
which would otherwise end the whole study with exit status 0. The run goes on to its report, which names
each failing method in one line (:func:`failure_lines`). ``KeyboardInterrupt`` (Ctrl-C, the studies' orderly
stop on ``SIGTERM``) is never caught.

Public API::

    METHOD_ERRORS                         # catch these around a method's call
    method_status(method, error) -> str   # the row's status: "Type: message" on one line
    failure_lines(tables) -> list[str]    # one line per method whose rows failed
"""

from __future__ import annotations

__all__ = ["METHOD_ERRORS", "method_status", "failure_lines"]

METHOD_ERRORS = (Exception, SystemExit)
"""What a cell catches around a method's call (:func:`method_status` sorts it out); never ``KeyboardInterrupt``."""


def method_status(method: str, error: BaseException) -> str:
    """The ``status`` of the result rows of ``method``, which raised ``error``: ``"Type: message"`` on one line.

    Every study's cells record a method's failure through this one function (see the module docstring).

    Examples
    --------
    >>> method_status("nystromformer", FloatingPointError("non-finite output"))
    'FloatingPointError: non-finite output'
    >>> method_status("mine", SystemExit(3))
    'SystemExit: the method called sys.exit(3)'
    """
    if isinstance(error, SystemExit):
        return f"SystemExit: the method called sys.exit({error.code!r})"
    return " ".join(f"{type(error).__name__}: {error}".split())


def failure_lines(tables: dict, *, limit: int = 5) -> list[str]:
    """One line per method (at most ``limit``) whose rows in ``tables`` (``{name: DataFrame}``) failed.

    A table with a ``status`` column holds ``"ok"`` or the error of a failed row; the line names the
    table, the method (``method``, ``attention`` or ``matrix`` column), how many of its rows failed and the first
    error. Tables without ``status`` say nothing.
    """
    lines = []
    for name, frame in tables.items():
        if "status" not in getattr(frame, "columns", ()) or not len(frame):
            continue
        column = next((c for c in ("method", "attention", "matrix") if c in frame.columns), None)
        failed = frame[frame["status"].astype(str) != "ok"]
        groups = failed.groupby(column, sort=False) if column else [(None, failed)] if len(failed) else []
        for value, rows in groups:
            total = int((frame[column] == value).sum()) if column else len(frame)
            who = f"{column} {value!r}" if column else "the study"
            lines.append(f"{who} failed in {len(rows)} of its {total} rows of {name}: {rows['status'].iloc[0]} "
                         "(those rows hold the error as their status)")
    return lines[:limit] + ([f"... and {len(lines) - limit} more failing methods"] if len(lines) > limit else [])
