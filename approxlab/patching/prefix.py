r"""A causal model run from one layer on: the unpatched layers below it computed once and shared.

With only layer :math:`K` replaced (``patch_attention(model, ..., layers=[K])``), layers :math:`0 .. K-1` run
unpatched, so the hidden states entering layer :math:`K` are the unpatched model's, the same for every method,
budget and seed on a window. :func:`layer_inputs` captures them once (one unpatched forward pass, any number of
layers), and :func:`token_nll_from` runs only layers :math:`K .. L-1`, the final norm and the head from them:

.. math::

    h^{(K)} = f_{K-1} \circ \dots \circ f_0 (\mathrm{embed}(x)), \qquad
    \ell_t = -\log \operatorname{softmax}\big(W\, \mathrm{norm}(f_{L-1} \circ \dots \circ f_K (h^{(K)}))_t\big)_{x_{t+1}},

the same :math:`\ell_t` as :func:`~approxlab.patching.token_nll` (the same kernels on the same inputs), at a cost
of :math:`L - K` layers instead of :math:`L`.
"""

from __future__ import annotations

import contextlib
import inspect

import torch

from .._validation import check_int
from ..data.capture import _check_input_ids
from ..data.layout import get_attribute
from . import _model
from .likelihood import next_token_losses, token_nll

__all__ = ["layer_inputs", "token_nll_from"]


def _layer_list(target):
    """The bare model's list of decoder layers, its owner and the attribute that holds it."""
    base = target.model.base_model
    path = target.architecture.layers.split(".")
    owner = get_attribute(base, ".".join(path[:-1])) if len(path) > 1 else base
    return owner, path[-1], getattr(owner, path[-1])


def _hidden_of(args, kwargs) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _check(model, input_ids, layer=None):
    target = _model.resolve_model(model)
    if not target.causal:
        raise ValueError(f"`model` must be a causal language model (a decoder); got a "
                         f"{target.architecture.model_type} model, which attends in both directions.")
    count = len(target.modules)
    if layer is not None:
        check_int(layer, "layer", low=0, high=count - 1)
    _check_input_ids(input_ids, int(target.model.config.vocab_size))
    return target


def _base_inputs(base, input_ids: torch.Tensor) -> dict:
    inputs = {"input_ids": input_ids}
    if "use_cache" in inspect.signature(base.forward).parameters:
        inputs["use_cache"] = False
    return inputs


def layer_inputs(model, input_ids: torch.Tensor, layers) -> dict[int, torch.Tensor]:
    r"""The hidden states entering each of ``layers`` in one unpatched forward pass: ``{layer: (S, n, h)}``.

    Parameters
    ----------
    model : transformers.PreTrainedModel or LoadedModel
        A causal model of a family approxlab reads (:func:`~approxlab.patching.token_nll`), not inside a patch.
    input_ids : torch.Tensor
        ``(S, n)`` integer token ids.
    layers : sequence of int
        Layer indices, ``0 <= layer < L``, at least one; the pass stops at the highest of them.

    Returns
    -------
    dict of int to torch.Tensor
        Per layer, :math:`h^{(K)}` of the module docstring, in the model's dtype and on its device (detached).

    Examples
    --------
    >>> import torch
    >>> from transformers import LlamaConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.patching.prefix import layer_inputs
    >>> model = load_model("initialized", seed=0, config=LlamaConfig(
    ...     vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
    ...     num_key_value_heads=2, tie_word_embeddings=True))
    >>> ids = torch.randint(30522, (1, 16), generator=torch.Generator().manual_seed(0))
    >>> found = layer_inputs(model, ids, [0, 2])
    >>> sorted(found), tuple(found[2].shape)
    ([0, 2], (1, 16, 32))
    """
    target = _check(model, input_ids)
    chosen = sorted({check_int(layer, "layers", low=0, high=len(target.modules) - 1) for layer in layers})
    if not chosen:
        raise ValueError(f"`layers` must name at least one layer; got {layers!r}.")
    _, _, modules = _layer_list(target)
    found, handles = {}, []

    def capture(index):
        def hook(module, args, kwargs):
            found[index] = _hidden_of(args, kwargs).detach().clone()
            if index == chosen[-1]:
                raise _Captured  # the layers above the last one asked for are not run
        return hook

    base = target.model.base_model
    try:
        for layer in chosen:
            handles.append(modules[layer].register_forward_pre_hook(capture(layer), with_kwargs=True))
        with torch.no_grad():
            base(**_base_inputs(base, input_ids.to(next(base.parameters()).device)))
    except _Captured:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return found


