"""Shared test configuration: the deterministic Hypothesis profile (torch keeps its default threads), a
fresh method registry with a user's plugin module for the tests of the public registry, and port 8787
held for the whole session."""

import contextlib
import os
import socket
import sys

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "approxlab",
    derandomize=True,
    deadline=None,
    max_examples=int(os.environ.get("APPROXLAB_HYPOTHESIS_EXAMPLES", "25")),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("approxlab")


TOP_K_SOURCE = '''"""Top-k attention, a method written outside approxlab: each query keeps its num_features largest logits."""
import torch

from approxlab.methods import Approximation, register


@register("top-k", target="softmax", features="kept keys per query", randomized=False)
def top_k(q, k, v, *, num_features, generator=None):
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    kept = logits.topk(num_features, dim=-1)
    weights = torch.zeros_like(logits).scatter(-1, kept.indices, kept.values.softmax(-1))
    return Approximation("top-k", "softmax", weights @ v, matrix=weights)
'''
"""A user's plugin module (written to a temporary folder by :func:`top_k_plugin`)."""


@pytest.fixture
def fresh_registry(monkeypatch):
    """The method registry with the built-ins only, for one test (its registrations are undone after it)."""
    from approxlab.methods import registry

    monkeypatch.setattr(registry, "_STATE", registry._State())
    return registry


@pytest.fixture
def top_k_plugin(tmp_path, monkeypatch, fresh_registry):
    """The name of a module outside the package that registers ``top-k`` when imported (not imported yet).

    Its folder is on ``sys.path`` and ``PYTHONPATH`` (Dask workers and subprocesses see it too);
    the module is forgotten after the test.
    """
    folder = tmp_path / "plugins"
    folder.mkdir()
    name = f"top_k_{abs(hash(str(tmp_path))):x}"
    (folder / f"{name}.py").write_text(TOP_K_SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    yield name
    sys.modules.pop(name, None)


DASK_DEFAULT_DASHBOARD_PORT = 8787


@contextlib.contextmanager
def hold_port(port: int):
    """Hold TCP ``port`` on all interfaces for the block, unless another program already holds it.
    Yields whether this process holds it."""
    holder = socket.socket()
    try:
        holder.bind(("0.0.0.0", port))
        holder.listen(1)
    except OSError:  # already taken by another program: the condition holds anyway
        holder.close()
        yield False
        return
    with contextlib.closing(holder):
        yield True


@pytest.fixture(scope="session", autouse=True)
def dashboard_port_taken():
    """Dask's default dashboard port is taken for the whole suite, as it is on a machine where
    another Dask cluster or a notebook runs: no test (and no cluster approxlab starts) may depend
    on it being free."""
    with hold_port(DASK_DEFAULT_DASHBOARD_PORT) as held:
        yield held
