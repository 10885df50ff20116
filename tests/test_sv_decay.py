"""Rank / decay / conditioning measures of the singular-value decay study (Skyformer App. B)."""

import math
import types

import numpy as np
import pandas as pd
import pytest
import torch

from approxlab import metrics
from approxlab.errors import UsageError
from approxlab.studies import compute, report, sv_decay
from approxlab.studies.inputs import wikitext
from approxlab.studies.sv_decay import figures as sv_decay_figure
from approxlab.synthetic import matrix_with_singular_values, synthetic_qkv


def _g(seed):
    return torch.Generator().manual_seed(seed)


def test_geometric_spectrum_by_hand():
    """sigma_i = r^i: the decay rate is ln r exactly, ranks and d_stat follow by hand."""
    r, n = 0.5, 40
    sigma = r ** torch.arange(n, dtype=torch.float64)
    out = sv_decay.spectrum_measures(sigma.unsqueeze(0), (n, n), num=16)
    assert out["decay_rate"].item() == pytest.approx(math.log(r), rel=1e-12)
    # r^i > 1e-6  <=>  i < 6 / log10(2) = 19.93  ->  20 values
    assert out["numerical_rank"].item() == 20
    assert out["stable_rank"].item() == pytest.approx(float((sigma**2).sum()), rel=1e-12)
    p = sigma / sigma.sum()
    assert out["effective_rank"].item() == pytest.approx(math.exp(float(-(p * p.log()).sum())), rel=1e-12)
    assert out["statistical_dimension_0.1"].item() == pytest.approx(float((sigma / (sigma + 0.1)).sum()), rel=1e-12)
    # sigma_min = 2^-39 ~ 1.8e-12 > 40 * eps64 ~ 8.9e-15: finite, equal to 2^39
    assert out["condition_number"].item() == pytest.approx(2.0**39, rel=1e-12)


def test_equal_singular_values():
    """r equal singular values: every rank measure is r, the decay rate 0, kappa 1."""
    out = sv_decay.spectrum_measures(torch.full((1, 7), 3.0, dtype=torch.float64), (7, 7))
    for key in ("numerical_rank", "stable_rank", "effective_rank"):
        assert out[key].item() == pytest.approx(7.0)
    assert out["decay_rate"].item() == pytest.approx(0.0, abs=1e-14)
    assert out["condition_number"].item() == pytest.approx(1.0)


def test_singular_reported_as_inf_not_noise():
    """A rank-deficient matrix gets kappa = inf, never a rounding-noise number like 1e+81."""
    sigma = torch.tensor([[1.0, 1e-3, 1e-20]], dtype=torch.float64)
    assert math.isinf(sv_decay.spectrum_measures(sigma, (3, 3))["condition_number"].item())
    m = matrix_with_singular_values(torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64), generator=_g(0))
    sig = torch.linalg.svdvals(m).unsqueeze(0)
    assert math.isinf(sv_decay.spectrum_measures(sig, (3, 3))["condition_number"].item())


@pytest.mark.parametrize("seed", range(20))
def test_measures_match_approxlab_metrics(seed):
    """On matrices with a prescribed spectrum (approxlab.synthetic), the one-SVD measures equal
    approxlab.metrics' numerical_rank, stable_rank, effective_rank, singular_value_decay_rate,
    condition_number and leverage.statistical_dimension (PSD case)."""
    gen = _g(seed)
    n = 24
    decay = 0.3 + 0.6 * torch.rand(1, generator=gen, dtype=torch.float64)
    spectrum = decay ** torch.arange(n, dtype=torch.float64)
    m = matrix_with_singular_values(spectrum, generator=gen)
    sigma = torch.linalg.svdvals(m).unsqueeze(0)
    out = sv_decay.spectrum_measures(sigma, (n, n), num=16)
    assert out["numerical_rank"].item() == metrics.numerical_rank(m, 1e-6)
    assert out["stable_rank"].item() == pytest.approx(metrics.stable_rank(m), rel=1e-9)
    assert out["effective_rank"].item() == pytest.approx(metrics.effective_rank(m), rel=1e-9)
    assert out["decay_rate"].item() == pytest.approx(metrics.singular_value_decay_rate(m, num=16), rel=1e-6)
    kappa = metrics.condition_number(m)
    assert (math.isinf(kappa) and math.isinf(out["condition_number"].item())) or \
        out["condition_number"].item() == pytest.approx(kappa, rel=1e-6)
    from approxlab.synthetic import psd_matrix

    k = psd_matrix(spectrum, generator=gen)
    eig = torch.linalg.eigvalsh(k).flip(-1).clamp_min(0).unsqueeze(0)
    lam = 0.1 * float(eig[0, 0])
    expected = float(metrics.statistical_dimension(k, lam))
    assert sv_decay.spectrum_measures(eig, (n, n))["statistical_dimension_0.1"].item() == pytest.approx(expected, rel=1e-6)


