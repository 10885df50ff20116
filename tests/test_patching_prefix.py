"""A causal model run from one layer on (:mod:`approxlab.patching.prefix`): with only that layer patched, the
tail run from the unpatched hidden states gives the whole patched run's losses and errors; the model is left as it
was."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

import approxlab
from approxlab.data import load_model
from approxlab.patching import token_nll
from approxlab.patching.prefix import layer_inputs, token_nll_from


@pytest.fixture(scope="module")
def model():
    config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return load_model("initialized", config=config, seed=0)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(30522, (2, 40), generator=torch.Generator().manual_seed(3))


def _patched(model, layer, method):
    return approxlab.patch_attention(model, method, layers=[layer], num_features=8, record_inputs=True,
                                     record_attention=True, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("method", ["performer", "topk", "streaming-llm"])
@pytest.mark.parametrize("layer", [1, 2, 3])
def test_the_tail_from_the_layer_input_equals_the_whole_patched_run(model, ids, layer, method):
    """Same seed, same kernels: the losses and the layer's errors of the whole patched pass, to rounding."""
    with _patched(model, layer, method) as whole:
        expected = token_nll(model, ids, start=5)
    hidden = layer_inputs(model, ids, [layer])[layer]
    with _patched(model, layer, method) as tail:
        found = token_nll_from(model, ids, layer=layer, hidden=hidden, start=5)
    torch.testing.assert_close(found, expected, rtol=0, atol=1e-10)
    assert [(r["layer"], r["head"]) for r in tail.errors()] == [(r["layer"], r["head"]) for r in whole.errors()]
    for got, want in zip(tail.errors(), whole.errors()):
        assert got["spectral"] == pytest.approx(want["spectral"], rel=1e-9, abs=1e-12)


def test_the_captured_inputs_are_the_layers_inputs_and_a_wrong_hidden_state_shows(model, ids):
    """Layer 0's input is the embedding; a hidden state that is not the layer's input changes the losses (the
    tail really starts from it)."""
    found = layer_inputs(model, ids, [0, 2])
    torch.testing.assert_close(found[0], model.model.get_input_embeddings()(ids), rtol=0, atol=0)
    right = token_nll_from(model, ids, layer=2, hidden=found[2])
    wrong = token_nll_from(model, ids, layer=2, hidden=found[0])
    torch.testing.assert_close(right, token_nll(model, ids), rtol=0, atol=1e-10)
    assert not torch.allclose(wrong, right, rtol=0, atol=1e-3)


def test_the_model_keeps_its_layers_after_a_run_and_after_a_failure(model, ids):
    layers = model.model.base_model.layers
    token_nll_from(model, ids, layer=3, hidden=layer_inputs(model, ids, [3])[3])
    assert model.model.base_model.layers is layers and len(layers) == 4
    with pytest.raises(ValueError, match=r"`hidden` must be a \(S, n, h\) tensor with \(S, n\) = \(2, 40\)"):
        token_nll_from(model, ids, layer=1, hidden=torch.zeros(1, 40, 32))
    with pytest.raises(ValueError, match=r"`layer` must be an integer with 0 <= layer <= 3; got 4"):
        token_nll_from(model, ids, layer=4, hidden=torch.zeros(2, 40, 32))
    with pytest.raises(ValueError, match="`layers` must name at least one layer"):
        layer_inputs(model, ids, [])
    assert model.model.base_model.layers is layers
    assert all(not m._forward_pre_hooks for m in layers)
