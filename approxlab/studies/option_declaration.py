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
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
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
        added = parser.add_argument(*self.flags, **kwargs)
        for alias, removed_in in self.deprecated.items():
            parser.add_argument(alias, **{**kwargs, "help": argparse.SUPPRESS, "action": DeprecatedAlias,
                                          "inner": self.action, "replacement": self.flags[0],
                                          "removed_in": removed_in})
        return added


class DeprecatedAlias(argparse.Action):
    """An old flag of an option (:attr:`Option.deprecated`): it sets the option as its replacement does, and
    prints one line on stderr, ``<prog>: FutureWarning: --old is deprecated and will be removed in approxlab
    <version>; use --new``. (A printed line, not :func:`warnings.warn`: a command line's user reads stderr.)"""

    def __init__(self, option_strings, dest, *, inner=None, replacement: str, removed_in: str, **kwargs):
        if inner is None or isinstance(inner, str):  # argparse's own actions by name ("store_true", ...)
            inner = argparse.ArgumentParser()._registry_get("action", inner, inner)
        self.inner = inner(option_strings, dest, **kwargs)
        super().__init__(option_strings, dest, nargs=self.inner.nargs, const=self.inner.const,
                         default=self.inner.default, type=self.inner.type, choices=self.inner.choices,
                         help=self.inner.help, metavar=self.inner.metavar)
        self.replacement = replacement
        self.removed_in = removed_in

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: FutureWarning: {option_string} is deprecated and will be removed in approxlab "
              f"{self.removed_in}; use {self.replacement}", file=sys.stderr)
        self.inner(parser, namespace, values, self.replacement)
