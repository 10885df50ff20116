"""The KV-cache package's public face: every name it lists resolves (imported on first use), is the object the
library's other doors hand out, and the earlier module paths still import their names."""

from __future__ import annotations

import subprocess
import sys

import pytest

import approxlab
import approxlab.cache


def test_every_public_name_resolves_and_the_other_doors_give_the_same_object():
    from approxlab import kv_budgets, kv_cache, methods

    for name in approxlab.cache.__all__:
        assert getattr(approxlab.cache, name) is not None, name
        assert name in dir(approxlab.cache)
    assert approxlab.kv_cache_attention is approxlab.cache.kv_cache_attention
    for name in ("cache_policy", "from_press", "PressModule"):
        assert getattr(methods, name) is getattr(approxlab.cache, name)
    for module in (kv_cache, kv_budgets):
        for name in module.__all__:
            assert getattr(module, name) is getattr(approxlab.cache, name), f"{module.__name__}.{name}"


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="approxlab.cache.*no_such_name"):
        approxlab.cache.no_such_name  # noqa: B018


def test_the_package_imports_first_in_a_fresh_interpreter():
    """The lower modules are imported by approxlab.methods while it loads; the package's __init__ imports nothing
    eagerly, so any entry point works."""
    for statement in ("import approxlab.cache._scores", "from approxlab.cache import kv_cache_attention",
                      "from approxlab.cache import cache_policy; import approxlab.methods"):
        result = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, statement + "\n" + result.stderr
