r"""Methods that are not cache policies, on one long sequence: :func:`sweep_methods`, the whole-sequence setting.

A cache policy compresses a context the model read exactly (:func:`~approxlab.patching.sweep_policies`). A method
such as top-k, Quest, MInference or HyperAttention instead replaces the attention of every layer over the whole
sequence (its causal form: row :math:`i` reads tokens :math:`\le i` only), so the context's own hidden states
change and nothing can be shared between methods: each runs the model over the whole sequence. What a sequence
can share is the reference: the unpatched model's continuation, its key tokens (LongPPL) and its clean q, k, v
at every layer, which come from one :func:`~approxlab.patching.exact_prefill` and one unpatched continuation.

Each method's row holds the same columns as a policy's row of :func:`~approxlab.patching.sweep_policies`, so
the two settings read side by side: exact match of the answer, its log-probability, the change in NLL on all
continuation tokens and on the key tokens, and the layers' relative spectral errors on clean and on patched
inputs -- here over every row of the sequence (the method's error on the whole causal attention), not the
continuation's alone.

Public API (re-exported by :mod:`approxlab.patching`)::

    sweep_methods(model, context_ids, continuation_ids, *, methods, ratios, answer_length, ...) -> (rows, layers)
    WholeSequence(model, context_ids, continuation_ids, *, answer_length, short_context=None)
        .run(method, ratio, *, seed=0, **options) -> (row, layers)   # the shared part once, a method per call
"""

from __future__ import annotations

import time

import torch

from ._continuation import _exact_rows
from .likelihood import token_nll
from .records import output_errors
from .sweep import _layer_summary, _Reference, budgets_of, failed_row

__all__ = ["sweep_methods", "WholeSequence"]


def sweep_methods(model, context_ids: torch.Tensor, continuation_ids: torch.Tensor, *, methods, ratios,
                  answer_length: int, short_context: int | None = None, seed: int = 0,
                  options: dict | None = None) -> tuple[list[dict], list[dict]]:
    r"""Run every method of ``methods`` over the whole sequence (every layer replaced) at every ratio's budget.

    Parameters
    ----------
    model : transformers.PreTrainedModel or LoadedModel
        A causal language model (:func:`~approxlab.patching.exact_prefill`).
    context_ids, continuation_ids : torch.Tensor
        ``(1, n_c)`` and ``(1, t)`` token ids: the context (the haystack), then the question and answer; the model
        reads :math:`n = n_c + t` tokens.
    methods : sequence of str
        Registered methods with a causal form of their own (``spec.causal`` True or ``"only"``: not
        ``mask-renormalise``, whose landmarks see later tokens), built-in or a user's.
    ratios : sequence of float
        Compression ratios :math:`r \in [0, 1)`: each gives the budget
        :math:`d = \max(1, \lfloor n_c(1 - r)\rfloor)` (``num_features``: landmarks, features, kept keys), the
        same :math:`b` a cache policy keeps of the context at that ratio.
    answer_length : int
        :math:`k`: the last ``k`` continuation tokens are the answer.
    short_context : int, optional
        LongPPL's truncated context :math:`s` for the key tokens (:func:`~approxlab.patching.sweep_policies`).
    seed : int
        Each method's generator is ``torch.Generator().manual_seed(seed)``; its clean-input errors replay the same
        per-layer streams (:func:`~approxlab.patching.replay`).
    options : dict, optional
        ``{method: {option: value}}``.

    Returns
    -------
    rows, layers
        As :func:`~approxlab.patching.sweep_policies`: the unpatched model's row, then one per method and ratio
        (``correct``, ``answer_logprob``, ``delta_logprob``, ``delta_all``, ``delta_key``, ``key_tokens``,
        ``clean_``/``patched_spectral_`` ``mean``/``median``/``max``/``worst_head``, ``seconds``, ``status``);
        one row per method, ratio and layer.

    Notes
    -----
    *Exact match* is teacher-forced: every answer token is the patched model's most likely next token after the
    question and the answer's earlier tokens. For a method whose row :math:`i` reads tokens :math:`\le i` only,
    that is what greedy generation gives (it generates the answer exactly when each step's argmax is the answer's
    token), without a generation loop over the whole patched model. The errors are measured on all :math:`n`
    rows of each layer: *patched*, on the inputs the patched run gave the layer; *clean*, the method on the
    unpatched model's q, k, v (from the shared prefill and unpatched continuation), against exact causal
    attention in float64 computed once per layer for every method. Cost per method and ratio: one forward pass of
    :math:`n` tokens with every layer replaced, plus the errors (:math:`O(L H n^2 p)` in float64).

    Examples
    --------
    >>> import torch
    >>> from transformers import LlamaConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.patching import sweep_methods
    >>> config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    >>> model = load_model("initialized", config=config, seed=0)
    >>> ids = torch.randint(30522, (1, 56), generator=torch.Generator().manual_seed(0))
    >>> rows, layers = sweep_methods(model, ids[:, :48], ids[:, 48:], methods=["exact", "topk"], ratios=[0.875],
    ...                              answer_length=2)
    >>> [(row["method"], row["num_features"]) for row in rows]
    [('unpatched', None), ('exact', 6), ('topk', 6)]
    >>> abs(rows[1]["delta_all"]) < 1e-4, rows[1]["clean_spectral_max"] < 1e-5  # exact attention loses nothing
    (True, True)
    """
    budgets_of(ratios, int(context_ids.shape[-1]))  # a bad ratio refused before the reference is built
    whole = WholeSequence(model, context_ids, continuation_ids, answer_length=answer_length,
                          short_context=short_context)
    rows, layers = [whole.reference.unpatched_row()], []
    for method in methods:
        for ratio in ratios:
            row, per_layer = whole.run(method, ratio, seed=seed, **dict(options or {}).get(method, {}))
            rows.append(row)
            layers.extend(per_layer)
    return rows, layers


