"""Domain errors and warnings raised by approxlab.

Every numerical failure mode the library can detect is one of these; nothing
fails silently.
"""

from __future__ import annotations

__all__ = [
    "NotPSDError",
    "NumericalWarning",
    "ConvergenceWarning",
    "SingularMatrixWarning",
    "CacheWarning",
    "PluginWarning",
    "RepeatedKVWarning",
    "RopeWarning",
    "CorpusChecksumError",
    "CorpusNotFoundError",
    "CachePathError",
    "CheckpointError",
    "CorruptResultsError",
    "MethodResultError",
    "StudyError",
    "UsageError",
]


class NotPSDError(ValueError):
    """A matrix that must be positive semidefinite is not (to the stated tolerance).

    Examples
    --------
    >>> import torch
    >>> from approxlab.errors import NotPSDError
    >>> from approxlab.leverage import ridge_leverage_scores
    >>> K = torch.tensor([[1.0, 0.0], [0.0, -1.0]], dtype=torch.float64)
    >>> try:
    ...     ridge_leverage_scores(K, lam=0.1)
    ... except NotPSDError as error:
    ...     print(type(error).__name__, isinstance(error, ValueError))
    NotPSDError True
    """


class NumericalWarning(RuntimeWarning):
    """A result is valid but numerically delicate (near-singular core, lost precision).

    Examples
    --------
    >>> import warnings
    >>> from approxlab.errors import NumericalWarning, SingularMatrixWarning
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", NumericalWarning)  # make every numerical warning an error
    ...     try:
    ...         warnings.warn(SingularMatrixWarning("condition number is inf"))
    ...     except NumericalWarning as caught:
    ...         print(type(caught).__name__)
    SingularMatrixWarning
    """


class SingularMatrixWarning(NumericalWarning):
    """A matrix is numerically singular: its condition number is reported as ``inf``.

    Examples
    --------
    >>> from approxlab.errors import NumericalWarning, SingularMatrixWarning
    >>> issubclass(SingularMatrixWarning, NumericalWarning), issubclass(SingularMatrixWarning, RuntimeWarning)
    (True, True)
    """


class ConvergenceWarning(RuntimeWarning):
    """An iteration stopped at its cap before reaching its tolerance.

    Attributes
    ----------
    residual : float
        The last residual (largest over the batch) when the iteration stopped.

    Examples
    --------
    >>> import warnings
    >>> import torch
    >>> from approxlab.errors import ConvergenceWarning
    >>> from approxlab.linalg.pinv import iterative_pinv
    >>> m = torch.tensor([[1.0, 0.9], [0.9, 1.0]], dtype=torch.float64)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     result = iterative_pinv(m, num_iter=1, tol=1e-12)  # one step is not enough
    >>> warning = caught[0].message
    >>> type(warning).__name__, bool(warning.residual > 1e-12)
    ('ConvergenceWarning', True)
    """

    def __init__(self, message: str, residual: float = float("nan")):
        super().__init__(message)
        self.residual = residual


class CacheWarning(RuntimeWarning):
    """A cache file was unreadable, truncated, failed its checksum or holds another key.

    The file is ignored and its content recomputed (and rewritten); it is never used.

    Examples
    --------
    >>> import tempfile, warnings
    >>> from approxlab.data import QKVCache, QKVKey
    >>> from approxlab.errors import CacheWarning
    >>> key = QKVKey(checkpoint="model", condition="pretrained", seed=None, mode="layer", layer=0, n=8,
    ...              window=0, dtype="float32", corpus="sha")
    >>> with tempfile.TemporaryDirectory() as root:
    ...     cache = QKVCache(root)
    ...     path = cache.path(key)
    ...     path.parent.mkdir(parents=True)
    ...     _ = path.write_bytes(b"not a safetensors file")
    ...     with warnings.catch_warnings(record=True) as caught:
    ...         warnings.simplefilter("always")
    ...         print(cache.load(key))  # ignored, to be recomputed
    None
    >>> type(caught[0].message).__name__
    'CacheWarning'
    """


class PluginWarning(RuntimeWarning):
    """An installed plugin (an ``approxlab.methods`` or ``approxlab.studies`` entry point) failed to load;
    its methods or study are missing, everything else is available.

    Examples
    --------
    >>> import warnings
    >>> from approxlab.errors import PluginWarning
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", PluginWarning)  # silence a broken third-party plugin
    ...     warnings.warn(PluginWarning("the entry point 'mine' failed to load"))
    >>> issubclass(PluginWarning, RuntimeWarning)
    True
    """

    @classmethod
    def failed(cls, entry, group: str, error: BaseException, missing: str) -> "PluginWarning":
        """The warning for entry point ``entry`` of ``group`` that raised ``error``; ``missing`` says
        what is not available because of it (``"its methods are not available, every other method is"``)."""
        source = getattr(getattr(entry, "dist", None), "name", None)
        return cls(f"approxlab: the entry point {entry.name!r} = {entry.value!r}"
                   + (f" of distribution {source!r}" if source else "")
                   + f" in group {group!r} failed to load ({type(error).__name__}: {error}); {missing}.")


