"""The lock of a study's output folder: one run writes into a folder at a time.

A study run holds :func:`output_lock` on its output folder: an OS-level lock (``filelock``,
``flock`` on POSIX) on ``<folder>/.approxlab.lock``, so a second run into the same folder fails at
once with :class:`OutputLockedError`, which names the process holding it (its id, host, command and
start time are written to ``<folder>/.approxlab.lock.json`` after the lock is taken). The operating
system drops the lock when its process dies, so a killed run never leaves a stale lock; its
half-written ``.approxlab-tmp-*`` files are removed by the next run that takes the lock.

Public API::

    output_lock(directory, *, command=None, timeout=0.2)   # context manager
    remove_stale_temp_files(directory) -> list[pathlib.Path]
    OutputLockedError, LOCK_NAME
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pathlib
import socket
import time

from ..._io import TEMP_PREFIX, write_json_atomic

__all__ = ["output_lock", "remove_stale_temp_files", "OutputLockedError", "LOCK_NAME"]

LOCK_NAME = ".approxlab.lock"
"""Lock file of an output folder (see :func:`output_lock`); ``LOCK_NAME + ".json"`` names its holder."""


class OutputLockedError(RuntimeError):
    """Another process holds the lock of an output folder (see :func:`output_lock`).

    Attributes
    ----------
    directory : pathlib.Path
        The locked folder.
    owner : dict
        What the holder wrote about itself: ``pid``, ``host``, ``command``, ``started``
        (empty when it could not be read, e.g. written by an older approxlab).
    """

    def __init__(self, directory, owner: dict):
        self.directory = pathlib.Path(directory)
        self.owner = dict(owner)
        super().__init__(f"{str(self.directory)!r} is in use by {self.describe_owner()}")

    def describe_owner(self) -> str:
        """``"process 1234 on host (`approxlab figure1 ...`, since 2026-01-01T00:00:00+00:00)"``."""
        owner = self.owner
        if "pid" not in owner:
            return "another process (its id could not be read)"
        details = [f"`{owner['command']}`" if owner.get("command") else None,
                   f"since {owner['started']}" if owner.get("started") else None]
        details = ", ".join(d for d in details if d)
        return f"process {owner['pid']} on {owner.get('host', '?')}" + (f" ({details})" if details else "")


_HELD: dict[pathlib.Path, list] = {}
"""Output locks this process holds: resolved folder -> [FileLock, depth] (the lock is reentrant)."""


def _read_owner(path: pathlib.Path, wait: float) -> dict:
    # The holder writes its record just after taking the lock; give it a moment.
    deadline = time.monotonic() + wait
    while True:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return {}
            time.sleep(0.05)


def remove_stale_temp_files(directory) -> list[pathlib.Path]:
    """Delete the ``.approxlab-tmp-*`` files in ``directory`` (left by a killed writer).

    Call it only while holding :func:`output_lock` on ``directory`` (a live writer's
    temporary file must not be removed); :func:`output_lock` does so itself.

    Returns
    -------
    list of pathlib.Path
        The files removed.
    """
    removed = []
    for path in sorted(pathlib.Path(directory).glob(TEMP_PREFIX + "*")):
        if path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


@contextlib.contextmanager
def output_lock(directory, *, command: str | None = None, timeout: float = 0.2):
    """Hold the lock of output folder ``directory`` for the duration of a ``with`` block.

    Creates ``directory`` (and parents), takes the lock within ``timeout`` seconds, writes
    the holder record (process id, host, ``command``, start time) beside it and removes
    stale temporary files (:func:`remove_stale_temp_files`). Reentrant within a process:
    a nested ``output_lock`` on the same folder only counts.

    Parameters
    ----------
    directory : str or os.PathLike
        The output folder.
    command : str, optional
        The command line of this run, shown to a run that finds the folder locked.
    timeout : float
        Seconds to wait for a lock held by another process (``>= 0``).

    Yields
    ------
    list of pathlib.Path
        The stale temporary files removed when the lock was taken (empty when nested).

    Raises
    ------
    OutputLockedError
        If another process holds the lock after ``timeout`` seconds.
    OSError
        If the folder cannot be created or the lock file cannot be written.
    """
    from filelock import FileLock, Timeout

    if not timeout >= 0:
        raise ValueError(f"`timeout` must be >= 0 seconds; got {timeout!r}.")
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = directory.resolve()
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield []
        finally:
            _HELD[key][1] -= 1
        return
    lock = FileLock(str(key / LOCK_NAME))
    owner_path = key / (LOCK_NAME + ".json")
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        raise OutputLockedError(directory, _read_owner(owner_path, wait=1.0)) from None
    _HELD[key] = [lock, 1]
    try:
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        write_json_atomic({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                           "started": started}, owner_path)
        yield remove_stale_temp_files(key)
    finally:
        del _HELD[key]
        try:
            owner_path.unlink(missing_ok=True)
        finally:
            lock.release()
