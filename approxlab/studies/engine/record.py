"""A run's record beside its tables: ``config.json`` (the grid, its hash, the run) and ``timing.json``.

``config.json`` holds the grid-defining config, its hash (:func:`~approxlab.studies.engine.keys.config_hash`),
the approxlab version, when the results were created and last updated, the tables written and the
(unhashed) run information -- command line, device, executor, threads. A run resumes only into a folder
whose saved hash is its own, or whose saved config it only extends; every other case is refused in one line before
anything is written.
A run that only extends the saved one along the study's growing entries (:func:`extension`) resumes it, and
``config.json`` keeps a list ``extensions``: when each extension was made, from which config hash, and what it
added. ``timing.json`` lists the wall time of every compute run made into the folder.

Public API::

    prepare_record(config_path, table_paths, config, run_info, restart, grows=()) -> dict
    extension(saved, config, grows) -> list[str] | None
    saved_config(config_path, table="results.csv") -> dict
    append_timing(out, entry), read_timing(out) -> list[dict], TIMING
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys

from ..._io import atomic_write_text
from ...errors import CorruptResultsError, StudyError
from .keys import canonical, config_hash
from .store import has_results, read_json, remove_table, stored_as

__all__ = ["prepare_record", "saved_config", "append_timing", "read_timing", "REMEDY", "TIMING"]

REMEDY = "pass --restart to discard the saved results, or a new --out directory"
TIMING = "timing.json"
"""The wall times of the compute runs made into a folder: ``{"runs": [{command, wall_seconds, ...}]}``."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _version() -> str:
    from ... import __version__

    return __version__


def _saved_record(config_path, restart):
    """The saved ``config.json`` record, None when there is none (or it is damaged and ``restart``)."""
    if config_path.is_dir():
        raise StudyError(f"{str(config_path)!r} is a directory where the study's config.json must go; "
                         "remove it or pass a new --out directory.")
    if not config_path.exists():
        return None
    try:
        saved = read_json(config_path)
    except CorruptResultsError as error:
        if restart:
            return None
        raise StudyError(f"{error}, so the results beside it cannot be resumed safely; {REMEDY}.") from None
    if not isinstance(saved.get("config_hash"), str) and not restart:
        raise StudyError(f"{str(config_path)!r} is not a config.json written by approxlab (it has no config_hash), "
                         f"so the results beside it cannot be resumed safely; {REMEDY}.")
    return saved


def _grows(old, new, top: bool = True) -> bool:
    """Whether ``new`` holds everything ``old`` holds: a list's entries, a dict's items (each the same or itself
    grown, a list or dict inside it), a count or more (a count at the config's top level only: inside a dict a
    number is a setting, such as a budget, and must stay as it was)."""
    if isinstance(old, list) and isinstance(new, list):
        return all(entry in new for entry in old)
    if isinstance(old, dict) and isinstance(new, dict):
        return all(key in new and (new[key] == value or (isinstance(value, (list, dict))
                                                         and _grows(value, new[key], top=False)))
                   for key, value in old.items())
    counts = [isinstance(x, int) and not isinstance(x, bool) for x in (old, new)]
    return top and all(counts) and new >= old


def _added(old, new):
    """What ``new`` adds to ``old`` (:func:`_grows`): a list's new entries, a dict's new or grown items, a count's
    new value; ``old`` None (an entry the saved config lacks): all of ``new``.

    Examples
    --------
    >>> _added(["a", "b"], ["a", "c", "b"]), _added({"k": [1], "x": 2}, {"k": [1, 3], "x": 2, "y": [4]})
    (['c'], {'k': [3], 'y': [4]})
    >>> _added(4, 8), _added(None, [16, 32])
    (8, [16, 32])
    """
    if isinstance(old, list) and isinstance(new, list):
        return [entry for entry in new if entry not in old]
    if isinstance(old, dict) and isinstance(new, dict):
        return {key: value if key not in old else _added(old[key], value) for key, value in new.items()
                if key not in old or old[key] != value}
    return new


def extension(saved: dict, config: dict, grows) -> list[str] | None:
    """The entries of ``config`` that extend the ``saved`` one (more windows, more methods, ...), or None
    when it is not an extension: an entry outside ``grows`` differs, or one of them shrinks. An entry of
    ``grows`` that the saved config lacks (a part of the grid declared after that run: a list or dict of new
    cells) extends it too; none may be dropped.

    Examples
    --------
    >>> extension({"windows": 4, "n": [512]}, {"windows": 8, "n": [512, 1024]}, grows=("windows", "n"))
    ['n', 'windows']
    >>> extension({"windows": 4, "seeds": 3}, {"windows": 8, "seeds": 2}, grows=("windows", "seeds")) is None
    True
    >>> extension({"windows": 4}, {"windows": 4, "depths": [8, 15]}, grows=("windows", "depths"))
    ['depths']
    """
    old, new = canonical(saved), canonical(config)
    changed = sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key))
    if not changed or not all(key in grows and key in new and (_grows(old[key], new[key]) if key in old
                                                               else isinstance(new[key], (list, dict)))
                              for key in changed):
        return None
    return changed


