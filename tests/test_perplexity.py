"""``approxlab perplexity`` end to end on a tiny random Llama (tied embeddings, so it scores tokens) and the packaged
all-MiniLM-L6-v2 encoder, offline: its tables, claims, figures and summary; the change in log-perplexity against
a hand-made computation; the statistics of its claims; the rankings read from saved figure1 and decoder runs; its
one-line errors. ``approxlab perplexity --quick`` on the packaged SmolLM2 runs in tests/test_perplexity_quick.py,
the kill test in tests/test_perplexity_kill.py."""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re

import numpy as np
import pandas as pd
import pytest
import torch
from test_models_qkv import save_tiny_checkpoint

import approxlab
from approxlab.cli import main
from approxlab.errors import UsageError
from approxlab.patching import token_nll
from approxlab.studies import perplexity
from approxlab.studies.engine import read_results
from approxlab.studies.perplexity import cells, grid, references, stats

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIGURE1 = ROOT / "figures" / "figure1"
GRID = ["--n", "32", "--context", "24", "--continuation", "8", "--num-features", "8,16", "--methods",
        "performer,informer,nystromformer,streaming-llm", "--encoder-methods", "nystromformer", "--layer-settings",
        "last,all", "--windows", "3", "--no-progress",
        *(["--compare-with", str(FIGURE1)] if (FIGURE1 / "results.csv").is_file() else [])]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny random decoder whose output embedding is its input embedding (token_nll can score it)."""
    return save_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny-llama") / "llama", tie_word_embeddings=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("perplexity-cache")


@pytest.fixture(scope="module", autouse=True)
def fewer_resamples():
    """200 bootstrap resamples instead of 2,000 (the intervals' code is the same; the tests check it, not coverage)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(stats.BOOTSTRAP, "resamples", 200)
        yield


@pytest.fixture(scope="module")
def run(llama, cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("perplexity-run")
    assert main(["perplexity", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(out), *GRID]) == 0
    return out


def test_tables_figures_claims_and_summary(run):
    for name in ("baseline.csv", "perplexity.csv", "layer_errors.csv", "encoder.csv", "cost.csv", "delta.csv",
                 "correlations.csv", "verdicts.csv", "encoder_stats.csv", "summary.md", "perplexity-d.png",
                 "perplexity-error.pdf", "perplexity-kv.png", "config.json", "timing.json"):
        assert (run / name).is_file(), name
    runs = read_results(run / "perplexity.csv")
    assert (runs["status"] == "ok").all(), runs.loc[runs["status"] != "ok", "status"]
    # settings: layer 1 (last), all, KV cache; methods: the control once, four methods at two d; 3 windows
    assert len(runs) == 3 * (1 + 4 * 2) * 3
    assert set(runs["layers"]) == {"layer 1", "all"} and set(runs["setting"]) == {"whole", "kv-cache"}
    layers = read_results(run / "layer_errors.csv")
    assert len(layers) == 3 * 9 * (1 + 2 + 2)  # one row per replaced layer: 1, then 2, then 2 (the KV cache)
    control = runs[runs["method"] == "exact"]
    assert (control["spectral_median"] < 1e-5).all()
    verdicts = read_results(run / "verdicts.csv")
    compared = "--compare-with" in GRID
    assert len(verdicts[verdicts["claim"] != "p3"]) == 3 * (1 + 2)
    # p3: figure1's ranking (one encoder layer, its d 16..256) against both whole-window settings at d = 16, over
    # the three methods both ran (streaming-llm is causal only)
    p3 = verdicts[verdicts["claim"] == "p3"]
    assert len(p3) == (2 if compared else 0) and (p3["num_features"] == 16).all() and (p3["methods"] == 3).all()
    assert set(verdicts["verdict"]) <= {"ranks the losses", "does not rank the losses", "better than spectral",
                                        "worse than spectral", "inconclusive", "same places", "different places"}
    summary = (run / "summary.md").read_text()
    for text in ("## Claims", "(p1)", "(p2)", "(p3)", "## Deviations", "Weights of the decoder", "## The encoder",
                 "## Cost of a patched forward pass", "## Against the papers", "KV cache (budget b)"):
        assert text in summary, text
    assert not re.search(r"\bnan\b", summary.lower())


def test_the_change_in_log_perplexity_is_the_patched_minus_the_unpatched_nll(run, llama, cache):
    """One cell recomputed by hand: the window's first n tokens, the unpatched and the patched model's mean NLL."""
    runs, baseline = read_results(run / "perplexity.csv"), read_results(run / "baseline.csv")
    row = runs[(runs["method"] == "performer") & (runs["layers"] == "all") & (runs["setting"] == "whole")].iloc[0]
    config = perplexity.build_config(num_layers=2, checkpoint=str(llama), n=[32], context=24, continuation=8,
                                     num_features=[8, 16], methods=["performer"],
                                     encoder_methods=["nystromformer"], layer_settings=["last", "all"], windows=3)
    cell = next(c for c in grid.decoder_cells(config, {"cache_dir": str(cache)})
                if c["setting"] == "whole" and c["layers"] == "all" and c["method"] == "performer"
                and c["window"] == row["window"] and c["num_features"] == row["num_features"])
    model = cells.decoder_model(cell)
    ids = cells.window_tokens(cell)[:, :32]
    before = token_nll(model, ids)
    key = tuple(cell[c] for c in cells.DECODER_KEY)
    generator = torch.Generator().manual_seed(cells.cell_seed(*key, base_seed=0))
    with approxlab.patch_attention(model, "performer", num_features=int(row["num_features"]), generator=generator):
        after = token_nll(model, ids)
    unpatched = baseline[(baseline["setting"] == "whole") & (baseline["window"] == row["window"])]["nll"].iloc[0]
    assert math.isclose(float(before.mean()), unpatched, rel_tol=1e-12)
    assert math.isclose(float(after.mean()), row["nll"], rel_tol=1e-12)


def test_resume_computes_nothing_and_plot_only_redraws(run, llama, cache, monkeypatch):
    before = {name: read_results(run / name) for name in ("perplexity.csv", "layer_errors.csv", "encoder.csv")}
    monkeypatch.setattr(perplexity, "STUDY", dataclasses.replace(perplexity.STUDY, figures=()))
    assert main(["perplexity", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(run), *GRID]) == 0
    for name, table in before.items():
        pd.testing.assert_frame_equal(read_results(run / name), table)
    summary = (run / "summary.md").read_text()
    assert main(["perplexity", "--out", str(run), "--plot-only", "--no-progress"]) == 0
    assert (run / "summary.md").read_text() == summary


def _frame(deltas, errors, windows=(0, 1, 2)) -> pd.DataFrame:
    """Cells of one setting: methods x windows with the given per-method change and error (plus window noise)."""
    rows = []
    for w in windows:
        for i, (method, delta) in enumerate(deltas.items()):
            spectral = errors[i] * (1 + 0.01 * w)
            rows.append({"setting": "whole", "layers": "layer 0", "method": method, "num_features": 8, "window": w,
                         "delta": delta + 1e-3 * w, "ok": True, "spectral_median": spectral,
                         "frobenius_median": errors[::-1][i], "worst_query_median": spectral ** 2})
    return pd.DataFrame(rows)


def test_p1_and_p2_follow_the_ranks():
    """The spectral error orders the losses exactly (rho = 1): p1 holds; the Frobenius measure, reversed, is worse."""
    frame = _frame({"a": 0.1, "b": 0.2, "c": 0.4, "d": 0.8}, [0.1, 0.2, 0.3, 0.5])
    found = stats.correlations(frame, control="exact")
    spectral = found[found["measure"] == "spectral"].iloc[0]
    assert spectral["rho"] > 0.95 and spectral["points"] == 12 and spectral["windows"] == 3
    table = stats.verdicts(frame, pd.DataFrame(), "exact", found)
    assert table.set_index(["claim", "measure"]).loc[("p1", "spectral"), "verdict"] == "ranks the losses"
    p2 = table[table["claim"] == "p2"].set_index("measure")
    assert p2.loc["frobenius", "verdict"] == "worse than spectral" and p2.loc["frobenius", "estimate"] < -1.5
    assert p2.loc["worst_query", "estimate"] == pytest.approx(0.0, abs=1e-12)  # a monotone map: the same ranks
    assert p2.loc["worst_query", "verdict"] == "inconclusive"


def test_p3_compares_the_methods_both_runs_measured():
    frame = _frame({"a": 0.1, "b": 0.2, "c": 0.4, "d": 0.8}, [0.1, 0.2, 0.3, 0.5])
    ranking = pd.DataFrame({"reference": "r", "study": ["decoder"] * 4 + ["figure1"] * 4, "layer": [0] * 8,
                            "method": list("abce") * 2, "num_features": 8, "error": [1, 2, 3, 4, 3, 2, 1, 4]})
    rows = pd.DataFrame(stats.reference_agreement(frame, ranking, "exact"))
    assert set(rows["methods"]) == {3}  # "d" and "e" are in one ranking each
    found = rows.set_index("reference")["estimate"]
    assert found["decoder (r, layer 0)"] > 0.9 and found["figure1 (r, layer 0)"] < -0.9
    assert rows.set_index("reference").loc["decoder (r, layer 0)", "verdict"] == "same places"


def test_deltas_mark_failures_as_inf_and_statistics_leave_them_out():
    perplexity_table = pd.DataFrame({"setting": "whole", "layers": "all", "method": "m", "num_features": 8,
                                     "window": [0, 1, 2], "nll": [3.5, math.inf, 3.25],
                                     "status": ["ok", "FloatingPointError: x", "ok"],
                                     "spectral_median": [0.5, math.inf, 0.25], "frobenius_median": 0.1,
                                     "worst_query_median": 0.2})
    baseline = pd.DataFrame({"setting": "whole", "window": [0, 1, 2], "nll": [3.0, 3.0, 3.0]})
    frame = stats.deltas(perplexity_table, baseline)
    assert frame["delta"].tolist() == [0.5, math.inf, 0.25]
    table = stats.delta_statistics(frame)
    assert table["delta"].iloc[0] == pytest.approx(0.375) and table["failures"].iloc[0] == 1
    assert table["windows"].iloc[0] == 3


@pytest.mark.parametrize("folder", ["figures/decoder", "figures/figure1"])
def test_the_rankings_of_the_committed_runs_are_read(folder):
    if not (ROOT / folder / "results.csv").is_file():
        pytest.skip(f"no committed {folder}")
    rows = pd.DataFrame(references.compute_reference({"reference": str(ROOT / folder), "n": 512}))
    lengths = pd.read_csv(ROOT / folder / "results.csv", usecols=["n"])["n"].unique()
    closest = min(lengths, key=lambda n: (abs(n - 512), n))  # the folder's length closest to this run's n
    assert set(rows["study"]) == {folder.split("/")[1]} and (rows["reference_n"] == closest).all()
    assert rows["condition"].eq("pretrained").all() and np.isfinite(rows["error"]).any()
    assert "performer" in set(rows["method"]) and (rows["samples"] >= 1).all()


def test_grid_errors_name_the_option(tmp_path):
    with pytest.raises(UsageError, match="--methods: methods with a causal form .*, got 'linformer'"):
        perplexity.build_config(num_layers=30, methods=["linformer"])
    with pytest.raises(UsageError, match="--layer-settings: layer indices in 0..29 .*, got 0,30"):
        perplexity.build_config(num_layers=30, layer_settings=[0, 30])
    with pytest.raises(UsageError, match="--compare-with: result folders of figure1 or decoder runs"):
        perplexity.build_config(num_layers=30, compare_with=[str(tmp_path)])
    with pytest.raises(UsageError, match="--methods: each value at most once, got 'topk,topk'"):
        perplexity.build_config(num_layers=30, methods=["topk", "topk"])
    config = perplexity.build_config(num_layers=30, layer_settings=["last", 29, "all"], methods=["topk"])
    assert config["layers"] == ["layer 29", "all"] and config["methods"] == ["topk"]
    assert grid.method_features(config, "yoso-e") == [16] and grid.method_features(config, "topk") == [16, 64, 256]


def _raises(q, k, v, *, num_features, generator=None, causal=False):
    raise RuntimeError("the plugin's own bug")


def _non_finite(q, k, v, *, num_features, generator=None, causal=False):
    return torch.full((*q.shape[:-1], v.shape[-1]), math.nan, dtype=v.dtype)


def test_a_method_that_fails_gets_failed_rows_and_the_report_is_written(fresh_registry, llama, cache, tmp_path,
                                                                         capsys):
    """A registered method raising RuntimeError used to end the run with a traceback (only ArithmeticError and
    LinAlgError were caught), and one with a non-finite output raised FloatingPointError from the cost step:
    both are failed rows naming their error (inf nll, inf cost), and the run writes its report."""
    from approxlab.methods import register

    register("raises", _raises, target="softmax", features="ignored", randomized=False, causal=True)
    register("non-finite", _non_finite, target="softmax", features="ignored", randomized=False, causal=True)
    out = tmp_path / "run"
    grid = [*GRID]
    grid[grid.index("--methods") + 1] = "raises,non-finite,performer"
    grid[grid.index("--windows") + 1] = "2"
    grid[grid.index("--layer-settings") + 1] = "last"
    assert main(["perplexity", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(out), *grid]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "method 'raises' failed in" in err, err
    rows = read_results(out / "perplexity.csv")
    failed = rows[rows["method"] == "raises"]
    assert len(failed) and (failed["status"] == "RuntimeError: the plugin's own bug").all()
    assert (failed["nll"] == math.inf).all()
    assert (rows.loc[rows["method"] == "non-finite", "status"].str.startswith("FloatingPointError")).all()
    assert (rows.loc[rows["method"] == "performer", "status"] == "ok").all()
    cost = read_results(out / "cost.csv").set_index("method")
    assert cost.loc["raises", "status"] == "RuntimeError: the plugin's own bug"
    assert cost.loc["non-finite", "status"].startswith("FloatingPointError")
    assert cost.loc["non-finite", "ratio"] == math.inf and cost.loc["performer", "status"] == "ok"
    assert (out / "summary.md").is_file()
