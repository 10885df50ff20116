"""Smoke tests of ``approxlab bench`` (tiny n; the benchmark itself is not a test).

The block Lanczos estimator it times is tested in ``tests/test_lanczos.py``."""

from __future__ import annotations

import time

import pandas as pd
import torch
import pytest

import approxlab
from approxlab.cli import main
from approxlab.errors import StudyError
from approxlab.studies.engine import environment, runner


def test_bench_cli_smoke(tmp_path, capsys):
    """``approxlab bench`` end to end at tiny n: tidy NaN-free table, figure, summary, --plot-only."""
    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--source", "synthetic", "--out", str(out), "--no-progress",
            "--accuracy-n", "96", "--scale-n", "128", "--forward-n", "96",
            "--forward-methods", "nystromformer", "streaming-llm", "--num-features", "16",
            "--training-n", "48", "--training-batch", "2", "--training-features", "8",
            "--patch-n", "64", "--patch-methods", "streaming-llm", "--causal-n", "48", "64", "--causal-budget", "8"]
    assert main(argv) == 0
    results = pd.read_csv(out / "results.csv")
    assert not results.isna().any().any()
    assert set(results["part"]) == {"accuracy", "scale", "forward", "ratios", "training", "patch", "causal"}
    wide = results.pivot_table(index=["part", "n", "algorithm"], columns="quantity", values="value").reset_index()
    accuracy = wide[wide["part"] == "accuracy"].set_index("algorithm")
    assert set(accuracy.index) == {"dense", "golub-kahan", "block-lanczos", "scipy"}
    assert accuracy.loc["block-lanczos", "relative_disagreement"] <= 1e-4
    assert accuracy.loc["golub-kahan", "relative_disagreement"] <= 1e-4
    assert (wide["peak_rss_mb"] >= wide["rss_before_mb"]).all()
    forward = wide[wide["part"] == "forward"]
    assert {"exact-blocked", "exact-sdpa", "torch-sdpa", "torch-sdpa-causal", "approximation"} <= set(forward["algorithm"])
    # the causal-only KV-cache policy is timed in its causal form, every other method in its bidirectional one
    timed = results[(results["algorithm"] == "approximation") & (results["quantity"] == "causal")]
    assert timed.set_index("method")["value"].to_dict() == {"nystromformer": 0.0, "streaming-llm": 1.0}
    patch = wide[wide["part"] == "patch"].set_index("algorithm")
    assert set(patch.index) == {"forward-unpatched", "forward-patched", "layer-approximation", "layer-sdpa",
                                "forward-patched-all"}
    assert patch.loc["forward-patched-all", "ratio_vs_unpatched"] > 0
    assert patch.loc["forward-patched", "ratio_vs_budget"] > 0 and (patch["repeats"] >= 5).all()
    assert (forward["repeats"] >= 5).all() and (forward["warmup"] == 1).all()
    assert (forward["wall_min_s"] <= forward["wall_s"]).all() and (forward["wall_s"] <= forward["wall_max_s"]).all()
    ratios = wide[wide["part"] == "ratios"].set_index("algorithm")
    assert {"operator-matmat", "operator-rmatmat", "spectral-error-sdpa-lanczos"} <= set(ratios.index)
    assert (ratios["ratio_vs_sdpa"].dropna() > 0).all()
    training = wide[wide["part"] == "training"].set_index("algorithm")
    assert set(training.index) == {"torch-sdpa", "softmax", "kernelized", "skyformer", "nystromformer",
                                   "spectral-shifting", "yoso"}
    assert training.loc["torch-sdpa", "ratio_vs_sdpa"] == 1.0 and (training["ratio_vs_sdpa"] > 0).all()
    assert (training["finite_gradients"] == 1.0).all() and (training["repeats"] >= 5).all()
    for name in ("bench.png", "bench.pdf", "summary.md", "config.json"):
        assert (out / name).is_file()
    summary = (out / "summary.md").read_text()
    assert "block-lanczos" in summary and "approxlab bench --quick" in summary
    assert "## Target ratios" in summary and "ExactAttentionOperator.rmatmat / SDPA forward" in summary
    assert "## Training step against a pure-SDPA model" in summary and "| nystromformer | `nystromformer` |" in summary
    assert "## Forward cost against SDPA" in summary and "| `streaming-llm` | causal | " in summary
    assert "## A forward pass with one layer patched" in summary and "| 64 | `streaming-llm` | 1 |" in summary
    assert "Cache policies in every layer" in summary
    causal = wide[wide["part"] == "causal"]
    assert {"torch-sdpa-causal", "causal/h2o", "causal/quest", "causal/topk", "causal/vattention", "causal/magicpig",
            "kv-cache/snapkv"} <= set(causal["algorithm"])
    # one cell per (n, policy): its policy and the fused baseline, timed in turn; the math path in a cell of its own
    cells = results[results["part"] == "causal"].groupby(["n", "method"])["algorithm"].agg(lambda a: sorted(set(a)))
    assert cells[(64, "causal/topk")] == ["causal/topk", "torch-sdpa-causal"]
    assert cells[(48, "torch-sdpa-causal-math")] == ["torch-sdpa-causal", "torch-sdpa-causal-math"]
    assert (causal.dropna(subset=["ratio_vs_sdpa"])["ratio_vs_sdpa"] > 0).all()
    assert "## Causal forms against fused causal SDPA (4-D)" in summary and "| `causal/streaming-llm` | " in summary
    before = (out / "results.csv").read_bytes()
    assert main(["bench", "--out", str(out), "--plot-only", "--no-progress"]) == 0
    assert (out / "results.csv").read_bytes() == before
    capsys.readouterr()


