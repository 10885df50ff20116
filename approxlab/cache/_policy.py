r"""A KV-cache policy as a causal method: the prompt compressed once by the policy, then decoded.

Every cache policy that compresses a prompt once (SnapKV's rule, kvpress's presses) has the same causal
form: rows :math:`i < P` (the prompt, ``prompt_length``) attend causally to the prompt, uncompressed, as
the prefill does; the prompt's cache is then compressed to ``b`` tokens per head, and every row
:math:`i \ge P` is the exact softmax over the kept prompt tokens :math:`\mathcal K` and the tokens
:math:`P, \dots, i`:

.. math::

    \tilde o_i = \sum_{j\in \mathcal K\,\cup\,\{P,\dots,i\}}
    \frac{e^{s_{ij}}}{\sum_{l\in \mathcal K\,\cup\,\{P,\dots,i\}} e^{s_{il}}}\, v_j, \qquad i \ge P.

Its rows :math:`i \ge P` are :func:`approxlab.kv_cache_attention` with ``context_length = P`` (and
``grouping="query-head"``: one kept set per head of the batch).

:func:`prompt_compressed` computes that form from a kept set; :func:`cache_policy` turns a per-key score
(:mod:`approxlab.cache._scores`) into a registered causal-only method whose kept set is the top ``b`` of
the scores of the prompt.
"""

from __future__ import annotations

import inspect

import torch

from .._validation import as_generator, check_int
from ._allocation import ALPHA_SAFEGUARD, adakv_keep, check_alpha_safeguard, kept_as_indices
from ..methods._base import CAUSAL_ONLY, method
from ..methods._masking import check_key_mask
from ..methods._selection import selected_weights, sparse_approximation
from ..methods.draws import check_draw
from ._scores import score_options, scored_compress, scores_of
from ._selection import attend_compressed, compressed_indices

__all__ = ["prompt_length_of", "prompt_compressed", "cache_policy"]


_EXAMPLES = """

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> approx = approxlab.approximate("{name}", q, k, v, num_features=8, causal=True{rope},
    ...                                generator=torch.Generator().manual_seed(0))
    >>> approx.output.shape, approx.info["kept"].shape, approx.info["prompt_length"]  # 16 prompt tokens -> 8
    (torch.Size([2, 32, 8]), torch.Size([2, 8]), 16)
    >>> full = approxlab.approximate("{name}", q, k, v, num_features=16, causal=True{rope},
    ...                              generator=torch.Generator().manual_seed(0))
    >>> float((full.output - approxlab.exact_attention(q, k, v, causal=True)).abs().max()) < 1e-12  # all kept
    True
"""


_ADAKV_EXAMPLES = """

    Examples
    --------
    >>> import torch, approxlab
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(1, 3, 32, 8, generator=g, dtype=torch.float64) for _ in range(3))  # 3 heads
    >>> approx = approxlab.approximate("{name}", q, k, v, num_features=8, causal=True{rope})
    >>> kept = approx.info["kept"]  # (1, 3, 16) bool: 16 prompt tokens, 3 * 8 kept across the heads
    >>> kept.shape, int(kept.sum()), bool((kept.sum(-1) >= 1).all())  # each head keeps int(0.2 * 8) or more
    (torch.Size([1, 3, 16]), 24, True)
    >>> full = approxlab.approximate("{name}", q, k, v, num_features=16, causal=True{rope})
    >>> float((full.output - approxlab.exact_attention(q, k, v, causal=True)).abs().max()) < 1e-12  # all kept
    True
"""


