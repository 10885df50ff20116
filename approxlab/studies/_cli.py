"""The study command line shared by every study: option parsers, one-line errors, checks.

A user error on the command line is one line on stderr and exit status 2, in argparse's
form (no traceback; a bug in approxlab itself still shows its traceback)::

    approxlab figure1: error: --windows: at most 64 (the windows available at n=512), got 1000

Everything that can be checked is checked before a cell is computed:

* here, by :mod:`approxlab.cli` for every study: ``--out`` creatable and writable (then
  locked, :func:`approxlab._io.output_lock`), ``--data-dir`` given but missing,
  ``--cache-dir`` writable, ``--scheduler`` reachable (a short TCP connect);
* by each study's ``run`` through the helpers below once its grid is known: sequence
  lengths and windows against the corpus (:func:`check_windows`), ``--checkpoint`` and
  ``--layer`` against the supported models (:func:`check_model`), head indices against
  the model (:func:`check_heads`), ``num_features`` against the methods
  (:func:`check_num_features`).

Public API::

    UsageError(option, allowed, got)                # a StudyError; message "<option>: <allowed>, got <got>"
    str_list, int_list, positive_int, nonnegative_int, positive_float, Flatten   # argparse types/action
    output_dir(args) -> pathlib.Path                 # --out, else approxlab-results/<study>[-quick]
    check_common(args)                               # --out, --data-dir, --cache-dir, --scheduler
    locked_output(args)                              # context manager: the --out lock, one-line error
    restored_environ(names)                          # context manager: os.environ[names] restored after
    missing_ancestor(path) -> pathlib.Path | None    # the outermost folder of path a run would create
    discard_output(out, created=None)                # remove the folders created for a refused run
    corpus_tokens(data_dir, cache_dir) -> int
    model_heads(condition, checkpoint=None) -> int
    check_windows(args, ids_by_n, *, windows=None, n_option="--n")
    check_model(args, conditions, *, layer=None, encoder_only=False) -> {condition: ModelInfo}
    check_heads(option, heads, conditions, *, index=False, checkpoint=None)
    check_num_features(option, num_features, methods, lengths)
    load_plugins(argv)                               # --plugin MODULE, before the parser is built
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import functools
import os
import pathlib
import re
import signal
import socket
import sys
import threading
import traceback
import urllib.parse

from .._io import LOCK_NAME, OutputLockedError, output_lock
from ..errors import CheckpointError, CorruptResultsError
from . import default_output_dir
from .runner import StudyError

__all__ = [
    "UsageError",
    "str_list",
    "int_list",
    "positive_int",
    "nonnegative_int",
    "positive_float",
    "Flatten",
    "output_dir",
    "check_common",
    "check_output_dir",
    "path_option",
    "Stopped",
    "orderly_stop",
    "error_line",
    "check_option_pairs",
    "check_data_dir",
    "check_cache_dir",
    "check_scheduler",
    "locked_output",
    "restored_environ",
    "missing_ancestor",
    "discard_output",
    "corpus_tokens",
    "model_heads",
    "check_windows",
    "check_model",
    "check_heads",
    "check_num_features",
    "load_plugins",
]

SCHEDULER_TIMEOUT = 5.0
"""Seconds a ``--scheduler`` address gets to accept a TCP connection."""


class UsageError(StudyError):
    """A command-line value the study cannot use: ``"<option>: <allowed>, got <got>"``.

    The CLI prints it as ``approxlab <study>: error: <message>`` and exits with status 2.
    """

    def __init__(self, option: str, allowed: str, got):
        self.option = option
        super().__init__(f"{option}: {allowed}, got {got}")


# ---------------------------------------------------------------- option parsers


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


def positive_float(text: str) -> float:
    """A finite number > 0 (argparse ``type=``)."""
    return _number(text, float, "a finite number > 0", lambda v: 0 < v < float("inf"))


def probability(text: str) -> float:
    """A number in [0, 1) (argparse ``type=``), e.g. a dropout rate."""
    return _number(text, float, "a number in [0, 1)", lambda v: 0 <= v < 1)


class Flatten(argparse.Action):
    """``--n 512 1024`` and ``--n 512,1024`` both give ``[512, 1024]`` (with ``nargs="+"``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [x for chunk in values for x in chunk])


# ------------------------------------------------------------ checks of every study


