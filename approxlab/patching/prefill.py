r"""One exact prefill, many compressed caches: the KV-cache setting at long context without a model run per policy.

In the KV-cache setting (:func:`~approxlab.patching.patch_attention` with ``context_length``) a context of
:math:`n_c` tokens is processed exactly -- its hidden states, queries, keys and values are the unpatched model's --
and only the continuation reads the compressed cache. Every policy and budget can therefore share one prefill,
as kvpress's pipeline does (prefill, compress, then generate): :func:`exact_prefill` runs the unpatched model over
the context once and keeps, per layer, its keys and values (the cache) and the queries that the policies' scores
read (SnapKV's observation window, H2O's accumulated attention, computed blockwise by the policy from them).
:meth:`ExactPrefill.continue_with` then, for one policy and budget, compresses each layer's cache per KV head
exactly as :func:`approxlab.kv_cache_attention` does and runs only the continuation on it: the cost of a
policy is its compression and a continuation of :math:`t` tokens, :math:`O(L\,t\,(b + t))` attention work
instead of a forward pass over :math:`n_c + t` tokens.

Public API (re-exported by :mod:`approxlab.patching`)::

    exact_prefill(model, context_ids) -> ExactPrefill
    ExactPrefill.continue_with(method, *, num_features, continuation_ids, answer_length=0, ...) -> Continuation
    ExactPrefill.unpatched(continuation_ids, *, answer_length=0) -> Continuation
    Continuation      # nll, hits, generated, correct, errors, error_rows(), seconds, status

The record a continuation gives back, :class:`~approxlab.patching.Continuation`, is
:mod:`approxlab.patching.continuation`'s.
"""

from __future__ import annotations

import inspect
import time

import torch

from .._validation import as_generator, check_choice, check_int
from ..data.capture import _check_input_ids
from ..data.positions import max_positions
from . import _model
from ._continuation import (_REQUEST_OPTIONS, _cut, _exact_rows, _Layer, _originals, _Policy,
                            _Prepared, _read_cache, _Recorder, _Together, decoding_cache, first_copies, reserved)
from ._layer import kv_cache_call
from .continuation import ERROR_INPUTS, Continuation
from .likelihood import _output_head, next_token_losses
from .patch import _LOCK, give_back, take_over
from .records import ERROR_MEASURES, output_errors

__all__ = ["exact_prefill", "ExactPrefill"]

ON_FAILURE = ("raise", "record")