class RepeatedKVWarning(UserWarning):
    """Keys and values repeated to the query heads reached a cache policy that keeps a set per KV head.

    Grouped-query attention's K/V, repeated to the ``H`` query heads (transformers' ``repeat_kv``;
    :func:`approxlab.data.get_qkv` by default), look to :func:`approxlab.kv_cache_attention` like ``H``
    independent heads: a policy then keeps ``b`` tokens per *query* head, up to ``g * b`` distinct tokens per
    KV head (``g`` query heads per KV head), not the ``b`` a decoder's cache holds. Pass the KV heads
    (``get_qkv(..., grouped=True)``, or ``k[..., ::g, :, :]``) for one set per KV head, or
    ``grouping="query-head"`` to keep a set per query head on purpose.

    Examples
    --------
    >>> import warnings, torch, approxlab
    >>> from approxlab.errors import RepeatedKVWarning
    >>> g = torch.Generator().manual_seed(0)
    >>> q = torch.randn(1, 6, 32, 8, generator=g, dtype=torch.float64)  # 6 query heads ...
    >>> k, v = (torch.randn(1, 2, 32, 8, generator=g, dtype=torch.float64) for _ in range(2))  # ... on 2 KV heads
    >>> repeated = k.repeat_interleave(3, dim=-3), v.repeat_interleave(3, dim=-3)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = approxlab.kv_cache_attention("h2o", q, *repeated, context_length=16, num_features=4)
    >>> type(caught[0].message).__name__
    'RepeatedKVWarning'
    >>> approxlab.kv_cache_attention("h2o", q, k, v, context_length=16, num_features=4).info["kept"].shape
    torch.Size([1, 2, 4])
    """


class RopeWarning(UserWarning):
    """A RoPE-aware cache policy (one that declares ``inputs=("rope_base",)``: expected-attention, CAP,
    leverage-score, Compactor) ran without the model's rotary frequencies.

    Without ``rope_frequencies`` (or ``rope_base``) the policy reads the keys and queries as un-rotated, right
    only for a model without RoPE; on post-RoPE keys (a Llama, SmolLM2, Qwen or Gemma layer) its scores are
    computed in the wrong frame. Pass ``rope_frequencies=`` (the layer's ``inv_freq``, ``(p // 2,)``) or
    ``rope_base=`` (``rope_theta``); ``rope_frequencies=None`` states that the keys carry no RoPE.
    :func:`approxlab.patch_attention` supplies the model's own.

    Examples
    --------
    >>> import warnings, torch, approxlab
    >>> from approxlab.errors import RopeWarning
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = approxlab.kv_cache_attention("cap", q, k, v, context_length=16, num_features=4)
    >>> [type(w.message).__name__ for w in caught]
    ['RopeWarning']
    >>> _ = approxlab.kv_cache_attention("cap", q, k, v, context_length=16, num_features=4, rope_frequencies=None)
    """


class CorpusChecksumError(ValueError):
    """The corpus file found is not the expected WikiText-2 test split (sha256 mismatch).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from approxlab.data import load_wikitext
    >>> from approxlab.errors import CorpusChecksumError
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     corpus = pathlib.Path(folder) / "wiki.test.raw"
    ...     _ = corpus.write_text("not the WikiText-2 test split")
    ...     try:
    ...         load_wikitext(corpus)
    ...     except CorpusChecksumError as error:
    ...         print(type(error).__name__)
    CorpusChecksumError
    """


class CorpusNotFoundError(FileNotFoundError):
    """The corpus is not where the user said it is (``data_dir``/``--data-dir``, ``$APPROXLAB_DATA``).

    Examples
    --------
    >>> from approxlab.data import find_wikitext
    >>> from approxlab.errors import CorpusNotFoundError
    >>> try:
    ...     find_wikitext("/no/such/folder")
    ... except CorpusNotFoundError as error:
    ...     print(str(error))
    `data_dir` (CLI: --data-dir) must be ...; got '/no/such/folder', which does not exist.
    """