def test_training_part_alone_writes_its_table_and_no_figure(tmp_path, capsys):
    """``--parts training``: the summary holds the training table, no empty figure is drawn, and
    no warning (legends of empty panels) is raised -- warnings are errors in this suite."""
    out = tmp_path / "training"
    argv = ["bench", "--quick", "--source", "synthetic", "--out", str(out), "--no-progress", "--parts", "training",
            "--training-n", "48", "--training-batch", "2", "--training-features", "8"]
    assert main(argv) == 0
    assert set(pd.read_csv(out / "results.csv")["part"]) == {"training"}
    assert not (out / "bench.png").exists()
    assert "## Training step against a pure-SDPA model" in (out / "summary.md").read_text()
    capsys.readouterr()


def test_bench_cli_refuses_dask(tmp_path, capsys):
    """The ratios are only fair in one process: --workers is refused with exit status 2."""
    assert main(["bench", "--quick", "--source", "synthetic", "--out", str(tmp_path), "--workers", "2"]) == 2
    assert "one process" in capsys.readouterr().err


def test_bench_plot_only_without_results(tmp_path, capsys):
    assert main(["bench", "--out", str(tmp_path / "none"), "--plot-only"]) == 2
    assert "run the study's compute step first" in capsys.readouterr().err


@pytest.mark.parametrize(("options", "environ", "expected"), [
    ([], {}, 1),
    (["--threads", "2"], {}, 2),
    ([], {"OMP_NUM_THREADS": "2"}, 1),  # a thread variable sets the process, not the training part
    (["--threads", "2", "--training-threads", "3"], {}, 3),
], ids=["default", "threads", "environment", "training-threads-wins"])
def test_the_training_part_runs_on_threads_when_given(options, environ, expected, tmp_path, monkeypatch, capsys):
    """``--threads`` sets the training part's threads unless ``--training-threads`` does (no step is run)."""
    seen = {}

    def stop_before_computing(steps, out, *, config, **kwargs):
        seen.update(config)
        raise StudyError("stopped before computing")

    monkeypatch.setattr(runner, "run_steps", stop_before_computing)
    for name in environment.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    argv = ["bench", "--quick", "--source", "synthetic", "--parts", "training", "--no-progress",
            "--out", str(tmp_path / "run"), *options]
    assert main(argv) == 2 and "stopped before computing" in capsys.readouterr().err
    assert seen["training_threads"] == expected


def test_measure_interleaved_times_in_turn_and_takes_each_median():
    from approxlab.studies.bench import measure_interleaved

    calls, delays = [], {"a": [0.0, 0.03, 0.0], "b": [0.01, 0.01, 0.05]}

    def make(name):
        def function():
            calls.append(name)
            time.sleep(delays[name][sum(c == name for c in calls) - 2] if len(calls) > 2 else 0.0)
        return function

    a, b = measure_interleaved([make("a"), make("b")], repeats=3, warmup=1)
    assert calls == ["a", "b"] + ["a", "b"] * 3  # warm-ups, then A, B, A, B, A, B
    assert (a.repeats, b.repeats, a.warmup) == (3, 3, 1)
    assert a.wall_min_s <= a.wall_s <= a.wall_max_s and b.wall_min_s <= b.wall_s <= b.wall_max_s
    assert 0.0 <= a.wall_s < 0.02 and 0.02 <= a.wall_max_s  # median of (0, 0.03, 0), not the mean
    assert 0.01 <= b.wall_s < 0.03 and 0.05 <= b.wall_max_s