class ExactPrefill:
    r"""The unpatched model's pass over a context, shared by every policy and budget (:func:`exact_prefill`).

    Attributes
    ----------
    context_length : int
        :math:`n_c`.
    context_ids : torch.Tensor
        ``(S, n_c)``.
    queries, keys, values : tuple of torch.Tensor
        Per layer, the context's ``(S, H, n_c, p)`` queries (rescaled to the :math:`1/\sqrt p` convention) and
        ``(S, H_kv, n_c, p)``, ``(S, H_kv, n_c, p_v)`` keys and values (RoPE applied), in the compute dtype (the
        model's, float32 for a half-precision model). Memory: about :math:`L\,n_c\,p\,(H + 2H_{kv})` numbers
        (566 MB in float32 for SmolLM2 at 8,192 tokens, besides the model's own cache of the same K/V).
    seconds : float
        Wall seconds of the prefill.

    Examples
    --------
    A tiny random Llama (4 query heads sharing 2 KV heads of width 8); :meth:`continue_with` runs a policy on it:

    >>> import torch
    >>> from transformers import LlamaConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.patching import exact_prefill
    >>> config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    >>> model = load_model("initialized", config=config, seed=0)
    >>> ids = torch.randint(30522, (1, 72), generator=torch.Generator().manual_seed(0))
    >>> prefill = exact_prefill(model, ids[:, :64])           # one pass over the context
    >>> prefill.context_length, len(prefill.queries), prefill.queries[0].shape, prefill.keys[0].shape
    (64, 2, torch.Size([1, 4, 64, 8]), torch.Size([1, 2, 64, 8]))
    >>> exact = prefill.unpatched(ids[:, 64:], answer_length=3)  # the reference every policy is compared with
    >>> exact.method, exact.nll.shape, exact.generated.shape, exact.errors
    ('unpatched', torch.Size([1, 8]), torch.Size([1, 3]), {})
    >>> kept = prefill.continue_with("snapkv", num_features=16, window=4, continuation_ids=ids[:, 64:],
    ...                              answer_length=3)         # every policy and budget: a continuation
    >>> kept.nll.shape, kept.generated.shape, kept.errors["clean"]["spectral"].shape  # 2 layers, 4 heads
    (torch.Size([1, 8]), torch.Size([1, 3]), torch.Size([2, 1, 4]))
    >>> bool(torch.equal(kept.nll[:, 0], exact.nll[:, 0]))    # the first token is predicted by the context
    True
    """

    def __init__(self, target, context_ids, cache, last_hidden, recorders, seconds, implementation):
        self._target = target
        self._implementation = implementation  # the model's own attention, set back after each pass
        self._cache = cache
        self._last_hidden = last_hidden  # (S, 1, h): predicts the continuation's first token
        self.context_ids = context_ids
        self.context_length = int(context_ids.shape[1])
        dtype = target.dtype
        self.compute_dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        self.queries = tuple(r.queries for r in recorders)
        self.keys = tuple(r.first_keys for r in recorders)
        self.values = tuple(r.first_values for r in recorders)
        self.seconds = seconds
        self._clean = {}  # continuation ids -> (unpatched Continuation, per layer clean (q, k, v), exact rows)

    def __repr__(self) -> str:
        return (f"ExactPrefill(context_length={self.context_length}, sequences={self.context_ids.shape[0]}, "
                f"layers={len(self.queries)}, seconds={self.seconds:.3g})")

    # -- running a continuation on the cache ---------------------------------------------------------------

    def _check_continuation(self, continuation_ids, answer_length):
        model = self._target.model
        _check_input_ids(continuation_ids, int(model.config.vocab_size))
        sequences, t = continuation_ids.shape
        if sequences != self.context_ids.shape[0]:
            raise ValueError(f"`continuation_ids` must have one row per context sequence ({self.context_ids.shape[0]}); "
                             f"got {sequences}.")
        limit = max_positions(self._target.architecture, model.config)
        if self.context_length + t > limit:
            raise ValueError(f"`continuation_ids` must fit the model's positions with the context: t <= "
                             f"{limit - self.context_length}; got t = {t}.")
        return check_int(answer_length, "answer_length", low=0, high=t)

    def _run(self, handlers: dict, continuation_ids: torch.Tensor, answer_length: int, copies: int = 1):
        """Teacher-forced pass over the continuation, then greedy generation of the answer, on the context's cache
        in buffers reserved for the whole continuation (:meth:`_reserved`: a step writes its own tokens, not a new
        copy of the cache), cut back to the context before and after. Returns ``(nll, hits, generated)``. With
        ``copies`` > 1 the continuation runs ``copies`` times in one batch (row ``s * copies + c`` is sequence
        ``s``'s copy ``c``) on a copy of the cache per row, which the handlers (:class:`_Together`) split among
        their policies."""
        target, context = self._target, self.context_length
        model, base = target.model, target.model.base_model
        device = self._last_hidden.device
        ids = continuation_ids.to(device).repeat_interleave(copies, dim=0)
        t = ids.shape[1]
        _cut(self._cache, context)
        cache = self._reserved(copies, context + t)

        def step(tokens):
            return base(input_ids=tokens, cache=cache, use_cache=True).last_hidden_state

        with _LOCK:
            registered = take_over(target, handlers)
        try:
            with torch.no_grad():
                hidden = torch.cat([self._last_hidden.repeat_interleave(copies, dim=0), step(ids)[:, :-1]], dim=1)
                nll, predicted = next_token_losses(model, hidden, ids)
                generated = predicted[:, t - answer_length:t - answer_length + 1] if answer_length else \
                    predicted[:, :0]
                _cut(cache, context + t - answer_length)
                while generated.shape[1] < answer_length:
                    last = step(generated[:, -1:].to(device))[:, -1:]
                    weight, bias = _output_head(model)
                    logits = torch.nn.functional.linear(last, weight, bias)
                    generated = torch.cat([generated, logits.argmax(dim=-1).cpu()], dim=1)
        finally:
            with _LOCK:
                give_back(target, self._implementation, lambda handler: handler in handlers.values(), registered)
            _cut(self._cache, context)
            _cut(cache, context)
        return nll, predicted == ids.cpu(), generated

    def _reserved(self, copies: int, capacity: int):
        """The context's cache ``copies`` times over in buffers of ``capacity`` tokens (:func:`reserved`), kept for
        the next continuation of as many copies (the context's tokens are never overwritten; one such cache per
        number of copies, two at most). Fewer copies of one sequence than a held cache has are its first rows
        (:func:`first_copies`): 15 policies in batches of 8 and 7 hold one cache of 8, not two, in either order
        (a cache of one sequence is dropped when one of more copies and at least its capacity is made: at 8,192
        tokens, batches of 3 and 4 policies hold 4 copies of the context, 1.4 GB with SmolLM2-135M, not 3 + 4)."""
        held = self.__dict__.setdefault("_held", {})
        if copies in held and held[copies][0] >= capacity:
            return held[copies][1]
        single = self.context_ids.shape[0] == 1
        larger = [number for number, (size, _) in held.items() if number > copies and size >= capacity]
        if larger and single:
            shared = first_copies(held[min(larger)][1], copies, self._target.model.config)
            if shared is not None:
                return shared
        held.pop(copies, None)  # the former buffers freed before the new ones are filled
        if single:  # and those the new one's first rows will serve
            for number in [n for n, (size, _) in held.items() if n < copies and size <= capacity]:
                held.pop(number)
        while len(held) >= 2:
            held.pop(next(iter(held)))
        held[copies] = (capacity, reserved(self._cache, copies, capacity, self._target.model.config))
        return held[copies][1]

    def _clean_pass(self, continuation_ids: torch.Tensor, answer_length: int):
        """The unpatched continuation (computed once per continuation): its result, each layer's clean q (window),
        k, v (per query head) and exact continuation rows in float64."""
        key = (tuple(continuation_ids.shape), tuple(continuation_ids.flatten().tolist()), answer_length)
        if key not in self._clean:
            start = time.perf_counter()
            handlers = {layer: _Layer(self, layer) for layer in range(len(self.queries))}
            nll, hits, generated = self._run(handlers, continuation_ids, answer_length)
            seconds = time.perf_counter() - start
            inputs = [handlers[layer].first_window() for layer in range(len(self.queries))]
            exact = [_exact_rows(*window) for window in inputs]
            result = Continuation("unpatched", None, nll, hits, generated, _answer(continuation_ids, answer_length),
                                  seconds=seconds)
            self._clean = {key: (result, inputs, exact)}  # the last continuation only (memory)
        return self._clean[key]

    def unpatched(self, continuation_ids: torch.Tensor, *, answer_length: int = 0) -> Continuation:
        """The unpatched model's continuation on the exact cache (the reference every policy is compared with): a
        :class:`Continuation` with ``method="unpatched"`` and no errors. Its clean q, k, v are kept for the
        policies' clean-input errors on the same continuation."""
        answer_length = self._check_continuation(continuation_ids, answer_length)
        return self._clean_pass(continuation_ids, answer_length)[0]

    def continue_with(self, method: str, *, num_features: int, continuation_ids: torch.Tensor,
                      answer_length: int = 0, layers=None, generator: torch.Generator | None = None,
                      grouping: str | None = None, allocation: str | None = None,
                      alpha_safeguard: float | None = None, layer_budgets: str | None = None,
                      pyramid_beta: float | None = None, decoding_interval: int | None = None,
                      on_failure: str = "raise", **options) -> Continuation:
        r"""The continuation with ``method`` compressing each replaced layer's cache to ``num_features`` tokens.

        Parameters
        ----------
        method : str
            A registered method with a causal form: a cache policy (``score=``/``compress=``: ``streaming-llm``,
            ``snapkv``, ``h2o``, ``knorm``, a user's) compresses the prefill's cache once per layer; any other
            causal method runs its causal form on the window so far at every call, as in
            :func:`approxlab.kv_cache_attention`.
        num_features : int
            The budget :math:`b` (context tokens kept per KV head), or the method's ``num_features``.
        continuation_ids : torch.Tensor
            ``(S, t)`` token ids after the context (e.g. a question and its answer), teacher-forced.
        answer_length : int, default 0
            :math:`k`, the last ``k`` continuation tokens are the answer: generated greedily after the first
            ``t - k`` (``Continuation.generated``), scored by exact match and by their log-probability.
        layers : None, int or sequence of int
            The layers whose cache is compressed (default: every layer); the others read the exact cache.
        generator : torch.Generator, optional
            The random streams of the layers, drawn as :func:`~approxlab.patching.patch_attention` draws them (one
            seed per model layer), so that a randomized policy takes the same draws in both.
        grouping, allocation, alpha_safeguard, layer_budgets, pyramid_beta
            As in :func:`~approxlab.patching.patch_attention`'s KV-cache setting.
        decoding_interval : int, optional
            :math:`k \ge 1`: decoding-time compression, as :func:`~approxlab.patching.patch_attention`'s
            ``decoding_interval`` (kvpress's ``DecodingPress`` after a compressed prefill): the cache is compressed
            again, back to the layer's budget, every :math:`k` tokens after the context -- the question's and the
            answer's, teacher-forced and generated alike (:mod:`approxlab.patching.decoding`). Default None: the
            context compressed once, every later token kept. A cache policy only (not AdaKV's allocation, nor a
            policy that reads the rotary embedding).
        on_failure : {"raise", "record"}, default "raise"
            What a failure of the method does: propagate, or give a :class:`Continuation` whose ``status`` names it
            (``nll`` :math:`+\infty`, no errors), so that a sweep goes on.
        **options
            The method's options (e.g. ``window``, ``sinks``).

        Returns
        -------
        Continuation
            Its ``errors`` hold, for each replaced layer, the relative errors of the continuation's rows
            (:func:`~approxlab.patching.output_errors`, float64) on two inputs (:data:`ERROR_INPUTS`).

        Raises
        ------
        TypeError, ValueError
            As :func:`~approxlab.patching.patch_attention` for ``method``, ``num_features``, ``layers`` and the
            budget options; ``continuation_ids`` not ``(S, t)`` ids of the model's vocabulary with one row per
            context sequence, or beyond the model's positions; ``answer_length`` not in ``[0, t]``; ``on_failure``
            not in ``("raise", "record")``.

        Notes
        -----
        **Exactness.** The prefill is the unpatched model's, as in the KV-cache setting of
        :func:`~approxlab.patching.patch_attention`, where the context's rows are exact attention; each replaced
        layer's continuation rows are ``kv_cache_attention(method, q, k, v, context_length=n_c, ...)`` on its window
        (the prefill's queries and keys, then the continuation's), so the result equals the per-cell path (the
        whole sequence in one patched forward pass) to rounding -- a test checks it. The compression depends on the
        context alone, so generated tokens read the same kept set
        (:func:`~approxlab.cache._selection.attend_compressed_rows`).

        **Errors.** With :math:`\tilde o_i` a layer's continuation row and :math:`o_i` exact causal attention,
        :math:`\|\tilde O - O\|_2 / \|O\|_2` and the other measures over the :math:`t` rows, per sequence and head:

        * ``"patched"``: on the q, k, v the patched run gave the layer (the teacher-forced pass);
        * ``"clean"``: on the unpatched run's (the exact prefill and one unpatched pass over the continuation,
          :meth:`unpatched`), the same kept set: the error the layer would make on the model's own inputs, free of
          the drift earlier layers cause. The clean q, k, v are computed once per continuation and shared.

        **Cost.** Per replaced layer: the compression (e.g. H2O's column sums, :math:`O(n_c^2 p)` in row blocks),
        :math:`O(t(b + t)p)` for the rows, and :math:`O(t\,n_c\,p)` float64 for each exact reference; the MLPs of
        :math:`t` tokens; no pass over the context. An example is in :class:`ExactPrefill`'s docstring.
        """
        start = time.perf_counter()
        answer_length = self._check_continuation(continuation_ids, answer_length)
        on_failure = check_choice(on_failure, "on_failure", ON_FAILURE)
        prepared = self._prepare(method, num_features, layers, generator, grouping, allocation, alpha_safeguard,
                                 layer_budgets, pyramid_beta, decoding_interval, options)
        clean, clean_inputs, clean_exact = self._clean_pass(continuation_ids, answer_length)
        try:
            run = self._run(prepared.handlers, continuation_ids, answer_length)
        except Exception as failure:  # noqa: BLE001 - the method's failure, recorded when asked
            return self._failed(prepared, failure, on_failure, clean, continuation_ids, answer_length, start)
        return self._finish(prepared, run, on_failure, continuation_ids, answer_length, start)

    def continue_together(self, requests, *, continuation_ids: torch.Tensor, answer_length: int = 0,
                          on_failure: str = "raise") -> list[Continuation]:
        r"""Several policies' continuations in one batched pass: ``continue_with(**request, ...)`` for each request,
        to rounding.

        Parameters
        ----------
        requests : sequence of dict
            The keyword arguments of :meth:`continue_with` for each policy besides those below (``method``,
            ``num_features``, ``generator``, the method's options, ...).
        continuation_ids, answer_length, on_failure
            As in :meth:`continue_with`, shared by every request.

        Returns
        -------
        list of Continuation
            One per request, in order; its ``seconds`` are its share of the batched pass (the pass's seconds over
            the requests) plus its own compression checks and errors.

        Raises
        ------
        TypeError, ValueError
            As :meth:`continue_with`, for any request.

        Notes
        -----
        The continuation runs once with a batch of one copy per request (the context's cache copied), each layer's
        handler handing each copy to its policy (:class:`_Together`), so the projections, MLPs and the model's
        Python overhead are paid once for all; what a policy computes -- its compression, its rows, its errors -- is
        its own, as in :meth:`continue_with`. The results differ from :meth:`continue_with`'s only by the rounding
        of batched matrix products (a test compares them). If the batched pass fails, each request runs alone, so
        that a failing policy is recorded (``on_failure="record"``) without taking the others with it. Memory: the
        context's cache once per request.

        Examples
        --------
        A tiny random GPT-2; two policies in one batch, and one of them alone:

        >>> import torch
        >>> from transformers import GPT2Config
        >>> ids = torch.randint(30522, (1, 72), generator=torch.Generator().manual_seed(1))
        >>> from approxlab.data import load_model
        >>> model = load_model("initialized", config=GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=80), seed=1)
        >>> from approxlab.patching import exact_prefill
        >>> prefill = exact_prefill(model, ids[:, :64])
        >>> requests = [{"method": "h2o", "num_features": 16}, {"method": "snapkv", "num_features": 16, "window": 4}]
        >>> found = prefill.continue_together(requests, continuation_ids=ids[:, 64:], answer_length=3)
        >>> alone = prefill.continue_with("snapkv", num_features=16, window=4, continuation_ids=ids[:, 64:],
        ...                               answer_length=3)
        >>> [c.method for c in found], bool(torch.allclose(found[1].nll, alone.nll, atol=1e-5))
        (['h2o', 'snapkv'], True)
        """
        start = time.perf_counter()
        answer_length = self._check_continuation(continuation_ids, answer_length)
        on_failure = check_choice(on_failure, "on_failure", ON_FAILURE)
        requests = [dict(request) for request in requests]
        for request in requests:
            for name in ("continuation_ids", "answer_length", "on_failure"):
                if name in request:
                    raise TypeError(f"`requests` must leave `{name}` to continue_together's own argument; got it in "
                                    f"a request for {request.get('method')!r}.")
        prepared = [self._prepare(request.pop("method"), request.pop("num_features"), *(
            request.pop(name, None) for name in _REQUEST_OPTIONS), request) for request in requests]
        self._clean_pass(continuation_ids, answer_length)
        copies = len(prepared)
        together = {layer: _Together([self._handler(one, layer) for one in prepared], copies)
                    for layer in sorted({layer for one in prepared for layer in one.chosen})}
        try:
            nll, hits, generated = self._run(together, continuation_ids, answer_length, copies=copies)
        except Exception:  # noqa: BLE001 - one policy's failure: each alone, so that it is recorded alone
            return [self.continue_with(**original, continuation_ids=continuation_ids, answer_length=answer_length,
                                       on_failure=on_failure) for original in _originals(prepared)]
        share = (time.perf_counter() - start) / copies
        return [self._finish(one, (nll[index::copies], hits[index::copies], generated[index::copies]), on_failure,
                             continuation_ids, answer_length, time.perf_counter() - share)
                for index, one in enumerate(prepared)]

    def _prepare(self, method, num_features, layers, generator, grouping, allocation, alpha_safeguard,
                 layer_budgets, pyramid_beta, decoding_interval, options) -> "_Prepared":
        """One policy's checked settings and its layers' handlers (:meth:`continue_with`'s arguments)."""
        target = self._target
        chosen = _model.check_layers(layers, target)
        spec, num_features, _ = _model.check_method(method, num_features, options, target)
        grouping = _model.check_grouping(grouping, self.context_length)
        generator = as_generator(generator)
        allocation, alpha_safeguard, _, per_layer = _model.check_budgets(
            spec, num_features, options, len(target.modules), self.context_length, allocation=allocation,
            alpha_safeguard=alpha_safeguard, layer_budgets=layer_budgets, pyramid_beta=pyramid_beta)
        decoding_interval = _model.check_decoding(spec, decoding_interval, self.context_length, allocation, False)
        supplied = _model.supplied_inputs(spec, options, target, chosen)
        unused = torch.Generator(device=generator.device)
        unused.set_state(generator.get_state())  # the request again, for a run alone
        seeds = _model.layer_seeds(generator, len(target.modules))
        step_options = {**supplied, **options, "grouping": grouping, "allocation": allocation,
                        "alpha_safeguard": alpha_safeguard}
        policy = _Policy(spec.name, {layer: per_layer[layer] for layer in chosen}, step_options, seeds,
                         decoding_interval)
        handlers = {layer: _Layer(self, layer, policy, torch.Generator().manual_seed(seeds[layer]))
                    for layer in chosen}
        original = {"method": method, "num_features": num_features, "layers": layers, "generator": unused,
                    "grouping": grouping, "allocation": allocation, "alpha_safeguard": alpha_safeguard,
                    "layer_budgets": layer_budgets, "pyramid_beta": pyramid_beta,
                    "decoding_interval": decoding_interval, **options}
        return _Prepared(spec.name, num_features, chosen, policy, handlers, original)

    def _handler(self, prepared, layer: int):
        """A policy's handler of ``layer``, or the unpatched layer's where the policy leaves it exact."""
        return prepared.handlers[layer] if layer in prepared.handlers else _Layer(self, layer)

    def _failed(self, prepared, failure, on_failure, clean, continuation_ids, answer_length, start):
        if on_failure == "raise":
            raise failure
        status = " ".join(f"{type(failure).__name__}: {failure}".split())
        return Continuation(prepared.method, prepared.num_features, torch.full_like(clean.nll, torch.inf),
                            torch.zeros_like(clean.hits), torch.zeros_like(clean.generated),
                            _answer(continuation_ids, answer_length), layers=prepared.chosen,
                            budgets=prepared.policy.budgets, seconds=time.perf_counter() - start, status=status)

    def _finish(self, prepared, run, on_failure, continuation_ids, answer_length, start) -> Continuation:
        """The continuation's errors (:meth:`_errors`) beside the run's ``(nll, hits, generated)``."""
        clean, clean_inputs, clean_exact = self._clean_pass(continuation_ids, answer_length)
        try:
            errors = self._errors(prepared.handlers, prepared.chosen, prepared.policy, clean_inputs, clean_exact)
        except Exception as failure:  # noqa: BLE001 - the method's failure, recorded when asked
            return self._failed(prepared, failure, on_failure, clean, continuation_ids, answer_length, start)
        nll, hits, generated = run
        return Continuation(prepared.method, prepared.num_features, nll, hits, generated,
                            _answer(continuation_ids, answer_length), layers=prepared.chosen,
                            budgets=prepared.policy.budgets, errors=errors, seconds=time.perf_counter() - start)

    def _errors(self, handlers, chosen, policy, clean_inputs, clean_exact) -> dict:
        """``{"clean": ..., "patched": ...}``, each ``{measure: (L', S, H)}`` (see :meth:`continue_with`)."""
        found = {inputs: {name: [] for name in ERROR_MEASURES} for inputs in ERROR_INPUTS}
        context = self.context_length
        for layer in chosen:
            handler = handlers[layer]
            queries, k, v = handler.first_window()
            rows = handler.first[3]
            patched = output_errors(rows, _exact_rows(queries, k, v))
            q_clean, k_clean, v_clean = clean_inputs[layer]
            if handler.decoding is not None:  # compressed again every decoding_interval tokens, on clean inputs
                cache = decoding_cache(policy, layer, torch.Generator().manual_seed(policy.seeds[layer]))
                window = torch.cat([self.queries[layer], q_clean], dim=-2)
                approx = cache.rows(window, k_clean, v_clean, context, context).output
            elif handler.kept is not None:
                approx = _read_cache(q_clean, k_clean, v_clean, handler.kept, context)
            else:  # a method without a compression step: its causal form, on the layer's own stream's seed
                window = torch.cat([self.queries[layer], q_clean], dim=-2)
                approx = kv_cache_call(policy.method, window, k_clean, v_clean, context_length=context,
                                       num_features=policy.budgets[layer],
                                       generator=torch.Generator().manual_seed(policy.seeds[layer]),
                                       **policy.options).output
            clean = output_errors(approx, clean_exact[layer])
            for inputs, measures in (("clean", clean), ("patched", patched)):
                for name in ERROR_MEASURES:
                    found[inputs][name].append(measures[name])
        return {inputs: {name: torch.stack(values) for name, values in measures.items()}
                for inputs, measures in found.items()}


