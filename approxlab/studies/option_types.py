"""The value types of the studies' options (argparse ``type=``), and the rule of distinct list values.

Each type turns the text of one option into its value or raises ``argparse.ArgumentTypeError`` with
what is allowed and what came in (argparse prints it as ``argument --n: comma-separated integers >= 1,
got '0'``); :func:`approxlab.studies.options.check_value` applies the same type, in the same words, to
values given in code. A list option takes commas or spaces alike (:class:`Flatten`), and holds each
value at most once (:func:`check_distinct`). Used through :mod:`approxlab.studies.options`, which
re-exports them.

Public API::

    str_list, int_list, positive_int, nonnegative_int, int_at_least(low), positive_float, probability,
    number_list(allowed, ok), ratio_list,
    path_option, thread_count, method_list, names_among(allowed, noun), layer_list, LAYER_NAMES, Flatten
    check_distinct(option, values, shown=None)
"""

from __future__ import annotations

import argparse
import json
import pathlib

from ..errors import UsageError

__all__ = ["str_list", "int_list", "positive_int", "nonnegative_int", "int_at_least", "positive_float",
           "probability", "relative_tolerance", "number_list", "ratio_list", "path_option", "thread_count", "method_list",
           "names_among", "layer_list", "LAYER_NAMES",
           "Flatten", "check_distinct"]


def str_list(text: str) -> list[str]:
    """``"a,b c"`` -> ``["a", "b", "c"]`` (commas or spaces)."""
    items = [x for x in str(text).replace(",", " ").split() if x]
    if not items:
        raise argparse.ArgumentTypeError(f"one or more comma-separated names, got {text!r}")
    return items


def int_list(text: str) -> list[int]:
    """``"512,1024"`` -> ``[512, 1024]``; every entry an integer >= 1."""
    try:
        values = [int(x) for x in str_list(text)]
    except (ValueError, argparse.ArgumentTypeError):
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"comma-separated integers >= 1, got {text!r}")
    return values


def _number(text: str, kind, allowed: str, ok):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{allowed}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{allowed}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (argparse ``type=``)."""
    return _number(text, int, "an integer >= 1", lambda v: v >= 1)


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (argparse ``type=``)."""
    return _number(text, int, "an integer >= 0", lambda v: v >= 0)


def int_at_least(low: int):
    """An argparse ``type=``: an integer >= ``low`` (``int_at_least(5)`` for at least five timed calls)."""
    def at_least(text: str) -> int:
        return _number(text, int, f"an integer >= {low}", lambda v: v >= low)

    at_least.__name__ = f"int_at_least_{low}"
    return at_least


def thread_count(text: str) -> int:
    """``--threads``: an integer from 1 to :func:`~approxlab.studies.engine.environment.max_threads` (argparse
    ``type=``)."""
    from .engine.environment import THREADS_ALLOWED, max_threads

    return _number(text, int, THREADS_ALLOWED.format(limit=max_threads()), lambda v: 1 <= v <= max_threads())


def positive_float(text: str) -> float:
    """A finite number > 0 (argparse ``type=``)."""
    return _number(text, float, "a finite number > 0", lambda v: 0 < v < float("inf"))


def probability(text: str) -> float:
    """A number in [0, 1) (argparse ``type=``), e.g. a dropout rate."""
    return _number(text, float, "a number in [0, 1)", lambda v: 0 <= v < 1)


def number_list(allowed: str, ok):
    """An argparse ``type=``: comma-separated numbers, each one ``ok(value)`` (``allowed`` says which, in words)."""
    def numbers(text: str) -> list[float]:
        try:
            values = [float(x) for x in str_list(text)]
        except (ValueError, argparse.ArgumentTypeError):
            values = []
        if not values or not all(ok(value) for value in values):
            raise argparse.ArgumentTypeError(f"comma-separated {allowed}, got {text!r}")
        return values

    return numbers


ratio_list = number_list("compression ratios in [0, 1)", lambda value: 0 <= value < 1)
ratio_list.__name__ = "ratio_list"
ratio_list.__doc__ = """``"0.5,0.875"`` -> ``[0.5, 0.875]``; every entry a compression ratio in ``[0, 1)``."""


