"""Small helpers shared by test files (imported as ``from _helpers import ...``)."""

import pytest
import torch

from approxlab.kernels import scaled_logits
from approxlab.synthetic import large_logit_qkv


# CUDA cases are always collected and reported as skipped, with the reason, on a machine without a GPU.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available on this machine"),
    ),
]


def rounding_bound(size: int, condition: float, dtype=torch.float64) -> float:
    """``size * eps * condition``: how far two backward-stable computations of a quantity of magnitude <= 1 that
    solves (or eigendecomposes) a ``size``-by-``size`` system of this condition number may differ.

    A backward-stable method's result is exact for a problem perturbed by about ``size * eps`` relative to its
    norm; the perturbation reaches the result amplified by at most the condition number (Higham, *Accuracy and
    Stability of Numerical Algorithms*, 2nd ed., 2002, Sec. 7.1-7.2, first order). Two methods, or two BLAS
    kernels, may land anywhere within that: a bound on their difference follows from the problem's size and
    conditioning, never from the rounding one machine happens to give.
    """
    return size * torch.finfo(dtype).eps * condition


def rope_stated(name: str) -> dict:
    """``{"rope_frequencies": None}`` for a method that reads the model's rotary embedding (it declares
    ``inputs=("rope_base",)``: expected-attention, CAP, leverage-score, Compactor), else ``{}``: synthetic Q/K/V
    carry no RoPE, and saying so keeps :class:`approxlab.errors.RopeWarning` for the calls that forget it."""
    from approxlab.methods import get
    from approxlab.cache._scores import MODEL_INPUTS

    return {"rope_frequencies": None} if any(name in MODEL_INPUTS for name in get(name).inputs) else {}


def gen(seed: int) -> torch.Generator:
    """A fresh CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def logits_80_qkv(n: int = 24, p: int = 16, seed: int = 0):
    """float32 ``(2, 3, n, p)`` q, k, v whose logits q k^T / sqrt(p) reach +-80 exactly."""
    q, k, v = large_logit_qkv((2, 3), n, p, generator=gen(seed))
    assert float(scaled_logits(q.double(), k.double()).abs().max()) == pytest.approx(80.0, rel=1e-5)
    return q, k, v


def opposed_logits_80_qkv(n: int, p: int = 16, seed: int = 0):
    """float32 ``(2, n, p)`` q, k, v with q, k near +-one direction and |q||k|/sqrt(p) ~ 80, so
    many logits sit near +80 and -80 at once (the harshest case for max-subtraction)."""
    g = gen(seed)
    direction = torch.randn(p, generator=g)
    direction = direction / direction.norm()
    radius = (80.0 * p**0.5) ** 0.5
    signs = torch.where(torch.rand(2, n, 1, generator=g) < 0.5, -1.0, 1.0)
    q = radius * (signs * direction + 0.01 * torch.randn(2, n, p, generator=g))
    k = radius * (-signs * direction + 0.01 * torch.randn(2, n, p, generator=g))
    v = torch.randn(2, n, p, generator=g)
    assert 75 < float(scaled_logits(q, k).abs().max()) < 90
    return q, k, v


def replace_compute(monkeypatch, module, step: int, function):
    """Run ``module.STUDY`` with ``function`` as the compute of its step ``step`` (for the test's duration)."""
    import dataclasses

    study = module.STUDY
    steps = list(study.steps)
    steps[step] = dataclasses.replace(steps[step], compute=function)
    monkeypatch.setattr(module, "STUDY", dataclasses.replace(study, steps=tuple(steps)))


def tiny_llama(vocab_size: int, num_layers: int):
    """A tiny random ``LlamaForCausalLM`` in float64, eval mode (4 query heads on 2 KV heads, width 32), its
    weights drawn with the global CPU generator seeded 0 and the caller's RNG state left as it was."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(config).to(torch.float64).eval()


def tiny_grouped_llama():
    """``(model, ids)``: a random 2-layer Llama with 4 query heads on 2 KV heads (seeded 0, the caller's RNG state
    left as it was) and one sequence of 40 token ids."""
    from transformers import LlamaConfig, LlamaModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaModel(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2)).eval()
    return model, torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(5))


def register_broken_policy(name: str = "broken-policy") -> None:
    """Register a cache policy whose scores raise ``FloatingPointError("no scores today")`` (use with the
    ``fresh_registry`` fixture)."""
    from approxlab.methods import register

    def never(q, k, v, *, num_features, generator=None, causal=True):
        raise AssertionError("the KV-cache setting runs the policy's scores only")

    def broken(q, k, v, **_):
        raise FloatingPointError("no scores today")

    register(name, never, target="softmax", features="kept keys", randomized=False, causal="only", score=broken)
