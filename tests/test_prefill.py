"""approxlab.patching.exact_prefill: one exact prefill shared by every policy equals the per-cell path.

The per-cell path is :func:`approxlab.patch_attention` in the KV-cache setting over the whole sequence (one
patched forward pass, :func:`approxlab.patching.token_nll`); the engine prefills the context once and runs only
the continuation on each compressed cache. A tiny random Llama (3 layers, 4 query heads on 2 KV heads, float64)
on 2 sequences of 56 tokens: the continuation's NLL, greedy hits and every layer's errors on the patched run's
inputs agree to rounding for several policies (GQA: one kept set per KV head, and per query head); the clean-input
errors equal those of the policy applied to the unpatched model's q, k, v; the greedy answer equals token-by-token
decoding inside a patch.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import register_broken_policy, tiny_llama

import approxlab
from approxlab.patching import exact_prefill, output_errors, token_nll

VOCAB, N, CONTEXT, ANSWER = 128, 56, 40, 4
CASES = [
    ("streaming-llm", 8, {}),
    ("snapkv", 10, {"window": 4}),
    ("h2o", 12, {}),
    ("knorm", 8, {}),
    ("h2o", 6, {"grouping": "query-head"}),
    ("ada-snapkv", 10, {"window": 4}),
    ("pyramidkv", 10, {"window": 4}),
    ("topk", 6, {}),  # no compression step: its causal form on the window so far
]


@pytest.fixture(scope="module")
def model():
    return tiny_llama(VOCAB, 3)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(5, VOCAB, (2, N), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def prefill(model, ids):
    return exact_prefill(model, ids[:, :CONTEXT])


def per_cell(model, ids, method, budget, options):
    """The per-cell path: the whole sequence in one patched forward pass, the layers' errors recorded."""
    with approxlab.patch_attention(model, method, num_features=budget, context_length=CONTEXT, record_inputs=True,
                                   generator=torch.Generator().manual_seed(7), **options) as patch:
        nll, hits = token_nll(model, ids, hits=True)
    return nll, hits, patch.errors()


def greedy_in_patch(model, ids, method, **patch):
    """``(S, ANSWER)``: the answer decoded token by token after the question inside ``patch_attention``."""
    tokens = []
    with torch.no_grad(), approxlab.patch_attention(model, method, **patch):
        out = model(input_ids=ids[:, :N - ANSWER], use_cache=True)
        tokens.append(out.logits[:, -1].argmax(-1))
        for _ in range(ANSWER - 1):
            out = model(input_ids=tokens[-1][:, None], cache=out.cache, use_cache=True)
            tokens.append(out.logits[:, -1].argmax(-1))
    return torch.stack(tokens, dim=1)


@pytest.mark.parametrize("method, budget, options", CASES, ids=[f"{m}-{b}-{o.get('grouping', 'kv-head')}"
                                                                for m, b, o in CASES])
def test_shared_prefill_equals_the_per_cell_path(model, ids, prefill, method, budget, options):
    nll, hits, rows = per_cell(model, ids, method, budget, options)
    found = prefill.continue_with(method, num_features=budget, continuation_ids=ids[:, CONTEXT:], answer_length=ANSWER,
                                  generator=torch.Generator().manual_seed(7), **options)
    assert found.status == "ok" and found.nll.dtype == torch.float64
    # entry j of the engine predicts continuation token j; the first from the context alone
    torch.testing.assert_close(found.nll, nll[:, CONTEXT - 1:], rtol=0, atol=1e-9)
    assert torch.equal(found.hits, hits[:, CONTEXT - 1:])
    assert float((found.nll[:, 1:] - token_nll(model, ids)[:, CONTEXT:]).abs().max()) > 1e-6  # the policy matters
    patched = found.errors["patched"]
    for row in rows:
        assert row["call"] == 0
        index = found.layers.index(row["layer"])
        for measure in ("spectral", "frobenius", "worst_query"):
            assert patched[measure][index, row["sequence"], row["head"]].item() == pytest.approx(row[measure],
                                                                                                rel=1e-7, abs=1e-12)
    assert len(rows) == 3 * 2 * 4 and min(row["spectral"] for row in rows) > 1e-4


