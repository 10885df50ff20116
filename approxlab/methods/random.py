r"""Random eviction: the floor every cache policy must beat (kvpress's ``RandomPress``).

A per-key cache scorer (:mod:`approxlab.cache._scorers`): independent uniform scores, so the kept set
of a budget :math:`b` is a uniformly random :math:`b`-subset of the real tokens.
"""

from __future__ import annotations

import torch

from .._validation import as_generator, check_tensor
from ..cache._policy import cache_policy
from ..cache._scorers import FEATURES, check_context, finish
from .draws import DrawEntry

__all__ = ["random_scores", "REGISTRATION", "RANDOM"]


def random_scores(q, k, v, *, generator=None, key_mask=None, uniform=None):
    r"""Independent :math:`U(0, 1)` scores, :math:`s_j \sim U[0, 1)`: a uniformly random kept set.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n_c, p)``, ``(*batch, n_c, p)``, ``(*batch, n_c, p_v)`` (validated, not used).
    generator : torch.Generator, optional
        The CPU generator the scores are drawn from (the draw is made on the CPU in float64, then cast
        and moved, so a seed gives the same kept set on every device and dtype); None: a fresh one
        seeded from OS entropy.
    uniform : torch.Tensor, optional
        ``(*batch, n_c)`` the scores themselves, a given draw (the causal method's draw ``uniform``).
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens; padded keys score :math:`-\infty` (a kept set within
        the real tokens is uniform among them).

    Returns
    -------
    torch.Tensor
        ``(*batch, n_c)`` scores in ``k.dtype``; higher is kept.

    Notes
    -----
    Since the scores are exchangeable and almost surely distinct, ``topk(b)`` of them is a uniform
    :math:`b`-subset. kvpress's ``RandomPress`` draws ``torch.rand(*keys.shape[:-1])``, one score per KV
    head, from a generator seeded with its ``seed`` (or the global one); here one draw per query head,
    which the grouped-query pooling averages: the mean of independent uniforms still gives a uniform
    random subset (exchangeable, distinct). Different draws, the same distribution of kept sets.
    **Cost**: :math:`O(n_c)`.

    References
    ----------
    kvpress (NVIDIA), ``kvpress/presses/random_press.py``.

    Examples
    --------
    >>> import torch
    >>> k = torch.zeros(2, 6, 4, dtype=torch.float64)
    >>> a = random_scores(k, k, k, generator=torch.Generator().manual_seed(0))
    >>> b = random_scores(k, k, k, generator=torch.Generator().manual_seed(0))
    >>> a.shape, bool((a == b).all())
    (torch.Size([2, 6]), True)
    """
    context = check_context(q, k, v, key_mask)
    if uniform is None:
        draw = torch.rand(*context.batch, context.n, generator=as_generator(generator), dtype=torch.float64)
    else:
        check_tensor(uniform, "uniform")
        if tuple(uniform.shape) != (*context.batch, context.n):
            raise ValueError(f"`uniform` must have shape (*batch, n_c) = {(*context.batch, context.n)}; got "
                             f"{tuple(uniform.shape)}.")
        draw = uniform
    return finish(draw.to(dtype=k.dtype, device=k.device), context)


def _draws(batch, prompt, p):
    """The draw of the causal form: ``uniform`` ``(*batch, P)``, the prompt's scores."""
    return {"uniform": (DrawEntry((*batch, prompt), "(*batch, prompt_length)"),
                        lambda generator: torch.rand(*batch, prompt, generator=generator, dtype=torch.float64))}


REGISTRATION = dict(score=random_scores, target="softmax", features=FEATURES, randomized=True, inputs=(),
                    draws=_draws)
"""The keyword arguments of this policy's registration: ``register("random", **REGISTRATION)``."""

RANDOM = cache_policy("random", **REGISTRATION)
"""The built-in method 'random': this policy's prompt compression as a causal method, its scores in the KV-cache setting."""
__test__ = {"random": RANDOM.function}  # doctest skips a MethodSpec: run its function's examples