class WholeSequence:
    r"""One sequence's shared part of the whole-sequence setting, then one method at one budget per :meth:`run`.

    Built once per sequence (the exact prefill of the context, the unpatched continuation and its key tokens, the
    clean q, k, v of every layer over all :math:`n` tokens and exact causal attention on them in float64), it
    serves any number of methods and budgets, in any order: :func:`sweep_methods` is its loop. Memory: the
    prefill's (:func:`~approxlab.patching.exact_prefill`) plus :math:`L\,H\,n\,p_v` float64 numbers of exact
    rows (283 MB for SmolLM2 at 2,048 tokens).

    Parameters
    ----------
    model, context_ids, continuation_ids, answer_length, short_context
        As :func:`sweep_methods`.

    Attributes
    ----------
    reference
        The unpatched model's continuation and key tokens; ``reference.unpatched_row()`` is its row.

    Examples
    --------
    A user's loop over their own methods and budgets, the sequence's shared part built once:

    >>> import torch
    >>> from transformers import LlamaConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.patching import WholeSequence
    >>> config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    >>> model = load_model("initialized", config=config, seed=0)
    >>> ids = torch.randint(30522, (1, 56), generator=torch.Generator().manual_seed(0))
    >>> whole = WholeSequence(model, ids[:, :48], ids[:, 48:], answer_length=2)
    >>> row, layers = whole.run("quest", 0.75, seed=1, page_size=4)
    >>> row["num_features"], row["status"], len(layers)   # 12 of 48 tokens' budget, both layers replaced
    (12, 'ok', 2)
    """

    def __init__(self, model, context_ids: torch.Tensor, continuation_ids: torch.Tensor, *, answer_length: int,
                 short_context: int | None = None):
        self.model = model
        self.reference = _Reference(model, context_ids, continuation_ids, answer_length=answer_length,
                                    short_context=short_context)
        self.ids = torch.cat([context_ids, continuation_ids], dim=1)
        queries = self.reference.prefill.queries
        self.clean = [(torch.cat([queries[layer].expand(q.shape[0], -1, -1, -1), q], dim=-2), k, v)
                      for layer, (q, k, v) in enumerate(self.reference.clean_inputs())]
        self.exact = [_exact_rows(*window) for window in self.clean]

    def run(self, method: str, ratio: float, *, seed: int = 0, **options) -> tuple[dict, list[dict]]:
        """``(row, layers)`` of ``method`` at compression ratio ``ratio`` (its budget :math:`d` the context tokens
        the ratio keeps), every layer replaced over the whole sequence, its generator seeded ``seed``: the columns
        of :func:`sweep_methods`; a failure of the method is recorded in ``row["status"]``."""
        from .patch import patch_attention
        from .replaying import replay

        reference = self.reference
        (ratio, budget), = reference.budgets([ratio])
        row = {"method": method, "compression_ratio": ratio, "num_features": budget}
        start = time.perf_counter()

        def patched():
            return patch_attention(self.model, method, num_features=budget, record_inputs=True,
                                   generator=torch.Generator().manual_seed(seed), **options)

        try:
            with patched() as patch:
                nll, hits = token_nll(self.model, self.ids, hits=True, start=reference.context_length - 1)
            errors = {"patched": _stack(patch.calls, lambda call: call.errors()["spectral"]),
                      "clean": _stack(replay(patched(), *zip(*self.clean)).calls,
                                      lambda call: output_errors(call.output, self.exact[call.layer])["spectral"])}
        except Exception as failure:  # noqa: BLE001 - the method's failure, recorded in its row
            return failed_row(row, failure, time.perf_counter() - start), []
        pooled, per_layer = _layer_summary(errors, [call.layer for call in patch.calls if call.call == 0])
        k = reference.answer_length
        correct = bool(hits[0, hits.shape[1] - k:].all()) if k else True
        row = {**row, **reference.scores(nll, correct, -float(nll[0, nll.shape[1] - k:].sum())), **pooled,
               "seconds": time.perf_counter() - start, "status": "ok"}
        return row, [{"method": method, "compression_ratio": ratio, "num_features": budget, **entry}
                     for entry in per_layer]


def _stack(calls, spectral) -> torch.Tensor:
    """``(L', S, H)``: ``spectral(call)`` ``(S, H)`` of each layer's first call."""
    return torch.stack([spectral(call) for call in calls if call.call == 0])