class _Captured(Exception):
    """Raised by :func:`layer_inputs`'s hook once the last layer asked for is reached, ending the pass."""


@contextlib.contextmanager
def _from_layer(target, layer: int, hidden: torch.Tensor):
    """The bare model looping over layers ``layer ..`` only, the first of them receiving ``hidden``; the model's
    own list of layers set back on leaving (the same module objects: a patch on them stays in force)."""
    owner, name, modules = _layer_list(target)

    def substitute(module, args, kwargs):
        if args:
            return (hidden, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden}

    handle = modules[layer].register_forward_pre_hook(substitute, with_kwargs=True)
    setattr(owner, name, torch.nn.ModuleList(list(modules)[layer:]))
    try:
        yield
    finally:
        setattr(owner, name, modules)
        handle.remove()


def token_nll_from(model, input_ids: torch.Tensor, *, layer: int, hidden: torch.Tensor, start: int = 0):
    r"""Per-token negative log-likelihood, float64 ``(S, n - 1 - start)``, running only layers ``layer ..``.

    Parameters
    ----------
    model : transformers.PreTrainedModel or LoadedModel
        As in :func:`~approxlab.patching.token_nll`; may be inside
        :func:`~approxlab.patching.patch_attention` with layers ``>= layer`` patched.
    input_ids : torch.Tensor
        ``(S, n)`` token ids (they give the positions, the mask and the targets).
    layer : int
        The first layer run, ``0 <= layer < L``.
    hidden : torch.Tensor
        ``(S, n, h)``: the hidden states entering ``layer`` (:func:`layer_inputs` of the same ids).
    start : int, default 0
        As in :func:`~approxlab.patching.token_nll`.

    Returns
    -------
    torch.Tensor
        What :func:`~approxlab.patching.token_nll` returns for the same model and ids when layers below ``layer``
        are unpatched (equal to rounding; a test checks it).

    Notes
    -----
    The model's list of decoder layers is replaced by its tail for the call (the same modules) and set back on
    leaving, normally or on an exception; the first layer of the tail has its input replaced by ``hidden``
    (whatever the bare model computed before its layers: embeddings, position embeddings, scaling), so the
    positions, the attention mask and the rotary embeddings are the model's own. ``layer = 0`` is the whole model.

    Examples
    --------
    >>> import torch
    >>> from transformers import LlamaConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.patching import token_nll
    >>> from approxlab.patching.prefix import layer_inputs, token_nll_from
    >>> model = load_model("initialized", seed=0, config=LlamaConfig(
    ...     vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
    ...     num_key_value_heads=2, tie_word_embeddings=True))
    >>> ids = torch.randint(30522, (1, 16), generator=torch.Generator().manual_seed(0))
    >>> hidden = layer_inputs(model, ids, [2])[2]
    >>> torch.allclose(token_nll_from(model, ids, layer=2, hidden=hidden), token_nll(model, ids), rtol=0, atol=1e-9)
    True
    """
    target = _check(model, input_ids, layer)
    if not isinstance(hidden, torch.Tensor) or hidden.shape[:2] != input_ids.shape:
        raise ValueError(f"`hidden` must be a (S, n, h) tensor with (S, n) = {tuple(input_ids.shape)} (the hidden "
                         f"states entering layer {layer}); got "
                         f"{tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__}.")
    n = input_ids.shape[1]
    start = check_int(start, "start", low=0, high=n - 2)
    if layer == 0:
        return token_nll(model, input_ids, start=start)
    model_ = target.model
    base = model_.base_model
    ids = input_ids.to(next(base.parameters()).device)
    with _from_layer(target, layer, hidden.to(ids.device)), torch.no_grad():
        last = base(**_base_inputs(base, ids)).last_hidden_state[:, start:-1]
        nll, _ = next_token_losses(model_, last, ids[:, start + 1:])
    return nll
