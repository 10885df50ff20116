"""The Figure 1 study (Skyformer Sec. 4.5) on a tiny grid with synthetic Q/K/V."""

from __future__ import annotations

import shlex
import types

import pandas as pd
import pytest
import torch

from approxlab.cli import main
from approxlab.errors import UsageError
from approxlab.plotting import method_curve
from approxlab.studies import compute, figure1
from approxlab.studies.engine import read_json, read_results
from approxlab.studies.inputs import wikitext
from approxlab.synthetic import synthetic_qkv

METHODS = ["skyformer-softmax", "nystromformer", "performer"]
TINY = ["--n", "32,48", "--num-features", "4,8", "--methods", ",".join(METHODS), "--windows", "1",
        "--seeds", "2", "--dtypes", "float64", "--no-progress"]


def synthetic_loader(window):
    """Stand-in for approxlab.data.get_qkv (:func:`approxlab.studies.inputs.wikitext.load_qkv`): 2 heads, head
    dim 8, float32, token ids cycling through 7 values."""
    generator = torch.Generator().manual_seed(10_000 * window.n + 100 * window.window + (window.condition == "pretrained"))
    q, k, v = synthetic_qkv((2,), window.n, 8, generator=generator)
    return types.SimpleNamespace(q=q.float()[None], k=k.float()[None], v=v.float()[None],
                                 input_ids=(torch.arange(window.n) % 7)[None], checkpoint=f"synthetic-{window.condition}")


def failing_loader(*args, **kwargs):
    raise AssertionError("the data must not be touched")


@pytest.fixture
def synthetic_data(monkeypatch):
    wikitext.clear_caches()
    monkeypatch.setattr(wikitext, "load_qkv", synthetic_loader)
    yield
    wikitext.clear_caches()


def test_the_recorded_command_is_the_one_given_with_every_flag_and_reruns_the_run(tmp_path, synthetic_data):
    """config.json and timing.json record the command as given (every flag, lists written either way, in shell
    quoting); run again, that command resumes the same configuration (nothing is computed again)."""
    out = tmp_path / "fig 1"  # a space: the record must quote it
    given = ["figure1", "--threads", "1", "--n", "32", "48", "--num-features", "4,8", "--methods", ",".join(METHODS),
             "--windows", "1", "--seeds", "2", "--dtypes", "float64", "--out", str(out), "--no-progress"]
    assert main(given) == 0
    command = read_json(out / "config.json")["run"]["command"]
    assert command == shlex.join(["approxlab", *given])
    assert [run["command"] for run in read_json(out / "timing.json")["runs"]] == [command]
    saved, rows = read_json(out / "config.json")["config_hash"], len(read_results(out / "results.csv.bz2"))
    assert main(shlex.split(command)[1:]) == 0
    assert read_json(out / "config.json")["config_hash"] == saved and len(read_results(out / "results.csv.bz2")) == rows
    assert [run["command"] for run in read_json(out / "timing.json")["runs"]] == [command, command]


