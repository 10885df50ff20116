"""TinyEncoder's two-tower mode (kind="pair-classification"), as LRA's Retrieval model encodes pairs."""

import pytest
import torch

from approxlab.tasks import Batch, make_task
from approxlab.training import TinyEncoder, accuracy, instability_trace


def _model(attention="softmax", **kw):
    return TinyEncoder(vocab_size=256, n=32, attention=attention, kind="pair-classification", num_classes=2,
                       num_features=8, embedding_dim=16, hidden_dim=32, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(0), **kw)


@pytest.mark.parametrize("attention", ["softmax", "kernelized"])
def test_towers_are_encoded_separately_and_combined_as_lra(attention):
    """Each tower's embedding is the encoder's embedding of that sequence alone (shared weights, its own
    padding mask); the logits are the head of [u, v, u * v, u - v] of the mean-pooled towers."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 256, (3, 2, 32), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 1, 20:] = False  # the second document of pair 1 is padded
    batch = Batch(ids, mask, torch.tensor([0, 1, 1]))
    model = _model(attention).eval()
    embedding, _ = model(batch)
    assert embedding.shape == (3, 2, 32, 16)
    for tower in range(2):
        alone = model.embed(ids[:, tower], mask=mask[:, tower])
        assert torch.allclose(embedding[:, tower][mask[:, tower]], alone[mask[:, tower]], atol=1e-12)
    weights = mask.to(torch.float64).unsqueeze(-1)
    u, v = ((embedding * weights).sum(-2) / weights.sum(-2)).unbind(1)
    assert torch.allclose(model.predict(batch), model.head(torch.cat([u, v, u * v, u - v], -1)), atol=1e-12)


def test_instability_trace_and_accuracy_on_the_retrieval_task():
    task = make_task("retrieval", n=32, batch_size=4, num_batches=2, generator=torch.Generator().manual_seed(0))
    model = _model("skyformer", dropout=0.1)
    trace = instability_trace(model, task.batches, lr=1e-3, seed=0)
    assert trace["tau"].shape == (2,) and bool(torch.isfinite(trace["tau"]).all() and (trace["tau"] > 0).all())
    assert 0.0 <= accuracy(model, task.batches) <= 1.0


def test_a_pair_model_rejects_single_sequences():
    batch = Batch(torch.ones(2, 32, dtype=torch.int64), torch.ones(2, 32, dtype=torch.bool), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"needs `input_ids` of shape \(batch, 2, n\); got \(2, 32\)"):
        _model()(batch)
    with pytest.raises(ValueError, match="`kind` must be one of"):
        TinyEncoder(vocab_size=8, n=8, kind="pairs", num_classes=2)