@pytest.mark.parametrize(("option", "value", "allowed"), [
    ("--tol", "5", r"a number in \(0, 1\)"), ("--tol", "1", r"a number in \(0, 1\)"),
    ("--tol", "nan", r"a number in \(0, 1\)"), ("--repeats", "0", "an integer >= 5"),
    ("--repeats", "-1", "an integer >= 5"), ("--repeats", "4", "an integer >= 5"),
])
def test_bench_refuses_a_tolerance_or_repeats_it_cannot_honour(option, value, allowed, tmp_path, capsys):
    """A relative tolerance >= 1 stops every route at once, and a median of fewer than 5 calls is noise: one
    line naming the option, what it allows and what came in, exit status 2, from the command line and code."""
    import re

    from approxlab.errors import UsageError
    from approxlab.studies.bench import build_config

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--quick", "--source", "synthetic", "--out", str(tmp_path), option, value])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and re.search(f"{option}: {allowed}.*got '{value}'", error), error
    with pytest.raises(UsageError, match=f"{option}: {allowed}"):
        build_config(quick=True, **{option[2:]: float(value) if option == "--tol" else int(value)})


def test_growth_exponent_recovers_a_power_law_and_says_how_well_it_fits():
    """The slope of log(time) on log(n) with its Student-t interval: a clean n^2 is recovered with a narrow
    interval that holds it, a noisy one with a wide interval, two n give no interval, bad input is refused."""
    import math

    import numpy as np

    from approxlab.studies.bench.growth import growth_exponent

    n = np.array([1024, 2048, 4096, 8192, 16384])
    clean = growth_exponent(n, 1e-9 * n**2.0 * np.array([1.0, 1.01, 0.99, 1.0, 1.01]))
    assert abs(clean.exponent - 2.0) < 0.01 and clean.low < 2.0 < clean.high and clean.high - clean.low < 0.05
    assert (clean.points, clean.n_min, clean.n_max) == (5, 1024, 16384)
    noisy = growth_exponent(n, 1e-6 * n * np.array([1.0, 3.0, 0.5, 2.0, 1.0]))
    assert noisy.low < 1.0 < noisy.high and noisy.high - noisy.low > 1.0
    two = growth_exponent([512, 1024], [1.0, 2.0])
    assert two.exponent == pytest.approx(1.0) and math.isnan(two.low) and math.isnan(two.high)
    with pytest.raises(ValueError, match="`seconds` must be positive and finite; got"):
        growth_exponent([512, 1024], [1.0, 0.0])
    with pytest.raises(ValueError, match="`n` and `seconds` must be of one length with two distinct n"):
        growth_exponent([512, 512], [1.0, 2.0])


@pytest.mark.parametrize(("options", "message"), [
    (["--patch-layer", "2"], r"--patch-layer: a layer index in 0\.\.1 \(the synthetic decoder has 2 layers\), got 2"),
    (["--patch-n", "5000"], r"--patch-n: lengths of at most 4096 \(the synthetic decoder's context\), got 5000"),
])
def test_the_patch_part_refuses_a_layer_or_window_its_decoder_lacks(options, message, tmp_path, capsys):
    """Before any cell runs, one line naming the option."""
    import re

    argv = ["bench", "--quick", "--source", "synthetic", "--parts", "patch", "--out", str(tmp_path), *options]
    assert main(argv) == 2
    assert re.search(message, capsys.readouterr().err)


def test_the_causal_part_times_every_cache_policy_the_registry_holds(fresh_registry):
    """A cache policy registered later (with a compression step) is timed through kv_cache_attention without a
    change to the bench; the selection methods and causal-only policies in their causal form."""
    from approxlab.methods import register
    from approxlab.studies.bench.causal import _verdict, policies

    def keep_first(q, k, v, *, budget, generator=None, key_mask=None):
        return torch.arange(budget).expand(*k.shape[:-2], budget)

    @register("first-tokens", target="softmax", features="cache size", randomized=False, causal="only",
              compress=keep_first)
    def first_tokens(q, k, v, *, num_features, generator=None, causal=True):
        return approxlab.approximate("streaming-llm", q, k, v, num_features=num_features, sinks=num_features,
                                     causal=True).output

    found = policies()
    assert {("causal", "first-tokens"), ("kv-cache", "first-tokens"), ("causal", "topk"), ("causal", "h2o"),
            ("kv-cache", "h2o")} <= set(found)
    assert ("causal", "performer") not in found
    assert _verdict("causal", "streaming-llm", {2048: 1.5, 4096: 0.4}, None).startswith("not met: growth exponent")
    assert _verdict("causal", "topk", {2048: 6.0, 4096: 2.9}, None) == "met"
    assert _verdict("causal", "topk", {4096: 3.1}, None) == "not met: 3.10x at n = 4096 (target <= 3x)"
    assert _verdict("kv-cache", "h2o", {4096: 1.6}, None) == "not met: 1.60x at n = 4096 (target <= 1.5x)"
    assert _verdict("kv-cache", "first-tokens", {4096: 3.5}, None) == "not met: 3.50x at n = 4096 (target <= 3x)"