def path_option(text: str) -> pathlib.Path:
    """A file or folder path (argparse ``type=``): an empty one would silently mean the current folder."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError(f"a file or folder path, got {text!r} (an empty path is the current folder)")
    return pathlib.Path(text)


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


PLOT_ONLY_OPTIONS = ("out", "quick", "progress", "plot_only", "plugin")
"""The options that mean something with ``--plot-only``: which folder to redraw, progress, and the
plugins whose methods the figures and summary describe."""


def check_option_pairs(args, parser: argparse.ArgumentParser) -> None:
    """Options that contradict each other, or that would be silently ignored, are a :class:`UsageError`.

    * an empty string for any option (``--checkpoint ""``: not a name; paths use :func:`path_option`);
    * ``--plot-only`` with ``--restart`` (one redraws the saved results, the other discards them);
    * ``--plot-only`` with any option that only shapes the computation (``--n``, ``--workers``,
      ``--device``, ...): the figure is redrawn from the saved results and their ``config.json``.
    """
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    for dest, action in actions.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.strip():
            raise UsageError(action.option_strings[0], "a non-empty value", repr(value))
    if not getattr(args, "plot_only", False):
        return
    if getattr(args, "restart", False):
        raise UsageError("--restart", "not with --plot-only (it discards the saved results that --plot-only redraws; "
                                      "use one of the two)", "both")
    for dest, action in actions.items():
        if dest in PLOT_ONLY_OPTIONS or dest == "restart" or action.default == argparse.SUPPRESS:
            continue
        if getattr(args, dest, None) != action.default:
            raise UsageError(action.option_strings[0], "not with --plot-only (the figure is redrawn from the saved "
                                                       "results and their config.json; drop one of the two)",
                             repr(getattr(args, dest)))


def output_dir(args) -> pathlib.Path:
    """``--out``, else :func:`~approxlab.studies.default_output_dir` of ``args.study`` (and ``--quick``)."""
    if args.out is not None:
        return pathlib.Path(args.out)
    return default_output_dir(args.study, quick=args.quick)


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def _writable_folder(option: str, path: pathlib.Path) -> pathlib.Path:
    """Create ``path`` (and parents) unless it exists; a :class:`UsageError` if this user cannot write there."""
    allowed = "a folder this user can create and write to"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(option, allowed, f"{str(path)!r} (not a folder)") from None
    except OSError as error:  # no permission, a file among the parents, a name too long, ...
        raise UsageError(option, allowed, f"{str(path)!r} ({_reason(error)})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(option, allowed, f"{str(path)!r} (not writable)")
    return path


def exists(path) -> bool:
    """``path.exists()``, False where the path cannot even be looked up (a name too long, ...)."""
    try:
        return pathlib.Path(path).exists()
    except OSError:
        return False


def one_line(text: str) -> str:
    """``text`` with its line breaks (and the blanks around them) made single spaces."""
    return re.sub(r"\s*[\r\n]+\s*", " ", str(text)).strip()


def check_output_dir(out, *, plot_only: bool = False) -> pathlib.Path:
    """``out`` exists or can be created, and this user can write to it (``--out``; not with ``plot_only``)."""
    if plot_only:  # nothing is created; a folder without results is the study's one-line error
        return pathlib.Path(out)
    return _writable_folder("--out", pathlib.Path(out))


def _corpus_error(error: Exception) -> StudyError:
    """The data layer's message (it names ``--data-dir`` or ``$APPROXLAB_DATA``) as one CLI line."""
    return StudyError(" ".join(str(error).split()))


def check_data_dir(data_dir, cache_dir=None) -> None:
    """A given ``--data-dir`` must hold the corpus: it is never skipped for another location."""
    if data_dir is None:
        return
    from ..data import CorpusNotFoundError, find_wikitext

    try:
        find_wikitext(data_dir, cache_dir=cache_dir)
    except CorpusNotFoundError as error:
        raise _corpus_error(error) from None


def check_cache_dir(cache_dir) -> None:
    """A given ``--cache-dir``, else a set ``$APPROXLAB_CACHE``, must be a folder this user can create and write to."""
    if cache_dir is not None:
        _writable_folder("--cache-dir", pathlib.Path(cache_dir).expanduser())
    elif os.environ.get(CACHE_VARIABLE):
        _writable_folder(f"${CACHE_VARIABLE}", pathlib.Path(os.environ[CACHE_VARIABLE]).expanduser())


