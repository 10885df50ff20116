"""Instability score (Skyformer Appendix F / Table 3), the tiny encoder and the study."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from approxlab.studies.instability import stats as instability_stats
from approxlab import tasks
from approxlab.training import TinyEncoder, instability_ratio, instability_score, instability_trace
from approxlab.errors import StudyError
from approxlab.studies import compute, report
from approxlab.studies import instability as study
from approxlab.studies.instability import report as instability_report
from approxlab.tasks.mlm import mask_tokens


class LinearModel(torch.nn.Module):
    """f(x, W) = c * x W with a loss linear in f: <f, G>. Follows the trainer's protocol."""

    def __init__(self, w0, scale=1.0):
        super().__init__()
        self.w = torch.nn.Parameter(w0.clone())
        self.scale = scale

    def embedding_parameters(self):
        return [self.w]

    def forward(self, batch, *, seed=0):
        x, g = batch
        f = self.scale * x @ self.w
        return f, (f * g).sum()


def _linear_problem(seed, steps=6, b=5, p=4, q=3):
    gen = torch.Generator().manual_seed(seed)
    w0 = torch.randn(p, q, generator=gen, dtype=torch.float64)
    batches = [(torch.randn(b, p, generator=gen, dtype=torch.float64),
                torch.randn(b, q, generator=gen, dtype=torch.float64)) for _ in range(steps)]
    return w0, batches


@pytest.mark.parametrize("seed", range(20))
def test_linear_model_tau_by_hand(seed):
    """Skyformer App. F definition on f(x, W) = xW: tau_i = ||x_i dW_i||^2 / ||dW_i||^2, with dW_i
    the Adam update replayed by hand (gradient x_i^T G_i of the loss <x_i W, G_i>)."""
    w0, batches = _linear_problem(seed)
    lr = 1e-3
    trace = instability_trace(LinearModel(w0), batches, lr=lr)
    m = torch.zeros_like(w0)
    v = torch.zeros_like(w0)
    b1, b2, eps = 0.9, 0.999, 1e-8
    for i, (x, g) in enumerate(batches, start=1):
        grad = x.T @ g
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad**2
        dw = -lr * (m / (1 - b1**i)) / ((v / (1 - b2**i)).sqrt() + eps)
        expected = float((x @ dw).square().sum() / dw.square().sum())
        assert trace["tau"][i - 1].item() == pytest.approx(expected, rel=1e-9)
        assert trace["parameter_change"][i - 1].item() == pytest.approx(float(dw.square().sum()), rel=1e-9)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_known_ratio_of_scaled_linear_model(seed, scale):
    """f = c xW vs f = xW from the same W_0 and batches: Adam's update is invariant to the
    gradient scale c (up to eps), so dW is the same and every tau ratio is c^2."""
    w0, batches = _linear_problem(seed)
    ref = instability_trace(LinearModel(w0), batches, lr=1e-4)
    scaled = instability_trace(LinearModel(w0, scale), batches, lr=1e-4)
    assert instability_ratio(scaled["tau"], ref["tau"]) == pytest.approx(scale**2, rel=1e-6)


def test_instability_score_validation():
    a = torch.ones(2, 3)
    w = [torch.ones(2)]
    assert instability_score(a * 3, a, [w[0] * 2], w) == pytest.approx(6 * 4 / 2)
    with pytest.raises(ValueError, match="0/0"):
        instability_score(a, a, w, w)
    with pytest.raises(ValueError, match="same shape"):
        instability_score(a, torch.ones(3, 2), w, w)
    with pytest.raises(ValueError, match="matching lists"):
        instability_score(a, a, w, [torch.ones(3)])
    with pytest.raises(ValueError, match="positive and finite"):
        instability_ratio(torch.ones(2), torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="lr"):
        instability_trace(LinearModel(torch.ones(2, 2)), [], lr=0.0)


def test_encoder_same_initial_weights_and_no_global_rng():
    """Shared parameters start equal for every attention; global RNG state is untouched."""
    state = torch.random.get_rng_state()
    models = [TinyEncoder(vocab_size=16, n=32, attention=a, num_classes=10, generator=torch.Generator().manual_seed(7))
              for a in ("softmax", "kernelized", "yoso")]
    assert torch.equal(state, torch.random.get_rng_state())
    ref = models[0].state_dict()
    for model in models[1:]:
        assert all(torch.equal(ref[k], t) for k, t in model.state_dict().items())
    with pytest.raises(ValueError, match="`attention` must be one of"):
        TinyEncoder(vocab_size=16, n=32, attention="bogus", num_classes=10)
    with pytest.raises(ValueError, match="divisible"):
        TinyEncoder(vocab_size=16, n=32, num_classes=10, embedding_dim=10, num_heads=3)


