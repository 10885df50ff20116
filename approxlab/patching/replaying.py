r"""A patch's layers on inputs recorded elsewhere: :func:`replay`, the layer errors of a teacher-forced pass.

Inside a patched forward pass each replaced layer receives the q, k, v the patched run gave it, which drift from
the unpatched model's once an earlier layer is replaced. :func:`replay` runs the same layers -- the same method,
budget, options, causal form, KV-cache setting and random streams as :func:`~approxlab.patching.patch_attention`
would -- on the **unpatched** model's q, k, v (e.g. :attr:`~approxlab.patching.ExactPrefill.queries`, ``keys``,
``values`` of one :func:`~approxlab.patching.exact_prefill` over the window), without running the model: each
layer's error is then the one it makes on the model's own inputs (a teacher-forced pass), and one capture of
those inputs serves every method and budget.
"""

from __future__ import annotations

import torch

from ..data.capture import repeat_kv_heads
from ._layer import PatchedLayer

__all__ = ["replay"]


def replay(patch, queries, keys, values):
    r"""Run the layers of ``patch`` (not entered) on recorded inputs, as a forward pass would run them.

    Parameters
    ----------
    patch : AttentionPatch
        What :func:`~approxlab.patching.patch_attention` returned, never entered: its method, budget, options,
        layers, KV-cache setting and per-layer seeds are used. It is used up (it cannot be entered afterwards).
    queries, keys, values : sequence of torch.Tensor
        Indexed by the model's layer: ``(S, H, n, p)`` queries (rescaled to the :math:`1/\sqrt p` convention, as
        :attr:`~approxlab.patching.ExactPrefill.queries` holds them) and ``(S, H_kv, n, p)``, ``(S, H_kv, n, p_v)``
        keys and values per KV head (RoPE applied), of one whole window each.

    Returns
    -------
    AttentionPatch
        ``patch``, its :attr:`~approxlab.patching.AttentionPatch.calls` holding one record per replaced layer (with
        its inputs and output when the patch records them, its attention measures when it measures them), so
        that :meth:`~approxlab.patching.AttentionPatch.errors` gives each layer's errors on these inputs.

    Raises
    ------
    TypeError, ValueError
        ``patch`` not a new :class:`~approxlab.patching.AttentionPatch`; ``queries``, ``keys`` or ``values``
        without an entry per model layer; and whatever the method raises on the inputs.

    Notes
    -----
    A layer is run by the very code a forward pass runs (``PatchedLayer``), on a fresh copy of the layer's random
    stream (seeded from :attr:`~approxlab.patching.AttentionPatch.seeds`): in the whole-window setting
    :math:`\tilde O = \texttt{approximate}(\mathrm{method}, Q, K, V)` with the key/value heads repeated; in the
    KV-cache setting the context's rows exact and the continuation's from :func:`approxlab.kv_cache_attention`.
    With the inputs a patched run gave layer :math:`\ell` (e.g. the first replaced layer, whose inputs are the
    unpatched model's), the records equal that run's to rounding; a test checks it.

    Examples
    --------
    A tiny random Llama of 2 layers, 4 query heads on 2 KV heads:

    >>> import torch, approxlab
    >>> from transformers import LlamaConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.patching import exact_prefill, replay
    >>> model = load_model("initialized", seed=0, config=LlamaConfig(
    ...     vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    ...     num_key_value_heads=2, tie_word_embeddings=True))
    >>> ids = torch.randint(30522, (1, 32), generator=torch.Generator().manual_seed(0))
    >>> clean = exact_prefill(model, ids)  # the unpatched model's q, k, v at every layer
    >>> patch = approxlab.patch_attention(model, "performer", num_features=8, record_inputs=True,
    ...                                   generator=torch.Generator().manual_seed(0))
    >>> rows = replay(patch, clean.queries, clean.keys, clean.values).errors()
    >>> len(rows), sorted({row["layer"] for row in rows})  # 2 layers x 4 heads
    (8, [0, 1])
    """
    from .patch import AttentionPatch

    if not isinstance(patch, AttentionPatch) or patch._state != "new":
        raise TypeError(f"`patch` must be an AttentionPatch that was never entered; got {patch!r}.")
    target = patch._target
    layers = len(target.modules)
    for name, inputs in (("queries", queries), ("keys", keys), ("values", values)):
        if len(inputs) != layers:
            raise ValueError(f"`{name}` must hold one tensor per model layer ({layers}); got {len(inputs)}.")
    patch._state = "replayed"
    for layer in patch.layers:
        handler = PatchedLayer(patch, layer, target.layouts[layer], torch.Generator().manual_seed(patch.seeds[layer]))
        dtype = patch.compute_dtype
        q, k, v = (x[layer].to(dtype) for x in (queries, keys, values))
        if patch.context_length is None:
            heads = q.shape[-3]
            handler._whole_window(q, repeat_kv_heads(k, heads), repeat_kv_heads(v, heads), None)
        else:
            handler._kv_cache(q, k, v, context_rows=False)  # the records alone: no exact context rows
    patch._target = None
    return patch