def test_tiny_grid_writes_tables_figure_and_summary(tmp_path, synthetic_data, monkeypatch):
    out = tmp_path / "fig1"
    assert main(["figure1", "--out", str(out), *TINY]) == 0
    for name in ("results.csv.bz2", "panel_stats.csv", "conditioning.csv", "windows.csv", "verdicts.csv",
                 "config.json", "figure1.png", "figure1.pdf", "summary.md"):
        assert (out / name).is_file(), name

    results = read_results(out / "results.csv.bz2")
    # 2 conditions x 2 n x 1 window x 2 d x (2 randomized methods x 2 seeds + nystromformer x 1 seed)
    assert len(results) == 2 * 2 * 1 * 2 * (2 * 2 + 1)
    assert not results.isna().any().any()
    assert (results["status"] == "ok").all()
    assert set(results.loc[results["method"] == "nystromformer", "seed"]) == {0}
    assert set(results["checkpoint"]) == {"synthetic-initialized", "synthetic-pretrained"}
    assert (results["error_min"] <= results["error_mean"]).all()
    assert (results["error_mean"] <= results["error_max"]).all()
    assert not results.duplicated(["condition", "n", "window", "method", "num_features", "seed"]).any()

    stats = read_results(out / "conditioning.csv")
    assert len(stats) == 2 * 2 * 2
    assert (stats["statistical_dimension_mean"] > 0).all()
    assert (stats["statistical_dimension_mean"] <= 2 * stats["n"]).all()
    assert (stats["core_condition_number_median"] >= 1).all()

    config = read_json(out / "config.json")
    assert config["config"]["methods"] == METHODS and config["config"]["n"] == [32, 48]
    assert "approxlab figure1" in config["run"]["command"]
    summary = (out / "summary.md").read_text()
    assert "synthetic-pretrained" in summary and "(a)" in summary and "(d)" in summary
    windows = read_results(out / "windows.csv")
    assert (windows["distinct_tokens"] == 7).all() and (windows["distinct_q_rows"] == windows["n"]).all()
    assert (windows["rank_a"] <= windows["n"]).all() and (windows["rank_a"] >= 1).all()
    panel = read_results(out / "panel_stats.csv")
    assert len(panel) == 2 * 2 * 3 * 2 and (panel["samples"] == panel["method"].map(
        {"skyformer-softmax": 4, "performer": 4, "nystromformer": 2})).all()
    assert ((panel["q25"] <= panel["median"]) & (panel["median"] <= panel["q75"]) & (panel["q75"] <= panel["max"])).all()
    verdicts = read_results(out / "verdicts.csv")
    assert list(verdicts.columns) == figure1.VERDICT_COLUMNS
    # One window: no interval, nothing to calibrate and no verdict.
    assert verdicts["ci_low"].isna().all() and verdicts["ci_high"].isna().all()
    assert set(verdicts["verdict"]) == {"inconclusive"} and (verdicts["windows"] == 1).all()
    assert set(verdicts["calibration"]) == {"no interval"} and set(verdicts["former_verdict"]) == {"inconclusive"}

    # --plot-only redraws from the CSVs alone (the data loader must not be called).
    monkeypatch.setattr(wikitext, "load_qkv", failing_loader)
    wikitext.clear_caches()
    for name in ("figure1.png", "figure1.pdf", "summary.md"):
        (out / name).unlink()
    assert main(["figure1", "--out", str(out), "--plot-only"]) == 0
    assert (out / "figure1.png").stat().st_size > 0 and (out / "figure1.pdf").stat().st_size > 0
    assert (out / "summary.md").read_text() == summary

    # Computing the same grid again resumes: nothing left to compute, nothing loaded.
    again = compute(figure1.STUDY, config["config"], out, progress=False)["results.csv.bz2"]
    pd.testing.assert_frame_equal(again, results)

    # A different grid in the same directory is refused with a clear message.
    assert main(["figure1", "--out", str(out), *TINY[:-3], "--seeds", "1", "--no-progress"]) == 2


def test_results_are_reproducible(tmp_path, synthetic_data):
    """Per-cell seeds: two runs (in different directories) give identical errors."""
    config = figure1.build_config(n=[32], num_features=[4], methods=["performer", "linformer"], windows=1,
                                  seeds=2, conditions=["pretrained"], stat_heads=1, dtypes=["float64"])
    a = compute(figure1.STUDY, config, tmp_path / "a", progress=False)["results.csv.bz2"]
    wikitext.clear_caches()
    b = compute(figure1.STUDY, config, tmp_path / "b", progress=False)["results.csv.bz2"]
    columns = [c for c in a.columns if c != "seconds"]
    pd.testing.assert_frame_equal(a[columns], b[columns])
    # different seeds give different draws
    performer = a[a["method"] == "performer"]
    assert performer["error_mean"].nunique() == 2


def test_plot_only_without_results_is_a_clear_error(tmp_path, capsys):
    assert main(["figure1", "--out", str(tmp_path / "none"), "--plot-only"]) == 2
    assert "run the study's compute step first" in capsys.readouterr().err


