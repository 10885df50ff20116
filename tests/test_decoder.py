"""``approxlab decoder`` end to end on a tiny random Llama saved to a folder (offline, seconds), its
statistics and its command-line errors. ``approxlab decoder --quick`` on the packaged SmolLM2 runs in
tests/test_smollm2.py (beside the model's other tests, sharing its converted GGUF); the claims and
verdicts on synthetic tables are in tests/test_decoder_claims.py."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch
from test_models_qkv import save_tiny_checkpoint

import approxlab
from approxlab.cli import main
from approxlab.data import get_qkv
from approxlab.errors import StudyError
from approxlab.methods import available, get
from approxlab.studies import decoder
from approxlab.studies.decoder import cells as decoder_cells
from approxlab.studies.decoder import claims as decoder_claims
from approxlab.studies.engine import read_results

GRID = ["--conditions", "pretrained", "--n", "16,32", "--layers", "0,1", "--windows", "2", "--num-features", "4,8", "--kv-context", "24",
        "--kv-continuation", "8", "--kv-budgets", "4,8", "--no-progress"]
TABLES = ("windows.csv", "assumptions.csv", "levels.csv", "results.csv", "kv_cache.csv", "performer.csv")


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
    for name in (*TABLES, "error_stats.csv", "kv_stats.csv", "assumption_stats.csv", "level_stats.csv",
                 "performer_stats.csv", "verdicts.csv", "hyperattention.csv", "correlations.csv", "config.json",
                 "timing.json", "summary.md", "decoder-assumptions.png", "decoder-errors-pretrained-sparse.png",
                 "decoder-errors-pretrained-sparse.pdf", "decoder-errors-pretrained-cache-attention.png",
                 "decoder-errors-pretrained-nystrom.png", "decoder-kv-cache.png", "decoder-hyperattention.png"):
        assert (tiny_run / name).is_file(), name
    results, assumptions = read_results(tiny_run / "results.csv"), read_results(tiny_run / "assumptions.csv")
    kv, performer = read_results(tiny_run / "kv_cache.csv"), read_results(tiny_run / "performer.csv")
    assert (results["status"] == "ok").all() and (kv["status"] == "ok").all()
    methods = len(decoder.METHODS)
    assert len(results) == 2 * 2 * 2 * methods * 2  # n, layers, windows, methods, d
    assert len(kv) == 2 * 2 * methods * 2  # layers, windows, methods, budgets
    assert set(kv.loc[kv["method"].isin(["h2o", "snapkv", "streaming-llm"]), "setting"]) == {"compressed"}
    assert set(results["causal_form"]) == {"causal", "mask-renormalise"}
    assert len(assumptions) == len(performer) == 2 * 2 * 2 * 4  # n, layers, windows, heads
    assert (assumptions["alpha"] >= assumptions["n"]).all()  # row 0 of a causal P is e_0
    assert set(assumptions["kv_head"]) == {0, 1}  # 4 query heads share 2 key/value heads
    levels = read_results(tiny_run / "levels.csv")
    assert (levels["depth"] == -1).all()  # n <= the block size 256: the recursion computes exactly
    summary = (tiny_run / "summary.md").read_text()
    for text in ("## Which assumptions hold", "structural", "## HyperAttention against its assumptions",
                 "## Why Performer fails", "## The KV-cache setting", "## Errors", "wall", "operationalisation"):
        assert text in summary, text
    verdicts = read_results(tiny_run / "verdicts.csv")
    assert set(verdicts["claim"]) == {"alpha_block", "kappa", "stable_rank", "bounded_entries"}  # no level: no sampling
    assert (verdicts.loc[verdicts["claim"] != "bounded_entries", "verdict"] == "inconclusive").all()  # 2 lengths
    correlations = read_results(tiny_run / "correlations.csv")
    assert set(correlations["claim"]) == {"hyper_alpha", "hyper_kappa"} and (correlations["verdict"] == "inconclusive").all()


def test_errors_are_against_exact_causal_attention_of_the_windows_prefixes(tiny_run, llama, cache, monkeypatch):
    """A window of n tokens is the first n tokens of the longest window: its Q/K/V are the first n rows of
    the longest extraction (a causal model), and the reference is exact causal attention of those; a full budget
    makes the methods exact, in the whole window and in the KV-cache setting."""
    config = decoder.build_config(layers=[0, 1], n=[16, 32], windows=2, num_features=[4, 8], kv_context=24,
                                  kv_continuation=8, kv_budgets=[4, 8], checkpoint=str(llama))
    window = decoder.window_ids(config)[0]
    long = get_qkv("pretrained", 32, [window], layer=1, checkpoint=str(llama), cache_dir=cache)
    short = get_qkv("pretrained", 16, [2 * window], layer=1, checkpoint=str(llama), cache_dir=cache)
    assert torch.equal(long.input_ids[0, :16], short.input_ids[0])
    for name in ("q", "k", "v"):
        torch.testing.assert_close(getattr(long, name)[..., :16, :], getattr(short, name), rtol=1e-5, atol=1e-6)
    cell = {"condition": "pretrained", "layer": 1, "window": window, "n": 16, "n_max": 32, "checkpoint": str(llama),
            "model_seed": 0, "data_dir": None, "cache_dir": str(cache), "device": "cpu", "base_seed": 0}
    expected = approxlab.exact_attention(*(getattr(short, x)[0].double() for x in "qkv"), causal=True)
    torch.testing.assert_close(decoder_cells._reference(cell)["output"], expected, rtol=1e-5, atol=1e-6)
    for method, form in (("nystrom", "mask-renormalise"), ("informer", True), ("topk", True)):
        rows = decoder.compute_errors({**cell, "method": method, "num_features": [16], "seeds": [0], "causal": form})
        assert rows[0]["status"] == "ok" and rows[0]["relative_error_max"] < 1e-9, (method, rows[0])
    for method, budget in (("h2o", 12), ("snapkv", 12), ("topk", 16)):  # every context token / key kept: exact
        rows = decoder.compute_kv_cache({**cell, "n": 16, "context": 12, "method": method, "budgets": [budget],
                                         "seeds": [0]})
        assert rows[0]["continuation"] == 4 and rows[0]["relative_error_max"] < 1e-9, (method, rows[0])
    # the captured K is after RoPE: a RoPE-aware policy gets the model's inv_freq, read from the checkpoint's config
    from transformers import AutoConfig  # noqa: PLC0415
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: PLC0415

    from approxlab.studies.inputs import wikitext  # noqa: PLC0415

    frequencies = wikitext.rotary_frequencies(decoder_cells._source(cell))
    assert torch.equal(frequencies, LlamaRotaryEmbedding(AutoConfig.from_pretrained(llama)).inv_freq)
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return approxlab.kv_cache_attention(*args, **kwargs)

    monkeypatch.setattr(decoder_cells, "kv_cache_attention", spy)
    for method in ("expected-attention", "h2o"):
        rows = decoder.compute_kv_cache({**cell, "context": 12, "method": method, "budgets": [4], "seeds": [0]})
        assert rows[0]["status"] == "ok", rows[0]
    assert torch.equal(seen[0]["rope_frequencies"], frequencies) and "rope_frequencies" not in seen[1]


def test_performer_control_shares_the_error_cells_projection(tiny_run):
    """The control's error at the model's scale is the error of ``results.csv`` at that d and seed (one projection)."""
    performer, results = read_results(tiny_run / "performer.csv"), read_results(tiny_run / "results.csv")
    keys = ["condition", "n", "layer", "window", "num_features", "seed"]
    ours = results[results["method"] == "performer"].merge(performer[performer["head"] == 0], on=keys)
    assert len(ours) == 2 * 2 * 2
    first_head = ours["relative_error_heads"].str.split().str[0].astype(float)
    assert first_head.to_numpy() == pytest.approx(ours["relative_error"].to_numpy(), rel=1e-12)


def test_resume_computes_nothing(tiny_run, llama, cache, monkeypatch):
    """The same command again finds every cell done (the tables unchanged)."""
    before = {name: read_results(tiny_run / name) for name in TABLES[1:]}
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


def test_checkpoint_layer_and_grid_errors_are_one_line(llama, cache, tmp_path, capsys):
    common = ["--cache-dir", str(cache), "--out", str(tmp_path / "out"), "--no-progress", "--kv-context", "8",
              "--kv-continuation", "8", "--kv-budgets", "4"]
    cases = [
        (["--checkpoint", str(llama), "--layers", "0,5"], "--layers: layer indices in 0..1 (the model has 2 layers), got 0,5"),
        (["--checkpoint", str(llama), "--n", "256"], "--n: lengths up to the model's context, 128, got 256"),
        (["--checkpoint", str(llama), "--n", "16", "--windows", "40"], "--windows: at most 32 (the pool"),
        (["--checkpoint", str(llama), "--n", "16", "--num-features", "100", "--methods", "nystromformer"],
         "--num-features: at most 16 for nystromformer at n=16 (a value some method cannot use at some n is left out there and listed; one that leaves a method nothing is refused), got 100"),
        (["--checkpoint", str(llama), "--n", "16", "--kv-context", "12"], "--kv-context: a context plus continuation of "
                                                                          "at most max(n) = 16 tokens"),
        (["--checkpoint", str(tmp_path / "nothing-here")], "--checkpoint"),
    ]
    for argv, expected in cases:
        assert expected in _one_line(capsys, ["decoder", *common, *argv]), argv
    bert = save_tiny_checkpoint("bert", tmp_path / "bert")
    empty = save_tiny_checkpoint("llama", tmp_path / "no-layers", num_hidden_layers=0)
    (tmp_path / "cut.gguf").write_bytes(b"GGUF\x03\x00\x00\x00\x01")  # a GGUF header cut short
    capsys.readouterr()  # the checkpoint writer's progress bar is not the command's output
    for checkpoint, expected in ((bert, "bidirectional bert"), (empty, "at least one layer"), (tmp_path / "cut.gguf",
                                                                                              "GGUF")):
        err = _one_line(capsys, ["decoder", "--checkpoint", str(checkpoint), "--n", "16", *common])
        assert "--checkpoint" in err and expected in err, err
    assert not (tmp_path / "out").exists()


def test_sliding_window_layers_are_refused(tmp_path, cache, capsys, monkeypatch):
    """Gemma 3's layer 0 attends the last 16 keys: at n = 32 it is refused (the reference is full causal attention);
    at n = 16 the window hides nothing, and its layer 1 attends every key."""
    gemma = save_tiny_checkpoint("gemma3", tmp_path / "gemma3")
    common = ["--checkpoint", str(gemma), "--cache-dir", str(cache), "--no-progress", "--windows", "1",
              "--num-features", "4", "--kv-context", "8", "--kv-continuation", "8", "--kv-budgets", "4",
              "--methods", "topk,h2o", "--conditions", "pretrained"]
    capsys.readouterr()
    err = _one_line(capsys, ["decoder", "--n", "32", "--layers", "0,1", "--out", str(tmp_path / "refused"), *common])
    assert "--layers" in err and "layer 0 attends only the last 16 keys" in err and "[1] are supported" in err, err
    monkeypatch.setattr(decoder, "STUDY", dataclasses.replace(decoder.STUDY, figures=()))  # the tables are checked
    assert main(["decoder", "--n", "16", "--layers", "0,1", "--out", str(tmp_path / "ok"), *common]) == 0
    windows = read_results(tmp_path / "ok" / "windows.csv")
    assert set(zip(windows["layer"], windows["sliding_window"].fillna(0))) == {(0, 16), (1, 0)}


def test_plot_only_of_a_folder_without_rows_is_one_line(tiny_run, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_run, copy)
    for name in ("results.csv", "assumptions.csv"):
        original = (copy / name).read_text()
        (copy / name).write_text(original.splitlines()[0] + "\n")  # the header only
        err = _one_line(capsys, ["decoder", "--plot-only", "--out", str(copy)])
        assert name in err and "holds no rows" in err, err
        (copy / name).write_text(original)


def test_methods_causal_forms_and_default_layers():
    """The default set is every softmax approximation with a causal form (own, causal-only or mask-renormalise)."""
    with_form = {m for m in available() if get(m).target == "softmax" and m != "exact"
                 and (get(m).causal in (True, "mask-renormalise") or get(m).causal_only)}
    assert set(decoder.METHODS) == with_form and len(decoder.METHODS) == 33  # ada-snapkv, pyramidkv, criticalkv, caote, and the sparse-prefill methods
    policies = {m for m in available() if get(m).score is not None or get(m).compress is not None}
    assert {"h2o", "snapkv", "knorm", "expected-attention", "cap", "criticalkv", "caote"} <= policies <= set(decoder.METHODS)
    assert decoder.causal_form("performer") is True and decoder.causal_form("nystrom") == "mask-renormalise"
    assert decoder.causal_form("h2o") is True and decoder.causal_form("snapkv") is True
    for method in ("linformer", "kdeformer", "polynomial"):
        with pytest.raises(StudyError, match=f"--methods: methods with a causal form .*, got '{method}'"):
            decoder.causal_form(method)
    assert decoder.default_layers(30) == [0, 15, 29] and decoder.default_layers(30, "first-last") == [0, 29]
    assert decoder.default_layers(1) == [0]
    config = decoder.build_config(layers=[0], n=[16, 32], num_features=[4, 32], kv_context=16, kv_continuation=16,
                                  kv_budgets=[8, 24])
    assert "nystromformer at n=16: d=32" in config["skipped"]  # beyond the limit at one n: left out, and said so
    assert "h2o in the KV-cache setting: budget 24" in config["skipped"]
    assert all(claim.min_units == 2 for claim in decoder_claims.CLAIMS + decoder_claims.CORRELATION_CLAIMS)


def test_the_kv_cache_defaults_follow_the_lengths_asked_for(capsys):
    """``--n 16`` (any n below 2,048) was refused unless --kv-context, --kv-continuation and --kv-budgets were all
    given (their defaults, 1,536 + 512, fit only the full grid's lengths): the defaults that do not fit follow the
    smallest n (a context of 3/4 of it, the rest continuation, the budgets below the context); given values stay."""
    config = decoder.build_config(layers=[0], n=[16])
    assert (config["kv_context"], config["kv_continuation"], config["kv_budgets"]) == (12, 4, [3, 6])
    config = decoder.build_config(layers=[0], n=[128, 1024])
    assert (config["kv_context"], config["kv_continuation"], config["kv_budgets"]) == (96, 32, [16, 64])
    config = decoder.build_config(layers=[0], n=[128, 1024], kv_context=64, kv_budgets=[8])
    assert (config["kv_context"], config["kv_continuation"], config["kv_budgets"]) == (64, 64, [8])  # the rest of the smallest n
    config = decoder.build_config(layers=[0])  # the full grid keeps its own
    assert (config["kv_context"], config["kv_continuation"], config["kv_budgets"]) == (1536, 512, [16, 64, 256, 1024])
    with pytest.raises(SystemExit):
        main(["decoder", "--help"])
    assert "3/4 of the smallest n" in " ".join(capsys.readouterr().out.split())


def test_kv_budgets_as_compression_ratios(llama, cache, tmp_path, capsys):
    """--kv-ratios: kvpress's compression ratios become the budgets max(1, int(n_c * (1 - r))), and kv_cache.csv
    carries each row's ratio beside its budget; with --kv-budgets, or ratios that keep one count twice, one line."""
    config = decoder.build_config(layers=[0], n=[32], kv_context=24, kv_continuation=8, kv_ratios=[0.5, 0.875])
    assert (config["kv_budgets"], config["kv_ratios"]) == ([3, 12], [0.875, 0.5])  # int(24 * 0.125) = 3
    assert "kv_ratios" not in decoder.build_config(layers=[0], n=[32], kv_context=24, kv_continuation=8,
                                                   kv_budgets=[4])
    out = tmp_path / "out"
    assert main(["decoder", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(out), "--conditions",
                 "pretrained", "--n", "32", "--layers", "1", "--windows", "1", "--num-features", "8", "--methods",
                 "h2o,topk", "--kv-context", "24", "--kv-continuation", "8", "--kv-ratios", "0.5,0.875",
                 "--no-progress"]) == 0
    rows = pd.read_csv(out / "kv_cache.csv")
    assert set(zip(rows["budget"], rows["compression_ratio"])) == {(3, 0.875), (12, 0.5)}
    assert (rows["status"] == "ok").all() and set(rows["method"]) == {"h2o", "topk"}
    capsys.readouterr()
    for extra, message in ((["--kv-budgets", "4"], "either --kv-budgets (counts) or --kv-ratios"),
                           ([], "ratios that keep different numbers of the 24 context tokens"),
                           (["--kv-ratios", "1.5"], "comma-separated compression ratios in [0, 1)")):
        ratios = ["--kv-ratios", "0.96,0.99"] if not extra else (["--kv-ratios", "0.5"] if extra[0] != "--kv-ratios"
                                                                else [])
        try:  # argparse's own refusals exit
            status = main(["decoder", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out",
                           str(tmp_path / "x"), "--n", "32", "--layers", "1", "--kv-context", "24", "--kv-continuation",
                           "8", *ratios, *extra, "--no-progress"])
        except SystemExit as exit_:
            status = exit_.code
        err = capsys.readouterr().err
        assert status == 2 and message in err and "Traceback" not in err, err


def test_vattention_error_cells_keep_the_uncapped_draw_of_the_committed_results(monkeypatch):
    """vAttention's default draw is capped at 512 variates per query (``MAX_SAMPLES``); the decoder's committed
    vattention cells (n = 768 to 4,096) were computed with the uncapped one: its error cells pass
    ``max_samples=None``, the other methods their defaults, so the committed rows re-derive."""
    from approxlab.methods.vattention import MAX_SAMPLES
    from approxlab.synthetic import synthetic_qkv

    n = 600  # above the cap: the capped and the uncapped draws differ
    q, k, v = (x.double() for x in synthetic_qkv((1,), n, 8, generator=torch.Generator().manual_seed(0)))
    exact = approxlab.exact_attention(q, k, v, causal=True)
    monkeypatch.setattr(decoder_cells, "_reference", lambda cell: {
        "q": q, "k": k, "v": v, "output": exact, "output_norm": exact.norm(dim=(-2, -1)), "checkpoint": "synthetic"})
    seen = []

    def spy(method, *args, **kwargs):
        seen.append((method, kwargs))
        return approxlab.approximate(method, *args, **kwargs)

    monkeypatch.setattr(decoder_cells, "approximate", spy)
    cell = {"condition": "pretrained", "n": n, "layer": 0, "window": 0, "base_seed": 0, "num_features": [8],
            "seeds": [0], "causal": True}
    rows = {method: decoder.compute_errors({**cell, "method": method})[0] for method in ("vattention", "topk")}
    assert MAX_SAMPLES == 512 and seen[0][1]["max_samples"] is None and "max_samples" not in seen[1][1]
    generator = seen[0][1]["generator"].manual_seed(seen[0][1]["generator"].initial_seed())
    uncapped = approxlab.approximate("vattention", q, k, v, num_features=8, causal=True, max_samples=None,
                                     generator=generator).output
    capped = approxlab.approximate("vattention", q, k, v, num_features=8, causal=True,
                                   generator=generator.manual_seed(generator.initial_seed())).output
    assert rows["vattention"]["status"] == "ok" and not torch.equal(capped, uncapped)
    error = float(approxlab.metrics.spectral_norm(uncapped - exact).max())
    assert rows["vattention"]["error_max"] == pytest.approx(error, rel=1e-12)
