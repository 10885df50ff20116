"""The methods the long-context settings run by default: those with a causal form that reads no later token, but
the two simulations too slow at thousands of tokens (:data:`LONG_SIMULATIONS`).

Public API::

    LONG_SIMULATIONS
    long_methods(methods=None, *, policies=True) -> list   # decoder-valid methods, simulations left out
"""

from __future__ import annotations

__all__ = ["LONG_SIMULATIONS", "long_methods"]

LONG_SIMULATIONS = ("magicpig", "vattention")
"""Methods left out of the long-context defaults: simulations of a sampler that form every logit and (vAttention)
every uniform variate of the n x n problem in float64. Measured at 2,048 tokens (9 heads, causal, one thread, on
a loaded machine): 5.2 and 8.4 s per layer for MagicPIG (64 and 256 tables), 4.4 and 4.5 s for vAttention, against
0.05 s for causal SDPA and 0.05-0.9 s for every other method; in every layer of the model their long cells would
be 46% of the perplexity study's long-context settings. They run in its 512-token settings; the options that
name methods take them."""


def long_methods(methods=None, *, policies: bool = True) -> list:
    """The decoder-valid ``methods`` (default: every registered one but ``exact``) that are not
    ``mask-renormalise`` (whose landmarks see later tokens) nor :data:`LONG_SIMULATIONS`; with
    ``policies=False``, those without a compression step only (the whole-sequence methods)."""
    from ...methods import available, get

    if methods is None:
        methods = [name for name in available() if name != "exact"]
    return [m for m in methods if get(m).causal in (True, "only") and m not in LONG_SIMULATIONS
            and (policies or get(m).compress is None)]