def test_the_causal_part_holds_sparse_prefill_to_sdpa_and_the_output_aware_policies_to_the_scorer_target():
    """The sparse-prefill patterns are timed in their causal form and held to fused causal SDPA (their reason to
    exist); CriticalKV and CAOTE, as scorers, in both forms and to the scorer target; ``methods`` restricts the part."""
    from approxlab.studies.bench.causal import PREFILL_TARGET, SCORER_TARGET, _verdict, policies, target

    found = policies()
    for method in ("minference", "xattention", "flexprefill", "duo-attention"):
        assert target(method) == PREFILL_TARGET == 1.0
        assert ("causal", method) in found and ("kv-cache", method) not in found
    for method in ("criticalkv", "caote"):
        assert target(method) == SCORER_TARGET == 1.5
        assert {("causal", method), ("kv-cache", method)} <= set(found)
    assert target("streaming-llm") == 0.5 and target("performer") == 3.0
    assert policies(["flexprefill", "caote"]) == [("causal", "caote"), ("kv-cache", "caote"), ("causal", "flexprefill")]
    assert _verdict("causal", "flexprefill", {8192: 1.2}, None) == "not met: 1.20x at n = 8192 (target <= 1x)"
    assert _verdict("causal", "flexprefill", {8192: 0.9}, None) == "met"


def test_a_policy_that_raises_is_a_failed_row_of_the_causal_part(fresh_registry, capsys):
    """A registered cache policy raising RuntimeError ended the causal part (and the bench) with a traceback: its
    row now holds the error as its status, every other policy is timed, and the summary says it failed."""
    import pandas as pd

    from approxlab.methods import register
    from approxlab.studies.bench.causal import causal_lines, causal_rows

    @register("raises", target="softmax", features="cache size", randomized=False, causal="only")
    def raises(q, k, v, *, num_features, generator=None, causal=True):
        raise RuntimeError("the plugin's own bug")

    config = {"causal_budget": 8, "seed": 0, "repeats": 1}
    rows = [{"method": name, **row} for name in ("causal/raises", "causal/h2o")
            for row in causal_rows({"config": config, "n": 32, "method": name, "device": "cpu"})]
    frame = pd.DataFrame(rows).assign(part="causal", n=32)
    assert frame.loc[frame["method"] == "causal/raises", "algorithm"].tolist() == ["causal/raises"]  # no SDPA row
    failed = frame[frame["algorithm"] == "causal/raises"]
    assert len(failed) == 1 and failed["failed"].iloc[0] == 1 and "wall_s" not in failed.dropna(axis=1)
    assert "causal/raises failed at n=32: RuntimeError: the plugin's own bug" in capsys.readouterr().err
    assert frame.loc[frame["algorithm"] == "causal/h2o", "ratio_vs_sdpa"].notna().all()
    text = "\n".join(causal_lines(frame))
    assert "`causal/raises` | failed at n = 32" in text


