r"""The per-token negative log-likelihood of a causal language model: what a patch costs the model.

For token ids :math:`x_1, \dots, x_n` the model's next-token distribution after :math:`x_{\le t}` is
:math:`p_\theta(\cdot \mid x_{\le t}) = \operatorname{softmax}(W h_t)` (the output head :math:`W` applied
to the last hidden state), and

.. math::

    \ell_t = -\log p_\theta(x_{t+1} \mid x_{\le t}), \qquad t = 1, \dots, n - 1,

with :math:`\frac{1}{n-1}\sum_t \ell_t` the log-perplexity (nats per token). Run inside
:func:`~approxlab.patching.patch_attention`, the same ids give the patched model's losses;
the difference of the two means is the change in log-perplexity.
"""

from __future__ import annotations

import inspect

import torch

from .._validation import check_int
from ..data.capture import _check_input_ids
from ..data.positions import max_positions
from . import _model

__all__ = ["token_nll", "next_token_losses"]

_CHUNK = 256
"""Positions whose logits over the vocabulary are formed at once (``(S, 256, V)`` float64)."""


def _output_head(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output head's weight ``(V, h)`` and bias: the task model's, or the tied input embedding of a bare
    model."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, torch.nn.Linear):
        return head.weight, head.bias
    base = model.base_model
    if getattr(model.config, "tie_word_embeddings", False):
        return base.get_input_embeddings().weight, None
    raise ValueError("`model` must have an output head: a causal language model (e.g. LlamaForCausalLM) or a "
                     "bare model whose output embedding is its input embedding (tie_word_embeddings); got a "
                     f"{type(model).__name__} with untied embeddings.")


def token_nll(model, input_ids: torch.Tensor, *, hits: bool = False, start: int = 0):
    r"""Per-token negative log-likelihood :math:`\ell_t` of a causal language model, float64 ``(S, n - 1 - start)``.

    Parameters
    ----------
    model : transformers.PreTrainedModel or LoadedModel
        A causal (decoder) model of a family approxlab reads, with its language-model head
        (``LlamaForCausalLM``, ``GPT2LMHeadModel``) or bare with tied input/output embeddings (SmolLM2,
        GPT-2, Gemma 3; e.g. from :func:`approxlab.data.load_model`).
    input_ids : torch.Tensor
        ``(S, n)`` integer token ids, ``n >= 2``, one sequence per row (no padding).
    hits : bool, default False
        Also return, per token, whether it is the model's most likely next token (greedy decoding would
        produce it, teacher-forced).
    start : int, default 0
        Score only the predictions made at positions ``start .. n - 2`` (0-based), ``0 <= start <= n - 2``:
        ``token_nll(model, input_ids)[:, start:]`` (to the rounding of the head's product in the model's dtype),
        with the output head applied to those positions only. With a context of :math:`n_c` tokens compressed by the KV-cache setting
        (``patch_attention(..., context_length=n_c)``), ``start=n_c`` scores the continuation from the
        positions whose attention reads the compressed cache; the prediction of the continuation's first token,
        made at the context's last position, does not (the prefill attends the whole context).

    Returns
    -------
    torch.Tensor
        ``(S, n - 1 - start)`` float64, on the CPU: entry ``t - start`` is
        :math:`-\log p(x_{t+1} \mid x_{\le t})` (module docstring).
        The logits are formed ``256`` positions at a time and their log-softmax taken in float64 (Gemma's
        final logit soft-cap applied where the config has one). With ``hits=True``, ``(nll, hits)``:
        ``hits`` a ``(S, n - 1 - start)`` bool tensor, entry ``t - start`` true where :math:`x_{t+1}` is the
        argmax.

    Raises
    ------
    TypeError, ValueError
        A ``model`` that is not a causal model of a supported family or has no output head; ``input_ids``
        that are not integer ``(S, n)`` ids in the vocabulary, with ``n < 2`` or ``n`` beyond the model's
        positions; ``start`` not an integer in ``[0, n - 2]``.

    Notes
    -----
    Runs under ``torch.no_grad()``, one forward pass of the bare model (``use_cache=False``) followed by the
    head; inside :func:`~approxlab.patching.patch_attention` the patched layers take part.

    Examples
    --------
    >>> import torch
    >>> from transformers import LlamaConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.patching import token_nll
    >>> config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    >>> model = load_model("initialized", config=config, seed=0)
    >>> ids = torch.randint(30522, (2, 16), generator=torch.Generator().manual_seed(0))
    >>> nll = token_nll(model, ids)
    >>> nll.shape, nll.dtype
    (torch.Size([2, 15]), torch.float64)
    >>> abs(float(nll.mean()) - torch.log(torch.tensor(30522.0)).item()) < 0.1  # a random model: about log V
    True
    >>> continuation = token_nll(model, ids, start=10)  # the predictions made at positions 10 .. 14
    >>> continuation.shape, torch.allclose(continuation, nll[:, 10:], rtol=0, atol=1e-4)  # float32 logits
    (torch.Size([2, 5]), True)
    """
    target = _model.resolve_model(model)
    model = target.model
    if not target.causal:
        raise ValueError(f"`model` must be a causal language model (a decoder); got a "
                         f"{target.architecture.model_type} model, which attends in both directions.")
    weight, bias = _output_head(model)
    _check_input_ids(input_ids, int(model.config.vocab_size))
    n, limit = input_ids.shape[1], max_positions(target.architecture, model.config)
    if not 2 <= n <= limit:
        raise ValueError(f"`input_ids` must have 2 <= n <= {limit} tokens per sequence (the model's positions); "
                         f"got n = {n}.")
    start = check_int(start, "start", low=0, high=n - 2)
    base = model.base_model
    inputs = {"input_ids": input_ids.to(weight.device)}
    if "use_cache" in inspect.signature(base.forward).parameters:
        inputs["use_cache"] = False
    with torch.no_grad():
        hidden = base(**inputs).last_hidden_state[:, start:-1]
        nll, predicted = next_token_losses(model, hidden, inputs["input_ids"][:, start + 1:])
    return (nll, predicted == input_ids[:, start + 1:].cpu()) if hits else nll


def next_token_losses(model, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``(nll, predicted)``: :math:`-\log p(\text{targets} \mid h)` in float64 and the most likely next token,
    ``(S, t)`` each on the CPU, from the last hidden states ``hidden`` ``(S, t, h)`` of a causal language model
    (its output head applied :data:`_CHUNK` positions at a time, Gemma's final logit soft-cap where the config has
    one); ``targets`` ``(S, t)`` the token each position predicts.

    Examples
    --------
    The losses :func:`token_nll` gives, from the bare model's last hidden states:

    >>> import torch
    >>> from transformers import LlamaConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.patching import token_nll
    >>> from approxlab.patching.likelihood import next_token_losses
    >>> config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    >>> model = load_model("initialized", config=config, seed=0).model
    >>> ids = torch.randint(30522, (2, 16), generator=torch.Generator().manual_seed(0))
    >>> with torch.no_grad():
    ...     hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state  # (2, 16, 32)
    >>> nll, predicted = next_token_losses(model, hidden[:, :-1], ids[:, 1:])
    >>> nll.shape, nll.dtype, predicted.shape, predicted.dtype
    (torch.Size([2, 15]), torch.float64, torch.Size([2, 15]), torch.int64)
    >>> torch.allclose(nll, token_nll(model, ids), rtol=0, atol=1e-6)
    True
    """
    weight, bias = _output_head(model)
    cap = getattr(model.config, "final_logit_softcapping", None)
    targets = targets.to(weight.device)
    losses, found = [], []
    for start in range(0, hidden.shape[1], _CHUNK):
        logits = torch.nn.functional.linear(hidden[:, start:start + _CHUNK], weight, bias).to(torch.float64)
        if cap:
            logits = cap * torch.tanh(logits / cap)
        chosen = targets[:, start:start + _CHUNK].unsqueeze(-1)
        losses.append(-torch.log_softmax(logits, dim=-1).gather(-1, chosen).squeeze(-1))
        found.append(logits.argmax(dim=-1))
    return torch.cat(losses, dim=-1).cpu(), torch.cat(found, dim=-1).cpu()
