r"""Every cache policy and budget on one sequence, one exact prefill shared: :func:`sweep_policies`.

The long-context question of a KV-cache policy is what it loses at each compression ratio. With the context's
prefill exact (the KV-cache setting), one :func:`~approxlab.patching.exact_prefill` serves every policy and
budget, and each costs only its compression and a continuation (:meth:`ExactPrefill.continue_with`).
:func:`sweep_policies` runs that loop on one sequence (a context, then a question and its answer) and returns one
tidy row per policy and ratio beside the unpatched model's row: exact match of the greedy answer, the answer's
log-probability, the change in NLL on all continuation tokens and on its key tokens (LongPPL), and summaries of
the layers' errors on clean and on patched inputs. A user's policy (registered with
:func:`approxlab.methods.register` and ``score=``) is swept the same way as the built-in ones.

Public API (re-exported by :mod:`approxlab.patching`)::

    sweep_policies(model, context_ids, continuation_ids, *, methods, ratios, answer_length, ...) -> (rows, layers)
"""

from __future__ import annotations

import contextlib
import math
import time

import torch

from .._validation import check_int
from ..cache._shared_scores import shared_scores
from ..cache._compression_ratio import kept_count
from .key_tokens import LCL_THRESHOLD, LSD_THRESHOLD
from .likelihood import token_nll
from .prefill import exact_prefill

__all__ = ["sweep_policies"]


def _short_nll(model, context_ids, continuation_ids, short_context: int) -> torch.Tensor:
    """``(1, t)``: the continuation's NLL read with only the last ``short_context`` context tokens (one forward of
    ``short_context + t`` tokens); entry ``j`` predicts continuation token ``j``."""
    ids = torch.cat([context_ids[:, context_ids.shape[1] - short_context:], continuation_ids], dim=1)
    return token_nll(model, ids)[:, short_context - 1:]


def _layer_summary(errors: dict, layer_ids) -> tuple[dict, list[dict]]:
    """Pooled columns of a run's errors ``{inputs: (L', S, H)}`` relative spectral error (mean, median and max over
    layers of each layer's median over heads and sequences; ``_worst_head``: the mean over layers of each layer's
    largest error over heads and sequences), and one row per replaced layer of ``layer_ids`` (its median and its
    largest over heads). The median over heads reads a method exact in most heads (DuoAttention's retrieval heads)
    as exact; the worst head says what its other heads lose."""
    columns, layers = {}, {}
    for inputs in ("clean", "patched"):
        flat = errors[inputs].flatten(1)  # (L', S H)
        per_layer, worst = flat.median(dim=1).values, flat.max(dim=1).values  # (L',) each
        columns.update({f"{inputs}_spectral_mean": float(per_layer.mean()),
                        f"{inputs}_spectral_median": float(per_layer.median()),
                        f"{inputs}_spectral_max": float(per_layer.max()),
                        f"{inputs}_spectral_worst_head": float(worst.mean())})
        for index, layer in enumerate(layer_ids):
            layers.setdefault(layer, {"layer": layer}).update({f"{inputs}_spectral": float(per_layer[index]),
                                                               f"{inputs}_spectral_worst_head": float(worst[index])})
    return columns, list(layers.values())


def failed_row(row: dict, status, seconds: float) -> dict:
    """A method's row where it failed: no answer, infinite losses, its failure on one line as ``status``."""
    if isinstance(status, BaseException):
        status = " ".join(f"{type(status).__name__}: {status}".split())
    return {**row, "correct": False, "answer_logprob": -math.inf, "delta_logprob": math.inf, "delta_all": math.inf,
            "delta_key": math.inf, "key_tokens": 0, "seconds": seconds, "status": status}


def budgets_of(ratios, context_length: int) -> list:
    """``[(ratio, b)]``: each compression ratio with the context tokens it keeps (:func:`kept_count`, which refuses a
    ratio outside ``[0, 1)``): checked before a sweep's prefill."""
    return [(float(ratio), kept_count(ratio, context_length)) for ratio in ratios]


