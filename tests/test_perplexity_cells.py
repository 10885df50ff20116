"""The perplexity study's added cells on a tiny random Llama: the clean-input errors (a patch's layers replayed on
the unpatched model's q, k, v) equal a patched run's where the two see the same inputs, in the whole window and the
KV cache; the depths and the fixed-budget configurations as the grid declares them; a saved run resumes into them."""

from __future__ import annotations

import math
import pathlib

import pytest
import torch
from transformers import LlamaConfig

import approxlab
from approxlab.data import load_model
from approxlab.errors import StudyError, UsageError
from approxlab.patching import exact_prefill, replay, token_nll
from approxlab.studies import perplexity
from approxlab.studies.engine.record import extension
from approxlab.studies.perplexity import clean, config_grid, configs, grid


@pytest.fixture(scope="module")
def model():
    config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return load_model("initialized", config=config, seed=0)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(30522, (1, 48), generator=torch.Generator().manual_seed(1))


def _errors(patch):
    return {(row["layer"], row["head"]): (row["spectral"], row["frobenius"], row["worst_query"])
            for row in patch.errors()}


@pytest.mark.parametrize(("method", "context"), [("performer", None), ("topk", None), ("performer", 32),
                                                 ("topk", 32), ("snapkv", 32)])
def test_replay_on_clean_inputs_equals_the_patched_run_where_the_inputs_agree(model, ids, method, context):
    """Layer 0 alone: the patched run's inputs are the unpatched model's, so replaying the patch on the exact
    prefill's q, k, v gives its errors and attention measures to rounding (random draws included)."""
    options = {} if context is None else {"context_length": context}
    seed = 12345

    def made():
        return approxlab.patch_attention(model, method, layers=[0], num_features=8, record_inputs=True,
                                         record_attention=True, generator=torch.Generator().manual_seed(seed),
                                         **options)

    with made() as patched:
        token_nll(model, ids)
    prefill = exact_prefill(model, ids)
    replayed = replay(made(), prefill.queries, prefill.keys, prefill.values)
    found, expected = _errors(replayed), _errors(patched)
    assert found.keys() == expected.keys()
    for key, values in expected.items():
        assert found[key] == pytest.approx(values, rel=1e-5, abs=1e-7)
    for name in ("total_variation", "kept_mass"):
        torch.testing.assert_close(replayed.calls[0].attention[name], patched.calls[0].attention[name],
                                   rtol=1e-5, atol=1e-7, equal_nan=True)


