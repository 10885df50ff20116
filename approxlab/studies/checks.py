"""The checks a study's run passes before a cell is computed, each a one-line error naming the option.

* of every run (:func:`check_common`): ``--out`` creatable and writable, a given ``--data-dir``
  holding the corpus, ``--cache-dir`` writable, ``--scheduler`` answering as a Dask scheduler (a short
  TCP connect, then Dask's ``identity`` call);
* against the data and models, once a study's grid is known (its :attr:`~approxlab.studies.Study.check`):
  sequence lengths and windows against the corpus (:func:`check_windows`), ``--checkpoint`` and
  ``--layer`` against the supported models (:func:`check_model`), head indices against the model
  (:func:`check_heads`), ``num_features`` against the methods (:func:`check_num_features`).

Every failure is a :class:`~approxlab.errors.UsageError` (``"<option>: <allowed>, got <got>"``) or a
:class:`~approxlab.errors.StudyError` with the data layer's one-line message.

Public API::

    check_common(args), check_output_dir(out, plot_only=False), check_data_dir(data_dir, cache_dir=None)
    check_cache_dir(cache_dir), check_scheduler(address, timeout=SCHEDULER_TIMEOUT)
    corpus_tokens(data_dir=None, cache_dir=None) -> int, model_heads(condition, checkpoint=None) -> int
    check_model(args, conditions, *, layer=None, encoder_only=False) -> {condition: ModelInfo}
    check_windows(args, ids_by_n, *, windows=None, n_option="--n")
    check_heads(option, heads, conditions, *, index=False, checkpoint=None)
    check_num_features(option, num_features, methods, lengths)
    ratio_budgets(ratios, context, option) -> {budget: ratio}     # kvpress's kept counts, distinct
    exists(path) -> bool
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pathlib
import socket
import urllib.parse

from ..errors import StudyError, UsageError

__all__ = ["SCHEDULER_TIMEOUT", "check_common", "check_output_dir", "check_data_dir", "check_cache_dir",
           "check_scheduler", "corpus_tokens", "model_heads", "check_model", "check_windows", "check_heads",
           "check_num_features", "ratio_budgets", "exists", "CACHE_VARIABLE"]

SCHEDULER_TIMEOUT = 5.0
"""Seconds a ``--scheduler`` address gets to accept a TCP connection."""


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
    from ..data import CheckpointError, describe_model

    infos = {}
    for condition in conditions:
        try:
            with _quiet_loading():
                info = describe_model(condition, checkpoint=args.checkpoint, cache_dir=args.cache_dir)
                if encoder_only and info.causal:  # from the config alone: no weights loaded for a refusal
                    raise UsageError("--checkpoint", "a bidirectional encoder (bert, roberta, distilbert) for this "
                                     "study of non-causal attention",
                                     f"{args.checkpoint!r} (a causal {info.model_type} model)")
                if layer is not None and not 0 <= layer < info.num_layers:
                    raise UsageError("--layer", f"a layer index in 0..{info.num_layers - 1} (the {condition} model "
                                     f"{info.checkpoint} has {info.num_layers} layers)", layer)
                info = describe_model(condition, checkpoint=args.checkpoint, cache_dir=args.cache_dir, verify=True)
        except CheckpointError as error:
            raise UsageError("--checkpoint", error.allowed, error.got) from None
        infos[condition] = info
    return infos


@contextlib.contextmanager
def _quiet_loading():
    """huggingface_hub's and transformers' log records below errors off for the block (restored after): their
    retry warnings and loading reports would print lines before the one error line."""
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    levels = hub_logging.get_verbosity(), hf_logging.get_verbosity()
    hub_logging.set_verbosity_error()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hub_logging.set_verbosity(levels[0])
        hf_logging.set_verbosity(levels[1])


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


def check_num_features(option: str, num_features: int, methods, lengths, *, at_most_n: bool = False) -> None:
    """``num_features`` is allowed for every method at every length (``MethodSpec.max_features``).

    The rule of every study: a number of features it cannot compute is refused in one line, never
    lowered, so the d in ``config.json`` and in the summary is the d computed. ``at_most_n``: the
    study hands ``min(d, n)`` to its models (:class:`~approxlab.training.TinyEncoder`, the bench's
    cells), so ``d`` must also be at most ``n`` for every method whose ``features`` are not
    ``"ignored"``.

    Examples
    --------
    >>> check_num_features("--num-features", 64, ["nystromformer"], [64, 128])
    >>> check_num_features("--num-features", 100, ["skyformer"], [64], at_most_n=True)
    Traceback (most recent call last):
    ...
    approxlab.errors.UsageError: --num-features: at most 64 for skyformer at n=64 (this study computes ...), got 100
    """
    from ..methods import get

    for method in methods:
        spec = get(method)
        if at_most_n and spec.features.startswith("ignored"):
            continue  # d is not used: min(d, n) changes nothing
        for n in lengths:
            limit = spec.max_features(n)
            why = ""
            if at_most_n and n < limit:
                limit, why = n, " (this study computes at most n features; a larger d is refused, not lowered)"
            if num_features > limit:
                raise UsageError(option, f"at most {limit} for {method} at n={n}{why}", num_features)


def ratio_budgets(ratios, context: int, option: str) -> dict[int, float]:
    """``{budget: ratio}``: each compression ratio's kept count of a context of ``context`` tokens
    (:func:`approxlab.cache.kept_count`, kvpress's rounding: max(1, int(n_c (1 - r)))), in increasing budget.

    Raises
    ------
    UsageError
        Two ratios that keep the same count of this context, naming ``option``.

    Examples
    --------
    >>> ratio_budgets([0.875, 0.5, 0.75], 1536, "--ratios")
    {192: 0.875, 384: 0.75, 768: 0.5}
    """
    from ..cache import kept_count

    budgets = {}
    for ratio in sorted(ratios, reverse=True):
        budget = kept_count(ratio, context)
        if budget in budgets:
            raise UsageError(option, f"ratios that keep different numbers of the {context} context tokens "
                                     f"({budgets[budget]} and {ratio} both keep {budget})", list(ratios))
        budgets[budget] = float(ratio)
    return budgets