class _Reference:
    """What every method of one sequence is compared with: the exact prefill of the context, the unpatched
    continuation, and (with ``short_context``) LongPPL's key tokens of the continuation."""

    def __init__(self, model, context_ids, continuation_ids, *, answer_length, short_context=None,
                 lsd_threshold=LSD_THRESHOLD, lcl_threshold=LCL_THRESHOLD):
        self.answer_length = check_int(answer_length, "answer_length", low=0)
        self.context_length = n_c = int(context_ids.shape[-1])
        if short_context is not None:
            short_context = check_int(short_context, "short_context", low=1, high=max(1, n_c - 1))
        self.continuation_ids = continuation_ids
        self.prefill = exact_prefill(model, context_ids)
        self.exact = self.prefill.unpatched(continuation_ids, answer_length=self.answer_length)
        self.mask, self.key_seconds = None, 0.0
        if short_context is not None:
            start = time.perf_counter()
            short = _short_nll(model, context_ids, continuation_ids, short_context)
            self.key_seconds = time.perf_counter() - start
            self.mask = (short - self.exact.nll > lsd_threshold) & (-self.exact.nll > lcl_threshold)
        self.exact_logprob = float(self.exact.answer_logprob()[0])

    def budgets(self, ratios) -> list:
        """``[(ratio, b)]``: each ratio with the context tokens it keeps (:func:`budgets_of`)."""
        return budgets_of(ratios, self.context_length)

    def clean_inputs(self) -> list:
        """Per layer, the unpatched continuation's queries ``(S, H, t, p)`` and the window's keys and values per KV
        head ``(S, H_kv, n_c + t, p)``."""
        return self.prefill._clean_pass(self.continuation_ids, self.answer_length)[1]

    def scores(self, nll: torch.Tensor, correct: bool, answer_logprob: float) -> dict:
        """The score columns of a run whose continuation NLL is ``nll`` ``(1, t)``."""
        difference = (nll - self.exact.nll)[0]
        key = self.mask[0] if self.mask is not None else torch.zeros_like(difference, dtype=torch.bool)
        return {"correct": bool(correct), "answer_logprob": answer_logprob,
                "delta_logprob": self.exact_logprob - answer_logprob, "delta_all": float(difference.mean()),
                "delta_key": float(difference[key].mean()) if bool(key.any()) else math.nan,
                "key_tokens": int(key.sum()) if self.mask is not None else 0}

    def continuation_scores(self, found) -> dict:
        """The score columns of a :class:`~approxlab.patching.Continuation`."""
        return self.scores(found.nll, bool(found.correct[0]), float(found.answer_logprob()[0]))

    def unpatched_row(self) -> dict:
        """The unpatched model's row."""
        return {"method": "unpatched", "compression_ratio": 0.0, "num_features": None,
                **self.continuation_scores(self.exact), "prefill_seconds": self.prefill.seconds,
                "key_token_seconds": self.key_seconds, "seconds": self.exact.seconds, "status": "ok"}