def relative_tolerance(text: str) -> float:
    """A relative tolerance, a number in (0, 1) (argparse ``type=``): at 1 or more every estimate is "converged"."""
    return _number(text, float, "a number in (0, 1) (a relative tolerance)", lambda v: 0 < v < 1)


def path_option(text: str) -> pathlib.Path:
    """A file or folder path (argparse ``type=``): an empty one would silently mean the current folder."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError(f"a file or folder path, got {text!r} (an empty path is the current folder)")
    return pathlib.Path(text)


def _method_names() -> list[str]:
    from ..methods import available

    return available()


def _methods_allowed() -> str:
    return f"registered method names among {_method_names()}"


def method_list(text: str) -> list[str]:
    """Registered method names (commas or spaces)."""
    names = str_list(text)
    if not set(names) <= set(_method_names()):
        raise argparse.ArgumentTypeError(f"{_methods_allowed()}, got {text!r}")
    return names


def names_among(allowed, noun: str):
    """An argparse ``type=``: comma-separated names among ``allowed`` (the ``noun`` says what they are)."""
    def names(text: str) -> list[str]:
        chosen = str_list(text)
        if not set(chosen) <= set(allowed):
            raise argparse.ArgumentTypeError(f"comma-separated {noun} among {list(allowed)}, got {text!r}")
        return chosen

    names.__name__ = f"{noun.replace(' ', '_')}_list"
    return names


LAYER_NAMES = ("first", "middle", "last")
_LAYERS_ALLOWED = "comma-separated layer indices >= 0 or first, middle, last, or 'all'"


def layer_list(text: str):
    """``"0,5"``, ``"first,last"`` (or mixed) -> a list; ``"all"`` -> ``"all"``."""
    if str(text).strip() == "all":
        return "all"
    try:
        names = str_list(text)
    except argparse.ArgumentTypeError:
        names = []
    layers = [int(x) if x.isdigit() else x for x in names]
    if not layers or not all(isinstance(x, int) or x in LAYER_NAMES for x in layers):
        raise argparse.ArgumentTypeError(f"{_LAYERS_ALLOWED}, got {text!r}")
    return layers


class Flatten(argparse.Action):
    """``--n 512 1024`` and ``--n 512,1024`` both give ``[512, 1024]`` (with ``nargs="+"``); ``all``
    (``--layers``) stays a word."""

    def __call__(self, parser, namespace, values, option_string=None):
        if any(chunk == "all" for chunk in values):
            if len(values) > 1:
                parser.error(f"argument {option_string}: {_LAYERS_ALLOWED}, got {' '.join(map(str, values))!r}")
            setattr(namespace, self.dest, "all")
            return
        setattr(namespace, self.dest, [x for chunk in values for x in chunk])


def _distinct_key(value) -> str:
    """A key under which two equal values (dicts and lists included) are the same."""
    return json.dumps(value, sort_keys=True, default=str)


def check_distinct(option: str, values, shown=None) -> None:
    """Each of ``values`` (a list option's entries) at most once; else a :class:`UsageError` naming the repeats.

    The rule of every list option of every study: a value given twice would compute the same cells
    twice (or collide in the results), so it is refused, never merged silently. ``shown``: how the
    values were written (``--tasks`` entries before parsing), for the message; default ``values``.

    Examples
    --------
    >>> check_distinct("--methods", ["performer", "nystromformer"])
    >>> check_distinct("--methods", ["performer", "performer"])
    Traceback (most recent call last):
    ...
    approxlab.errors.UsageError: --methods: each value at most once, got 'performer,performer' ('performer' ...)
    """
    values = list(values)
    shown = values if shown is None else list(shown)
    first, repeats = {}, []
    for value, written in zip(values, shown):
        key = _distinct_key(value)
        if key not in first:
            first[key] = written
            continue
        what = (f"{str(written)!r} given more than once" if str(written) == str(first[key]) else
                f"{str(written)!r} is {str(first[key])!r} again")
        if what not in repeats:
            repeats.append(what)
    if repeats:
        raise UsageError(option, "each value at most once", f"{','.join(map(str, shown))!r} ({'; '.join(repeats)})")