def test_grids_and_windows():
    full = figure1.build_config()
    assert full["n"] == [512, 1024, 2048, 4096] and full["num_features"] == [16, 32, 64, 128, 256]
    assert full["methods"][:4] == list(figure1.PAPER_METHODS) and len(full["methods"]) == 15
    assert full["windows"] >= 4 and full["seeds"] >= 3 and full["mode"] == "embedding" and full["layer"] == 0
    assert full["dtypes"] == ["float64", "float32"] and full["positions"] == "interpolate"
    quick = figure1.build_config(quick=True)
    assert quick["n"] == [256, 512] and quick["num_features"] == [16, 64, 128]  # every d below every n
    assert quick["windows"] == 1 and quick["seeds"] == 1
    ids = figure1.window_ids(full)
    assert ids == figure1.window_ids(figure1.build_config()) and len(set(ids)) == 4
    assert all(0 <= i < full["window_pool"] for i in ids)
    cells = figure1.STUDY.steps[0].cells(full, {"data_dir": None, "cache_dir": None, "device": "cpu"})
    assert len(cells) == 2 * 4 * 2 * 4 * 15
    assert {c["seeds"] == [0] for c in cells if c["method"] in ("nystromformer", "spectral-shifting")} == {True}
    with pytest.raises(UsageError, match="--methods: registered method names among"):
        figure1.build_config(methods=["nope"])
    with pytest.raises(UsageError, match="--conditions"):
        figure1.build_config(conditions=["finetuned"])
    with pytest.raises(UsageError, match="--windows: an integer >= 1, got 0"):
        figure1.build_config(windows=0)
    with pytest.raises(UsageError, match="--positions: one of"):
        figure1.build_config(positions="rope")
    with pytest.raises(UsageError, match="--dtypes: comma-separated precisions among"):
        figure1.build_config(dtypes=["float16"])


def _table(sky, others, ns=(512, 1024), windows=(0, 1, 2), spread=0.02):
    """Hand-made results: error(d) per method given as {n: (err at d=16, err at d=256)}, 3 windows
    whose errors at d=256 differ by a factor ``1 +- spread``."""
    rows = []
    for n in ns:
        for method, errors in [(figure1.PAPER_METHODS[0], sky), *others.items()]:
            for d, e in zip((16, 256), errors[n]):
                for i, w in enumerate(windows):
                    value = e * (1 + spread * (i - 1) * (d == 256))
                    rows.append({"condition": "pretrained", "n": n, "dtype": "float64", "window": w,
                                 "method": method, "num_features": d, "seed": 0, "checkpoint": "ckpt",
                                 "error_mean": value, "error_heads": f"{value!r} {value!r}",
                                 "relative_error_mean": value, "status": "ok"})
    return pd.DataFrame(rows)


def _verdicts(results):
    config = {**figure1.build_config(conditions=["pretrained"], n=[512, 1024], num_features=[16, 256]),
              "_command": "approxlab figure1 --test"}
    return config, figure1.verdicts(config, results)


def test_verdicts_follow_the_fixed_thresholds_with_intervals(monkeypatch):
    """The thresholds' rule alone, on the declared intervals: calibration (3 identical-but-for-scale windows are too
    few to calibrate; tested in test_figure1_stats.py and test_stats_calibration.py) set aside."""
    from approxlab.studies.figure1 import stats as figure1_stats

    monkeypatch.setattr(figure1_stats, "calibrated_verdicts", lambda *args, **kwargs: None)
    flat = {512: (1.0, 0.95), 1024: (1.0, 0.95)}
    baselines = figure1.PAPER_METHODS[1:]
    config, good = _verdicts(_table({512: (1.0, 0.4), 1024: (1.0, 0.2)}, {m: flat for m in baselines}))
    assert list(good.columns) == figure1.VERDICT_COLUMNS
    assert len(good) == 2 * (2 + 2 * 3 + 2 * 3 + 2 + 1) and set(good["verdict"]) == {"reproduced"}, good
    good = good[good["aggregation"] == "median"]
    assert ((good["ci_low"] <= good["estimate"]) & (good["estimate"] <= good["ci_high"])).all()
    ratios = good[good["claim"].isin(["a", "b"])]
    assert (ratios["ci_high"] > ratios["ci_low"]).all()  # windows differ: a real interval
    gap = good[(good["claim"] == "c") & (good["n"] == 1024)]["estimate"].iloc[0]
    assert gap == pytest.approx((0.95 - 0.2) / 0.95)
    _, bad = _verdicts(_table({512: (1.0, 0.99), 1024: (1.0, 0.99)},
                              {m: {512: (1.0, 0.1), 1024: (1.0, 0.1)} for m in baselines}))
    assert set(bad["verdict"]) == {"not reproduced"}, bad
    # Skyformer's ratio 0.5 +- 2 % across windows: the interval straddles the 0.5 bar.
    _, edge = _verdicts(_table({512: (1.0, 0.5), 1024: (1.0, 0.5)}, {m: flat for m in baselines}, spread=0.05))
    assert set(edge[edge["claim"] == "a"]["verdict"]) == {"inconclusive"}, edge
    text = figure1.summarize(config, _table({512: (1.0, 0.4), 1024: (1.0, 0.2)}, {m: flat for m in baselines}),
                             figure1.panel_statistics(_table({512: (1.0, 0.4), 1024: (1.0, 0.2)},
                                                             {m: flat for m in baselines})))
    assert "approxlab figure1 --test" in text and "| reproduced |" in text