class CachePathError(OSError):
    """Something other than a file (a directory) is where a cache file must go.

    Examples
    --------
    >>> import tempfile
    >>> from approxlab.data import QKVCache, QKVKey
    >>> from approxlab.errors import CachePathError
    >>> key = QKVKey(checkpoint="model", condition="pretrained", seed=None, mode="layer", layer=0, n=8,
    ...              window=0, dtype="float32", corpus="sha")
    >>> with tempfile.TemporaryDirectory() as root:
    ...     cache = QKVCache(root)
    ...     cache.path(key).mkdir(parents=True)  # a folder where the cache file must go
    ...     try:
    ...         cache.load(key)
    ...     except CachePathError as error:
    ...         print(type(error).__name__, isinstance(error, OSError))
    CachePathError True
    """


class CheckpointError(OSError, ValueError):
    """A model checkpoint approxlab cannot use: missing, unreachable, foreign or broken.

    Raised before any computation, with one line naming the parameter (``checkpoint``), what
    is allowed and what came in. Both an ``OSError`` (a file or download problem) and a
    ``ValueError`` (a checkpoint of the wrong kind).

    Attributes
    ----------
    allowed, got : str
        The two halves of the message, so the command line can say them about ``--checkpoint``.

    Examples
    --------
    >>> from approxlab.errors import CheckpointError
    >>> error = CheckpointError("an existing local folder", "'/no/such/folder', which does not exist")
    >>> print(error)
    `checkpoint` must be an existing local folder; got '/no/such/folder', which does not exist.
    >>> isinstance(error, OSError) and isinstance(error, ValueError)
    True
    """

    def __init__(self, allowed: str, got: str, *, name: str = "checkpoint"):
        self.allowed = allowed
        self.got = got
        super().__init__(f"`{name}` must be {allowed}; got {got}.")


class CorruptResultsError(ValueError):
    """A saved results table or ``config.json`` cannot be read as one: empty, binary, cut short,
    of another study, or not a file. Nothing is computed from it; the message names the file
    and what is wrong with it.

    Attributes
    ----------
    path : str
        The file.
    reason : str
        What is wrong, e.g. ``"it is empty (0 bytes)"``.

    Examples
    --------
    >>> from approxlab.errors import CorruptResultsError
    >>> error = CorruptResultsError("results.csv", "it is empty (0 bytes)")
    >>> print(error)
    'results.csv' is not a readable approxlab result file: it is empty (0 bytes)
    >>> error.reason
    'it is empty (0 bytes)'
    """

    def __init__(self, path, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{self.path!r} is not a readable approxlab result file: {reason}")


class MethodResultError(TypeError, ValueError):
    """A method's function -- or its ``draw``, ``max_features`` or operator -- returned what approxlab
    cannot use: not an ``Approximation`` or tensor, a tensor or operator of the wrong shape, dtype
    or device, no operator where the evaluation asked for needs one, a draw that is not a dict of
    tensors, a feature limit that is not an integer >= 1.

    Raised by :func:`approxlab.approximate` and :func:`approxlab.methods.draw` after the call, with
    a message naming the method, what it must return and what it returned. Both a ``TypeError``
    and a ``ValueError`` (a result of the wrong kind or of the wrong shape).

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.errors import MethodResultError
    >>> from approxlab.methods import register, unregister
    >>> @register("half-output", target="softmax", features="ignored", randomized=False)
    ... def half_output(q, k, v, *, num_features, generator=None):
    ...     return v[..., :1, :]  # one row, where every query needs one
    >>> q = k = v = torch.ones(1, 4, 2, dtype=torch.float64)
    >>> try:
    ...     approxlab.approximate("half-output", q, k, v, num_features=1)
    ... except MethodResultError as error:
    ...     print(error)
    method 'half-output' must return an output of shape (*batch, n, p_v) = (1, 4, 2); got (1, 1, 2).
    >>> _ = unregister("half-output")
    """


class StudyError(RuntimeError):
    """A study cannot run as asked: saved results of another configuration, a missing device, a
    corpus too small for the grid, an option value the study cannot use.

    ``approxlab <study>`` prints its message as one line, without a traceback, and exits with
    status 2.

    Examples
    --------
    >>> from approxlab.errors import StudyError
    >>> print(StudyError("--device cuda was requested but CUDA is not available"))
    --device cuda was requested but CUDA is not available
    """


class UsageError(StudyError):
    """A command-line value a study cannot use: the message is ``"<option>: <allowed>, got <got>"``.

    Attributes
    ----------
    option : str
        The option (``"--windows"``) or environment variable (``"$OMP_NUM_THREADS"``).

    Examples
    --------
    >>> from approxlab.errors import UsageError
    >>> error = UsageError("--windows", "at most 64 (the windows available at n=512)", 1000)
    >>> print(error)
    --windows: at most 64 (the windows available at n=512), got 1000
    >>> error.option
    '--windows'
    """

    def __init__(self, option: str, allowed: str, got):
        self.option = option
        super().__init__(f"{option}: {allowed}, got {got}")
