"""Decoding-time compression (``patch_attention(..., decoding_interval=k)``) under ``generate()`` on a tiny Llama."""

from __future__ import annotations

import pytest
import torch

import approxlab
from _helpers import gen, tiny_llama

PROMPT = 20
GENERATE = dict(max_new_tokens=16, do_sample=False, output_scores=True, return_dict_in_generate=True,
                pad_token_id=0, eos_token_id=None)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(64, 2)


def _ids():
    return torch.randint(0, 64, (1, PROMPT), generator=gen(5))


def _generate(model, **patch):
    with torch.no_grad(), approxlab.patch_attention(model, context_length=PROMPT, **patch) as patched:
        out = model.generate(_ids(), **GENERATE)
    return out, patched


@pytest.mark.parametrize("method", ["h2o", "snapkv", "knorm", "caote"])
def test_the_cache_never_holds_more_than_the_budget_plus_the_interval(model, method):
    options = {"window": 2} if method == "snapkv" else {}
    _, patched = _generate(model, method=method, num_features=8, decoding_interval=4, **options)
    largest = [call.info["largest_cache"] for call in patched.calls]
    assert max(largest) == 8 + 4  # reached, never passed
    assert all(call.info["kept_positions"].shape == (1, 2, 8) for call in patched.calls)  # b per KV head
    assert all(bool((call.info["kept_positions"] < PROMPT + 16).all()) for call in patched.calls)


def test_the_first_tokens_equal_the_uncompressed_run_while_under_budget(model):
    with torch.no_grad():
        plain = model.generate(_ids(), **GENERATE)
    out, _ = _generate(model, method="h2o", num_features=PROMPT, decoding_interval=5)  # the context kept whole
    same = [torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(plain.scores, out.scores)]  # float32 scores
    assert same[:6] == [True] * 6  # the prefill's prediction and 5 tokens attend everything (20 + 5 keys)
    assert not all(same[6:])  # then 5 of the 25 are evicted


def test_one_forward_over_the_generated_sequence_gives_the_generated_predictions(model):
    out, _ = _generate(model, method="h2o", num_features=8, decoding_interval=3)
    with torch.no_grad(), approxlab.patch_attention(model, "h2o", num_features=8, context_length=PROMPT,
                                                    decoding_interval=3):
        logits = model(out.sequences[:, :-1]).logits  # teacher-forced: the same rows in one call per layer
    stepwise = torch.stack(out.scores, dim=1).to(logits.dtype)  # generate() returns float32 scores
    assert torch.allclose(logits[:, PROMPT - 1:], stepwise, rtol=0, atol=1e-5)


def test_an_interval_past_the_continuation_is_the_kv_cache_setting(model):
    ids = torch.randint(0, 64, (1, 36), generator=gen(6))
    outputs = []
    for interval in (None, 16):
        with torch.no_grad(), approxlab.patch_attention(model, "snapkv", num_features=8, context_length=PROMPT,
                                                        decoding_interval=interval, window=2):
            outputs.append(model(ids).logits)
    assert torch.allclose(outputs[0], outputs[1], rtol=0, atol=1e-10)


def test_decoding_interval_is_refused_where_it_does_not_apply(model):
    def patch(method="h2o", **options):
        return approxlab.patch_attention(model, method, num_features=8, **options)

    with pytest.raises(ValueError, match=r"`decoding_interval` must be an integer with 1 <= .*got 0"):
        patch(context_length=PROMPT, decoding_interval=0)
    with pytest.raises(ValueError, match="pass it with context_length; got decoding_interval=4 without"):
        patch(decoding_interval=4)
    with pytest.raises(ValueError, match="needs a cache policy .* got method 'topk'"):
        patch("topk", context_length=PROMPT, decoding_interval=4)
    with pytest.raises(ValueError, match="reads the rotary embedding cannot; got method 'expected-attention'"):
        patch("expected-attention", context_length=PROMPT, decoding_interval=4)
    with pytest.raises(ValueError, match="allowed with allocation='uniform' .* got allocation='adakv'"):
        patch(context_length=PROMPT, decoding_interval=4, allocation="adakv")
    with pytest.raises(ValueError, match="got record_attention=True"):
        patch(context_length=PROMPT, decoding_interval=4, record_attention=True)
