"""Domain errors and warnings raised by approxlab.

Every numerical failure mode the library can detect is one of these; nothing
fails silently (STYLE.md, convention 4).
"""

from __future__ import annotations

__all__ = [
    "NotPSDError",
    "NumericalWarning",
    "ConvergenceWarning",
    "SingularMatrixWarning",
    "CacheWarning",
    "PluginWarning",
    "CorpusChecksumError",
    "CorpusNotFoundError",
    "CachePathError",
    "CheckpointError",
    "CorruptResultsError",
]


class NotPSDError(ValueError):
    """A matrix that must be positive semidefinite is not (to the stated tolerance)."""


class NumericalWarning(RuntimeWarning):
    """A result is valid but numerically delicate (near-singular core, lost precision)."""


class SingularMatrixWarning(NumericalWarning):
    """A matrix is numerically singular: its condition number is reported as ``inf``."""


class ConvergenceWarning(RuntimeWarning):
    """An iteration stopped at its cap before reaching its tolerance.

    Attributes
    ----------
    residual : float
        The last residual (largest over the batch) when the iteration stopped.
    """

    def __init__(self, message: str, residual: float = float("nan")):
        super().__init__(message)
        self.residual = residual


class CacheWarning(RuntimeWarning):
    """A cache file was unreadable, truncated, failed its checksum or holds another key.

    The file is ignored and its content recomputed (and rewritten); it is never used.
    """


class PluginWarning(RuntimeWarning):
    """An installed plugin (an ``approxlab.methods`` entry point) failed to load; its methods are missing."""


class CorpusChecksumError(ValueError):
    """The corpus file found is not the expected WikiText-2 test split (sha256 mismatch)."""


class CorpusNotFoundError(FileNotFoundError):
    """The corpus is not where the user said it is (``data_dir``/``--data-dir``, ``$APPROXLAB_DATA``)."""


class CachePathError(OSError):
    """Something other than a file (a directory) is where a cache file must go."""


class CheckpointError(OSError, ValueError):
    """A model checkpoint approxlab cannot use: missing, unreachable, foreign or broken.

    Raised before any computation, with one line naming the parameter (``checkpoint``), what
    is allowed and what came in. Both an ``OSError`` (a file or download problem) and a
    ``ValueError`` (a checkpoint of the wrong kind).

    Attributes
    ----------
    allowed, got : str
        The two halves of the message, so the command line can say them about ``--checkpoint``.
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
    """

    def __init__(self, path, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{self.path!r} is not a readable approxlab result file: {reason}")
