"""Smoke tests of ``approxlab bench`` (tiny n; the benchmark itself is not a test).

The block Lanczos estimator it times is tested in ``tests/test_lanczos.py``."""

from __future__ import annotations

import pandas as pd

from approxlab.cli import main


def test_bench_cli_smoke(tmp_path, capsys):
    """``approxlab bench`` end to end at tiny n: tidy NaN-free table, figure, summary, --plot-only."""
    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--source", "synthetic", "--out", str(out), "--no-progress",
            "--accuracy-n", "96", "--scale-n", "128", "--forward-n", "96",
            "--forward-methods", "nystromformer", "--num-features", "16"]
    assert main(argv) == 0
    results = pd.read_csv(out / "results.csv")
    assert not results.isna().any().any()
    assert set(results["part"]) == {"accuracy", "scale", "forward"}
    wide = results.pivot_table(index=["part", "n", "algorithm"], columns="quantity", values="value").reset_index()
    accuracy = wide[wide["part"] == "accuracy"].set_index("algorithm")
    assert set(accuracy.index) == {"dense", "golub-kahan", "block-lanczos", "scipy"}
    assert accuracy.loc["block-lanczos", "relative_disagreement"] <= 1e-4
    assert accuracy.loc["golub-kahan", "relative_disagreement"] <= 1e-4
    assert (wide["peak_rss_mb"] >= wide["rss_before_mb"]).all()
    assert {"exact-blocked", "exact-dense", "approximation"} <= set(wide[wide["part"] == "forward"]["algorithm"])
    for name in ("bench.png", "bench.pdf", "summary.md", "config.json"):
        assert (out / name).is_file()
    summary = (out / "summary.md").read_text()
    assert "block-lanczos" in summary and "approxlab bench --quick" in summary
    before = (out / "results.csv").read_bytes()
    assert main(["bench", "--out", str(out), "--plot-only", "--no-progress"]) == 0
    assert (out / "results.csv").read_bytes() == before
    capsys.readouterr()


def test_bench_cli_refuses_dask(tmp_path, capsys):
    """The ratios are only fair in one process: --workers is refused with exit status 2."""
    assert main(["bench", "--quick", "--source", "synthetic", "--out", str(tmp_path), "--workers", "2"]) == 2
    assert "one process" in capsys.readouterr().err


def test_bench_plot_only_without_results(tmp_path, capsys):
    assert main(["bench", "--out", str(tmp_path / "none"), "--plot-only"]) == 2
    assert "run the study's compute step first" in capsys.readouterr().err
