"""Transitional."""
from ..errors import StudyError


CONDITIONS = ("initialized", "pretrained")


def override_grid(defaults: dict, overrides: dict, *, check_method) -> dict:
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