CACHE_VARIABLE = "APPROXLAB_CACHE"
"""The environment variable of the cache root (see :func:`approxlab.data.wikitext.default_cache_dir`)."""


def check_scheduler(address, timeout: float = SCHEDULER_TIMEOUT):
    """Return ``address`` as a URL (``tcp://`` added) once a Dask scheduler answered there.

    A TCP connect, then Dask's ``identity`` call, each within ``timeout`` seconds (a Dask
    client would otherwise wait 30 s or more, or forever on a port where something else listens).

    Addresses of other protocols (``inproc://``, ``ucx://``, ...) are returned unchecked.
    """
    if address is None:
        return None
    url = address if "://" in address else f"tcp://{address}"
    parts = urllib.parse.urlsplit(url)
    allowed = "the address of a running Dask scheduler, e.g. tcp://host:8786"
    if parts.scheme not in ("tcp", "tls"):
        return url
    try:
        host, port = parts.hostname, parts.port or 8786
    except ValueError:  # a port that is not a number
        host = port = None
    if not host:
        raise UsageError("--scheduler", allowed, repr(address))
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as error:
        reason = "no answer" if isinstance(error, TimeoutError) else _reason(error)
        raise UsageError("--scheduler", allowed, f"{address!r} ({reason} within {timeout:g} s)") from None
    try:  # something listens there; is it a Dask scheduler?
        kind = asyncio.run(_identity(url, timeout)).get("type")
    except (OSError, asyncio.TimeoutError, TimeoutError) as error:
        kind = f"{type(error).__name__}"
    if kind != "Scheduler":
        raise UsageError("--scheduler", allowed, f"{address!r} (no Dask scheduler answered within {timeout:g} s)")
    return url


async def _identity(url: str, timeout: float) -> dict:
    """The ``identity`` of the Dask server at ``url`` (``{"type": "Scheduler", ...}``), within ``timeout`` s."""
    from distributed.core import rpc

    remote = rpc(url, timeout=timeout)
    try:
        return await asyncio.wait_for(remote.identity(), timeout)
    finally:
        await remote.close_rpc()


def check_common(args) -> None:
    """The checks of every study (``args.out`` already resolved); ``args.scheduler`` normalised."""
    check_output_dir(args.out, plot_only=args.plot_only)
    if not args.plot_only:
        check_data_dir(args.data_dir, args.cache_dir)
        check_cache_dir(args.cache_dir)
        args.scheduler = check_scheduler(args.scheduler)


@contextlib.contextmanager
def locked_output(args):
    """Hold the lock of ``args.out`` (:func:`approxlab._io.output_lock`); a held lock is a :class:`UsageError`.

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


@contextlib.contextmanager
def restored_environ(names):
    """The variables ``names`` of ``os.environ`` as they were before the block (set or unset)."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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


# --------------------------------------------------------- checks against the data


@functools.lru_cache(maxsize=4)
def _token_count(data_dir, cache_dir) -> int:
    from ..data import CorpusChecksumError, CorpusNotFoundError, wikitext_token_ids
    from ..tasks.mlm import load_tokenizer

    try:
        return int(wikitext_token_ids(load_tokenizer(), data_dir=data_dir, cache_dir=cache_dir).numel())
    except (CorpusNotFoundError, CorpusChecksumError) as error:
        raise _corpus_error(error) from None


def corpus_tokens(data_dir=None, cache_dir=None) -> int:
    """Tokens of the WikiText-2 test split (273,178 with the MiniLM/BERT uncased tokenizer).

    A missing or corrupt corpus is a :class:`StudyError` (the data layer's message, which
    names ``--data-dir`` or ``$APPROXLAB_DATA``).
    """
    as_key = (lambda p: None if p is None else str(p))
    return _token_count(as_key(data_dir), as_key(cache_dir))


@functools.lru_cache(maxsize=8)
def model_heads(condition: str, checkpoint=None) -> int:
    """Attention heads per layer of the model of ``condition`` (see :func:`approxlab.data.load_model`)."""
    from ..data import describe_model

    return describe_model(condition, checkpoint=checkpoint).num_heads