def prompt_length_of(prompt_length, n: int) -> int:
    """The prompt :math:`P`: ``prompt_length`` (an integer in ``[1, n]``), default ``n // 2`` (at least 1)."""
    return max(1, n // 2) if prompt_length is None else check_int(prompt_length, "prompt_length", low=1, high=n)


def prompt_compressed(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kept: torch.Tensor,
                      prompt: int, key_mask: torch.Tensor | None, info: dict, *,
                      later_mask: torch.Tensor | None = None):
    r"""The causal form of a prompt compressed to ``kept`` ``(*batch, b)`` (module docstring's equation).

    ``q, k, v`` are ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``; ``kept`` the prompt tokens
    (indices in ``[0, prompt)``) kept per head; ``key_mask`` ``(*batch, n)`` bool or None. Returns an
    :class:`~approxlab.methods.Approximation` named ``name`` with ``output`` ``(*batch, n, p_v)``, a
    row-sparse operator formed on request, and ``info`` (``prompt_length`` added). ``later_mask`` ``(*batch, n)``
    bool, when given, is the key mask of the rows after the prompt instead of ``key_mask``: with heads that keep
    different numbers of tokens, :func:`~approxlab.cache._allocation.kept_as_indices`'s (the slots a head
    left over hidden).

    **Cost**: the prompt's causal attention (:math:`O(P^2 p)`, the prefill's own) and :math:`O((n-P)(b + n - P)p)`
    for the rows after the prompt, both through torch's fused attention kernel (:func:`.attend_compressed`): in
    a patched SmolLM2 forward at 2,048 tokens with the policy in every layer, about the unpatched forward's
    time (``approxlab bench --parts patch``).
    """
    n = k.shape[-2]
    context_mask = None if key_mask is None else key_mask[..., :prompt]
    width = kept.shape[-1] + n - prompt
    prompt_rows = attend_compressed(q[..., :prompt, :], k[..., :prompt, :], v[..., :prompt, :], kept[..., :0], 0,
                                    context_mask)  # exact causal attention over the prompt, visible columns only
    later = key_mask if later_mask is None else later_mask
    later_rows = attend_compressed(q, k, v, kept, prompt, later) if prompt < n else None
    output = prompt_rows if later_rows is None else torch.cat([prompt_rows, later_rows], dim=-2)

    def every(start, stop):  # prompt rows: keys 0..P-1 causally; later rows: the compressed prompt and after
        batch, total = kept.shape[:-1], max(width, prompt)
        columns = torch.arange(total, device=q.device)
        rows = torch.arange(start, stop, device=q.device).unsqueeze(-1)
        indices = torch.where(columns < prompt, columns, torch.zeros_like(columns)).expand(*batch, stop - start,
                                                                                          total).clone()
        valid = ((columns <= rows) & (columns < prompt)).expand(*batch, stop - start, total).clone()
        if stop > prompt:
            first = max(start, prompt)
            later_indices, later_valid = compressed_indices(kept, prompt, n, first - prompt, stop - prompt, None)
            indices[..., first - start:, :width] = later_indices
            valid[..., first - start:, :] = False
            valid[..., first - start:, :width] = later_valid
        split = min(max(prompt - start, 0), stop - start)  # rows before it are the prompt's
        for mask, rows in ((key_mask, slice(0, split)), (later, slice(split, stop - start))):
            if mask is not None:
                part = indices[..., rows, :]
                valid[..., rows, :] &= torch.gather(mask.expand(*batch, n), -1, part.flatten(-2)).view_as(part)
        return indices, valid

    record = lambda: selected_weights(q, k, v, every, width=max(width, prompt))  # noqa: E731
    return sparse_approximation(name, output, n, record, {**info, "prompt_length": prompt})


def cache_policy(name: str, *, score, target: str = "softmax", features: str, randomized: bool, inputs=(),
                 draws=None, allocation: str = "uniform", layer_budgets: str = "uniform"):
    r"""The :class:`~approxlab.methods.MethodSpec` of a cache policy given by its per-key ``score``, whole.

    Public as :func:`approxlab.methods.cache_policy`: every built-in scorer is made by it, and
    ``register(name, score=fn, ...)`` without a ``function`` registers what it builds. The spec is not
    registered here (``registry.get`` does not know it); its ``function`` is the causal form below, its
    ``compress`` the top ``b`` of the scores, its ``score`` the given one, so the KV-cache setting, the
    patch and every study's row (whole window, cost, long context) run it like a built-in.

    The method is causal-only: ``approximate(name, q, k, v, num_features=b, causal=True,
    prompt_length=P, **options)`` keeps the top ``min(b, P)`` scores of the prompt per head
    (``score(q[:P], k[:P], v[:P], **options)``) and runs :func:`prompt_compressed`; ``info["kept"]`` is
    ``(*batch, min(b, P))``. In :func:`approxlab.kv_cache_attention` the same ``score`` keeps one set per
    KV head of a grouped model. ``inputs`` names the options the policy needs from the model (e.g.
    ``rope_base``). A randomized policy gives ``draws(batch, prompt, p, **options)``: key -> ``(DrawEntry,
    sample)``, ``sample(generator)`` the float64 CPU tensor that the score function would draw, handed to it
    as the option named by the key (:func:`approxlab.methods.draw`, ``approximate(..., draw=...)``).

    ``allocation="adakv"`` (:mod:`approxlab.cache._allocation`) makes the causal form keep AdaKV's top
    ``H * min(b, P)`` scores of the ``H`` heads of dimension -3 jointly (``q`` ``(*batch, H, n, p)``; a ``q``
    without that dimension is one head), with an option ``alpha_safeguard`` (default 0.2), and ``info["kept"]``
    the ``(*batch, P)`` bool kept set; it is also the default ``allocation`` of the KV-cache setting for this
    method, as ``layer_budgets`` is for :func:`approxlab.patch_attention`'s.

    Examples
    --------
    >>> import torch, approxlab
    >>> from approxlab.methods import cache_policy
    >>> def small_keys(q, k, v, *, generator=None, key_mask=None):  # Knorm's score
    ...     return -k.norm(dim=-1)
    >>> spec = cache_policy("small-keys", score=small_keys, features="kept context tokens", randomized=False)
    >>> spec.causal, spec.score is small_keys
    ('only', True)
    >>> q = k = v = torch.randn(1, 32, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> spec.function(q, k, v, num_features=4).info["kept"].shape  # the prompt's 16 tokens compressed to 4
    torch.Size([1, 4])
    """
    compress = scored_compress(name, score)
    adaptive = allocation == "adakv"

    def layout(q, k, prompt_length, options):
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        return draws(batch, prompt_length_of(prompt_length, k.shape[-2]), k.shape[-1], **options)

    def function(q, k, v, *, num_features, generator=None, prompt_length=None, key_mask=None, causal=True,
                 draw=None, **options):
        if causal is not True:
            raise ValueError(f"{name} is a KV-cache policy, causal-only: pass causal=True (or use "
                             f"approxlab.kv_cache_attention); got causal={causal!r}.")
        key_mask = check_key_mask(key_mask, k)
        prompt = prompt_length_of(prompt_length, k.shape[-2])
        if draw is not None:
            expected = {key: entry for key, (entry, _) in layout(q, k, prompt_length, options).items()}
            options, generator = {**options, **check_draw(name, draw, expected, device=q.device)}, None
        context_mask = None if key_mask is None else key_mask[..., :prompt]
        budget = min(num_features, prompt)
        inputs = (q[..., :prompt, :], k[..., :prompt, :], v[..., :prompt, :])
        if adaptive:  # AdaKV over the heads of dimension -3: a kept set of its own size per head
            alpha_safeguard = check_alpha_safeguard(options.pop("alpha_safeguard", ALPHA_SAFEGUARD))
            scores = scores_of(name, score, *inputs, budget=budget, generator=generator, key_mask=context_mask,
                               **options)
            heads = scores if scores.ndim >= 2 else scores.unsqueeze(0)
            keep = adakv_keep(heads, budget, alpha_safeguard=alpha_safeguard).view(scores.shape)
            indices, later = kept_as_indices(keep, key_mask, k.shape[-2])
            return prompt_compressed(name, q, k, v, indices.to(q.device), prompt, key_mask, {"kept": keep},
                                     later_mask=later)
        kept = compress(*inputs, budget=budget, generator=generator, key_mask=context_mask, **options)
        return prompt_compressed(name, q, k, v, kept, prompt, key_mask, {"kept": kept})

    def draw_of(q, k, *, num_features, generator=None, prompt_length=None, **options):
        generator = as_generator(generator)
        return {key: sample(generator).to(q.device) for key, (_, sample) in
                layout(q, k, prompt_length, {o: x for o, x in options.items() if o in draw_options}).items()}

    own = [inspect.Parameter(option, inspect.Parameter.KEYWORD_ONLY, default=parameter.default)
           for option, parameter in inspect.signature(score).parameters.items()
           if option in (score_options(score) or ())]
    base = [p for p in inspect.signature(function).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    if draws is None:
        base = [p for p in base if p.name != "draw"]
    draw_options = [] if draws is None else [o for o in inspect.signature(draws).parameters
                                             if o not in ("batch", "prompt", "p")]
    if adaptive:
        own.append(inspect.Parameter("alpha_safeguard", inspect.Parameter.KEYWORD_ONLY, default=ALPHA_SAFEGUARD))
    if score_options(score) is None:  # the score takes **options: so does the method
        own = [inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD)]
    function.__signature__ = inspect.Signature(base + own)
    function.__name__ = function.__qualname__ = name.replace("-", "_")
    function.__doc__ = (f"The KV-cache policy {name!r} as a causal method: the prompt (``prompt_length``, default "
                        f"n // 2) compressed once to the top ``num_features`` of its scores "
                        + ("(per head on average, AdaKV's allocation over the heads of dimension -3) " if adaptive
                           else "")
                        + f"(:func:`{score.__module__}.{score.__name__}`), then decoded "
                        "(:mod:`approxlab.cache._policy`)."
                        + (f" It needs from the model: {', '.join(f'``{i}``' for i in inputs)}." if inputs else "")
                        + (_ADAKV_EXAMPLES if adaptive else _EXAMPLES).format(
                            name=name, rope=", rope_frequencies=None" if "rope_base" in inputs else ""))
    function.__module__ = score.__module__  # documented, and doctested (its ``__test__``), beside its score
    return method(name, target=target, features=features, randomized=randomized, causal=CAUSAL_ONLY,
                  score=score, draw=None if draws is None else draw_of, inputs=tuple(inputs), allocation=allocation,
                  layer_budgets=layer_budgets)(function)
