"""The optimiser of Skyformer's LRA code (approxlab.optim) and the encoder options it trains with."""

import pytest
import torch

from approxlab.optim import SKYFORMER_LRA, make_optimizer, one_cycle, optimizer_step
from approxlab.training import TinyEncoder


def test_one_cycle_rises_over_the_warmup_then_falls_linearly():
    assert one_cycle(0, warmup=10, total_steps=110) == pytest.approx(1 / 25)
    assert one_cycle(5, warmup=10, total_steps=110) == pytest.approx(1 / 25 + (1 - 1 / 25) / 2)
    assert one_cycle(10, warmup=10, total_steps=110) == pytest.approx(1.0)
    assert one_cycle(60, warmup=10, total_steps=110) == pytest.approx(0.5, abs=1e-5)
    assert one_cycle(110, warmup=10, total_steps=110) == pytest.approx(1 / 25 / 1e4)


def test_adamw_schedule_and_value_clipping():
    w = torch.nn.Parameter(torch.zeros(3))
    model = torch.nn.Module()
    model.w = w
    opt, schedule = make_optimizer(model.parameters(), lr=1e-3, optimizer="adamw", warmup=4, total_steps=8)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["eps"] == 1e-6 and opt.defaults["weight_decay"] == 0
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 25)
    w.grad = torch.tensor([5.0, -0.5, -7.0])
    optimizer_step(model, opt, schedule, clip_value=1.0)
    assert w.grad.tolist() == [1.0, -0.5, -1.0]  # every entry clipped to [-1, 1]
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * (1 / 25 + (1 - 1 / 25) / 4))
    adam, none = make_optimizer(model.parameters(), lr=1e-3, optimizer="adam")
    assert isinstance(adam, torch.optim.Adam) and none is None
    with pytest.raises(ValueError, match="optimizer"):
        make_optimizer(model.parameters(), lr=1e-3, optimizer="sgd")
    assert SKYFORMER_LRA["pathfinder"]["batch_size"] == 128 and SKYFORMER_LRA["listops"]["lr"] == 1e-4


def _encoder(**kw):
    return TinyEncoder(vocab_size=8, n=16, num_classes=2, generator=torch.Generator().manual_seed(0), **kw)


def test_two_d_positions_are_row_plus_column():
    model = _encoder(positions="2d")
    vectors = model._position_vectors(16, "cpu")
    table = model.position_embedding.weight
    assert table.shape == (8, 64)
    torch.testing.assert_close(vectors[2 * 4 + 3], table[2] + table[4 + 3])
    torch.testing.assert_close(vectors[1], table[0] + table[4 + 1])
    with pytest.raises(ValueError, match="square"):
        TinyEncoder(vocab_size=8, n=15, num_classes=2, positions="2d")


def test_dropout_masks_follow_the_seed_and_vanish_in_eval_mode():
    ids = torch.randint(0, 8, (2, 16), generator=torch.Generator().manual_seed(1))
    model, plain = _encoder(dropout=0.5), _encoder()
    model.train()
    torch.testing.assert_close(model.embed(ids, seed=3), model.embed(ids, seed=3))
    assert not torch.allclose(model.embed(ids, seed=3), model.embed(ids, seed=4))
    assert not torch.allclose(model.embed(ids, seed=3), plain.embed(ids, seed=3))
    model.eval()
    torch.testing.assert_close(model.embed(ids, seed=3), plain.embed(ids, seed=3))
    with pytest.raises(ValueError, match="dropout"):
        _encoder(dropout=1.0)
