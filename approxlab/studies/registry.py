"""The study registry: names -> :class:`~approxlab.studies.Study`, built-in, registered or installed.

Three ways a study gets a name, as methods do (:mod:`approxlab.methods.registry`):

1. **Built-in**: a package in ``approxlab/studies/`` whose ``STUDY`` is the declaration, and one line
   in :data:`STUDIES` (imported on first use, so ``approxlab figure1`` imports figure1 only).
2. **Registered**: :func:`register` from any code, e.g. a module named with ``approxlab <study>
   --plugin MODULE`` (imported before the command line is read, here and in every Dask worker).
3. **Installed**: a distribution that declares an entry point in the group ``approxlab.studies``
   (:data:`ENTRY_POINT_GROUP`), named as its study, pointing at the study or at a module that
   registers it::

       # pyproject.toml of the distribution that ships the study
       [project.entry-points."approxlab.studies"]
       toy = "my_package.toy:STUDY"

   It is loaded only when that study runs or when the studies are listed; one that fails to load
   (it raises, or calls ``sys.exit``) gives a :class:`~approxlab.errors.PluginWarning` naming it, and
   every other study stays available.

Public API::

    register(study) -> Study, unregister(name) -> Study
    get(name) -> Study, available() -> list[str], describe(name) -> str
    load_plugins(argv) -> list[str]
    STUDIES, ENTRY_POINT_GROUP
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import threading
import traceback
import warnings

from ..errors import PluginWarning, StudyError, UsageError
from .declaration import Study

__all__ = ["register", "unregister", "get", "available", "describe", "load_plugins", "STUDIES", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "approxlab.studies"
"""The ``importlib.metadata`` entry-point group that installed distributions declare studies in."""

STUDIES = {
    "figure1": "approxlab.studies.figure1",
    "sv-decay": "approxlab.studies.sv_decay",
    "instability": "approxlab.studies.instability",
    "bench": "approxlab.studies.bench",
    "lra-svd": "approxlab.studies.lra_svd",
    "decoder": "approxlab.studies.decoder",
    "perplexity": "approxlab.studies.perplexity",
    "long-context": "approxlab.studies.long_context",
}
"""The built-in studies: command -> the module whose ``STUDY`` declares it (imported only when needed)."""

_REGISTERED: dict = {}
_LOCK = threading.RLock()


def register(study: Study) -> Study:
    """Make ``study`` runnable as ``approxlab <study.name>`` and listed by ``approxlab``; returns it.

    Raises
    ------
    TypeError
        ``study`` is not a :class:`~approxlab.studies.Study`.
    ValueError
        Its name is a built-in study's or already registered (:func:`unregister` it first); one of its
        options takes a flag or destination of the options every study shares (``--out``, ``--quick``, ...).
        (An option declared twice, or two steps writing one table, are refused when the
        :class:`~approxlab.studies.Study` is made.)
    """
    if not isinstance(study, Study):
        raise TypeError(f"`study` must be an approxlab.studies.Study; got {type(study).__name__}.")
    _check_common_options(study)
    with _LOCK:
        if study.name in STUDIES or study.name in _REGISTERED:
            where = "a built-in study" if study.name in STUDIES else "already registered"
            raise ValueError(f"`study` name {study.name!r} is {where}; choose another name"
                             + ("" if study.name in STUDIES else " or unregister it first") + ".")
        _REGISTERED[study.name] = study
    return study


def _check_common_options(study: Study) -> None:
    """No option of ``study`` takes a flag or destination of :func:`~approxlab.studies.options.add_common`'s."""
    from .options import add_common

    parser = argparse.ArgumentParser(add_help=True)
    add_common(parser, study.name)
    flags = {flag for action in parser._actions for flag in action.option_strings}
    dests = {action.dest for action in parser._actions}
    for option in study.options:
        taken = [flag for flag in (*option.flags, *option.deprecated) if flag in flags] or ([f"dest={option.dest!r}"]
                                                                      if option.dest in dests else [])
        if taken:
            raise ValueError(f"study {study.name!r}: `options` declares {taken[0]} (the option with flags "
                             f"{list(option.flags)}), which every study already has; choose another flag and dest.")