def test_clean_errors_are_the_policy_on_the_unpatched_inputs(model, ids, prefill):
    """Clean inputs: the policy applied to the unpatched model's q, k, v of the whole sequence (recorded in a pass
    with exact attention in every layer), its continuation rows against exact causal attention."""
    found = prefill.continue_with("h2o", num_features=8, continuation_ids=ids[:, CONTEXT:])
    with approxlab.patch_attention(model, "exact", num_features=1, record_inputs=True) as unpatched:
        model(ids)
    for call in unpatched.calls:
        q, k, v = call.inputs  # k, v repeated to the 4 query heads: one KV head per pair
        approx = approxlab.kv_cache_attention("h2o", q, k[:, ::2], v[:, ::2], context_length=CONTEXT, num_features=8)
        exact = approxlab.exact_attention(q, k, v, causal=True)[..., CONTEXT:, :]
        expected = output_errors(approx.output, exact)
        for measure, values in expected.items():
            torch.testing.assert_close(found.errors["clean"][measure][call.layer], values, rtol=1e-7, atol=1e-12)
    # layer 0 reads the embeddings: its patched inputs are clean; later layers' drift
    torch.testing.assert_close(found.errors["patched"]["spectral"][0], found.errors["clean"]["spectral"][0])
    assert not torch.allclose(found.errors["patched"]["spectral"][2], found.errors["clean"]["spectral"][2])


def test_greedy_answer_equals_token_by_token_decoding_in_a_patch(model, ids, prefill):
    question = N - ANSWER
    found = prefill.continue_with("snapkv", num_features=6, window=4, continuation_ids=ids[:, CONTEXT:],
                                  answer_length=ANSWER)
    assert torch.equal(found.generated, greedy_in_patch(model, ids, "snapkv", num_features=6, window=4,
                                                         context_length=CONTEXT))
    assert torch.equal(found.correct, (found.generated == ids[:, question:]).all(-1))
    unpatched = prefill.unpatched(ids[:, CONTEXT:], answer_length=ANSWER)
    assert unpatched.errors == {} and unpatched.method == "unpatched"
    torch.testing.assert_close(unpatched.nll, token_nll(model, ids)[:, CONTEXT - 1:], rtol=0, atol=1e-9)
    torch.testing.assert_close(found.answer_logprob(), -found.nll[:, -ANSWER:].sum(-1))


@pytest.mark.parametrize("method, options", [("h2o", {}), ("snapkv", {"window": 2})])
def test_decoding_time_compression_equals_a_patch_that_compresses_while_decoding(model, ids, prefill, method, options):
    """The cache compressed again every 3 tokens after the context (8 kept per KV head): the teacher-forced NLL, the
    patched-input errors and the greedy answer equal patch_attention(..., decoding_interval=3); the clean errors
    equal the same compressions on the unpatched q, k, v; and compressing again changes the result."""
    from approxlab.patching.decoding import DecodingCache

    budget = 8
    patch = dict(num_features=budget, context_length=CONTEXT, decoding_interval=3, **options)
    found = prefill.continue_with(method, num_features=budget, continuation_ids=ids[:, CONTEXT:], answer_length=ANSWER,
                                  decoding_interval=3, **options)
    with approxlab.patch_attention(model, method, record_inputs=True, **patch) as patched:
        nll = token_nll(model, ids)
    torch.testing.assert_close(found.nll, nll[:, CONTEXT - 1:], rtol=0, atol=1e-9)
    for row in patched.errors():
        index = found.layers.index(row["layer"])
        assert found.errors["patched"]["spectral"][index, row["sequence"], row["head"]].item() == pytest.approx(
            row["spectral"], rel=1e-7, abs=1e-12)
    once = prefill.continue_with(method, num_features=budget, continuation_ids=ids[:, CONTEXT:], answer_length=ANSWER,
                                 **options)
    assert float((found.nll - once.nll).abs().max()) > 1e-6
    assert torch.equal(found.generated, greedy_in_patch(model, ids, method, **patch))
    with approxlab.patch_attention(model, "exact", num_features=1, record_inputs=True) as clean:
        model(ids)
    for call in clean.calls:
        q, k, v = call.inputs  # k, v repeated to the 4 query heads: one KV head per pair
        rows = DecodingCache(method, budget, 3, "kv-head", None, options).rows(q, k[:, ::2], v[:, ::2], CONTEXT,
                                                                               CONTEXT).output
        exact = approxlab.exact_attention(q, k, v, causal=True)[..., CONTEXT:, :]
        expected = output_errors(rows, exact)["spectral"]
        torch.testing.assert_close(found.errors["clean"]["spectral"][found.layers.index(call.layer)], expected,
                                   rtol=1e-7, atol=1e-12)


def test_the_model_and_the_prefill_are_left_as_they_were(model, ids, prefill):
    before = token_nll(model, ids)
    implementation = model.config._attn_implementation
    keys = prefill.keys[1].clone()
    prefill.continue_with("streaming-llm", num_features=4, continuation_ids=ids[:, CONTEXT:], answer_length=2)
    assert model.config._attn_implementation == implementation
    assert torch.equal(token_nll(model, ids), before) and torch.equal(prefill.keys[1], keys)
    assert prefill._cache.get_seq_length() == CONTEXT


