"""Transitional: the shared command-line helpers, now in options, checks, driver and registry."""
from ..errors import StudyError, UsageError  # noqa: F401
from .checks import *  # noqa: F401,F403
from .checks import _token_count  # noqa: F401
from .driver import Stopped, discard_output, error_line, locked_output, missing_ancestor, one_line, orderly_stop  # noqa: F401
from .engine.environment import restored_environ  # noqa: F401
from .options import *  # noqa: F401,F403
from .registry import load_plugins  # noqa: F401