def test_encoder_trace_reproducible_and_finite():
    task = tasks.make_task("listops", n=32, batch_size=2, num_batches=3, generator=torch.Generator().manual_seed(0))
    traces = []
    for _ in range(2):
        model = TinyEncoder(vocab_size=task.vocab_size, n=32, attention="kernelized", num_classes=10,
                            num_features=8, generator=torch.Generator().manual_seed(1))
        traces.append(instability_trace(model, task.batches, seed=5))
    assert torch.equal(traces[0]["tau"], traces[1]["tau"])
    assert bool((traces[0]["tau"] > 0).all()) and bool(torch.isfinite(traces[0]["tau"]).all())
    assert model.embed(task.batches[0].input_ids).shape == (2, 32, 64)


def test_mlm_head_and_masking():
    """BERT masking: selected positions carry labels, others IGNORE; about 15% selected."""
    ids = torch.randint(5, 100, (4, 256), generator=torch.Generator().manual_seed(0))
    corrupted, labels = mask_tokens(ids, mask_token_id=1, vocab_size=100, generator=torch.Generator().manual_seed(2))
    selected = labels != tasks.IGNORE_INDEX
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(corrupted[~selected], ids[~selected])
    assert 0.10 < selected.float().mean().item() < 0.20
    assert (corrupted[selected] == 1).float().mean().item() > 0.6
    again, _ = mask_tokens(ids, mask_token_id=1, vocab_size=100, generator=torch.Generator().manual_seed(2))
    assert torch.equal(again, corrupted)
    batch = tasks.Batch(corrupted, torch.ones_like(ids, dtype=torch.bool), labels)
    model = TinyEncoder(vocab_size=100, n=256, kind="mlm", generator=torch.Generator().manual_seed(0))
    f, loss = model(batch)
    assert f.shape == (4, 256, 64) and math.isfinite(float(loss.detach()))
    with pytest.raises(ValueError, match="mask_rate"):
        mask_tokens(ids, mask_token_id=1, vocab_size=100, mask_rate=1.5)


def test_study_end_to_end_tiny(tmp_path):
    """A tiny grid over Table 3's proxy columns (Text, Retrieval and Image, Retrieval with a seed count of its
    own) writes results.csv, residual.csv, ratios.csv, table.md,
    config.json and the figure, names every proxy with its length and labels, and resumes."""
    config = study.build_config(tasks=["text:16:1", "retrieval:16:1:3", "image:64:1"],
                                attentions=["kernelized"], seeds=2, steps=2, num_features=4)
    tables = compute(study.STUDY, config, tmp_path, progress=False)
    results, residual = tables["results.csv"], tables["residual.csv"]
    assert set(results["attention"]) == {"softmax", "kernelized"}
    assert (results["status"] == "ok").all() and len(results) == (2 + 3 + 2) * 2 * 2
    assert results.groupby("task")["seed"].nunique().to_dict() == {"text": 2, "retrieval": 3, "image": 2}
    assert len(residual) == 7 and (residual[["rms_softmax", "rms_kernelized"]] > 0).all().all()
    written = report(study.STUDY, tmp_path)
    names = {p.name for p in written}
    assert {"ratios.csv", "intervals.csv", "table.md", "instability.png", "instability.pdf"} <= names
    assert (tmp_path / "config.json").is_file()
    ratios = pd.read_csv(tmp_path / "ratios.csv")
    assert (ratios.loc[ratios["attention"] == "softmax", "ratio"] == 1.0).all()
    proxies = pd.read_csv(tmp_path / "intervals.csv").groupby("task")["proxy"].first().to_dict()
    assert proxies == {"text": "wikitext-articles", "retrieval": "wikitext-same-article",
                       "image": "sklearn-digits"}
    table = (tmp_path / "table.md").read_text()
    assert "| kernelized |" in table and "[" in table and "inconclusive" in table
    header = next(line for line in table.splitlines() if line.startswith("| attention | Text"))
    assert header == "| attention | Text (n=16) | Retrieval (n=16) | Image (n=64) |"  # Table 3's order
    for section in ("## Entry by entry against Table 3", "## Where the spread comes from", "## The proxies",
                    "## Does each column answer Table 3?"):
        assert section in table
    proxy_rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()
                  if line.split(" | ")[1:2] in (["`text`"], ["`retrieval`"], ["`image`"])}
    assert set(proxy_rows) == {"Text", "Retrieval", "Image"}
    assert "16 tokens" in proxy_rows["Text"] and "10 balanced classes, chance 0.1" in proxy_rows["Text"]
    assert "16 tokens per document, two documents (2 x 16)" in proxy_rows["Retrieval"]
    assert "chance 0.5" in proxy_rows["Retrieval"] and "two-tower" in proxy_rows["Retrieval"]
    assert "64 tokens" in proxy_rows["Image"] and "upsampled bilinearly to 8 x 8" in proxy_rows["Image"]
    assert all(line.count(" | ") == 6 for line in proxy_rows.values())  # every column filled, "why" included
    # a resumed run computes nothing new and gives the same tables
    again = compute(study.STUDY, config, tmp_path, progress=False)
    pd.testing.assert_frame_equal(again["results.csv"], results)
    pd.testing.assert_frame_equal(again["residual.csv"], residual)
    with pytest.raises(StudyError, match="--tasks"):
        study.build_config(tasks=["listops:32"])