def test_attention_spectra_properties():
    """D^-1 A is row-stochastic, so ||D^-1 A||_2 >= 1; the completion is PSD (eigenvalues >= 0,
    descending); A rescaled by its max keeps sigma_i/sigma_1; approximations have rank <= d-ish."""
    q, k, v = synthetic_qkv((2,), 48, 8, generator=_g(0))
    spectra = sv_decay.attention_spectra(q, k, v, approximations=("nystromformer",), num_features=8)
    assert set(spectra) == {"scores", "softmax", "kernelized", "completion", "output", "nystromformer"}
    assert bool((spectra["softmax"][0][:, 0] >= 1 - 1e-12).all())
    eig = spectra["completion"][0]
    assert eig.shape == (2, 96) and bool((eig >= 0).all()) and bool((eig[:, :-1] >= eig[:, 1:]).all())
    a = torch.exp(q @ k.transpose(-1, -2) / math.sqrt(8))
    ref = torch.linalg.svdvals(a)
    torch.testing.assert_close(spectra["scores"][0] / spectra["scores"][0][:, :1], ref / ref[:, :1])
    ranks = sv_decay.spectrum_measures(spectra["nystromformer"][0], (48, 48))["numerical_rank"]
    assert bool((ranks <= 8).all())


def test_layer_index():
    assert [sv_decay.layer_index(x, 12) for x in ("first", "middle", "last")] == [0, 6, 11]
    assert [sv_decay.layer_index(x, 6) for x in ("first", "middle", "last")] == [0, 3, 5]
    with pytest.raises(ValueError, match="`layer` must be one of"):
        sv_decay.layer_index("second", 6)


def test_study_end_to_end_tiny(tmp_path, monkeypatch):
    """A tiny grid on synthetic Q/K/V writes results.csv, spectra.csv, config.json, the figure
    and summary.md; the summary states the condition-number comparison with numbers."""

    def fake_qkv(window):
        q, k, v = synthetic_qkv((3,), window.n, 8, scale=1.5 if window.condition == "pretrained" else 0.5,
                                generator=_g(window.window + window.n))
        return types.SimpleNamespace(q=q[None], k=k[None], v=v[None], checkpoint=f"synthetic-{window.condition}")

    wikitext.clear_caches()
    monkeypatch.setattr(wikitext, "load_qkv", fake_qkv)
    config = sv_decay.build_config(quick=True, n=[32, 64], heads=2, num_features=8,
                                   approximations=["nystromformer", "spectral-shifting"])
    assert config["modes"] == {"32": "hidden", "64": "hidden"}
    tables = compute(sv_decay.STUDY, config, tmp_path, progress=False)
    wikitext.clear_caches()
    results, spectra = tables["results.csv"], tables["spectra.csv.gz"]
    assert len(results) == 2 * 2 * 2 * 7  # conditions x n x heads x matrices
    assert np.isfinite(results["stable_rank"]).all()
    assert set(spectra["matrix"]) == set(results["matrix"])
    paths = report(sv_decay.STUDY, tmp_path)
    assert {p.name for p in paths} == {"sv_decay.png", "sv_decay.pdf", "summary.md"}
    summary = (tmp_path / "summary.md").read_text()
    assert "kappa_2" in summary and "Verdict" in summary and "numerical rank" in summary.lower()
    saved = pd.read_csv(tmp_path / "results.csv")
    assert set(saved["checkpoint"]) == {"synthetic-initialized", "synthetic-pretrained"}
    with pytest.raises(UsageError, match="--layers"):
        sv_decay.build_config(layers=["second"])


def _raises(q, k, v, *, num_features, generator=None):
    raise RuntimeError("the plugin's own bug")