def test_replay_with_every_layer_sees_the_unpatched_inputs_not_the_drifting_ones(model, ids):
    """Every layer replaced: from layer 1 on the patched run's inputs drift, the replayed ones do not."""
    def made():
        return approxlab.patch_attention(model, "performer", num_features=4, record_inputs=True,
                                         generator=torch.Generator().manual_seed(0))

    with made() as patched:
        token_nll(model, ids)
    prefill = exact_prefill(model, ids)
    replayed = replay(made(), prefill.queries, prefill.keys, prefill.values)
    q_clean = [call.inputs[0] for call in replayed.calls]
    q_patched = [call.inputs[0] for call in patched.calls]
    torch.testing.assert_close(q_clean[0], q_patched[0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(q_clean[2], q_patched[2], rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(q_clean[2], prefill.queries[2])


def test_replay_refuses_an_entered_patch_and_inputs_without_every_layer(model, ids):
    prefill = exact_prefill(model, ids)
    patch = approxlab.patch_attention(model, "performer", num_features=4)
    with patch:
        pass
    with pytest.raises(TypeError, match="`patch` must be an AttentionPatch that was never entered"):
        replay(patch, prefill.queries, prefill.keys, prefill.values)
    with pytest.raises(ValueError, match=r"`keys` must hold one tensor per model layer \(3\); got 2"):
        replay(approxlab.patch_attention(model, "performer", num_features=4), prefill.queries, prefill.keys[:2],
               prefill.values)


def test_depths_default_to_five_spread_over_the_model_and_refuse_all():
    assert config_grid.spread_depths(30) == [0, 8, 15, 22, 29]
    config = grid.build_config(num_layers=30)
    assert config["depths"] == ["layer 0", "layer 8", "layer 15", "layer 22", "layer 29"]
    cells = grid.decoder_cells(config, {})
    found = {c["layers"] for c in cells if c["setting"] == "whole"}
    assert found == {"all", "layer 0", "layer 8", "layer 15", "layer 22", "layer 29"}
    assert [c["layers"] for c in cells[:1]] == ["layer 0"]  # the saved settings keep their place
    assert grid.build_config(num_layers=30, depths=[3, "last"])["depths"] == ["layer 3", "layer 29"]
    with pytest.raises(UsageError, match="--depths: single layers"):
        grid.build_config(num_layers=30, depths=["all"])
    with pytest.raises(UsageError, match="--depths: layer indices in 0..29"):
        grid.build_config(num_layers=30, depths=[30])


def test_the_clean_cells_follow_the_multi_layer_cells_window_by_window():
    config = grid.build_config(num_layers=30, methods=["performer", "snapkv"], num_features=[16, 64], windows=2)
    cells = clean.clean_cells(config, {})
    decoder = {tuple(c[k] for k in clean.CLEAN_KEY) for c in grid.decoder_cells(config, {}) if c["layers"] == "all"}
    assert {tuple(c[k] for k in clean.CLEAN_KEY) for c in cells} == decoder  # the same keys: the same draws
    windows = [c["window"] for c in cells]
    assert windows == sorted(windows, key=windows.index) and len(cells) == 2 * 2 * (1 + 2 * 2)


def test_the_configurations_share_one_budget_and_name_their_options():
    config = grid.build_config(num_layers=30)
    assert config["configs"]["budget"] == 64
    assert len(config["configs"]["methods"]) >= 8
    assert all(len(found) >= 5 for found in config["configs"]["methods"].values())
    cells = configs.config_cells(config, {})
    assert {c["num_features"] for c in cells} == {64} and {c["setting"] for c in cells} == {"kv-cache"}
    snapkv = [c for c in cells if c["method"] == "snapkv" and c["window"] == cells[0]["window"]]
    assert snapkv[0]["config"] == "window=8, kernel_size=5" and snapkv[0]["options"] == {"window": 8, "kernel_size": 5}
    draws = [c for c in cells if c["method"] == "random" and c["window"] == cells[0]["window"]]
    assert [c["config"] for c in draws] == [f"seed={s}" for s in range(5)] and all(c["options"] == {} for c in draws)
    with pytest.raises(UsageError, match="--config-methods"):
        perplexity.STUDY.configure(perplexity.STUDY.arguments(quick=True, config_methods=["topk"]))


def test_a_saved_run_resumes_into_the_depths_and_configurations():
    """A run saved before ``depths`` and ``configs`` were declared extends into them (its cells kept)."""
    config = grid.build_config(num_layers=30)
    saved = {k: v for k, v in config.items() if k not in ("depths", "configs")}
    assert extension(saved, config, perplexity.STUDY.grows) == ["configs", "depths"]
    assert extension({**saved, "n": [256]}, config, perplexity.STUDY.grows) is None


def test_the_committed_run_is_the_default_grid_extended_once(tmp_path, capsys):
    """The committed ``figures/perplexity`` config is the default grid: the run was extended once, when CriticalKV,
    CAOTE and the sparse-prefill patterns joined ``methods`` and ``long_methods``, and ``config.json`` records it;
    resuming it extends nothing, and a changed setting is refused."""
    import json

    from approxlab.studies.engine.record import prepare_record

    committed = pathlib.Path(__file__).resolve().parents[1] / "figures" / "perplexity" / "config.json"
    saved = json.loads(committed.read_text())
    references = saved["config"]["compare_with"]
    config = grid.build_config(num_layers=30, compare_with=references, checked_references=references)
    new = {"criticalkv", "caote", "minference", "xattention", "flexprefill", "duo-attention"}
    from approxlab.studies.engine.record import canonical

    assert canonical(saved["config"]) == canonical(config)
    assert extension(saved["config"], config, perplexity.STUDY.grows) is None  # nothing to extend
    (added,) = [entry["added"] for entry in saved["extensions"]]
    assert set(added) == {"methods", "long_methods"} and set(added["methods"]) == set(added["long_methods"]) == new
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved))
    record = prepare_record(path, [], config, {}, False, perplexity.STUDY.grows)
    assert record["extensions"] == saved["extensions"] and record["created"] == saved["created"]
    assert "extending the saved run" not in capsys.readouterr().err
    with pytest.raises(StudyError, match="different configuration"):
        prepare_record(path, [], {**config, "context": 256}, {}, False, perplexity.STUDY.grows)


def test_a_configuration_row_holds_the_drifting_and_the_clean_errors(tmp_path):
    """One cell of the design on a tiny saved Llama: nll, the errors on both inputs, their seconds summed."""
    from test_models_qkv import save_tiny_checkpoint

    folder = save_tiny_checkpoint("llama", tmp_path / "llama", tie_word_embeddings=True)
    config = grid.build_config(num_layers=2, checkpoint=str(folder), n=[32], context=24, continuation=8,
                               num_features=[8, 16], methods=["performer"], encoder_methods=["nystromformer"],
                               config_methods=["streaming-llm"], windows=1)
    cell = configs.config_cells(config, {"cache_dir": str(tmp_path / "cache")})[1]
    row = configs.compute_config(cell)[0]
    assert row["status"] == "ok" and row["clean_status"] == "ok" and math.isfinite(row["nll"])
    assert row["clean_inputs"] == "the unpatched model's"
    for name in ("spectral_median", "frobenius_max", "total_variation_median"):
        assert math.isfinite(row[name]) and math.isfinite(row[f"clean_{name}"])
    assert row["seconds"] > 0 and row["cpu_seconds"] > 0


def test_resuming_into_a_new_grid_entry_says_what_grew(tmp_path, capsys):
    """The note on stderr names an entry the saved run lacked as grown from none (it raised a KeyError)."""
    import json

    from approxlab.studies.engine.record import prepare_record

    config = grid.build_config(num_layers=30)
    saved = {k: v for k, v in config.items() if k != "depths"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(prepare_record(path, [], saved, {}, False, perplexity.STUDY.grows)))
    prepare_record(path, [], config, {}, False, perplexity.STUDY.grows)
    assert "extending the saved run (depths: none -> ['layer 0', 'layer 8'," in capsys.readouterr().err


def test_a_depth_cell_from_the_shared_layer_input_equals_the_whole_forward(tmp_path, monkeypatch):
    """A single-layer cell above layer 0 runs only the layers from its own (the unpatched hidden states entering it
    captured once per window): its row and layer rows equal those of the whole forward pass (same seeds)."""
    from test_models_qkv import save_tiny_checkpoint

    from approxlab.studies.perplexity import cells

    folder = save_tiny_checkpoint("llama", tmp_path / "llama", tie_word_embeddings=True)
    config = grid.build_config(num_layers=2, checkpoint=str(folder), n=[32], context=24, continuation=8,
                               num_features=[8, 16], methods=["performer", "streaming-llm"],
                               encoder_methods=["nystromformer"], windows=1, depths=[1])
    chosen = [c for c in grid.decoder_cells(config, {"cache_dir": str(tmp_path / "cache")})
              if c["layers"] == "layer 1" and c["method"] != "exact"]
    assert len(chosen) == 4
    shared = [cells.compute_decoder(cell) for cell in chosen]
    assert cells._layer_input.cache_info().currsize >= 1
    monkeypatch.setattr(cells, "_forward", lambda cell, model, ids, layers: lambda: token_nll(model, ids))
    whole = [cells.compute_decoder(cell) for cell in chosen]
    timing = ("seconds", "cpu_seconds")
    for found, expected in zip(shared, whole):
        row, want = found["perplexity.csv.gz"][0], expected["perplexity.csv.gz"][0]
        assert {k: v for k, v in row.items() if k not in timing} == pytest.approx(
            {k: v for k, v in want.items() if k not in timing}, rel=1e-12, abs=1e-12, nan_ok=True)
        assert found["layer_errors.csv"] == pytest.approx(expected["layer_errors.csv"], rel=1e-12, abs=1e-12, nan_ok=True)


def test_budgets_given_as_compression_ratios_keep_kvpress_s_counts_and_the_rows_carry_both(tmp_path):
    """``--ratios``: b = max(1, int(n_c (1 - r))) of the KV-cache context (384: 0.5 -> 192, 0.9 -> 38), the budgets
    of every setting; a config of counts has no ``ratios`` (a saved run resumes unchanged); a computed row carries
    ``compression_ratio`` beside ``num_features``."""
    from test_models_qkv import save_tiny_checkpoint

    from approxlab.studies.perplexity import cells

    config = grid.build_config(num_layers=30, ratios=[0.5, 0.9, 0.75])
    assert config["num_features"] == [38, 96, 192] and config["ratios"] == {"38": 0.9, "96": 0.75, "192": 0.5}
    assert config["configs"]["budget"] == 96 and "ratios" not in grid.build_config(num_layers=30)
    with pytest.raises(UsageError, match=r"--ratios: ratios that keep different numbers of the 48 context tokens "
                                         r"\(0.901 and 0.9 both keep 4\)"):
        grid.build_config(num_layers=30, quick=True, ratios=[0.9, 0.901])
    with pytest.raises(UsageError, match="--ratios: either --ratios or --num-features"):
        perplexity.STUDY.configure(perplexity.STUDY.arguments(quick=True, ratios=[0.5], num_features=[8]))
    folder = save_tiny_checkpoint("llama", tmp_path / "llama", tie_word_embeddings=True)
    tiny = grid.build_config(num_layers=2, checkpoint=str(folder), n=[32], context=24, continuation=8,
                             ratios=[0.5, 0.75], methods=["streaming-llm"], encoder_methods=["nystromformer"],
                             config_methods=["streaming-llm"], windows=1, depths=[1])
    settings = {"cache_dir": str(tmp_path / "cache")}
    cell = next(c for c in grid.decoder_cells(tiny, settings) if c["method"] == "streaming-llm")
    row = cells.compute_decoder(cell)["perplexity.csv.gz"][0]
    assert (cell["num_features"], row["compression_ratio"]) == (6, 0.75) and row["status"] == "ok"
    assert clean.compute_clean(clean.clean_cells(tiny, settings)[1])[0]["compression_ratio"] in (0.5, 0.75)
    assert configs.config_cells(tiny, settings)[0]["compression_ratio"] == 0.5  # the middle budget, b = 12
    cost = grid.cost_cells(tiny, settings)[0]  # cost.csv at the middle budget, and long.csv: both carry the ratio
    assert cells.compute_cost(cost)[0]["compression_ratio"] == 0.5
    assert all(c["with_ratio"] for c in grid.long_study_cells(tiny, settings))
    counts = grid.build_config(num_layers=30)
    assert not any("with_ratio" in c or "compression_ratio" in c for c in grid.long_study_cells(counts, settings)
                   + grid.cost_cells(counts, settings))