def test_ratio_interval_is_the_student_t_interval():
    """mean ± t_{0.975, s-1} sd / sqrt(s); t_{0.975, 4} = 2.776."""
    values = [0.8, 0.9, 1.0, 0.7, 0.6]
    mean, low, high = study.ratio_interval(values)
    half = 2.7764451051977987 * float(np.std(values, ddof=1)) / math.sqrt(5)
    assert mean == pytest.approx(0.8) and low == pytest.approx(0.8 - half) and high == pytest.approx(0.8 + half)
    assert math.isnan(study.ratio_interval([0.5])[1])


@pytest.mark.parametrize("low,high,word", [(0.5, 0.99, "below 1"), (1.01, 2.0, "above 1"), (0.9, 1.1, "inconclusive"),
                                           (0.5, 1.0, "inconclusive")])
def test_verdict_needs_the_whole_interval(low, high, word):
    assert study.verdict(low, high) == word


def test_intervals_verdicts_and_paper_comparison():
    rows = [{"task": "listops", "n": 100, "seed": s, "attention": a, "steps": 2, "ratio": r, "status": "ok"}
            for s in range(5) for a, r in (("softmax", 1.0), ("kernelized", 0.70 + 0.01 * s),
                                           ("nystromformer", 0.9 + 0.05 * s))]
    rows.append({"task": "listops", "n": 100, "seed": 0, "attention": "yoso", "steps": 0, "ratio": None,
                 "status": "failed: boom"})
    summary = study.intervals(pd.DataFrame(rows)).set_index("attention")
    assert summary.loc["kernelized", "verdict"] == "below 1"
    assert summary.loc["nystromformer", "verdict"] == "inconclusive"
    assert summary.loc["softmax", "verdict"] == "reference" and summary.loc["yoso", "verdict"] == "failed"
    comparison = study.paper_comparison(summary.reset_index()).set_index("attention")
    assert comparison.loc["kernelized", "paper"] == "0.77"
    assert comparison.loc["kernelized", "paper inside our CI"] == "no"  # ours: 0.72 [0.70, 0.74]
    assert comparison.loc["kernelized", "same side of 1"] == "yes"
    assert comparison.loc["nystromformer", "paper inside our CI"] == "yes"


@pytest.mark.parametrize("low,high,power,word", [(0.5, 0.99, 0.1, "below 1"), (1.01, 2.0, 0.1, "above 1"),
                                                 (0.5, 1.5, 0.3, "not confirmed (underpowered)"),
                                                 (0.5, 1.5, 0.95, "inconclusive"), (0.5, 1.5, float("nan"), "inconclusive")])
def test_verdict_labels_an_undecided_interval_by_its_power(low, high, power, word):
    assert study.verdict(low, high, power) == word