def test_matrix_free_reference_equals_dense(tmp_path, synthetic_data):
    """Above ``--matrix-free-above`` the exact output is applied in row blocks; the
    errors are the same numbers, and the statistical dimension is the matrix-free estimate."""
    grid = ["--n", "32", "48", "--num-features", "4", "8", "--methods", "skyformer-softmax", "nystromformer",
            "--windows", "1", "--seeds", "1", "--no-progress", "--conditions", "initialized"]
    assert main(["figure1", "--out", str(tmp_path / "dense"), *grid]) == 0
    wikitext.clear_caches()
    assert main(["figure1", "--out", str(tmp_path / "free"), "--matrix-free-above", "40", *grid]) == 0
    dense = read_results(tmp_path / "dense" / "results.csv.bz2")
    free = read_results(tmp_path / "free" / "results.csv.bz2")
    columns = ["error_mean", "error_max", "relative_error_mean"]
    pd.testing.assert_frame_equal(free[columns], dense[columns], rtol=1e-10, atol=0)
    stats = read_results(tmp_path / "free" / "conditioning.csv").set_index("n")
    assert stats.loc[48, "stat_heads"].min() == 2 and stats.loc[32, "stat_heads"].min() == 2
    assert set(stats.loc[48, "statistical_dimension_method"]) == {"estimate"}
    assert set(stats.loc[32, "statistical_dimension_method"]) == {"eigvalsh"}
    assert stats["statistical_dimension_mean"].notna().all()



def test_every_method_visible_on_a_log_axis():
    """Log y axis; a median that is not finite is marked at the top edge."""
    import matplotlib.pyplot as plt

    curve = pd.DataFrame({"num_features": [4, 8, 16], "median": [1.0, float("inf"), 1e-3],
                          "q25": [0.5, 1.0, 5e-4], "q75": [2.0, float("inf"), 2e-3]})
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    method_curve(ax, curve, "performer")
    lines = ax.get_lines()
    assert list(lines[0].get_xdata()) == [4, 16]
    (marker,) = [line for line in lines if line.get_marker() == "^" and line.get_linestyle() == "None"]
    assert list(marker.get_xdata()) == [8] and not marker.get_clip_on()
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    both = pd.concat([curve.assign(dtype="float64", median=[1.0, 2.0, 3.0]), curve.assign(dtype="float32")])
    method_curve(ax, both, "performer")
    (hollow,) = [line for line in ax.get_lines() if line.get_marker() == "^" and line.get_linestyle() == "None"]
    assert list(hollow.get_xdata()) == [8] and hollow.get_markerfacecolor() == "none"  # float32's failure
    plt.close("all")


def test_window_rank_needs_a_dense_a_only_up_to_dense_max_n(synthetic_data):
    cell = {"condition": "initialized", "n": 48, "window": 0, "mode": "embedding", "layer": 0, "model_seed": 0,
            "data_dir": None, "cache_dir": None, "device": "cpu", "positions": "interpolate", "checkpoint": None,
            "base_seed": 0}
    dense = figure1.compute_window({**cell, "dense_max_n": 48})[0]
    assert dense["rank_a"] == 48 and dense["distinct_q_rows"] == 48
    above = figure1.compute_window({**cell, "dense_max_n": 32})[0]
    assert above["rank_a"] != above["rank_a"]  # NaN: no O(n^3) factorisation above --matrix-free-above
    assert above["distinct_q_rows"] == 48


