"""One markdown renderer for every table of every summary.

:func:`markdown_table` writes a header, a rule and a row per record; each cell goes through the
column's format (a callable, or a ``str.format`` pattern), the frame's default otherwise.
:func:`format_number` is the default: three significant digits, whole numbers as integers, ``n/a``
for a missing value and ``inf`` for an infinite one.

Public API::

    markdown_table(frame, *, formats=None, default=format_number, missing="—", empty="(none)",
                   index=None) -> list[str]
    format_number(x) -> str
"""

from __future__ import annotations

import math

import pandas as pd

__all__ = ["markdown_table", "format_number"]


def format_number(x) -> str:
    """``0.123456 -> "0.123"``, ``3.0 -> "3"``, ``nan -> "n/a"``, ``inf -> "inf"``, text as it is.

    Examples
    --------
    >>> [format_number(x) for x in (0.123456, 3.0, float("nan"), float("inf"), 12345.678, "skyformer")]
    ['0.123', '3', 'n/a', 'inf', '1.23e+04', 'skyformer']
    """
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e7:
        return str(int(x))
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def _formatter(spec, missing: str):
    if callable(spec):
        return spec

    def pattern(value):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return missing
        return spec.format(value)

    return pattern


def markdown_table(frame: pd.DataFrame, *, formats=None, default=format_number, missing: str = "—",
                   empty: str | None = "(none)", index: str | None = None) -> list[str]:
    """``frame`` as the lines of a markdown table.

    Parameters
    ----------
    frame : pandas.DataFrame
        One row per line; the columns in order.
    formats : mapping, optional
        Column -> a callable ``value -> str`` or a pattern such as ``"{:.3f}"``.
    default : callable or str
        The format of the other columns (:func:`format_number`; ``str`` writes values as they are).
    missing : str
        What a pattern writes for a missing value (callables decide for themselves).
    empty : str, optional
        The one line written for a frame without rows (None: the header and rule alone).
    index : str, optional
        Write the index as a first column with this header.

    Examples
    --------
    >>> frame = pd.DataFrame({"method": ["a", "b"], "error": [0.12345, float("nan")]})
    >>> print("\\n".join(markdown_table(frame)))
    | method | error |
    |---|---|
    | a | 0.123 |
    | b | n/a |
    """
    if empty is not None and frame.empty:
        return [empty]
    if index is not None:
        frame = frame.rename_axis(index).reset_index()
    formats = {column: _formatter(spec, missing) for column, spec in (formats or {}).items()}
    fallback = _formatter(default, missing)
    columns = list(frame.columns)
    lines = [_line(map(str, columns)), "|" + "---|" * len(columns)]
    cells = [formats.get(column, fallback) for column in columns]
    for row in frame.itertuples(index=False, name=None):
        lines.append(_line(cell(value) for cell, value in zip(cells, row)))
    return lines


def _line(cells) -> str:
    """``| a | b |``; an empty cell is one blank between its bars."""
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"