def test_a_method_that_raises_gets_failed_rows_and_the_report_is_written(tmp_path, monkeypatch, fresh_registry):
    """A registered method raising RuntimeError ended the sv-decay run with a traceback: its rows now hold the
    error as their status (inf measures, no spectrum), every other matrix is computed and the report written."""
    from approxlab.methods import register

    def fake_qkv(window):
        q, k, v = synthetic_qkv((3,), window.n, 8, generator=_g(window.window + window.n))
        return types.SimpleNamespace(q=q[None], k=k[None], v=v[None], checkpoint="synthetic")

    register("raises", _raises, target="softmax", features="ignored", randomized=False)
    wikitext.clear_caches()
    monkeypatch.setattr(wikitext, "load_qkv", fake_qkv)
    config = sv_decay.build_config(quick=True, n=[32], heads=2, num_features=8, conditions=["pretrained"],
                                   approximations=["raises", "nystromformer"])
    tables = compute(sv_decay.STUDY, config, tmp_path, progress=False)
    wikitext.clear_caches()
    results, spectra = tables["results.csv"], tables["spectra.csv.gz"]
    failed = results[results["matrix"] == "raises"]
    assert len(failed) == 2 and (failed["status"] == "RuntimeError: the plugin's own bug").all()
    assert not results.isna().any().any() and (failed["stable_rank"] == math.inf).all()
    assert (results.loc[results["matrix"] != "raises", "status"] == "ok").all()
    assert "raises" not in set(spectra["matrix"]) and "nystromformer" in set(spectra["matrix"])
    report(sv_decay.STUDY, tmp_path)
    assert (tmp_path / "summary.md").is_file()


def test_nothing_drawn_below_the_noise_floor():
    """Ratios below 2 n eps64 are rounding noise and are not drawn."""
    import matplotlib.pyplot as plt

    n = 64
    floor = sv_decay.noise_floor(n)
    assert floor == 2 * n * torch.finfo(torch.float64).eps
    logs = np.linspace(0, -20, 40)
    curve = pd.DataFrame({"index": np.arange(40), "log10_mean": logs, "log10_min": logs - 1, "log10_max": logs + 1})
    fig, ax = plt.subplots()
    sv_decay_figure._draw_curve(ax, curve, {"color": "k"}, np.log10(floor))
    (line,) = ax.get_lines()
    assert line.get_ydata().min() >= floor and len(line.get_ydata()) < 40
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() >= floor * (1 - 1e-12)
    plt.close(fig)


def test_the_conditioning_verdict_rests_on_an_interval_over_windows_within_cases():
    """The former summary's verdict had no interval, unit or test: now the median log10 kappa ratio (kernelized
    over softmax, same head and window) with a stratified bootstrap over windows within each case, and no verdict
    with too few windows."""
    from approxlab.studies.sv_decay import claims as sv_claims

    rng = np.random.default_rng(0)

    def run(windows):
        return pd.DataFrame([{"condition": "initialized", "layer": layer, "n": 512, "window": w, "head": h,
                              "matrix": matrix, "condition_number": 1e6 * (10.0 if matrix == "kernelized" else 1.0)
                              * rng.uniform(0.5, 2.0)}
                             for layer in ("first", "last") for w in range(windows) for h in range(4)
                             for matrix in ("softmax", "kernelized")])
    many = sv_claims.conditioning(run(25)).iloc[0]
    assert many["ci_low"] > 0 and many["windows"] == 50 and many["cases"] == 2 and many["heads"] == 200
    assert many["coverage"] >= 0.9 and many["verdict"] == "kernelized worse conditioned"
    assert many["coverage_high"] - many["coverage_low"] <= 0.04  # the coverage known to +-2 points
    assert many["ci_low"] <= many["nominal_low"] and many["ci_high"] >= many["nominal_high"]


def test_a_conditioning_claim_below_90_percent_coverage_is_withheld_only_for_its_calibration():
    """2 windows per case, 2 cases: the declared interval covers less than 90% of the draws, and the former rule
    withheld the verdict for that estimate; now it is withheld because a quarter of the draws repeat one window in
    every case (an interval of zero width, never judged by its coverage), the reason stated, and the summary lists
    the change."""
    from approxlab.studies.sv_decay import claims as sv_claims
    from approxlab.studies.sv_decay import summary as sv_summary

    rng = np.random.default_rng(1)
    results = pd.DataFrame([{"condition": "initialized", "layer": layer, "n": 512, "window": w, "head": h,
                             "matrix": matrix, "condition_number": 1e6 * (10.0 if matrix == "kernelized" else 1.0)
                             * rng.uniform(0.5, 2.0) * (1 + 3 * w)}
                            for layer in ("first", "last") for w in range(2) for h in range(4)
                            for matrix in ("softmax", "kernelized")])
    row = sv_claims.conditioning(results).iloc[0]
    assert row["gated_verdict"].startswith("no verdict: coverage") and row["coverage"] < 0.9
    assert row["verdict"].startswith("no verdict: ") and "give no interval" in row["verdict"]
    assert "coverage" not in row["verdict"] and row["coverage_high"] - row["coverage_low"] <= 0.04
    text = "\n".join(sv_summary._conditioning_lines(sv_summary._conditioning_table(results)))
    assert "### Changes of verdict" in text and row["gated_verdict"] in text and row["verdict"] in text
