"""``approxlab decoder`` end to end on a tiny random Llama saved to a folder (offline, seconds), its
statistics and its command-line errors. ``approxlab decoder --quick`` on the packaged SmolLM2 runs in
tests/test_smollm2.py (beside the model's other tests, sharing its converted GGUF)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from test_models_qkv import save_tiny_checkpoint

from approxlab.studies.engine import read_results
from approxlab.cli import main
from approxlab.data import get_qkv
from approxlab.errors import StudyError
from approxlab.studies import decoder
from approxlab.studies.decoder import cells as decoder_cells
from approxlab.studies.decoder import stats as decoder_stats

GRID = ["--n", "16,32", "--layers", "0,1", "--windows", "2", "--num-features", "4,8", "--no-progress"]
VOLATILE = ["seconds", "from_cache"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny-llama") / "llama")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("decoder-cache")


@pytest.fixture(scope="module")
def tiny_run(llama, cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("decoder-run")
    assert main(["decoder", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(out), *GRID]) == 0
    return out


def test_tables_figures_and_summary(tiny_run):
    for name in ("windows.csv", "assumptions.csv", "results.csv", "error_stats.csv", "assumption_stats.csv",
                 "verdicts.csv", "config.json", "timing.json", "summary.md", "decoder-assumptions.png",
                 "decoder-errors-pretrained.png", "decoder-errors-initialized.pdf"):
        assert (tiny_run / name).is_file(), name
    results, assumptions = read_results(tiny_run / "results.csv"), read_results(tiny_run / "assumptions.csv")
    assert (results["status"] == "ok").all(), results.loc[results["status"] != "ok", "status"]
    assert len(results) == 2 * 2 * 2 * 2 * len(decoder.METHODS) * 2  # conditions, n, layers, windows, methods, d
    assert set(results["causal_form"]) == {"causal", "mask-renormalise"}
    assert len(assumptions) == 2 * 2 * 2 * 2 * 4  # conditions, n, layers, windows, heads
    assert not assumptions[["alpha", "kappa", "alpha_block", "stable_rank", "entry_bound"]].isna().any().any()
    assert (assumptions["alpha"] >= assumptions["n"]).all()  # row 0 of a causal P is e_0
    assert set(assumptions["kv_head"]) == {0, 1}  # 4 query heads share 2 key/value heads
    summary = (tiny_run / "summary.md").read_text()
    for text in ("## Which assumptions hold", "HyperAttention: kappa", "Alman-Song", "## Errors", "wall"):
        assert text in summary, text
    verdicts = read_results(tiny_run / "verdicts.csv")
    assert set(verdicts["claim"]) == {claim.id for claim in decoder_stats.CLAIMS} and len(verdicts) == 5 * 2 * 2


def test_errors_are_against_exact_causal_attention_of_the_windows_prefixes(tiny_run, llama, cache):
    """A window of n tokens is the first n tokens of the longest window: its Q/K/V are the first n rows of
    the longest extraction (a causal model), and the reference is exact causal attention of those."""
    config = decoder.build_config(layers=[0, 1], n=[16, 32], windows=2, num_features=[4, 8], checkpoint=str(llama))
    window = decoder.window_ids(config)[0]
    long = get_qkv("pretrained", 32, [window], layer=1, checkpoint=str(llama), cache_dir=cache)
    short = get_qkv("pretrained", 16, [2 * window], layer=1, checkpoint=str(llama), cache_dir=cache)
    assert torch.equal(long.input_ids[0, :16], short.input_ids[0])
    for name in ("q", "k", "v"):
        torch.testing.assert_close(getattr(long, name)[..., :16, :], getattr(short, name), rtol=1e-5, atol=1e-6)
    cell = {"condition": "pretrained", "layer": 1, "window": window, "n": 16, "n_max": 32, "checkpoint": str(llama),
            "model_seed": 0, "data_dir": None, "cache_dir": str(cache), "device": "cpu"}
    reference = decoder_cells._reference(cell)
    import approxlab

    expected = approxlab.exact_attention(*(getattr(short, x)[0].double() for x in "qkv"), causal=True)
    torch.testing.assert_close(reference["output"], expected, rtol=1e-5, atol=1e-6)
    # Nystrom with all 16 columns is the exact matrix (masked and renormalised); causal ProbSparse with
    # every query active is exact causal attention: both errors vanish against the reference.
    for method, form in (("nystrom", "mask-renormalise"), ("informer", True)):
        rows = decoder.compute_errors({**cell, "method": method, "num_features": [16], "seeds": [0],
                                       "causal": form, "base_seed": 0})
        assert rows[0]["status"] == "ok" and rows[0]["relative_error_max"] < 1e-9, (method, rows[0])


def test_resume_computes_nothing(tiny_run, llama, cache, monkeypatch):
    """The same command again finds every cell done (the tables unchanged; ``--workers`` runs are the runner's
    tests, and the committed full run used them)."""
    before = {name: read_results(tiny_run / name) for name in ("results.csv", "assumptions.csv")}
    import dataclasses

    # the tables are compared here; drawn once above
    monkeypatch.setattr(decoder, "STUDY", dataclasses.replace(decoder.STUDY, figures=()))
    assert main(["decoder", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(tiny_run), *GRID]) == 0
    for name, table in before.items():
        pd.testing.assert_frame_equal(read_results(tiny_run / name), table)


def _one_line(capsys, argv):
    try:
        status = main(argv)
    except SystemExit as exit_info:
        status = exit_info.code
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_checkpoint_and_layer_errors_are_one_line(llama, cache, tmp_path, capsys):
    common = ["--cache-dir", str(cache), "--out", str(tmp_path / "out"), "--no-progress"]
    err = _one_line(capsys, ["decoder", "--checkpoint", str(llama), "--layers", "0,5", *common])
    assert "--layers: layer indices in 0..1 (the model has 2 layers), got 0,5" in err
    err = _one_line(capsys, ["decoder", "--checkpoint", str(llama), "--n", "256", *common])
    assert "--n: lengths up to the model's context, 128, got 256" in err
    bert = save_tiny_checkpoint("bert", tmp_path / "bert")
    capsys.readouterr()  # the checkpoint writer's progress bar is not the command's output
    err = _one_line(capsys, ["decoder", "--checkpoint", str(bert), "--n", "16", "--num-features", "8", *common])
    assert "--checkpoint: a causal decoder" in err and "bidirectional bert" in err
    err = _one_line(capsys, ["decoder", "--checkpoint", str(tmp_path / "nothing-here"), *common])
    assert "--checkpoint" in err
    assert not (tmp_path / "out").exists()


def test_causal_forms_and_default_layers():
    assert decoder.causal_form("performer") is True and decoder.causal_form("nystrom") == "mask-renormalise"
    with pytest.raises(StudyError, match="--methods: methods with a causal form .*, got 'linformer'"):
        decoder.causal_form("linformer")
    assert decoder.default_layers(30) == [0, 15, 29] and decoder.default_layers(30, "first-last") == [0, 29]
    assert decoder.default_layers(1) == [0]


def test_growth_exponent_and_verdicts_follow_the_thresholds():
    assert decoder_stats.growth_exponent([512, 1024, 2048], [1.0, 2.0, 4.0]) == pytest.approx(1.0)
    assert decoder_stats.growth_exponent([512, 1024], [3.0, 3.0]) == pytest.approx(0.0)
    assert math.isnan(decoder_stats.growth_exponent([512, 1024], [math.nan, 1.0]))
    rng = np.random.default_rng(0)
    rows = []
    for n in (256, 512, 1024, 2048):
        for window in range(4):
            for head in range(3):
                noise = rng.uniform(0.9, 1.1)
                rows.append({"condition": "pretrained", "layer": 0, "n": n, "window": window, "head": head,
                             "alpha": n * noise, "alpha_block": 2.0 * noise, "kappa": n**0.5 * noise,
                             "stable_rank": 3.0 * noise, "logit_bound": 4 * math.log(n) * noise,
                             "sqrt_log_n": math.sqrt(math.log(n))})
    table = decoder_stats.verdicts({"n": [256, 512, 1024, 2048], "conditions": ["pretrained"], "layers": [0]},
                                   pd.DataFrame(rows)).set_index("claim")
    assert table.loc["alpha", "verdict"] == "not reproduced" and table.loc["alpha", "estimate"] == pytest.approx(1, abs=0.1)
    assert table.loc["alpha_block", "verdict"] == "reproduced" and table.loc["stable_rank", "verdict"] == "reproduced"
    assert table.loc["bounded_entries", "verdict"] == "not reproduced"  # sqrt(4 ln n) / sqrt(ln n) = 2
    assert table.loc["kappa", "estimate"] == pytest.approx(0.5, abs=0.1)
    assert (table["ci_low"] <= table["estimate"]).all() and (table["estimate"] <= table["ci_high"]).all()