def test_the_causal_part_has_one_cell_per_length_and_policy_on_the_same_tensors_per_length(monkeypatch):
    """The causal part was one cell per n timing every policy in turn (re-timing one method re-ran all, about an
    hour): one cell per (n, policy) and one for the math path per n, every cell of one n on the same Q, K, V."""
    from approxlab.studies.bench import causal
    from approxlab.studies.bench.grid import build_cells, build_config

    config = build_config(quick=True, parts=["causal"], causal_n=[32, 48], causal_budget=8)
    cells = build_cells(config, {"device": "cpu"})
    names = causal.cell_methods()
    assert [(cell["n"], cell["method"]) for cell in cells] == [(n, name) for n in (32, 48) for name in names]
    assert names[0] == causal.MATH_PATH and {"causal/topk", "kv-cache/h2o"} <= set(names)
    seen = {}

    def call(form, method, q, k, v, budget):
        seen[form, method, q.shape[-2]] = q.clone()
        return lambda: v

    monkeypatch.setattr(causal, "_call", call)
    for cell in cells[1:3] + cells[len(names) + 1:len(names) + 3]:
        rows = causal.causal_rows({**cell, "config": {**config, "repeats": 1}})
        assert [row["algorithm"] for row in rows] == [causal.SDPA, cell["method"]] and rows[1]["ratio_vs_sdpa"] > 0
    (first, second), (third, fourth) = list(seen.values())[:2], list(seen.values())[2:]
    assert torch.equal(first, second) and torch.equal(third, fourth) and first.shape != third.shape


def test_the_causal_summary_leaves_out_the_former_per_length_cells():
    """A table saved with the former cells (method ``policies``, every policy in one cell per n) is not mixed
    with the new cells' rows: the summary leaves those rows out and says how to drop them."""
    from approxlab.studies.bench.causal import FORMER_CELLS, MATH_PATH, SDPA, causal_lines

    common = {"part": "causal", "n": 64, "num_features": 8}
    rows = [{**common, "method": FORMER_CELLS, "algorithm": SDPA, "wall_s": 1.0},
            {**common, "method": FORMER_CELLS, "algorithm": "causal/topk", "wall_s": 9.0, "ratio_vs_sdpa": 9.0},
            {**common, "method": "causal/topk", "algorithm": SDPA, "wall_s": 1.0},
            {**common, "method": "causal/topk", "algorithm": "causal/topk", "wall_s": 2.0, "ratio_vs_sdpa": 2.0},
            {**common, "method": MATH_PATH, "algorithm": SDPA, "wall_s": 1.0},
            {**common, "method": MATH_PATH, "algorithm": MATH_PATH, "wall_s": 3.0, "ratio_vs_sdpa": 3.0}]
    text = "\n".join(causal_lines(pd.DataFrame(rows)))
    assert "| `causal/topk` | 2.00 | 2.00 (<= 3x) |" in text and "9.00" not in text
    assert "Left out: the rows of the former cells (method `policies`" in text and "at n = 64;" in text
    former = "\n".join(causal_lines(pd.DataFrame(rows[:2])))
    assert "Left out" in former and "| `causal/topk`" not in former


def test_an_error_method_that_raises_is_a_failed_cell_and_the_report_is_written(tmp_path, capsys, fresh_registry):
    """A registered method raising RuntimeError as --error-method ended the bench with a traceback in the accuracy
    and ratios parts: each cell is a failed row (its error on stderr, one line), and the summary is written."""
    from approxlab.methods import register

    @register("raises", target="softmax", features="ignored", randomized=False)
    def raises(q, k, v, *, num_features, generator=None):
        raise RuntimeError("the plugin's own bug")

    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--source", "synthetic", "--out", str(out), "--no-progress", "--parts", "accuracy",
            "ratios", "--accuracy-n", "64", "--error-method", "raises", "--num-features", "8"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "raises failed in the accuracy part at n=64: RuntimeError: the plugin's own bug" in err
    results = pd.read_csv(out / "results.csv")
    assert not results.isna().any().any()
    assert {"accuracy-failed", "ratios-failed"} <= set(results["algorithm"])
    assert (out / "summary.md").is_file()


def test_every_layer_target_is_judged_at_its_length_only():
    """A cache policy in every layer is judged against 1.3x the unpatched forward at 2048 tokens only; a shorter
    forward (where the per-call overhead dominates) is shown without a verdict."""
    from approxlab.studies.bench.patched import ALL_LAYERS_N, patch_lines

    rows = []
    for n, ratio in ((512, 2.0), (ALL_LAYERS_N, 1.2), (4096, 1.1)):
        common = {"part": "patch", "n": n, "method": "h2o", "layer": 1, "wall_s": 1.0, "cpu_ratio_vs_budget": 1.0}
        rows += [{**common, "algorithm": "forward-unpatched"},
                 {**common, "algorithm": "forward-patched", "ratio_vs_budget": 1.0, "overhead_s": 0.0},
                 {**common, "algorithm": "layer-approximation"}, {**common, "algorithm": "layer-sdpa"},
                 {**common, "algorithm": "forward-patched-all", "ratio_vs_unpatched": ratio,
                  "cpu_ratio_vs_unpatched": ratio}]
    lines = [line for line in patch_lines(pd.DataFrame(rows)) if line.startswith("| ") and "`h2o` | 1.000 |" in line]
    assert [line.rsplit("|", 2)[-2].strip() for line in lines] == ["—", "met", "—"]
    rows[9]["ratio_vs_unpatched"] = 1.5  # the 2048-token every-layer row (above the target)
    lines = [line for line in patch_lines(pd.DataFrame(rows)) if "`h2o` | 1.000 |" in line]
    assert lines[1].rsplit("|", 2)[-2].strip() == "not met: 1.50x"


