"""Skyformer Appendix B / Figure 4 study (approxlab.studies.lra_svd) and the classifier training loop."""

import pandas as pd
import pytest
import torch

from approxlab import tasks
from approxlab.studies import lra_svd
from approxlab.tasks import Batch
from approxlab.training import TinyEncoder, accuracy, train_classifier


def _model(n, vocab=16, seed=0):
    return TinyEncoder(vocab_size=vocab, n=n, attention="softmax", num_classes=2, generator=torch.Generator().manual_seed(seed))


def _token_task(num_batches, seed):
    """Label = whether token 3 occurs; learnable in a few steps."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_batches):
        ids = torch.randint(4, 16, (8, 12), generator=g)
        labels = torch.arange(8) % 2
        ids[labels == 1, 5] = 3
        batches.append(Batch(ids, torch.ones_like(ids, dtype=torch.bool), labels))
    return batches


def test_train_classifier_learns_and_keeps_best_weights():
    model = _model(12)
    validation = _token_task(2, 1)
    result = train_classifier(model, _token_task(60, 0), validation, lr=3e-3, eval_every=10, patience=3)
    assert result["best_accuracy"] >= 0.9
    assert accuracy(model, validation) == pytest.approx(result["best_accuracy"])  # best weights restored
    assert result["history"][0]["step"] == 0 and result["stopped"] in {"plateau", "budget"}


def test_train_classifier_stops_on_a_plateau():
    """lr so small that nothing changes: no evaluation beats the initial one -> plateau."""
    result = train_classifier(_model(12), _token_task(30, 0), _token_task(1, 1), lr=1e-12, eval_every=2, patience=2)
    assert result["stopped"] == "plateau" and result["steps"] == 4 and result["best_step"] == 0


def test_attention_output_spectrum_normalised_and_descending():
    task = tasks.make_task("listops", n=64, batch_size=3, num_batches=1, generator=torch.Generator().manual_seed(0))
    model = TinyEncoder(vocab_size=task.vocab_size, n=64, attention="softmax", num_classes=10,
                        generator=torch.Generator().manual_seed(0))
    sigma, decay = lra_svd.attention_output_spectrum(model, task.batches[0])
    rows = int(task.batches[0].mask.sum(-1).min())
    assert sigma.shape == (3, min(rows, 64)) and sigma.dtype == torch.float64
    assert torch.allclose(sigma[:, 0], torch.ones(3, dtype=torch.float64))
    assert bool((sigma[:, 1:] <= sigma[:, :-1] + 1e-12).all())
    assert decay.shape == (3,) and bool((decay < 0).all())


def test_attention_outputs_are_the_layers_attention():
    """The captured layer-2 output equals softmax attention on layer 2's own q, k, v."""
    model = _model(12).double()
    ids = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(3))
    captured = []
    model.embed(ids, attention_outputs=captured)
    assert len(captured) == 2 and captured[1].shape == (2, 12, 64)
    x = model.token_embedding(ids) + model.position_embedding(torch.arange(12))
    block = model.blocks[0]
    x = block(x, lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 32**0.5, -1) @ v)
    q, k, v = model.blocks[1].qkv(model.blocks[1].norm1(x)).view(2, 12, 3, 2, 32).permute(2, 0, 3, 1, 4)
    expected = (torch.softmax(q @ k.transpose(-1, -2) / 32**0.5, -1) @ v).transpose(1, 2).reshape(2, 12, 64)
    torch.testing.assert_close(captured[1], expected.detach())


def test_study_end_to_end_tiny(tmp_path):
    config = lra_svd.build_config(quick=True, tasks=["listops:48"], max_steps=3)
    lra_svd.compute(config, tmp_path, progress=False)
    written = {p.name for p in lra_svd.plot(tmp_path)} | {lra_svd.summarize(tmp_path).name}
    assert {"lra_svd.png", "lra_svd.pdf", "summary.md"} <= written
    results = pd.read_csv(tmp_path / "results.csv")
    assert len(results) == 1 and results.loc[0, "steps"] == 3 and results.loc[0, "stopped"] == "budget"
    spectra = pd.read_csv(tmp_path / "spectra.csv")
    assert spectra["mean"].iloc[0] == pytest.approx(1.0) and (spectra["mean"] <= 1 + 1e-12).all()
    assert "ListOps (n=48)" in (tmp_path / "summary.md").read_text()


def test_bad_task_spec():
    from approxlab.studies.runner import StudyError

    with pytest.raises(StudyError, match="NAME:N"):
        lra_svd.build_config(tasks=["listops"])
