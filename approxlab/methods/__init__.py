"""Attention approximations, one per file, behind one public registry.

``num_features`` is one budget with one meaning per method:

===================  ==========================================================
method               ``num_features`` counts
===================  ==========================================================
exact, kernelized    ignored (exact references)
skyformer            sampled columns ``d`` of the 2n x 2n completion (Eq. (5))
skyformer-softmax    sampled columns ``d`` of the completion of [Q; K]
nystrom              sampled columns (landmarks) ``d``
nystromformer        segment-means landmarks ``m``
spectral-shifting    segment-means landmarks ``c``
yoso                 hashes ``m`` (each of ``tau`` concatenated hyperplanes)
yoso-e               ignored (exact expectation)
performer            positive orthogonal random features ``r``
performer-lra        the same, fed as the Skyformer authors' code feeds them
informer             selected "active" queries ``u``
linformer            projected length ``k`` of keys and values
topk                 kept keys ``k`` per query (the k largest logits; an oracle)
topp                 the most keys kept per query (smallest set of mass >= ``p``)
streaming-llm        cache size: ``sinks`` attention sinks plus the recent window
h2o                  cache size: heavy hitters plus ``recent_size`` recent tokens
snapkv               kept prompt tokens per head (observation window included)
quest                token budget per query: ``ceil(budget / page_size)`` pages
hyperattention       sampled columns ``m`` (``block_size``, ``bits``: sortLSH's blocks)
kdeformer            sampled columns ``m`` (``block_size``, ``bits``: sortLSH's blocks)
polynomial           polynomial features ``C(p + g, g)`` (the degree ``g`` that fits)
===================  ==========================================================

Public API::

    available() -> list[str]                     # every usable name: built-in, registered, installed
    get(name) -> MethodSpec
    register(name, function=None, *, target, features, max_features=None, randomized=True,
             draw=None, causal=False, compress=None, score=None, overwrite=False)   # a call or a decorator
    causal_support(support) -> list[str]         # methods with causal=True / "only" / "mask-renormalise"
    cache_policy(name, *, score, features, randomized, ...) -> MethodSpec   # a whole cache policy from its score
    from_press(press, *, name, ...) -> MethodSpec    # a kvpress press (its scorer interface), registered
    unregister(name) -> MethodSpec
    load_plugin(module) -> module                # what `approxlab <study> --plugin MODULE` does
    draw(method, q, k, *, num_features, generator=None, **options) -> dict[str, Tensor]
    rank_keys(q, k, budgets) -> KeyRanking       # the oracles' ranked logits, shared by topk and topp at every budget
    Approximation(method, target, output, operator=None, info=None, *, matrix=None)
    MethodSpec, TARGETS, CAUSAL_SUPPORT, CAUSAL_ONLY, ENTRY_POINT_GROUP ("approxlab.methods")

Causal (decoder) attention, ``approximate(..., causal=...)`` (:mod:`approxlab.methods.causal`):
``causal=True`` runs a method's own causal form (exact, kernelized, yoso-e: masked dense; performer:
prefix-sum FAVOR+; informer: causal ProbSparse; hyperattention: its causal recursion; topk, topp, quest: per-query selection among keys
``j <= i``; streaming-llm, h2o, snapkv: what the cache policy keeps when query ``i`` is decoded, and
nothing else: they are causal-only, ``causal="only"``); ``causal="mask-renormalise"`` evaluates
skyformer-softmax, nystromformer, nystrom and spectral-shifting by masking and renormalising their
bidirectional matrix (an evaluation variant: their landmarks have seen future tokens); every other
method refuses ``causal``.

Evaluate your own attention against the built-ins (the README's example, tested)::

    import torch, approxlab, approxlab.data
    from approxlab.methods import Approximation, register
    from approxlab.metrics import spectral_error

    @register("top-k", target="softmax", features="kept keys per query", randomized=False)
    def top_k(q, k, v, *, num_features, generator=None):      # softmax over each query's num_features largest logits
        logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        kept = logits.topk(num_features, dim=-1)
        weights = torch.zeros_like(logits).scatter(-1, kept.indices, kept.values.softmax(-1))
        return Approximation("top-k", "softmax", weights @ v, matrix=weights)   # or only the output: weights @ v

    data = approxlab.data.get_qkv("pretrained", 1024, window_ids=[0])        # 12 heads of MiniLM on Wikitext-2
    q, k, v = (x[0].double() for x in (data.q, data.k, data.v))              # (12, 1024, 32), float64
    exact = approxlab.exact_attention(q, k, v)
    for name in ("top-k", "skyformer-softmax", "nystromformer", "performer"):
        approx = approxlab.approximate(name, q, k, v, num_features=128, generator=torch.Generator().manual_seed(0))
        error = spectral_error(approx.output, exact, relative=True)          # per head
        print(f"{name:17} median relative spectral error over 12 heads {float(error.quantile(0.5)):.3f}")

which prints, on the pretrained MiniLM's 12 heads of Wikitext-2 window 0 at n = 1024, the median
relative spectral error of each method (top-k first; the numbers are in the README). The same
method runs in every study: ``approxlab figure1 --quick --plugin my_attention --methods
top-k,skyformer-softmax`` (``my_attention.py`` holding the function, on ``PYTHONPATH``).
"""

from ..cache._policy import cache_policy
from ..cache._press import PressModule, from_press
from ._base import CAUSAL_ONLY, CAUSAL_SUPPORT, TARGETS, Approximation, MethodSpec
from ._selection import KeyRanking, rank_keys
from .draws import draw
from .registry import (ENTRY_POINT_GROUP, available, causal_support, get, load_plugin, plugin_modules, register,
                       unregister)

__all__ = [
    "available",
    "get",
    "register",
    "unregister",
    "load_plugin",
    "plugin_modules",
    "draw",
    "causal_support",
    "cache_policy",
    "rank_keys",
    "KeyRanking",
    "from_press",
    "PressModule",
    "Approximation",
    "MethodSpec",
    "TARGETS",
    "CAUSAL_SUPPORT",
    "CAUSAL_ONLY",
    "ENTRY_POINT_GROUP",
]