def test_power_analysis_is_the_t_test_at_the_papers_value():
    from approxlab.stats import t_test_power, t_test_sample_size

    values = [0.6, 0.9, 1.4, 0.8, 1.1]
    sd, power, needed = study.power_analysis(values, 0.77)
    assert sd == pytest.approx(float(np.std(values, ddof=1)))
    assert power == pytest.approx(t_test_power(5, difference=-0.23, sd=sd))
    assert needed == t_test_sample_size(difference=-0.23, sd=sd, power=0.8)
    assert t_test_power(needed, difference=-0.23, sd=sd) >= 0.8 > t_test_power(needed - 1, difference=-0.23, sd=sd)
    assert math.isnan(study.power_analysis(values, None)[1]) and math.isnan(study.power_analysis(values, 1.01)[1])


def test_intervals_report_geometric_mean_power_and_both_verdicts():
    ratios = [0.5, 0.6, 0.55, 3.0, 0.5]  # a heavy right tail: arithmetic mean above the geometric one
    rows = [{"task": "listops", "n": 100, "seed": s, "attention": a, "steps": 2, "ratio": r, "status": "ok"}
            for s, r in enumerate(ratios) for a, r in (("softmax", 1.0), ("kernelized", r))]
    summary = study.intervals(pd.DataFrame(rows)).set_index("attention")
    row = summary.loc["kernelized"]
    assert row["geo_mean"] == pytest.approx(math.exp(np.mean(np.log(ratios))))
    _, log_low, log_high = study.ratio_interval(np.log(ratios))  # the declared interval, beside the calibrated one
    assert (row["geo_nominal_low"], row["geo_nominal_high"]) == pytest.approx((math.exp(log_low), math.exp(log_high)))
    assert row["geo_low"] <= row["geo_nominal_low"] and row["geo_high"] >= row["geo_nominal_high"]
    assert row["paper"] == 0.77 and 0 < row["power"] < 0.8
    # 5 skewed seeds: the t interval covers 64.5% of the first 400 draws; the former rule withheld the verdict, the
    # calibrated interval (wider on its short side) gives one, and the coverage is known to +-2 points
    assert row["former_verdict"] == "no verdict: coverage 64.5% < 90%"
    assert row["calibrated_level"] > 0.95 and row["coverage_high"] - row["coverage_low"] <= 0.04
    assert row["verdict"] == study.verdict(row["low"], row["high"], row["power"], paper=0.77)
    assert not row["verdict"].startswith("no verdict")
    from approxlab.stats import t_test_power  # the geometric mean's power is the t-test's on the logs

    logs = np.log(ratios)
    assert row["geo_sd"] == pytest.approx(float(np.std(logs, ddof=1)))
    assert row["geo_power"] == pytest.approx(t_test_power(5, difference=math.log(0.77), sd=row["geo_sd"]))
    cell = instability_report._verdict_cell(next(summary.reset_index().itertuples(index=False)))  # softmax row: no power
    assert cell == "reference"
    text = instability_report._verdict_cell(next(r for r in summary.reset_index().itertuples(index=False) if r.attention == "kernelized"))
    assert text.startswith(row["verdict"] + " (power 0.")


def _skewed(attention="kernelized", task="pathfinder", count=40, seed=0, location=0.0):
    rng = np.random.default_rng(seed)
    ratios = np.exp(rng.normal(location, 0.5, size=count))
    return pd.DataFrame([{"task": task, "n": 256, "seed": s, "attention": a, "steps": 20, "ratio": r, "status": "ok"}
                         for s, value in enumerate(ratios) for a, r in (("softmax", 1.0), (attention, value))])


