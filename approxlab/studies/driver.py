"""The one run path of every study: config, checks, run record and timing, compute, report.

:func:`run` is what ``approxlab <study>`` does once the command line is parsed and checked
(:mod:`approxlab.cli`): unless ``--plot-only``, it builds the study's config from the options
(:attr:`~approxlab.studies.Study.configure`), runs the study's checks against the data and models,
computes every cell not yet saved (:func:`compute`, on :func:`~approxlab.studies.engine.run_steps`)
and records the run's wall time in ``timing.json``; then it writes the report from the saved files
only (:func:`~approxlab.studies.reporting.write_report`). A study declares none of this.

The command line around it: the lock of ``--out`` (:func:`locked_output`), an orderly stop on
``SIGINT``/``SIGTERM`` (:func:`orderly_stop`: the first signal unwinds through the runner, which
writes its tables; rerunning resumes), and one error line for what the user can fix (:func:`error_line`).

Public API::

    run(study, args) -> int
    compute(study, config, out, *, data_dir=None, cache_dir=None, device="cpu", scheduler=None,
            workers=None, progress=True, restart=False, run_info=None, **settings) -> {table: DataFrame}
    report(study, out) -> list[pathlib.Path]
    locked_output(args), orderly_stop(), Stopped, error_line(error, plot_only=False), one_line(text)
    missing_ancestor(path), discard_output(out, created=None), check_device(device)
"""

from __future__ import annotations

import contextlib
import errno
import pathlib
import re
import signal
import sys
import threading
import time

from ..errors import CheckpointError, CorruptResultsError, StudyError, UsageError
from .checks import exists
from .engine import runner
from .engine.lock import LOCK_NAME, OutputLockedError, output_lock
from .engine.record import append_timing
from .reporting.summary import write_report

__all__ = ["run", "compute", "report", "locked_output", "orderly_stop", "Stopped", "error_line", "one_line",
           "missing_ancestor", "discard_output", "check_device"]


def compute(study, config: dict, out, *, data_dir=None, cache_dir=None, device: str = "cpu", scheduler=None,
            workers=None, progress: bool = True, restart: bool = False, run_info: dict | None = None,
            **settings) -> dict:
    """Run (or resume) the cells of ``study`` for ``config`` into ``out``; return every table.

    ``settings``: the study's run settings (:attr:`~approxlab.studies.Study.settings`), handed with the
    data location and device to its steps' ``cells`` builders. See
    :func:`~approxlab.studies.engine.run_steps` for the rest.
    """
    settings = {"data_dir": None if data_dir is None else str(data_dir),
                "cache_dir": None if cache_dir is None else str(cache_dir), "device": device, **settings}
    steps = [(step, step.cells(config, settings)) for step in study.steps]
    return runner.run_steps(steps, out, config=config, run_info=run_info, scheduler=scheduler, workers=workers,
                            progress=progress, flush_every_seconds=study.flush_every_seconds, restart=restart,
                            grows=study.grows)


def report(study, out) -> list[pathlib.Path]:
    """Write the report of ``study`` (derived tables, figures, summary) from the saved files in ``out``."""
    return write_report(study, out)


def _check_executor(study, args) -> None:
    """``--scheduler``, ``--workers`` and ``--device`` where the study runs (:attr:`~approxlab.studies.Study.executors`)."""
    note = f": {study.executor_note}" if study.executor_note else ""
    for kind, option, value in (("scheduler", "--scheduler", getattr(args, "scheduler", None)),
                                ("local", "--workers", getattr(args, "workers", None))):
        if value is not None and kind not in study.executors:
            raise UsageError(option, f"not with this study{note}", repr(value))
    if args.device not in study.devices:
        raise UsageError("--device", f"{' or '.join(study.devices)} (where {study.name} runs)", repr(args.device))


def _run_info(study, args, config) -> dict:
    import torch

    info = {"command": getattr(args, "command", f"approxlab {study.name}"), "device": args.device,
            "scheduler": getattr(args, "scheduler", None), "workers": getattr(args, "workers", None),
            "torch": torch.__version__, "threads": torch.get_num_threads()}
    return {**info, **(study.run_info(args, config) if study.run_info is not None else {})}