def check_model(args, conditions, *, layer=None, encoder_only: bool = False) -> dict:
    """``--checkpoint`` (and ``layer``, from ``--layer``) name a usable model for every condition.

    A missing, broken or unsupported checkpoint (tokenizer and weights included: see
    :func:`approxlab.data.describe_model` with ``verify=True``) is the data layer's one-line
    :class:`~approxlab.errors.CheckpointError` said about ``--checkpoint``; ``encoder_only``
    refuses a causal decoder. Returns ``{condition: ModelInfo}``.
    """
    from huggingface_hub.utils import logging as hub_logging

    from ..data import CheckpointError, describe_model

    infos = {}
    for condition in conditions:
        level = hub_logging.get_verbosity()
        hub_logging.set_verbosity_error()  # its retry warnings would add lines before the one error line
        try:
            info = describe_model(condition, checkpoint=args.checkpoint, cache_dir=args.cache_dir, verify=True)
        except CheckpointError as error:
            raise UsageError("--checkpoint", error.allowed, error.got) from None
        finally:
            hub_logging.set_verbosity(level)
        if encoder_only and info.causal:
            raise UsageError("--checkpoint", "a bidirectional encoder (bert, roberta, distilbert) for this study "
                             "of non-causal attention", f"{args.checkpoint!r} (a causal {info.model_type} model)")
        if layer is not None and not 0 <= layer < info.num_layers:
            raise UsageError("--layer", f"a layer index in 0..{info.num_layers - 1} (the {condition} model "
                             f"{info.checkpoint} has {info.num_layers} layers)", layer)
        infos[condition] = info
    return infos


def check_windows(args, ids_by_n: dict, *, windows: int | None = None, n_option: str = "--n") -> None:
    """Every window ``ids_by_n[n]`` (indices of disjoint ``n``-token windows) lies in the corpus.

    ``windows``: the count asked for (``--windows``); the study drew ``ids_by_n[n]`` from
    its pool, so fewer ids than asked means the pool is too small.
    """
    tokens = corpus_tokens(args.data_dir, args.cache_dir)
    for n, ids in ids_by_n.items():
        ids = list(ids)
        if n > tokens:
            raise UsageError(n_option, f"at most {tokens:,} tokens (the WikiText-2 test split)", f"{n:,}")
        if windows is not None and len(ids) < windows:
            raise UsageError("--windows", f"at most {len(ids)} (the windows available at n={n})", windows)
        last = max(ids, default=0)
        if (last + 1) * n > tokens:
            raise UsageError(n_option, f"at most {tokens // (last + 1):,} tokens so that {last + 1} windows fit in "
                                       f"the corpus's {tokens:,}", f"{n:,}")


def check_heads(option: str, heads: int, conditions, *, index: bool = False, checkpoint=None) -> None:
    """``heads`` heads (``index``: a head index) exist in the model of every condition."""
    for condition in conditions:
        count = model_heads(condition, None if checkpoint is None else str(checkpoint))
        if index and not 0 <= heads < count:
            raise UsageError(option, f"a head index in 0..{count - 1} (the {condition} model has {count} heads)", heads)
        if not index and not 1 <= heads <= count:
            raise UsageError(option, f"between 1 and {count} (the {condition} model has {count} heads)", heads)


def check_num_features(option: str, num_features: int, methods, lengths) -> None:
    """``num_features`` is allowed for every method at every length (``MethodSpec.max_features``)."""
    from ..methods import get

    for method in methods:
        for n in lengths:
            limit = get(method).max_features(n)
            if num_features > limit:
                raise UsageError(option, f"at most {limit} for {method} at n={n}", num_features)


# ------------------------------------------------------------------ plugins


def load_plugins(argv) -> list[str]:
    """Import every ``--plugin MODULE`` of ``argv`` (:func:`approxlab.methods.load_plugin`), in order.

    Done before the study's parser is built, so its options (``choices=available()``) and
    ``--methods`` know the plugins' methods. A module that cannot be imported, or that raises
    while it registers its methods, is a :class:`UsageError` naming it, the error and where it
    happened (one line, no traceback).
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
                                 "folder) that registers methods", f"{module!r} ({error})") from None
            raise UsageError("--plugin", "a module that imports and registers its methods",
                             f"{module!r} ({_failure(error)})") from None
        except Exception as error:  # noqa: BLE001 - the user's module: one line naming it, not a traceback
            raise UsageError("--plugin", "a module that imports and registers its methods",
                             f"{module!r} ({_failure(error)})") from None
    return modules


def _failure(error: BaseException) -> str:
    """``Type: message at file:line`` of the innermost frame of ``error``."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__name__}: {error}{where}"