def test_the_papers_value_is_placed_among_the_seeds_and_a_disagreement_of_the_means_depends_on_the_statistic():
    """Table 3's value is one seed's statistic: its percentile among the seeds and the prediction interval for
    one new seed beside the population mean's interval. Lognormal seeds (sigma 0.5, median 0.87): the arithmetic
    mean (about 0.99) excludes the paper's 0.74 while the geometric mean's interval need not; where they disagree,
    the reading is "depends on the statistic" (the former table gave only the arithmetic verdict)."""
    row = study.intervals(_skewed(location=math.log(0.87))).set_index("attention").loc["kernelized"]
    values = _skewed(location=math.log(0.87)).query("attention == 'kernelized'")["ratio"].to_numpy()
    assert row["paper_percentile"] == pytest.approx(float(np.mean(values <= 0.74)))
    assert 0.1 <= row["paper_percentile"] <= 0.5 and row["pred_low"] < 0.74 < row["pred_high"]
    assert instability_stats.PRIMARY_MEAN == "geometric"
    assert row["reading"] == instability_stats._reading(row.to_dict())
    if (row["paper_verdict"] == "holds the paper's value") != (row["geo_paper_verdict"] == "holds the paper's value"):
        assert row["reading"] == instability_stats.DEPENDS
    assert instability_stats._reading({"paper_verdict": "above the paper's value", "geo_paper_verdict": "holds the paper's value"}) \
        == "depends on the statistic"
    # Pathfinder-like: the arithmetic mean holds 1 and rejects 0.74, the geometric mean is below 1
    assert instability_stats._reading({"paper_verdict": "above the paper's value",
                                       "geo_paper_verdict": "above the paper's value",
                                       "verdict": "rejects the paper's value", "geo_verdict": "below 1"}) \
        == "depends on the statistic"


def test_the_changes_of_verdict_list_an_entry_that_depends_on_the_statistic():
    """An entry whose two means disagree about the paper's value reads "depends on the statistic", an outcome the
    former rules did not have (they gave each mean's verdict alone): the Changes list names it, with both means'
    intervals and former verdicts."""
    summary = study.intervals(_skewed(location=math.log(0.87)))
    row = summary.set_index("attention").loc["kernelized"]
    summary.loc[summary["attention"] == "kernelized", "reading"] = instability_stats.DEPENDS
    lines = instability_report._changes_lines(summary)
    entry = [line for line in lines if line.startswith("| kernelized | Pathfinder (n=256) | both (the entry) |")]
    assert len(entry) == 1 and entry[0].endswith(f"| {row['former_verdict']} / {row['former_geo_verdict']} | "
                                                  "depends on the statistic |")
    assert "of 3 verdict(s) change" in "\n".join(lines)


def test_a_paper_value_near_1_is_tested_like_any_other():
    """Nystromformer's 1.02: an interval wholly below it rejects it, as for every other entry (the former rule
    exempted values within 0.05 of 1 and called the entry inconclusive)."""
    row = study.intervals(_skewed("nystromformer", task="image", count=60, location=math.log(0.6))) \
        .set_index("attention").loc["nystromformer"]
    assert row["paper"] == 1.02 and row["high"] < 1.02 and row["low"] < 1.0
    assert row["paper_verdict"] == "below the paper's value"
    assert row["former_verdict"] in ("below 1", "inconclusive")


def test_full_grid_uses_the_papers_optimiser_settings():
    config = study.build_config()
    assert config["optimizer"] == "adamw" and config["dropout"] == 0.1 and config["clip_value"] == 1.0
    lr = {t["task"]: (t["lr"], t["warmup"], t["total_steps"]) for t in config["tasks"]}
    assert lr == {"text": (1e-4, 80, 50000), "listops": (1e-4, 1000, 50000), "retrieval": (2e-4, 800, 50000),
                  "pathfinder": (2e-4, 312, 50000), "image": (1e-4, 175, 50000)}
    assert {(t["n"], t["batch_size"]) for t in config["tasks"]} == {(256, 8)} and config["num_features"] == 128
    cells = study.make_cells(config, {"data_dir": None, "cache_dir": None, "device": "cpu"})
    assert [c["seed"] for c in cells[:20]] == [0] * 20  # seed by seed: a stopped run holds whole seeds


def test_a_run_of_the_softmax_reference_alone_writes_its_report(tmp_path, capsys):
    """``--attentions softmax`` computed every cell and then the report raised ``KeyError: 'decision'`` (an empty
    summary of the entries still open), with ``--plot-only`` too: both write table.md."""
    from approxlab.cli import main

    out = tmp_path / "run"
    assert main(["instability", "--attentions", "softmax", "--tasks", "text:16:1", "--seeds", "2", "--steps", "2",
                 "--out", str(out), "--no-progress"]) == 0
    assert "| softmax | 1 (reference) |" in (out / "table.md").read_text()
    (out / "table.md").unlink()
    assert main(["instability", "--out", str(out), "--plot-only"]) == 0
    assert (out / "table.md").is_file() and "Traceback" not in capsys.readouterr().err