def run(study, args) -> int:
    """``approxlab <study>``: compute (resumable) unless ``--plot-only``, then write the report; exit status 0."""
    _check_executor(study, args)
    out = pathlib.Path(args.out)
    if not args.plot_only:
        config = study.configure(args)
        if study.check is not None:
            study.check(args, config)
        info = _run_info(study, args, config)
        settings = study.settings(args) if study.settings is not None else {}
        start = time.perf_counter()
        compute(study, config, out, data_dir=args.data_dir, cache_dir=args.cache_dir, device=args.device,
                scheduler=getattr(args, "scheduler", None), workers=getattr(args, "workers", None),
                progress=args.progress, restart=args.restart, run_info=info, **settings)
        seconds = time.perf_counter() - start
        append_timing(out, {"command": info["command"], "wall_seconds": round(seconds, 1),
                            "workers": info["workers"], "threads": info["threads"],
                            "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
        print(f"{study.name}: computed in {seconds:.1f} s -> {out}")
    for path in report(study, out):
        print(f"{study.name}: wrote {path}")
    return 0


def check_device(device: str) -> str:
    """Return ``device`` if usable; :class:`StudyError` (clear message) if CUDA is missing."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise StudyError(
                "--device cuda was requested but CUDA is not available on this machine "
                f"(torch {torch.__version__}, torch.version.cuda={torch.version.cuda}); use --device cpu."
            )
    return device


class Stopped(KeyboardInterrupt):
    """The run was asked to stop by a signal (``SIGINT`` or ``SIGTERM``): ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def orderly_stop():
    """Turn ``SIGINT`` and ``SIGTERM`` into :class:`Stopped` (a ``KeyboardInterrupt``) for the block.

    The first signal stops the run like Ctrl-C: the exception unwinds through the runner, which
    writes its table in its ``finally``. Signals that follow are ignored until the block ends, so a
    second Ctrl-C or a supervisor's repeated ``SIGTERM`` cannot cut that write short (``SIGKILL``
    still can; the journal keeps the finished cells then). Outside the main thread (where Python
    cannot install handlers) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        for number in STOP_SIGNALS:
            signal.signal(number, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {number: signal.signal(number, stop) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG,
                      errno.EIO, errno.EFBIG, errno.ENOTDIR, errno.EISDIR, errno.EMFILE, errno.ENFILE, errno.ENOENT}
"""``OSError`` numbers that describe the machine (a full disk, a read-only or unreachable path), not
approxlab: reported as one error line. Any other ``OSError`` shows its traceback."""


def error_line(error: BaseException, *, plot_only: bool = False) -> str | None:
    """The one-line message of an error the user can act on, or None for a bug (shown with its traceback)."""
    if isinstance(error, (StudyError, CheckpointError)) or (
            isinstance(error, FileNotFoundError) and error.filename is None):
        return one_line(error)  # approxlab's own message (a missing results table, ...)
    if isinstance(error, CorruptResultsError):
        remedy = ("rerun without --plot-only to resume (damaged tables are refused) or with --restart to start over"
                  if plot_only else "pass --restart to discard the saved results, or a new --out directory")
        return one_line(f"{error}; {remedy}")
    if isinstance(error, OSError) and error.errno in ENVIRONMENT_ERRNOS:
        where = f" {str(error.filename)!r}" if error.filename else ""
        name = errno.errorcode.get(error.errno, str(error.errno))
        return (f"cannot write or read{where}: {error.strerror or error} ({name}); every cell finished before it "
                "is saved, nothing is half-written. Fix this and rerun the same command to resume.")
    return None


def one_line(text: str) -> str:
    """``text`` with its line breaks (and the blanks around them) made single spaces."""
    return re.sub(r"\s*[\r\n]+\s*", " ", str(text)).strip()


@contextlib.contextmanager
def locked_output(args):
    """Hold the lock of ``args.out`` (:func:`approxlab.studies.engine.output_lock`); a held lock is a :class:`UsageError`.

    With ``--plot-only`` and no such folder there is nothing to lock (the study reports it).
    """
    if args.plot_only and not pathlib.Path(args.out).is_dir():
        yield
        return
    try:
        with output_lock(args.out, command=getattr(args, "command", None)) as removed:
            for path in removed:
                print(f"approxlab: removed {path.name}, a temporary file left by an interrupted run",
                      file=sys.stderr)
            yield
    except OutputLockedError as error:
        raise UsageError("--out", "a folder no other run is writing to",
                         f"{str(args.out)!r} (locked by {error.describe_owner()})") from None


def missing_ancestor(path) -> pathlib.Path | None:
    """The outermost folder of ``path`` (itself included) that does not exist yet; None if ``path`` exists."""
    path = pathlib.Path(path)
    missing = None
    for folder in (path, *path.parents):
        if exists(folder):
            break
        missing = folder
    return missing


def discard_output(out, created=None) -> None:
    """Remove ``out`` if it holds nothing but its lock file (a run refused before writing anything),
    then its parents up to ``created`` (:func:`missing_ancestor` before the run) that are left empty."""
    out = pathlib.Path(out)
    if exists(out) and out.is_dir() and {p.name for p in out.iterdir()} <= {LOCK_NAME}:
        (out / LOCK_NAME).unlink(missing_ok=True)
        out.rmdir()
    if created is None or not (out == pathlib.Path(created) or pathlib.Path(created) in out.parents):
        return
    for folder in out.parents:
        if folder == pathlib.Path(created).parent or not exists(folder) or any(folder.iterdir()):
            break
        folder.rmdir()
