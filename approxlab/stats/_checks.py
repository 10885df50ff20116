"""The validation every statistic opens with: messages name the parameter, the allowed values and the value received."""

from __future__ import annotations

import math
import numbers

import numpy as np
import pandas as pd

ALTERNATIVES = ("two-sided", "greater", "less")
"""The alternative hypotheses of :func:`~approxlab.stats.t_test_power`."""

__all__ = ["ALTERNATIVES", 'choice', 'is_real', 'probability', 'integer', 'flag', 'check_frame', 'reals', 'unit_values',
           'check_effect']

def choice(value, name, allowed):
    try:
        known = value in allowed
    except TypeError:  # an unhashable value is simply not one of them
        known = False
    if not known:
        raise ValueError(f"`{name}` must be one of {list(allowed)}; got {value!r}.")
    return value


def is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def probability(value, name):
    if not is_real(value) or not (0 < value < 1):
        raise ValueError(f"`{name}` must be a number with 0 < {name} < 1; got {value!r}.")
    return float(value)


def integer(value, name, *, low, why=""):
    """``value`` as an int ``>= low``; bools, floats and strings are refused (never truncated)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer >= {low}{why}; got {value!r} ({type(value).__name__}).")
    if value < low:
        raise ValueError(f"`{name}` must be an integer >= {low}{why}; got {value!r}.")
    return int(value)


def flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a bool (True or False); got {value!r} ({type(value).__name__}).")
    return bool(value)


def check_frame(frame, by, column, **others) -> list:
    """The validation of a long table: ``frame`` a DataFrame; ``by`` a column name or a non-empty list
    of them; ``by``, ``column`` and each of ``others`` (name -> column) columns of ``frame``;
    ``frame[column]`` real numbers (``inf`` allowed) without NaN. Returns ``by`` as a list."""
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"`frame` must be a pandas.DataFrame; got {type(frame).__name__}.")
    columns = [by] if isinstance(by, str) else by
    if not isinstance(columns, (list, tuple)) or not columns:
        raise ValueError(f"`by` must be a column name or a non-empty list of column names; got {by!r}.")
    for name, value in [*(("by", c) for c in columns), *others.items(), ("column", column)]:
        try:
            present = value in frame.columns
        except TypeError:  # unhashable
            present = False
        if not present:
            raise ValueError(f"`{name}` must name columns of `frame` (one of {list(frame.columns)}); got "
                             f"{value!r}, which is not one.")
    values = frame[column]
    if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        raise TypeError(f"`column` {column!r} must hold real numbers; got dtype {values.dtype}.")
    missing = int(values.isna().sum())
    if missing:
        raise ValueError(f"`column` {column!r} must hold no NaN (drop those rows, or record a failure as inf); got "
                         f"{missing} NaN value(s) of {len(values)}.")
    return list(columns)




def reals(values, name) -> np.ndarray:
    """``values`` as a flat float64 array of real numbers (strings, bools and objects refused)."""
    return _real_array(values, name).astype(float).ravel()


def _real_array(values, name) -> np.ndarray:
    """``values`` as an array of real numbers, its shape kept (strings, bools, objects and ragged lists refused)."""
    try:
        array = np.asarray(values)
    except ValueError:  # a ragged nesting of lists
        raise TypeError(f"`{name}` must be an array of real numbers; got a ragged sequence {values!r}.") from None
    if array.dtype.kind == "O":
        try:
            array = array.astype(float)
        except (TypeError, ValueError):
            pass
    if array.dtype.kind not in "iuf":
        example = array.ravel()[0] if array.size else None
        raise TypeError(f"`{name}` must be an array of real numbers; got dtype {array.dtype}"
                        + (f" (e.g. {example!r})." if array.size else "."))
    return array


def unit_values(values, name) -> np.ndarray:
    """``values`` as a one-dimensional float64 array of finite real numbers, one per unit, at least one: a
    string, a bool, a 2-D array, a NaN or an inf is refused with a message naming ``name``."""
    array = _real_array(values, name)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be one-dimensional (one real number per unit); got shape {array.shape}.")
    array = array.astype(float)
    if array.size == 0:
        raise ValueError(f"`{name}` must hold at least one value; got none.")
    bad = int((~np.isfinite(array)).sum())
    if bad:
        raise ValueError(f"`{name}` must hold finite numbers (a NaN or an inf has no place in a mean); got "
                         f"{int(np.isnan(array).sum())} NaN and {int(np.isinf(array).sum())} inf of {array.size} "
                         "values.")
    return array


def check_effect(difference, sd, alpha, alternative):
    if not is_real(difference) or not math.isfinite(difference):
        raise (ValueError if is_real(difference) else TypeError)(
            f"`difference` must be a finite number; got {difference!r}.")
    if not is_real(sd) or not (0 < sd < math.inf):
        raise (ValueError if is_real(sd) else TypeError)(f"`sd` must be a finite number > 0; got {sd!r}.")
    probability(alpha, "alpha")
    choice(alternative, "alternative", ALTERNATIVES)