def _answer(continuation_ids: torch.Tensor, answer_length: int) -> torch.Tensor:
    return continuation_ids[:, continuation_ids.shape[1] - answer_length:].cpu()


def exact_prefill(model, context_ids: torch.Tensor) -> ExactPrefill:
    r"""Run the unpatched model over a context once, keeping what every cache policy needs.

    Parameters
    ----------
    model : transformers.PreTrainedModel or LoadedModel
        A causal language model of a family approxlab reads (with its output head, or tied embeddings), in
        ``eval()`` mode; it is not changed (its attention is taken over only while a pass runs, as
        :func:`~approxlab.patching.patch_attention` does).
    context_ids : torch.Tensor
        ``(S, n_c)`` integer token ids, ``n_c >= 1``, no padding.

    Returns
    -------
    ExactPrefill
        The context's cache, the queries of every layer and the hidden state that predicts the first token
        after it; :meth:`ExactPrefill.continue_with` runs a policy's continuation on it.

    Raises
    ------
    TypeError, ValueError
        ``model`` not a causal model of a supported family or without an output head; ``context_ids`` not
        integer ``(S, n_c)`` ids of its vocabulary within its positions; a model with sliding-window layers.

    Notes
    -----
    One forward pass of the bare model with a ``DynamicCache``, every layer's attention PyTorch's SDPA (as
    ``attn_implementation="sdpa"``): the hidden states, keys and values are those of the unpatched model, which
    is what the KV-cache setting assumes of the context (kvpress: prefill, compress, then the questions). The
    queries are kept whole: a policy's scores may read any of them (SnapKV the last window's, H2O all of them
    through its column sums, a user's policy whatever it declares).

    References
    ----------
    .. [1] NVIDIA kvpress: a press compresses the prefilled cache; the questions follow.

    Examples
    --------
    A tiny random GPT-2 (4 heads of width 8); :meth:`ExactPrefill.continue_with` has an example with grouped heads:

    >>> import torch
    >>> from transformers import GPT2Config
    >>> from approxlab.data import load_model
    >>> from approxlab.patching import exact_prefill
    >>> model = load_model("initialized", config=GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64), seed=0)
    >>> prefill = exact_prefill(model, torch.randint(30522, (1, 48), generator=torch.Generator().manual_seed(0)))
    >>> prefill.queries[0].shape, prefill.keys[0].shape, prefill.context_length
    (torch.Size([1, 4, 48, 8]), torch.Size([1, 4, 48, 8]), 48)
    """
    from transformers import DynamicCache

    start = time.perf_counter()
    target = _model.resolve_model(model)
    if not target.causal:
        raise ValueError(f"`model` must be a causal language model (a decoder); got a "
                         f"{target.architecture.model_type} model, which attends in both directions.")
    _model.check_layers(None, target)  # refuses sliding-window layers
    base_model = target.model
    weight, _ = _output_head(base_model)
    _check_input_ids(context_ids, int(base_model.config.vocab_size))
    limit = max_positions(target.architecture, base_model.config)
    if not 1 <= context_ids.shape[1] < limit:
        raise ValueError(f"`context_ids` must have 1 <= n_c < {limit} tokens per sequence (the model's positions, "
                         f"one left for a continuation); got n_c = {context_ids.shape[1]}.")
    if "cache" not in inspect.signature(base_model.base_model.forward).parameters:
        raise ValueError(f"`model` must take a cache in its forward pass (transformers' `cache=`); got a "
                         f"{type(base_model.base_model).__name__} without one.")
    dtype = target.dtype if target.dtype in (torch.float32, torch.float64) else torch.float32
    recorders = {layer: _Recorder(target.layouts[layer], dtype) for layer in range(len(target.modules))}
    cache = DynamicCache(config=base_model.config)
    previous = base_model.config._attn_implementation
    with _LOCK:
        registered = take_over(target, recorders)
    try:
        with torch.no_grad():
            hidden = base_model.base_model(input_ids=context_ids.to(weight.device), cache=cache,
                                           use_cache=True).last_hidden_state
    finally:
        with _LOCK:
            give_back(target, previous, lambda handler: handler in recorders.values(), registered)
    prefill = ExactPrefill(target, context_ids.cpu(), cache, hidden[:, -1:], [recorders[layer] for layer in
                                                                             range(len(target.modules))],
                           time.perf_counter() - start, previous)
    return prefill
