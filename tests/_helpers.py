"""Small helpers shared by test files (imported as ``from _helpers import ...``)."""

import pytest
import torch

from approxlab.kernels import scaled_logits
from approxlab.synthetic import large_logit_qkv


def gen(seed: int) -> torch.Generator:
    """A fresh CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def logits_80_qkv(n: int = 24, p: int = 16, seed: int = 0):
    """float32 ``(2, 3, n, p)`` q, k, v whose logits q k^T / sqrt(p) reach +-80 exactly."""
    q, k, v = large_logit_qkv((2, 3), n, p, generator=gen(seed))
    assert float(scaled_logits(q.double(), k.double()).abs().max()) == pytest.approx(80.0, rel=1e-5)
    return q, k, v