def prepare_record(config_path, table_paths, config, run_info, restart, grows=()) -> dict:
    """Check the saved config and tables against ``config``; return the ``config.json`` record to
    write (once the saved tables, too, have been read: a refused run changes nothing).

    With ``restart`` the tables, their manifests and journals are deleted first. A config that only
    extends the saved one along ``grows`` (:func:`extension`) resumes it: the saved cells are kept,
    the new ones computed, and a note on stderr says what grew.
    """
    config_path = pathlib.Path(config_path)
    digest = config_hash(config)
    saved = _saved_record(config_path, restart)
    grown = None
    if saved is not None and not restart and saved.get("config_hash") != digest:
        grown = extension(saved.get("config", {}), config, grows)
        if grown is not None:
            before = saved.get("config", {})
            what = ", ".join(f"{key}: {before.get(key, 'none')} -> {canonical(config[key])}" for key in grown)
            print(f"approxlab: {config_path.parent}: extending the saved run ({what}); only the new cells are "
                  "computed", file=sys.stderr)
    for path in table_paths:
        if path.is_dir():
            raise StudyError(f"{str(path)!r} is a directory where the results table must go; remove it or "
                             "pass a new --out directory.")
    renamed = {stored_as(path) for path in table_paths} - set(table_paths)  # saved under another compression
    if restart:
        for path in [*table_paths, *renamed]:
            remove_table(path)
    if saved is not None and saved.get("config_hash") != digest and not restart and grown is None:
        raise StudyError(
            f"{str(config_path.parent)!r} holds results of a different configuration "
            f"(config hash {saved.get('config_hash')!r}, this run {digest!r}); pass a new --out "
            "directory, or --restart to discard the saved results."
        )
    for path in table_paths:
        if saved is None and has_results(stored_as(path)) and not restart:
            raise StudyError(
                f"{str(stored_as(path))!r} exists but {str(config_path)!r} does not, so it cannot be "
                "resumed safely; pass a new --out directory, or --restart to discard it."
            )
    same = saved is not None and (saved.get("config_hash") == digest or grown is not None)
    tables = sorted((set(saved.get("tables", []) if same else []) - {path.name for path in renamed})
                    | {path.name for path in table_paths})
    extensions = list(saved.get("extensions", [])) if same else []
    if grown is not None:
        extensions.append(_extension_entry(saved, config, grown))
    return {
        "config": canonical(config),
        "config_hash": digest,
        "approxlab_version": _version(),
        "created": saved.get("created", _now()) if same else _now(),
        "updated": _now(),
        "tables": tables,
        **({"extensions": extensions} if extensions else {}),
        "run": canonical(run_info or {}),
    }


def _extension_entry(saved: dict, config: dict, grown) -> dict:
    """The record of one extension of a saved run in its ``config.json``: when, from which config hash, and what
    each grown entry added (:func:`_added`)."""
    before, after = canonical(saved.get("config", {})), canonical(config)
    return {"extended": _now(), "from_config_hash": saved.get("config_hash"),
            "added": {key: _added(before.get(key), after[key]) for key in grown}}


def saved_config(config_path, table: str = "results.csv") -> dict:
    """The ``config`` of a study's saved ``config.json``, for its report step.

    Raises
    ------
    StudyError
        If the file is missing (``table`` then has no config beside it), damaged, or not written
        by approxlab; the message names the file.
    """
    config_path = pathlib.Path(config_path)
    if not config_path.exists():
        raise StudyError(f"{str(config_path)!r} does not exist, so {table} beside it cannot be read as a run of "
                         "this study; rerun without --plot-only.")
    try:
        record = read_json(config_path)
    except CorruptResultsError as error:
        raise StudyError(f"{error}; rerun without --plot-only (with --restart to start over).") from None
    if not isinstance(record.get("config"), dict):
        raise StudyError(f"{str(config_path)!r} is not a config.json written by approxlab (no `config` object); "
                         "rerun without --plot-only (with --restart to start over).")
    return record["config"]


def read_timing(out) -> list[dict]:
    """The compute runs recorded in ``out/timing.json`` (``[]`` without one)."""
    path = pathlib.Path(out) / TIMING
    return read_json(path).get("runs", []) if path.is_file() else []


def append_timing(out, entry: dict) -> pathlib.Path:
    """Append one compute run (``command``, ``wall_seconds``, ``workers``, ``threads``, ``finished``)."""
    runs = [*read_timing(out), dict(entry)]
    return atomic_write_text(pathlib.Path(out) / TIMING, json.dumps({"runs": runs}, indent=2) + "\n")