def test_the_causal_section_states_the_load_under_which_each_n_was_timed():
    """The committed causal part was timed at a load average of 5.6 to 13.9 on 2 cores: the section says so per n,
    beside the ratios it qualifies (the CPU-time ratios named the steadier reading)."""
    import pathlib

    import pandas as pd

    from approxlab.studies.bench.causal import FORMER_CELLS, causal_lines
    from approxlab.studies.bench.report import _wide

    results = pd.read_csv(pathlib.Path(__file__).parents[1] / "figures" / "bench" / "results.csv")
    former = results["method"] == FORMER_CELLS  # a run with the former cells: each algorithm as a cell of its own
    results.loc[former, "method"] = results.loc[former, "algorithm"]
    text = "\n".join(causal_lines(_wide(results)))
    line = next(line for line in text.splitlines() if line.startswith("1-minute load average"))
    assert "at n = 2048" in line and "at n = 8192" in line and "CPU time" in line


def test_the_figure1_cell_line_names_its_baseline_and_method_count_and_sets_its_target_from_it():
    """The Figure-1 cell's line says what it divides by (one 12-head float64 SDPA exact attention at n) and how many
    methods the cell ran; its target is 10 forwards for nine methods plus one per further method (16 for 15)."""
    from approxlab.studies.bench.ratios import ratio_lines

    common = {"part": "ratios", "n": 4096, "method": "figure1-cell", "compute_dtype": "float64", "heads": 12,
              "load_average": 1.0}
    rows = pd.DataFrame([{**common, "algorithm": "exact-attention-sdpa-all-heads", "wall_s": 1.0},
                         {**common, "algorithm": "figure1-cell-compute", "wall_s": 15.0, "ratio_vs_sdpa": 15.0,
                          "methods": 15}])
    line = next(line for line in ratio_lines(rows) if line.startswith("| Figure-1 cell"))
    assert "15 methods" in line and "/ one 12-head float64 SDPA exact attention at n |" in line
    assert line.endswith("| 15.00 | <= 16 | yes |")
    rows.loc[1, "methods"] = 9
    line = next(line for line in ratio_lines(rows) if line.startswith("| Figure-1 cell"))
    assert "9 methods" in line and line.endswith("| 15.00 | <= 10 | no |")


def test_duo_attention_is_timed_with_the_split_its_authors_fix_offline_and_the_split_is_reported_apart(monkeypatch):
    """DuoAttention's cell found its head split on every timed call (about one fused causal attention, which the
    authors pay once per model, offline): the split is found once before the timed calls, the timed calls are
    given it, and its seconds are the row's ``offline_s``, said in the summary and not in the ratio."""
    import pandas as pd

    from approxlab.attention import approximate
    from approxlab.studies.bench import causal

    given = []

    def call(form, method, q, k, v, budget, **options):
        given.append(options)
        return lambda: approximate(method, q, k, v, num_features=budget, causal=True, **options).output

    monkeypatch.setattr(causal, "_call", call)
    config = {"causal_budget": 8, "seed": 0, "repeats": 1}
    rows = causal.causal_rows({"config": config, "n": 64, "method": "causal/duo-attention", "device": "cpu"})
    (options,) = given
    found = approximate("duo-attention", *causal.causal_qkv(config, 64), num_features=8, causal=True)
    assert torch.equal(options["retrieval_heads"], found.info["retrieval_heads"])
    assert rows[1]["offline_s"] > 0 and "offline_s" not in rows[0]
    lines = causal.causal_lines(pd.DataFrame([{"part": "causal", "n": 64, "method": "causal/duo-attention", **row}
                                              for row in rows]))
    assert any(line.startswith("`causal/duo-attention` is timed with the result of the step") for line in lines)
    rows = causal.causal_rows({"config": config, "n": 64, "method": "causal/minference", "device": "cpu"})
    assert given[-1] == {} and "offline_s" not in rows[1]