def test_method_labels_shared_limits_and_one_legend():
    """The plotting path every study shares: the target in the legend when it is not softmax
    attention, the same y-limits per panel across figures, every method once in the legend."""
    import matplotlib.pyplot as plt

    from approxlab.plotting import figure_legend, method_label, share_ylimits

    assert method_label("yoso") == "YOSO (target: YOSO-E)"
    assert method_label("skyformer") == "Skyformer (kernelized) (target: kernelized attention CV)"
    assert method_label("performer") == "Performer" and method_label("not-registered") == "not-registered"
    curve = pd.DataFrame({"num_features": [4, 8, 4, 8], "dtype": ["float64", "float64", "float32", "float32"],
                          "median": [1.0, 0.5, 1.1, 0.4], "q25": [0.8, 0.4, 0.9, 0.3], "q75": [1.2, 0.6, 1.3, 0.5]})
    main_fig, main_axes = plt.subplots(1, 2, squeeze=False)
    extra_fig, extra_axes = plt.subplots(1, 2, squeeze=False)
    for ax, scale in zip(main_axes[0], (1.0, 1e3)):
        method_curve(ax, curve.assign(median=curve["median"] * scale), "performer")
    for ax in extra_axes[0]:
        method_curve(ax, curve.assign(median=curve["median"] * 1e-2), "yoso", secondary=True)
    solid, dotted = main_axes[0][0].get_lines()
    assert solid.get_linestyle() == "-" and dotted.get_linestyle() == ":" and solid.get_label() == "Performer"
    share_ylimits(main_axes, extra_axes)
    for j in range(2):
        assert main_axes[0][j].get_ylim() == extra_axes[0][j].get_ylim()
    low, high = main_axes[0][1].get_ylim()
    assert low <= 0.004 and high >= 1100  # both figures' data stay in view
    legend = figure_legend(main_fig, main_axes)
    assert [t.get_text() for t in legend.get_texts()] == ["Performer"]
    with pytest.raises(ValueError, match="`axes_grids` must have one shape"):
        share_ylimits(main_axes, extra_axes[:, :1])
    plt.close(main_fig)
    plt.close(extra_fig)


def test_a_plugin_method_is_computed_summarised_and_drawn(tmp_path, synthetic_data, top_k_plugin):
    """Issue 'Done means' (in-process): `--plugin MODULE --methods top-k,skyformer-softmax` computes the
    user's method, names it in summary.md and draws it in the companion figure."""
    out = tmp_path / "fig1"
    assert main(["figure1", "--out", str(out), "--plugin", top_k_plugin, "--methods", "top-k,skyformer-softmax",
                 *TINY[:4], *TINY[6:]]) == 0
    results = read_results(out / "results.csv.bz2")
    top_k = results[results["method"] == "top-k"]
    assert len(top_k) == 2 * 2 * 2 and (top_k["status"] == "ok").all() and set(top_k["seed"]) == {0}
    summary = (out / "summary.md").read_text()
    assert "`figure1-extra.png`: top-k" in summary and "| top-k |" in summary
    assert (out / "figure1-extra.png").stat().st_size > 0 and (out / "figure1.png").stat().st_size > 0
    assert figure1.figure_groups({"methods": ["top-k", "skyformer-softmax"]}, {"top-k", "skyformer-softmax"}) == {
        "figure1": ["skyformer-softmax"], "figure1-extra": ["top-k"]}