def test_a_failing_method_is_recorded_when_asked(prefill, ids, fresh_registry):
    register_broken_policy()
    found = prefill.continue_with("broken-policy", num_features=4, continuation_ids=ids[:, CONTEXT:],
                                  on_failure="record")
    with pytest.raises(FloatingPointError, match="no scores today"):
        prefill.continue_with("broken-policy", num_features=4, continuation_ids=ids[:, CONTEXT:])
    assert found.status == "FloatingPointError: no scores today" and bool(torch.isinf(found.nll).all())


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(continuation_ids=torch.zeros(3, 4, dtype=torch.long)), ValueError,
     r"`continuation_ids` must have one row per context sequence \(2\); got 3"),
    (dict(continuation_ids=torch.zeros(2, 100, dtype=torch.long)), ValueError,
     r"`continuation_ids` must fit the model's positions with the context: t <= 88; got t = 100"),
    (dict(continuation_ids=torch.zeros(2, 4, dtype=torch.long), answer_length=5), ValueError, r"`answer_length`"),
    (dict(continuation_ids=torch.zeros(2, 4, dtype=torch.long), on_failure="skip"), ValueError,
     r"`on_failure` must be one of \['raise', 'record'\]"),
    (dict(continuation_ids=torch.zeros(2, 4, dtype=torch.long), decoding_interval=0), ValueError,
     r"`decoding_interval`"),
    (dict(continuation_ids=torch.zeros(2, 4, dtype=torch.long), decoding_interval=2, allocation="adakv"), ValueError,
     r"`decoding_interval` keeps b tokens per head .* got allocation='adakv'"),
])
def test_inputs_are_checked(prefill, kwargs, error, match):
    with pytest.raises(error, match=match):
        prefill.continue_with("h2o", num_features=4, **kwargs)


def test_batched_policies_equal_each_alone_and_fewer_share_a_larger_batchs_cache(model, ids, monkeypatch):
    """``continue_together`` on one sequence: 3 policies in a batch, then 2 in the first rows of the same buffers
    (the context's cache held once, for 3 copies), each equal to its ``continue_with`` alone to rounding, the
    greedy answers (generated rows on kept sets per KV head and per query head) the same."""
    from approxlab.patching import prefill as module

    made, reserved = [], module.reserved
    monkeypatch.setattr(module, "reserved", lambda cache, copies, *args: made.append(copies) or reserved(cache, copies,
                                                                                                          *args))
    one = exact_prefill(model, ids[:1, :CONTEXT])
    three = [{"method": "snapkv", "num_features": 10, "window": 4}, {"method": "h2o", "num_features": 6,
             "grouping": "query-head"}, {"method": "knorm", "num_features": 8}]
    for requests in (three, three[1:], three):
        found = one.continue_together(requests, continuation_ids=ids[:1, CONTEXT:], answer_length=ANSWER)
        for request, result in zip(requests, found):
            alone = one.continue_with(**request, continuation_ids=ids[:1, CONTEXT:], answer_length=ANSWER)
            torch.testing.assert_close(result.nll, alone.nll, rtol=0, atol=1e-9)
            assert torch.equal(result.generated, alone.generated) and torch.equal(result.hits, alone.hits)
            torch.testing.assert_close(result.errors["patched"]["spectral"], alone.errors["patched"]["spectral"],
                                       rtol=1e-7, atol=1e-12)
    assert made == [1, 3]  # the unpatched pass's one copy and the batch of 3: none made for 2 (or 1 again)


def test_a_larger_batchs_cache_replaces_the_smaller_ones_it_serves(model, ids, monkeypatch):
    """2 policies, then 3, then 2 again on one sequence: the cache of 3 copies, once made, is the only one held (the
    unpatched pass's and the 2 policies' are dropped), and serves 2 copies and 1 from its first rows, with the same
    results as before it was made."""
    from approxlab.patching import prefill as module

    made, reserved = [], module.reserved
    monkeypatch.setattr(module, "reserved", lambda cache, copies, *args: made.append(copies) or reserved(cache, copies,
                                                                                                          *args))
    one = exact_prefill(model, ids[:1, :CONTEXT])
    three = [{"method": "snapkv", "num_features": 10, "window": 4}, {"method": "h2o", "num_features": 6},
             {"method": "knorm", "num_features": 8}]
    kwargs = {"continuation_ids": ids[:1, CONTEXT:], "answer_length": ANSWER}
    first = one.continue_together(three[1:], **kwargs)
    assert sorted(one._held) == [2]  # the unpatched pass's one copy dropped too
    one.continue_together(three, **kwargs)
    assert sorted(one._held) == [3]
    again = one.continue_together(three[1:], **kwargs)
    alone = one.continue_with(**three[1], **kwargs)
    assert made == [1, 2, 3] and sorted(one._held) == [3]
    for before, after in zip(first, again):
        assert torch.equal(before.nll, after.nll) and torch.equal(before.generated, after.generated)
    torch.testing.assert_close(alone.nll, first[0].nll, rtol=0, atol=1e-9)
