"""What a study declares of a command-line option: :class:`Option`, and :class:`DeprecatedAlias` for its old flags.

A study's options are :class:`Option` objects, most of them taken from the shared set of
:mod:`approxlab.studies.options` (which keeps an option's type, ``nargs`` and messages the same in every study).
:mod:`approxlab.studies.declaration` re-exports both names beside the other declaration types; like them, this
module imports nothing from approxlab, so every layer of the studies may use it.

Public API::

    Option(flags, dest, help, type=None, nargs=None, action=None, choices=None, default=None, metavar=None,
           grid=True, deprecated={})   # deprecated: {old flag: the approxlab version that removes it}
    Option.but(**changes) -> Option, Option.add_to(parser) -> argparse.Action
    DeprecatedAlias                     # the argparse action of a deprecated flag

A list option, and an option with a deprecated flag, is given once on a command line, by one of its flags:
``--methods A --methods B`` or ``--approximations A --methods B`` (a deprecated flag with its new one) is one line
of error naming both, where argparse would keep the last and drop ``A`` without a word. A one-value option given
again takes the last value, as every command line does (a script's later ``--seeds 1`` overrides its base
command's); options that gather their values (``action="append"``, ``"count"``) may repeat.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import weakref
from typing import Any, Callable, Mapping

__all__ = ["Option", "DeprecatedAlias"]


@dataclasses.dataclass(frozen=True)
class Option:
    """A command-line option: what ``argparse.add_argument`` gets, and whether it shapes the grid.

    ``grid`` options are handed to :attr:`~approxlab.studies.Study.configure` and hashed with the config; the others
    (``grid=False``) are run settings. ``deprecated`` maps an old flag of the option to the approxlab version
    that removes it: until then it still works, with one line on stderr (:class:`DeprecatedAlias`). :meth:`but`
    gives a copy with another default or help text: a shared option keeps its type, ``nargs`` and messages in every
    study.
    """

    flags: tuple
    dest: str
    help: str
    type: Callable | None = None
    nargs: str | None = None
    action: Any = None
    choices: Any = None
    default: Any = None
    metavar: str | None = None
    grid: bool = True
    deprecated: Mapping = dataclasses.field(default_factory=dict)

    def but(self, **changes) -> "Option":
        """A copy with ``changes`` (``default``, ``help``, ``grid``, ``flags``, ``deprecated``)."""
        return dataclasses.replace(self, **changes)

    def add_to(self, parser) -> argparse.Action:
        """Add the option to ``parser`` (or an argument group), with its deprecated aliases (hidden from
        ``--help``; each use prints one line on stderr naming the option that replaces it)."""
        kwargs = {"dest": self.dest, "help": self.help, "default": self.default}
        for name in ("type", "nargs", "action", "choices", "metavar"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value() if name == "choices" and callable(value) else value
        inner = _action_class(self.action)
        given = _Given((*self.flags, *self.deprecated))
        listed = self.nargs in ("+", "*")
        once = _given_once(inner) if (listed or self.deprecated) and not issubclass(inner, _GATHERING) else inner
        added = parser.add_argument(*self.flags, **{**kwargs, "action": once})
        added.given = given
        for alias, removed_in in self.deprecated.items():
            parser.add_argument(alias, **{**kwargs, "help": argparse.SUPPRESS, "action": DeprecatedAlias,
                                          "inner": self.action, "replacement": self.flags[0],
                                          "removed_in": removed_in}).given = given
        return added


_GATHERING = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction)
"""argparse's actions whose option may be given several times: each use adds to the value."""


def _action_class(action) -> type:
    """The argparse action class of ``action`` (None and argparse's names, ``"store_true"``, resolved)."""
    if action is None or isinstance(action, str):
        return argparse.ArgumentParser()._registry_get("action", action, action)
    return action


def _shown(values) -> str:
    """An option's parsed values as written: ``[["a", "b"], ["c"]]`` -> ``"a,b,c"``; a flag alone -> ``""``."""
    if isinstance(values, (list, tuple)):
        return ",".join(_shown(value) for value in values)
    return "" if values is None else str(values)


class _Given:
    """Which flag of one option (and which values) the parse in progress has seen, if any.

    One object per :meth:`Option.add_to`, shared by the option's flag and its deprecated ones; it tells one parse
    (one ``argparse.Namespace``, held weakly) from the next.
    """

    def __init__(self, flags):
        self.flags = tuple(flags)
        self._namespace = lambda: None
        self._first = ""

    def check(self, parser, namespace, values, option_string) -> None:
        """Record this use of the option; a second use in the same parse is ``parser.error``, naming both."""
        use = f"{option_string} {_shown(values)}".strip()
        if self._namespace() is not namespace:
            self._namespace, self._first = weakref.ref(namespace), use
            return
        main, *aliases = self.flags
        named = (f" ({', '.join(aliases)}: {'its deprecated name' if len(aliases) == 1 else 'its deprecated names'})"
                 if aliases else "")
        parser.error(f"argument {main}: given once{named}, with all its values after one {main}, "
                     f"got {self._first!r} and {use!r}")


@functools.cache
def _given_once(inner: type) -> type:
    """``inner`` (an argparse action class) that refuses a second use of its option in one parse (:class:`_Given`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(self, "given", None)
        if given is None:
            given = self.given = _Given(self.option_strings)
        given.check(parser, namespace, values, option_string)
        inner.__call__(self, parser, namespace, values, option_string)

    return type(inner.__name__, (inner,), {"__call__": __call__, "__doc__": inner.__doc__,
                                           "__module__": inner.__module__})


class DeprecatedAlias(argparse.Action):
    """An old flag of an option (:attr:`Option.deprecated`): it sets the option as its replacement does, and
    prints one line on stderr, ``<prog>: FutureWarning: --old is deprecated and will be removed in approxlab
    <version>; use --new``. (A printed line, not :func:`warnings.warn`: a command line's user reads stderr.) A
    parser with a ``deprecation_notes`` list (``approxlab``'s) gets the line there, to print once the command line
    is parsed: a command refused for another reason then prints its one error line alone."""

    def __init__(self, option_strings, dest, *, inner=None, replacement: str, removed_in: str, **kwargs):
        inner = _action_class(inner)  # argparse's own actions by name ("store_true", ...) resolved
        self.inner = inner(option_strings, dest, **kwargs)
        super().__init__(option_strings, dest, nargs=self.inner.nargs, const=self.inner.const,
                         default=self.inner.default, type=self.inner.type, choices=self.inner.choices,
                         help=self.inner.help, metavar=self.inner.metavar)
        self.replacement = replacement
        self.removed_in = removed_in

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(self, "given", None)
        if given is not None:  # with its new flag as well: refused, never one of them dropped
            given.check(parser, namespace, values, option_string)
        note = (f"{parser.prog}: FutureWarning: {option_string} is deprecated and will be removed in approxlab "
                f"{self.removed_in}; use {self.replacement}")
        deferred = getattr(parser, "deprecation_notes", None)
        if deferred is None:
            print(note, file=sys.stderr)
        else:  # printed once the whole command line is read (a parser that refuses it prints its error alone)
            deferred.append(note)
        self.inner(parser, namespace, values, self.replacement)