def test_every_method_with_a_bidirectional_form_is_in_the_default_grid_and_drawn_in_its_own_style(tmp_path,
                                                                                                synthetic_data):
    """Today's methods with a bidirectional form are in the default grid (the causal-only KV-cache policies are
    not: this study is of bidirectional attention); each is computed, summarised and drawn in the companion
    figure with a house style of its own (no two built-ins share colour and marker, no plugin's fallback colour
    is a built-in's)."""
    import matplotlib.pyplot as plt

    from approxlab import method_styles, plotting
    from approxlab.methods import available, get

    today = ["hyperattention", "kdeformer", "polynomial", "topk", "topp", "quest"]
    full = figure1.build_config()["methods"]
    assert set(today) <= set(full) and not {m for m in full if get(m).causal == "only"}
    causal_only = {m for m in available() if get(m).causal == "only"}
    scored = {m for m in available() if get(m).score is not None}  # the cache policies
    assert {"streaming-llm", "h2o", "snapkv", "knorm", "expected-attention", "cap"} <= scored <= causal_only
    assert causal_only - scored == {"minference", "xattention", "flexprefill", "duo-attention"}  # sparse prefill: no cache scores
    styles = [(plotting.METHOD_STYLES[m]["color"], plotting.METHOD_STYLES[m]["marker"]) for m in available()]
    assert len(set(styles)) == len(styles)
    assert not set(method_styles.FALLBACK_COLORS) & {color for color, _ in styles}
    config = figure1.build_config(n=[32], num_features=[8, 16], methods=["performer", *today], windows=1, seeds=1,
                                  dtypes=["float64"], conditions=["pretrained"], stat_heads=1)
    results = compute(figure1.STUDY, config, tmp_path / "fig1", progress=False)["results.csv.bz2"]
    assert set(results["method"]) == {"performer", *today} and (results["status"] == "ok").all()
    assert figure1.figure_groups(config, set(results["method"])) == {"figure1": ["performer"], "figure1-extra": today}
    fig, axes = figure1.figures._draw(config, figure1.panel_statistics(results), today, "the other methods")
    legend = plotting.figure_legend(fig, axes)
    assert [t.get_text() for t in legend.get_texts()] == [plotting.method_label(m) for m in today]
    plt.close(fig)


def test_polynomial_is_refused_where_its_features_do_not_fit():
    """``polynomial``'s degree grows with d, its features as C(p + g, g): a grid whose d needs more than its
    2^27 feature entries at some n is refused before any cell runs, naming the largest d that fits."""
    minilm = types.SimpleNamespace(num_heads=12, head_dim=32)
    fits = figure1.build_config(n=[512, 4096], num_features=[16, 6544], methods=["polynomial"])
    figure1.grid.check_polynomial_features(fits, {"pretrained": minilm})  # degree 2 at n = 4096: 55M entries
    too_many = figure1.build_config(n=[512, 4096], num_features=[16, 6545], methods=["polynomial"])
    with pytest.raises(UsageError, match=r"--num-features: at most 6544 for polynomial at n=4096 \(the pretrained "
                                         r"model has 12 heads of width 32: degree 3 needs 6545 features.*got 6545"):
        figure1.grid.check_polynomial_features(too_many, {"pretrained": minilm})
    default = figure1.build_config()
    bert_base = types.SimpleNamespace(num_heads=12, head_dim=64)
    figure1.grid.check_polynomial_features(default, {"initialized": bert_base, "pretrained": minilm})


def test_panel_reuses_the_core_condition_of_its_window_cell(synthetic_data, monkeypatch):
    """The panel's core condition number, read from the seed-0 Skyformer run of its window's
    approximation cell, equals the one the panel computes itself; without that run it is computed."""
    from approxlab.studies.figure1 import cells

    config = figure1.build_config(n=[48], num_features=[4, 8], methods=["skyformer-softmax"], windows=1, seeds=2,
                                  dtypes=["float64"], conditions=["initialized"])
    settings = {"data_dir": None, "cache_dir": None, "device": "cpu", "dense_max_n": 4096}
    (panel,) = figure1.panel_cells(config, settings)
    monkeypatch.setattr(cells, "_CORE_CONDITIONS", type(cells._CORE_CONDITIONS)())
    computed = figure1.compute_panel(panel)
    for cell in figure1.approximation_cells(config, settings):
        figure1.compute_cell(cell)
    assert len(cells._CORE_CONDITIONS) == 2  # d = 4, 8 at seed 0
    calls = []
    monkeypatch.setattr(cells, "approximate", lambda *a, **k: calls.append(a))
    reused = figure1.compute_panel(panel)
    assert not calls  # read, not recomputed
    assert reused == computed and "core_condition_number_median" in reused[0]
