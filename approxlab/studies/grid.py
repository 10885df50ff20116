"""A study's grid: its declared defaults, the options that override them, checked in one place.

Public API::

    override_grid(defaults, overrides, *, check_method) -> dict
"""

from __future__ import annotations

from .runner import StudyError

__all__ = ["override_grid", "CONDITIONS"]

CONDITIONS = ("initialized", "pretrained")
"""The model conditions of the Wikitext-2 studies."""


def override_grid(defaults: dict, overrides: dict, *, check_method) -> dict:
    """``defaults`` with every non-None value of ``overrides`` put in, then checked.

    Parameters
    ----------
    defaults : dict
        The study's grid (``FULL_GRID`` or ``QUICK_GRID``), with at least ``conditions``, ``n``,
        ``num_features``, ``methods``, ``windows`` and ``seeds``.
    overrides : dict
        Option name -> value (``None``: keep the default; a list or tuple is copied).
    check_method : callable
        ``check_method(name)`` raises :class:`~approxlab.studies.runner.StudyError` for a method the study
        cannot run.

    Returns
    -------
    dict
        A new grid: ``n`` and ``num_features`` sorted without repeats.

    Raises
    ------
    StudyError
        A condition outside :data:`CONDITIONS`, a length or d below 1, windows or seeds below 1; the
        message names the option (``--n``, ``--num-features``, ...), what is allowed and what came in.
    """
    grid = dict(defaults)
    for name, value in overrides.items():
        if value is not None:
            grid[name] = list(value) if isinstance(value, (list, tuple)) else value
    for method in grid["methods"]:
        check_method(method)
    for condition in grid["conditions"]:
        if condition not in CONDITIONS:
            raise StudyError(f"--conditions must be among {list(CONDITIONS)}; got {condition!r}.")
    for name in ("n", "num_features"):
        if not grid[name] or any(int(x) < 1 for x in grid[name]):
            raise StudyError(f"--{name.replace('_', '-')} must be positive integers; got {grid[name]}.")
        grid[name] = sorted({int(x) for x in grid[name]})
    for name in ("windows", "seeds"):
        if int(grid[name]) < 1:
            raise StudyError(f"--{name} must be an integer >= 1; got {grid[name]}.")
    return grid
