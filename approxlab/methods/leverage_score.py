r"""Leverage scores of the keys (Chari and Van Durme, 2025; kvpress's ``LeverageScorePress``): keep the keys
that stand out geometrically, the rows of high ridge leverage in a Gaussian sketch of the centred pre-RoPE
keys.

A per-key cache scorer (:mod:`approxlab.cache._scorers`), query-agnostic and randomized.
"""

from __future__ import annotations

import torch

from .._validation import as_generator, check_bool, check_int, check_positive_float, check_tensor
from ..cache._policy import cache_policy
from .draws import DrawEntry
from ..cache._scorers import FEATURES, check_context, check_extra_input, finish, masked_mean, masked_zscore
from .expected_attention import before_rope, rotary_frequencies

__all__ = ["key_leverage_scores", "sketch_draws", "REGISTRATION", "LEVERAGE_SCORE"]

HOW_PRE_ROPE = ("the context's keys before the rotary embedding: pass keys_pre_rope=(*batch, n_c, p), or "
                "rope_base=/rope_frequencies= to rotate k back (keys_pre_rope=k for a model without RoPE)")


def keys_before_rope(k, context, policy, keys_pre_rope, rope_base, rope_frequencies):
    """``keys_pre_rope`` if given, else ``k`` rotated back by the declared RoPE (``rope_base`` or
    ``rope_frequencies``), else ``k`` itself: without a declared RoPE the keys are taken as they are, as for a
    model without rotary embeddings (as every RoPE-aware scorer here does; ``approxlab.patch_attention``
    declares a model's RoPE)."""
    if keys_pre_rope is None and (rope_base is not None or rope_frequencies is not None):
        return before_rope(k, context, rotary_frequencies(k.shape[-1], rope_base, rope_frequencies,
                                                          device=k.device))
    if keys_pre_rope is None:
        return k
    return check_extra_input(keys_pre_rope, "keys_pre_rope", policy, k, HOW_PRE_ROPE)


def draw_sketch(batch, p, sketch_dimension, generator, like):
    r"""The Gaussian sketch :math:`\Phi` ``(*batch, p, r)``, entries :math:`\mathcal N(0, 1/r)`, drawn on the CPU
    in float64 from ``generator`` and moved to ``like``'s dtype and device."""
    draw = torch.randn(*batch, p, sketch_dimension, generator=as_generator(generator), dtype=torch.float64)
    return (draw / sketch_dimension ** 0.5).to(dtype=like.dtype, device=like.device)


def check_sketch(sketch, batch, p, sketch_dimension, like):
    check_tensor(sketch, "sketch")
    if tuple(sketch.shape) != (*batch, p, sketch_dimension):
        raise ValueError(f"`sketch` must have shape (*batch, p, sketch_dimension) = {(*batch, p, sketch_dimension)}; "
                         f"got {tuple(sketch.shape)}.")
    return sketch.to(dtype=like.dtype, device=like.device)


def sketched_ridge_leverage(keys, used, sketch, ridge):
    r"""Ridge leverage scores of the sketched, centred keys, ``(*batch, n)`` (0 where not ``used``).

    :math:`X = (\tilde K - \mathbf 1\bar k^\top)\Phi` over the ``used`` rows (:math:`\bar k` their mean) and
    :math:`\ell_i = x_i^\top(X^\top X + \lambda I)^{-1}x_i`, from the eigendecomposition of the
    :math:`r\times r` Gram :math:`X^\top X` in float64 (:math:`O(nr^2 + r^3)`). These are the
    :math:`\lambda`-ridge leverage scores of the kernel :math:`XX^\top`,
    ``approxlab.leverage.ridge_leverage_scores(X @ X.mT, ridge)``, without its :math:`n\times n` matrix.
    """
    weights = used.unsqueeze(-1).to(torch.float64)
    keys = keys.to(torch.float64)
    X = (keys - masked_mean(keys, used, -2)) @ sketch.to(torch.float64) * weights  # (*batch, n, r)
    gram = X.transpose(-1, -2) @ X
    eigenvalues, eigenvectors = torch.linalg.eigh(0.5 * (gram + gram.transpose(-1, -2)))
    coordinates = X @ eigenvectors
    return (coordinates * coordinates / (eigenvalues.clamp_min(0) + ridge).unsqueeze(-2)).sum(-1)


