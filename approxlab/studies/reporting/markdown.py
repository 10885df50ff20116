"""One markdown renderer for every table of every summary.

:func:`markdown_table` writes a header, a rule and a row per record; each cell goes through the
column's format (a callable, or a ``str.format`` pattern), the frame's default otherwise.
:func:`format_number` is the default: three significant digits, whole numbers as integers, ``n/a``
for a missing value and ``inf`` for an infinite one. :func:`format_interval` writes an estimate with
its interval and the failed units beside it, ``n/a`` where either cannot be computed.

Public API::

    markdown_table(frame, *, formats=None, default=format_number, missing="—", empty="(none)",
                   index=None) -> list[str]
    format_number(x) -> str
    format_interval(estimate, low, high, *, failed=0, units=None) -> str
"""

from __future__ import annotations

import math

import pandas as pd

__all__ = ["markdown_table", "format_number", "format_interval"]


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


def format_interval(estimate, low, high, *, failed: int = 0, units: int | None = None) -> str:
    """An estimate with its interval, ``"0.5 [0.4, 0.6]"``, and the failed units beside it when there are any:
    ``"12.5 [11.2, 14.6] (9 of 12 failed)"``.

    What cannot be computed reads ``n/a``, never ``inf``: the estimate when no unit gave a value (``n/a (12 of 12
    failed)``), the interval when it rests on fewer than two units or a bound is not finite (``13 [n/a] (11 of 12
    failed)``). An interval that does not hold its own estimate (bounds computed over other units than the
    estimate) is not printed either.

    Parameters
    ----------
    estimate, low, high : float
        The estimate and its interval's bounds (NaN or infinite: not computed).
    failed : int
        Units whose run failed (left out of the estimate), ``>= 0``.
    units : int, optional
        Units run, failed ones included (``failed <= units``); None: the count of failures alone is written.

    Examples
    --------
    >>> format_interval(0.5, 0.4, 0.6)
    '0.5 [0.4, 0.6]'
    >>> format_interval(12.5, 11.2, 14.6, failed=9, units=12)
    '12.5 [11.2, 14.6] (9 of 12 failed)'
    >>> format_interval(13.0, float("nan"), float("nan"), failed=11, units=12)
    '13 [n/a] (11 of 12 failed)'
    >>> format_interval(float("inf"), float("inf"), float("inf"), failed=12, units=12)
    'n/a (12 of 12 failed)'
    >>> format_interval(12.5, float("inf"), float("inf"))  # bounds not computed: no interval, not [inf, inf]
    '12.5 [n/a]'
    """
    failed = int(failed)
    if failed < 0 or (units is not None and not 0 <= failed <= int(units)):
        raise ValueError(f"`failed` must be an integer in [0, units]; got failed={failed}, units={units}.")
    note = "" if not failed else (f" ({failed} failed)" if units is None else f" ({failed} of {int(units)} failed)")
    values = [float(v) if v is not None else math.nan for v in (estimate, low, high)]
    if not math.isfinite(values[0]):
        return "n/a" + note
    estimate, low, high = values
    if not (math.isfinite(low) and math.isfinite(high) and low <= estimate <= high):
        return f"{format_number(estimate)} [n/a]{note}"
    return f"{format_number(estimate)} [{format_number(low)}, {format_number(high)}]{note}"


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