def sweep_policies(model, context_ids: torch.Tensor, continuation_ids: torch.Tensor, *, methods, ratios,
                   answer_length: int, short_context: int | None = None, seed: int = 0,
                   lsd_threshold: float = LSD_THRESHOLD, lcl_threshold: float = LCL_THRESHOLD,
                   options: dict | None = None, share: bool = True,
                   batch: bool = True) -> tuple[list[dict], list[dict]]:
    r"""Run every policy of ``methods`` at every compression ratio on one sequence, the exact prefill shared.

    Parameters
    ----------
    model : transformers.PreTrainedModel or LoadedModel
        A causal language model (:func:`~approxlab.patching.exact_prefill`).
    context_ids, continuation_ids : torch.Tensor
        ``(1, n_c)`` and ``(1, t)`` token ids: the context the policies compress, then the question and answer.
    methods : sequence of str
        Registered methods with a compression step (cache policies), built-in or a user's.
    ratios : sequence of float
        Compression ratios :math:`r \in [0, 1)` (kvpress's): each keeps
        :math:`b = \max(1, \lfloor n_c(1 - r)\rfloor)` context tokens per KV head
        (:func:`approxlab.cache.kept_count`).
    answer_length : int
        :math:`k`: the last ``k`` continuation tokens are the answer, generated greedily after the question.
    short_context : int, optional
        LongPPL's truncated context :math:`s` (``1 <= s < n_c``): the continuation's key tokens are those whose
        log-probability gains more than ``lsd_threshold`` nats from the context beyond the last :math:`s` tokens
        and exceeds ``lcl_threshold`` with the full context (:mod:`approxlab.patching.key_tokens`). None: no
        key tokens (``delta_key`` NaN).
    seed : int
        Each continuation's generator is ``torch.Generator().manual_seed(seed)`` (a randomized policy draws the
        same streams at every ratio).
    lsd_threshold, lcl_threshold : float
        LongPPL's :math:`\alpha` and :math:`\beta`.
    options : dict, optional
        ``{method: {option: value}}``, a policy's options (e.g. ``{"snapkv": {"window": 16}}``).
    share : bool, default True
        Compute what the prefill gives every budget once: each policy's scores of a layer's context, once for
        every ratio (:func:`~approxlab.cache._shared_scores.shared_scores`; a score function that takes the
        budget, once per budget, but CAP, expected attention and Compactor, whose budget only fits their sinks,
        share their budget-free core), and the context's attention column sums that H2O and observed attention score
        by, once per layer for both policies (the results are the same, bit for bit; False recomputes them per
        policy and ratio, for comparison).
    batch : bool, default True
        Run the policies of one ratio as one batched continuation (:meth:`ExactPrefill.continue_together`, at most
        :data:`BATCH_TOKENS` context tokens of cache copies at once), or each alone (False): the same results to the
        rounding of batched matrix products, the batch paying the model's projections, MLPs and Python overhead
        once for its policies.

    Returns
    -------
    rows : list of dict
        The unpatched model's row (``method="unpatched"``, ``prefill_seconds``, ``key_token_seconds``), then one
        per method and ratio:
        ``method``, ``compression_ratio``, ``num_features`` (:math:`b`), ``correct`` (exact match), ``answer_logprob``,
        ``delta_logprob`` (the unpatched model's answer log-probability minus this), ``delta_all`` and
        ``delta_key`` (mean change in NLL over all continuation tokens and over its key tokens, nats),
        ``key_tokens``, the ``clean_`` and ``patched_spectral_`` ``mean``/``median``/``max`` over layers (each
        layer's median over heads) and ``worst_head`` (the mean over layers of each layer's largest error over
        heads), ``seconds`` and ``status``.
    layers : list of dict
        One row per method, ratio and layer: ``clean_spectral`` and ``patched_spectral`` (median over heads), and
        ``clean_spectral_worst_head`` and ``patched_spectral_worst_head`` (largest over heads).

    Raises
    ------
    TypeError, ValueError
        As :func:`~approxlab.patching.exact_prefill` and :meth:`~approxlab.patching.ExactPrefill.continue_with`;
        ``short_context`` not in ``[1, n_c - 1]``; a ratio outside ``[0, 1)``.

    Notes
    -----
    Cost: one prefill of :math:`n_c` tokens, the unpatched continuation (its clean q, k, v and exact rows, which
    every policy's clean-input errors read, computed once), one forward of :math:`s + t` tokens for the key tokens
    (``key_token_seconds``), then per ratio one batched continuation of its policies
    (:meth:`ExactPrefill.continue_together`; with ``batch=False`` one :meth:`ExactPrefill.continue_with` per method
    and ratio); with ``share`` the :math:`O(n_c^2 p)` column sums of H2O and observed attention once per layer,
    not per policy and ratio. A policy row's ``seconds`` is its share of its batch plus its own errors. A failure
    of a policy is recorded in its row's ``status`` (NaN scores), and the sweep goes on.

    Examples
    --------
    A tiny random Llama; two policies at two ratios on a context of 48 tokens:

    >>> import torch
    >>> from transformers import LlamaConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.patching import sweep_policies
    >>> config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    >>> model = load_model("initialized", config=config, seed=0)
    >>> ids = torch.randint(30522, (1, 56), generator=torch.Generator().manual_seed(0))
    >>> rows, layers = sweep_policies(model, ids[:, :48], ids[:, 48:], methods=["streaming-llm", "h2o"],
    ...                               ratios=[0.5, 0.875], answer_length=2, short_context=16)
    >>> [(row["method"], row["num_features"]) for row in rows]
    [('unpatched', None), ('streaming-llm', 24), ('streaming-llm', 6), ('h2o', 24), ('h2o', 6)]
    >>> len(layers), sorted(layers[0])  # 2 layers for each of the 4 policy rows
    (8, ['clean_spectral', 'clean_spectral_worst_head', 'compression_ratio', 'layer', 'method', 'num_features',
         'patched_spectral', 'patched_spectral_worst_head'])
    """
    options = dict(options or {})
    budgets = budgets_of(ratios, int(context_ids.shape[-1]))  # a bad ratio refused before the prefill
    reference = _Reference(model, context_ids, continuation_ids, answer_length=answer_length,
                           short_context=short_context, lsd_threshold=lsd_threshold, lcl_threshold=lcl_threshold)
    answer_length, n_c, prefill = reference.answer_length, reference.context_length, reference.prefill
    rows = [reference.unpatched_row()]
    found = {}
    with contextlib.ExitStack() as stack:
        if share:  # the policies' scores and H2O's / observed attention's column sums
            stack.enter_context(shared_scores())
        for ratio, budget in budgets:
            for chunk in _chunks(list(methods), batch, n_c):
                requests = [{"method": method, "num_features": budget, "generator": torch.Generator().manual_seed(seed),
                             **options.get(method, {})} for method in chunk]
                if batch:
                    results = prefill.continue_together(requests, continuation_ids=continuation_ids,
                                                        answer_length=answer_length, on_failure="record")
                else:
                    results = [prefill.continue_with(**request, continuation_ids=continuation_ids,
                                                     answer_length=answer_length, on_failure="record")
                               for request in requests]
                found.update({(method, ratio): result for method, result in zip(chunk, results)})
    layers = []
    for method in methods:
        for ratio, budget in budgets:
            result = found[(method, ratio)]
            row = {"method": method, "compression_ratio": ratio, "num_features": budget}
            if result.status != "ok":
                rows.append(failed_row(row, result.status, result.seconds))
                continue
            pooled, per_layer = _layer_summary({inputs: result.errors[inputs]["spectral"] for inputs in
                                                ("clean", "patched")}, result.layers)
            rows.append({**row, **reference.continuation_scores(result), **pooled, "seconds": result.seconds,
                         "status": "ok"})
            layers.extend({**row, **entry} for entry in per_layer)
    return rows, layers


BATCH_TOKENS = 32768
r"""The most context tokens a batched continuation holds (its policies times :math:`n_c`): 16 policies at 2,048
tokens, 8 at 4,096, 4 at 8,192 (each copy of SmolLM2-135M's cache is 46 kB a token in float32)."""


def _chunks(methods: list, batch: bool, context_length: int) -> list:
    """The policies of one ratio in as few groups of at most ``BATCH_TOKENS // n_c`` as hold them, of sizes that
    differ by at most one (17 policies at 2,048 tokens: 9 and 8, not 16 and 1); one each without ``batch``."""
    size = max(1, BATCH_TOKENS // context_length) if batch else 1
    count = -(-len(methods) // size)
    bounds = [len(methods) * index // count for index in range(count + 1)]
    return [methods[start:stop] for start, stop in zip(bounds, bounds[1:])]