def key_leverage_scores(q, k, v, *, generator=None, key_mask=None, keys_pre_rope=None, rope_base=None,
                        rope_frequencies=None, sketch_dimension=48, ridge=1e-2, sketch=None, zscore=True):
    r"""Ridge leverage of each key in a Gaussian sketch of the centred pre-RoPE keys, z-scored:
    :math:`s_j = z\big(x_j^\top(X^\top X + \lambda I)^{-1}x_j\big)`, :math:`X = (\tilde K - \mathbf 1\bar k^\top)\Phi`.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n_c, p)``, ``(*batch, n_c, p)``, ``(*batch, n_c, p_v)`` (``q``, ``v`` validated, not
        used): the context, keys after the rotary embedding.
    generator : torch.Generator, optional
        The CPU generator :math:`\Phi` is drawn from (unless ``sketch`` is given).
    key_mask : torch.Tensor, optional
        ``(*batch, n_c)`` bool, True on real tokens: padded keys enter neither the mean nor the Gram and
        score :math:`-\infty`.
    keys_pre_rope : torch.Tensor
        ``(*batch, n_c, p)``, the keys before the rotary embedding :math:`\tilde K` (kvpress's ``k_proj`` of
        the hidden states). Optional: with ``rope_base`` or ``rope_frequencies`` ``k`` is rotated back
        (positions counting real tokens); with neither, ``k`` is taken as it is (a model without RoPE).
        For a RoPE model pass one of the three, or the scores are those of the rotated keys.
    rope_base : float, optional
        The model's RoPE base, to rotate ``k`` back (see
        :func:`approxlab.methods.expected_attention.expected_attention_scores`).
    rope_frequencies : torch.Tensor, optional
        ``(p // 2,)`` rotary frequencies, overriding ``rope_base``.
    sketch_dimension : int, default 48
        :math:`r`, the columns of :math:`\Phi`.
    ridge : float, default 1e-2
        :math:`\lambda > 0` (kvpress's first Cholesky jitter, always added).
    sketch : torch.Tensor, optional
        ``(*batch, p, r)``, a given :math:`\Phi` (a draw to share: common random numbers, or kvpress's one
        sketch per KV head repeated over its group).
    zscore : bool, default True
        Return :math:`(\ell - \bar\ell)/\max(\operatorname{sd}(\ell), 10^{-6})` over each head's real tokens
        (kvpress's output); False: the leverage scores :math:`\ell` themselves.

    Returns
    -------
    torch.Tensor
        ``(*batch, n_c)`` scores in ``k.dtype``; higher is kept.

    Notes
    -----
    :math:`\Phi\in\mathbb R^{p\times r}` has i.i.d. :math:`\mathcal N(0, 1/r)` entries (the paper's right
    sketch); the leverage of row :math:`j` of the sketched centred keys measures how far key :math:`j`
    lies outside the directions the other keys span -- an outlier score that needs no query. kvpress's
    ``LeverageScorePress.compute_leverage_scores`` forms :math:`G = X^\top X` in float32 and solves with a
    Cholesky factor of :math:`G + 10^{-2}I` (retrying with a larger jitter if it fails); here the same
    :math:`\ell_j` in float64 from an eigendecomposition of :math:`G`, which cannot fail, with the ridge
    fixed.

    **What differs from kvpress.** (1) kvpress z-scores over the whole ``(batch, KV heads, tokens)`` tensor
    at once; here over each head's real tokens: the same affine map within a head, so the same kept sets,
    and the same scores when one KV head is scored. (2) kvpress draws one :math:`\Phi` per KV head; a
    per-query-head call draws one per query head, and the grouped-query pooling then averages the group's
    independent estimates -- pass ``sketch`` repeated over the group for kvpress's draw. (3) float64
    throughout instead of float32.

    **Cost**: :math:`O(n_c p r + n_c r^2 + r^3)` per head; memory :math:`O(n_c r)`.

    References
    ----------
    Chari and Van Durme, "Compactor: Calibrated query-agnostic KV cache compression with approximate
    leverage scores" (arXiv:2507.08143). Alaoui and Mahoney (2015), ridge leverage scores. kvpress
    (NVIDIA), ``kvpress/presses/leverage_press.py``.

    Examples
    --------
    >>> import torch
    >>> from approxlab.synthetic import synthetic_qkv
    >>> q, k, v = synthetic_qkv((2,), 32, 8, generator=torch.Generator().manual_seed(0))
    >>> k[:, 5] = 10.0  # an outlying key
    >>> key_leverage_scores(q, k, v, keys_pre_rope=k, generator=torch.Generator().manual_seed(0)).argmax(-1)
    tensor([5, 5])
    """
    context = check_context(q, k, v, key_mask)
    sketch_dimension = check_int(sketch_dimension, "sketch_dimension", low=1)
    ridge = check_positive_float(ridge, "ridge")
    check_bool(zscore, "zscore")
    keys = keys_before_rope(k, context, "leverage-score", keys_pre_rope, rope_base, rope_frequencies)
    p = k.shape[-1]
    sketch = (draw_sketch(context.batch, p, sketch_dimension, generator, k) if sketch is None
              else check_sketch(sketch, context.batch, p, sketch_dimension, k))
    leverage = sketched_ridge_leverage(keys, context.real, sketch, ridge)
    scores = masked_zscore(leverage, context.real) if zscore else leverage
    return finish(scores.to(k.dtype), context)


def sketch_draws(batch, prompt, p, *, sketch_dimension=48, **others):
    """The draw of the causal form: ``sketch`` ``(*batch, p, r)``, as :func:`draw_sketch` draws it (float64).
    The policy's ``others`` options (``rope_base``, ``rope_frequencies``, ``keys_pre_rope``, ``ridge``, ...) do not
    shape the draw: they are accepted and ignored, as :func:`approxlab.methods.draw` documents.

    Examples
    --------
    >>> import torch
    >>> entry, sample = sketch_draws((2,), 16, 8, sketch_dimension=4)["sketch"]
    >>> entry.shape, sample(torch.Generator().manual_seed(0)).dtype
    ((2, 8, 4), torch.float64)
    """
    return {"sketch": (DrawEntry((*batch, p, sketch_dimension), "(*batch, p, sketch_dimension)"),
                       lambda generator: draw_sketch(batch, p, sketch_dimension, generator,
                                                     torch.empty(0, dtype=torch.float64)))}


REGISTRATION = dict(score=key_leverage_scores, target="softmax", features=FEATURES, randomized=True,
                    inputs=("rope_base",), draws=sketch_draws)
"""The keyword arguments of this policy's registration: ``register("leverage-score", **REGISTRATION)``.
``inputs``: the options the caller must supply -- ``keys_pre_rope`` (or ``rope_base``/``rope_frequencies``
to rotate ``k`` back); missing, the scorer raises a one-line error naming it."""

LEVERAGE_SCORE = cache_policy("leverage-score", **REGISTRATION)
"""The built-in method 'leverage-score': this policy's prompt compression as a causal method, its scores in the KV-cache setting."""
__test__ = {"leverage_score": LEVERAGE_SCORE.function}  # doctest skips a MethodSpec: run its function's examples

