"""Smoke tests of ``approxlab bench`` and of its fast path (tiny n; the benchmark itself is not a test)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from approxlab import approximate
from approxlab.cli import main
from approxlab.kernels import softmax_matrix
from approxlab.linalg import fused_normal_pass, normal_block_lanczos
from approxlab.synthetic import synthetic_qkv


def _problem(n, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = synthetic_qkv((1,), n, 16, scale=scale, generator=g, dtype=torch.float64)
    approx = approximate("nystromformer", q, k, v, num_features=8)
    return q, k, approx.operator()


def _dense_error(q, k, op):
    return float(torch.linalg.matrix_norm(op.to_dense() - softmax_matrix(q, k), ord=2).max())


def test_fused_normal_pass_matches_dense():
    """One fused pass returns ``M x`` and ``M^T M x`` for ``M = S~ - S`` (float64, rounding-level)."""
    q, k, op = _problem(96, 0, scale=2.0)
    x = torch.randn(1, 96, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    m = op.to_dense() - softmax_matrix(q, k)
    normal, residual = fused_normal_pass(q, k, op, x, row_block=10, compute_dtype=torch.float64)
    torch.testing.assert_close(residual, m @ x, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(normal, m.transpose(-1, -2) @ (m @ x), rtol=1e-10, atol=1e-12)


def test_fused_normal_pass_is_overflow_safe_in_float32():
    """Logits of size ~ +-80 in float32 give finite products (max-subtracted softmax per row block)."""
    q, k, _ = _problem(64, 2)
    q = (q * 9.0).float()
    k = (k * 9.0).float()
    assert float((q @ k.transpose(-1, -2)).abs().max()) / 4.0 > 80.0
    op = approximate("nystromformer", q, k, k, num_features=8).operator()
    x = torch.randn(1, 64, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    normal, residual = fused_normal_pass(q, k, op, x)
    assert bool(torch.isfinite(normal).all()) and bool(torch.isfinite(residual).all())


@pytest.mark.parametrize("block", [1, 3])
def test_block_lanczos_agrees_with_dense_svd(block):
    """Over 6 seeds the estimate matches the dense SVD to 1e-7 relative, never exceeds it beyond
    rounding (Ritz values are lower bounds), and lies within its certified distance bound
    (Parlett Theorem 4.5.1 on M^T M). Deterministic given the seeds; a failure is a bug."""
    for seed in range(6):
        q, k, op = _problem(96, seed, scale=1.5)
        reference = _dense_error(q, k, op)
        result = normal_block_lanczos(q, k, op, block=block, tol=1e-9,
                                      generator=torch.Generator().manual_seed(seed), compute_dtype=torch.float64)
        estimate = float(result.estimate)
        assert bool(result.converged.all())
        assert abs(estimate - reference) <= 1e-7 * reference, (seed, estimate, reference)
        assert estimate <= reference * (1 + 1e-12)
        assert abs(estimate - reference) <= float(result.distance_bound) + 1e-12 * reference
        assert result.num_matvecs == 2 * block * result.num_passes


def test_block_lanczos_float32_logits_agree_to_1e5():
    """float32 logits/softmax (the benchmark's default) stay within 1e-5 relative of float64 dense."""
    q, k, op = _problem(128, 3, scale=1.5)
    reference = _dense_error(q, k, op)
    result = normal_block_lanczos(q.float(), k.float(), op, tol=1e-8, generator=torch.Generator().manual_seed(0))
    assert abs(float(result.estimate) - reference) <= 1e-5 * reference


def test_block_lanczos_is_reproducible_and_batched():
    """The same generator gives the same result; a batch of heads equals the heads one at a time."""
    g = torch.Generator().manual_seed(5)
    q, k, v = synthetic_qkv((3,), 64, 8, generator=g, dtype=torch.float64)
    op = approximate("nystromformer", q, k, v, num_features=4).operator()
    first = normal_block_lanczos(q, k, op, tol=1e-10, generator=torch.Generator().manual_seed(0),
                                 compute_dtype=torch.float64)
    second = normal_block_lanczos(q, k, op, tol=1e-10, generator=torch.Generator().manual_seed(0),
                                  compute_dtype=torch.float64)
    torch.testing.assert_close(first.estimate, second.estimate, rtol=0, atol=0)
    dense = torch.linalg.matrix_norm(op.to_dense() - softmax_matrix(q, k), ord=2)
    torch.testing.assert_close(first.estimate, dense, rtol=1e-8, atol=0)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"block": 0}, ValueError, "`block` must be an integer with 1 <= block"),
        ({"tol": -1.0}, ValueError, "`tol` must be a finite number > 0"),
        ({"max_iter": 1.5}, TypeError, "`max_iter` must be an integer"),
        ({"failure_probability": 2.0}, ValueError, "`failure_probability` must be in"),
    ],
)
def test_block_lanczos_validation(kwargs, error, match):
    q, k, op = _problem(32, 0)
    with pytest.raises(error, match=match):
        normal_block_lanczos(q, k, op, **kwargs)


def test_block_lanczos_rejects_mismatched_operator():
    q, k, _ = _problem(32, 0)
    _, _, other = _problem(48, 0)
    with pytest.raises(ValueError, match=r"`approx_op` must have shape \(\*batch, 32, 32\)"):
        normal_block_lanczos(q, k, other)


def test_bench_cli_smoke(tmp_path, capsys):
    """``approxlab bench`` end to end at tiny n: tidy NaN-free table, figure, summary, --plot-only."""
    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--source", "synthetic", "--out", str(out), "--no-progress",
            "--accuracy-n", "96", "--scale-n", "128", "--forward-n", "96",
            "--forward-methods", "nystromformer", "--num-features", "16"]
    assert main(argv) == 0
    results = pd.read_csv(out / "results.csv")
    assert not results.isna().any().any()
    assert set(results["part"]) == {"accuracy", "scale", "forward", "ratios"}
    wide = results.pivot_table(index=["part", "n", "algorithm"], columns="quantity", values="value").reset_index()
    accuracy = wide[wide["part"] == "accuracy"].set_index("algorithm")
    assert set(accuracy.index) == {"dense", "golub-kahan", "block-lanczos", "scipy"}
    assert accuracy.loc["block-lanczos", "relative_disagreement"] <= 1e-4
    assert accuracy.loc["golub-kahan", "relative_disagreement"] <= 1e-4
    assert (wide["peak_rss_mb"] >= wide["rss_before_mb"]).all()
    assert {"exact-blocked", "exact-sdpa", "torch-sdpa", "approximation"} <= set(wide[wide["part"] == "forward"]["algorithm"])
    forward = wide[wide["part"] == "forward"]
    assert (forward["repeats"] >= 5).all() and (forward["warmup"] == 1).all()
    assert (forward["wall_min_s"] <= forward["wall_s"]).all() and (forward["wall_s"] <= forward["wall_max_s"]).all()
    ratios = wide[wide["part"] == "ratios"].set_index("algorithm")
    assert {"operator-matmat", "operator-rmatmat", "spectral-error-sdpa-lanczos"} <= set(ratios.index)
    assert (ratios["ratio_vs_sdpa"].dropna() > 0).all()
    for name in ("bench.png", "bench.pdf", "summary.md", "config.json"):
        assert (out / name).is_file()
    summary = (out / "summary.md").read_text()
    assert "block-lanczos" in summary and "approxlab bench --quick" in summary
    assert "## Ratios of the issue" in summary and "ExactAttentionOperator.rmatmat / SDPA forward" in summary
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
