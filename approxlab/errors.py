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