def unregister(name: str) -> Study:
    """Remove a registered study; returns it. Built-in studies cannot be removed."""
    with _LOCK:
        if name not in _REGISTERED:
            raise ValueError(f"`name` must be a registered (not built-in) study, one of {sorted(_REGISTERED)}; "
                             f"got {name!r}.")
        return _REGISTERED.pop(name)


def _entry_points() -> dict:
    try:
        return {entry.name: entry for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    except Exception:  # noqa: BLE001 - broken installed metadata must not break the built-in studies
        return {}


def available() -> list[str]:
    """Every study name: the built-in ones, the registered ones, then the installed ones (not loaded)."""
    names = list(STUDIES) + [name for name in _REGISTERED if name not in STUDIES]
    return names + [name for name in _entry_points() if name not in names]


def _load_entry_point(name: str):
    entry = _entry_points()[name]
    try:
        loaded = entry.load()
    except (Exception, SystemExit) as error:  # noqa: BLE001 - third-party code (sys.exit included) must not break
        # unrelated use
        warnings.warn(PluginWarning.failed(entry, ENTRY_POINT_GROUP, error, "that study is not available, every "
                                           "other study is"), stacklevel=3)
        return None
    if isinstance(loaded, Study) and loaded.name not in _REGISTERED:
        register(loaded)
    return _REGISTERED.get(name)


def get(name: str) -> Study:
    """The study called ``name``, importing its module (or loading its entry point) on first use.

    Raises
    ------
    StudyError
        No study has that name, or its module cannot be imported (the message says which).
    """
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in STUDIES:
        try:
            module = importlib.import_module(STUDIES[name])
        except ModuleNotFoundError as error:
            if error.name and STUDIES[name].startswith(error.name):
                raise StudyError(f"study {name!r} is not available: module {STUDIES[name]!r} does not exist "
                                 "(yet).") from None
            raise
        return module.STUDY
    if name in _entry_points():
        study = _load_entry_point(name)
        if study is not None:
            return study
        raise StudyError(f"study {name!r} is not available: its entry point failed to load (see the warning).")
    raise StudyError(f"unknown study {name!r}; available: {available()}.")


def describe(name: str) -> str | None:
    """The one-line description of study ``name``; None when it cannot be loaded."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PluginWarning)
            return get(name).description
    except StudyError:
        return None


def load_plugins(argv) -> list[str]:
    """Import every ``--plugin MODULE`` of ``argv`` (:func:`approxlab.methods.load_plugin`), in order.

    Done before the parser is built, so a study a plugin registers can be named, and ``--methods``
    knows the plugins' methods. A module that cannot be imported, that raises while it registers, or
    that calls ``sys.exit`` (which would end approxlab with the plugin's status, having run nothing),
    is a :class:`~approxlab.errors.UsageError` naming it, the error and where it happened.
    """
    from ..methods import load_plugin

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugin", action="append", default=[])
    modules = pre.parse_known_args(list(argv))[0].plugin
    for module in modules:
        try:
            load_plugin(module)
        except ImportError as error:
            missing = getattr(error, "name", None) or ""
            if missing and (module == missing or module.startswith(missing + ".")):
                raise UsageError("--plugin", "a module importable from Python's path (set PYTHONPATH to its "
                                 "folder) that registers methods or studies", f"{module!r} ({error})") from None
            raise UsageError("--plugin", "a module that imports and registers its methods or studies",
                             f"{module!r} ({_failure(error)})") from None
        except Exception as error:  # noqa: BLE001 - the user's module: one line naming it, not a traceback
            raise UsageError("--plugin", "a module that imports and registers its methods or studies",
                             f"{module!r} ({_failure(error)})") from None
    return modules


def _failure(error: BaseException) -> str:
    """``Type: message at file:line`` of the innermost frame of ``error`` (``it called sys.exit(code) at
    file:line`` for a plugin that exits: :func:`approxlab.methods.load_plugin` chains the ``SystemExit``)."""
    cause = error.__cause__ if isinstance(error.__cause__, SystemExit) else None
    frames = traceback.extract_tb((cause or error).__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    if cause is not None:
        return f"it called sys.exit({cause.code!r}) while it was imported{where}"
    return f"{type(error).__name__}: {error}{where}"
