"""approxlab.patching.key_tokens: LongPPL's key tokens, against a brute-force truncated context per token.

A tiny random Llama (float64) on 2 sequences of 48 tokens: the truncated NLL of each prediction equals the model
run on exactly the window LongPPL's sliding scheme gives it; the key tokens are those the two thresholds select;
``delta`` averages over them.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import tiny_llama

from approxlab.patching import token_nll
from approxlab.patching.key_tokens import key_tokens

VOCAB, N, SHORT, STRIDE = 64, 48, 12, 5


@pytest.fixture(scope="module")
def model():
    return tiny_llama(VOCAB, 2)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(VOCAB, (2, N), generator=torch.Generator().manual_seed(1))


def test_truncated_nll_reads_the_sliding_window(model, ids):
    found = key_tokens(model, ids, short_context=SHORT, stride=STRIDE, lsd_threshold=0.0, lcl_threshold=-1e9)
    torch.testing.assert_close(found.nll, token_nll(model, ids), rtol=0, atol=1e-12)
    for i in range(N - 1):  # the prediction at position i, of token i + 1
        first = 0 if i < SHORT else SHORT + (i - SHORT) // STRIDE * STRIDE - SHORT
        expected = token_nll(model, ids[:, first:i + 2])[:, -1]
        torch.testing.assert_close(found.nll_short[:, i], expected, rtol=0, atol=1e-10)
    early = SHORT + STRIDE  # the first window's predictions read the whole text before them
    assert torch.equal(found.nll_short[:, :early], found.nll[:, :early])
    assert bool((found.nll_short[:, early:] != found.nll[:, early:]).all())
    assert torch.equal(found.mask, found.nll_short - found.nll > 0.0) and 0 < int(found.mask.sum()) < found.mask.numel()
    assert not found.mask[:, :early].any()


def test_thresholds_and_delta(model, ids):
    found = key_tokens(model, ids, short_context=SHORT, stride=STRIDE, lsd_threshold=0.05, lcl_threshold=-4.5)
    lsd, lcl = found.nll_short - found.nll, -found.nll
    assert torch.equal(found.mask, (lsd > 0.05) & (lcl > -4.5))
    reference = found.nll[:, -20:]
    changed = reference + torch.arange(20, dtype=torch.float64)
    delta = found.delta(changed, reference)
    mask = found.mask[:, -20:]
    for s in range(2):
        steps = torch.arange(20, dtype=torch.float64)[mask[s]]
        expected = float(steps.mean()) if len(steps) else float("nan")
        assert delta["key"][s].item() == pytest.approx(expected, nan_ok=True)
        assert delta["all"][s].item() == pytest.approx(9.5) and delta["key_tokens"][s] == int(mask[s].sum())
    with pytest.raises(ValueError, match=r"`nll` and `reference` must be \(S, t\) with S = 2 and t <= 47"):
        found.delta(changed[:1], reference[:1])


@pytest.mark.parametrize("kwargs, match", [
    (dict(short_context=0), r"`short_context` must be an integer with 1 <= short_context <= 46"),
    (dict(short_context=47), r"`short_context` must be an integer with 1 <= short_context <= 46"),
    (dict(short_context=8, stride=0), r"`stride` must be an integer"),
])
def test_inputs_are_checked(model, ids, kwargs, match):
    with pytest.raises(ValueError, match=match):
        key_tokens(model, ids, **kwargs)
