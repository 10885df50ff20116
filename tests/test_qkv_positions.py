"""Positions beyond BERT's table and ``checkpoint`` for both conditions."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from approxlab.data import get_qkv, load_model, minilm_path
from approxlab.data.qkv import extract_qkv, position_embeddings


def _table(rows=8, width=5):
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_interpolated_positions_are_distinct_and_keep_the_ends():
    table = _table()
    rows = position_embeddings(table, 29, "interpolate")
    assert rows.shape == (29, 5)
    assert torch.unique(rows, dim=0).shape[0] == 29
    torch.testing.assert_close(rows[0], table[0], rtol=0, atol=0)
    torch.testing.assert_close(rows[-1], table[-1], rtol=0, atol=1e-15)
    # t = i * 7 / 28 = i / 4: row 4 is table row 1, row 2 the midpoint of rows 0 and 1.
    torch.testing.assert_close(rows[4], table[1], rtol=0, atol=1e-15)
    torch.testing.assert_close(rows[2], (table[0] + table[1]) / 2, rtol=0, atol=1e-15)


def test_copied_positions_repeat_and_short_windows_use_the_table():
    table = _table()
    rows = position_embeddings(table, 20, "copy")
    assert torch.equal(rows[:8], table) and torch.equal(rows[8:16], table) and torch.equal(rows[16:], table[:4])
    for positions in ("interpolate", "copy"):
        assert torch.equal(position_embeddings(table, 6, positions), table[:6])
    assert position_embeddings(table, 20, "none") is None
    with pytest.raises(ValueError, match=r"`positions` must be one of \['copy', 'interpolate', 'none'\]"):
        position_embeddings(table, 20, "rope")


def _tiny_config():
    return BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=32, attn_implementation="eager")


def test_extract_rows_distinct_only_with_positions():
    tiny = load_model("initialized", config=_tiny_config(), seed=0)
    ids = torch.tensor([[5, 6, 7, 8] * 24])  # n = 96 > 32 positions, 4 distinct tokens
    distinct = {}
    for positions in ("interpolate", "copy", "none"):
        q, _, _ = extract_qkv(tiny, ids, mode="embedding", positions=positions, dtype=torch.float64)
        distinct[positions] = torch.unique(q[0, 0], dim=0).shape[0]
    # copy: (token i mod 4, position i mod 32) repeats every 32 tokens.
    assert distinct == {"interpolate": 96, "copy": 32, "none": 4}
    # Hidden mode takes the same choice: at layer 1 the positions reach the input through layer 0.
    hidden = {p: extract_qkv(tiny, ids, mode="hidden", layer=1, positions=p)[0] for p in ("interpolate", "none")}
    assert torch.unique(hidden["none"][0, 0], dim=0).shape[0] == 4
    assert torch.unique(hidden["interpolate"][0, 0], dim=0).shape[0] == 96


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A tiny random BertModel + the uncased tokenizer saved as a local checkpoint folder."""
    folder = tmp_path_factory.mktemp("tiny-bert")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        BertModel(_tiny_config()).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("condition", ["pretrained", "initialized"])
def test_local_checkpoints_load_offline_for_both_conditions(tiny_checkpoint, condition, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = load_model(condition, checkpoint=str(tiny_checkpoint), seed=1)
    assert (model.num_heads, model.head_dim, model.num_layers) == (4, 8, 2)
    label = str(tiny_checkpoint.resolve())
    assert model.checkpoint == (label if condition == "pretrained" else model.checkpoint)
    if condition == "initialized":
        assert model.checkpoint.startswith(f"init:{label}#")
        saved = BertModel.from_pretrained(tiny_checkpoint)
        assert not torch.equal(model.model.embeddings.word_embeddings.weight, saved.embeddings.word_embeddings.weight)
    minilm = load_model(condition, checkpoint=str(minilm_path()))
    assert (minilm.num_heads, minilm.head_dim, minilm.num_layers) == (12, 32, 6)


def test_get_qkv_initialized_4096_has_distinct_rows():
    """Every row of Q distinct at n = 4096 with the default positions."""
    qkv = get_qkv("initialized", 4096, window_ids=[0])
    assert qkv.positions == "interpolate" and qkv.input_ids.shape == (1, 4096)
    assert torch.unique(qkv.q[0, 0], dim=0).shape[0] == 4096
    none = get_qkv("initialized", 4096, window_ids=[0], positions="none")
    assert torch.unique(none.q[0, 0], dim=0).shape[0] == qkv.input_ids[0].unique().numel() < 4096


def test_studies_take_a_local_checkpoint(tiny_checkpoint, tmp_path, monkeypatch):
    """``--checkpoint DIR`` offline, for both conditions and both BERT studies."""
    from approxlab.studies.engine import read_json, read_results
    from approxlab.cli import main
    from approxlab.studies.inputs import wikitext

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    wikitext.clear_caches()
    out = tmp_path / "fig1"
    assert main(["figure1", "--checkpoint", str(tiny_checkpoint), "--n", "64", "--num-features", "4",
                 "--methods", "performer", "--windows", "1", "--seeds", "1", "--dtypes", "float64",
                 "--positions", "interpolate", "--out", str(out), "--no-progress"]) == 0
    wikitext.clear_caches()
    label = str(tiny_checkpoint.resolve())
    checkpoints = set(read_results(out / "results.csv.bz2")["checkpoint"])
    assert label in checkpoints and any(c.startswith(f"init:{label}#") for c in checkpoints)
    config = read_json(out / "config.json")["config"]
    assert config["checkpoint"] == str(tiny_checkpoint) and config["positions"] == "interpolate"
    windows = read_results(out / "windows.csv")
    assert (windows["distinct_q_rows"] == 64).all() and (windows["distinct_tokens"] < 64).all()
    layer1 = tmp_path / "fig1-layer1"
    assert main(["figure1", "--checkpoint", str(tiny_checkpoint), "--layer", "1", "--conditions", "pretrained",
                 "--n", "64", "--num-features", "4", "--methods", "performer", "--windows", "1", "--seeds", "1",
                 "--dtypes", "float64", "--out", str(layer1), "--no-progress"]) == 0
    wikitext.clear_caches()
    config = read_json(layer1 / "config.json")["config"]
    assert (config["layer"], config["mode"]) == (1, "hidden") and "entering layer 1" in config["inputs"]
    svd = tmp_path / "svd"
    assert main(["sv-decay", "--checkpoint", str(tiny_checkpoint), "--n", "32", "--heads", "1", "--windows", "1",
                 "--conditions", "pretrained", "--num-features", "4", "--methods", "nystromformer",
                 "--out", str(svd), "--no-progress"]) == 0
    assert set(read_results(svd / "results.csv")["checkpoint"]) == {label}
