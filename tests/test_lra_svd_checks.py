"""The Figure-4 proxy checked against our own bug (approxlab.studies.lra_svd.checks) and its resolution check."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from approxlab import stats
from approxlab.studies import lra_svd
from approxlab.studies.inputs.tasks import seeded_task
from approxlab.studies.lra_svd import checks
from approxlab.studies.lra_svd import report as report_text
from approxlab.training import TinyEncoder


def _spectra(slopes, *, low_from=None):
    """Per (task, seed): sigma_j / sigma_1 = exp(slope (j - 1)); ``low_from``: {(task, seed): j} where the batch's
    minimum drops to 1e-17 (one example's rounding) while the mean stays resolved."""
    rows = []
    for task, values in slopes.items():
        for seed, slope in enumerate(values):
            for j in range(1, 65):
                mean = math.exp(slope * (j - 1))
                low = 1e-17 if low_from and j >= low_from.get((task, seed), 99) else mean / 2
                rows.append({"task": task, "n": 256, "seed": seed, "index": j, "mean": mean, "min": low, "max": mean})
    return pd.DataFrame(rows)


def _results(slopes, spread=0.02):
    return pd.DataFrame([{"task": task, "n": 256, "seed": s, "decay_slope": v, "decay_slope_std": spread,
                          "passed": True, "validation_accuracy": 0.8 if task == "pathfinder" else 0.34,
                          "majority_rate": 0.5 if task == "pathfinder" else 0.16, "test_batch_accuracy": 0.75,
                          "gate": lra_svd.GATES[task], "steps": 2000, "validation_size": 512,
                          "num_singular_values": 64, "seconds": 1.0}
                         for task, values in slopes.items() for s, v in enumerate(values)])


def _training(slopes):
    return pd.DataFrame([{"task": task, "n": 256, "seed": s, "step": step, "train_loss": loss,
                          "validation_accuracy": 0.5}
                         for task, values in slopes.items() for s in range(len(values))
                         for step, loss in ((0, float("nan")), (2000, 0.4 if task == "pathfinder" else 1.5))])


SLOPES = {"listops": [-0.22, -0.23, -0.225, -0.218, -0.232],
          "pathfinder": [-0.24, -0.245, -0.238, -0.242, -0.35]}


def test_resolution_reads_each_example_not_only_the_batch_mean():
    """A batch whose mean stays resolved while one example's values fall to rounding from j = 50: the summary must
    say so (it said "never" when it read the mean alone)."""
    line = report_text._resolution_lines(_spectra(SLOPES, low_from={("pathfinder", 4): 50}), 64, "float64")[0]
    assert "mean spectrum falls below it: never, for any seed" in line
    assert "Pathfinder (n=256) seed 4: from j = 50, 24% of the fit" in line  # 15 of the 63 fitted indices
    assert "ListOps (n=256) seed 0: from" not in line


def test_outlying_seeds_by_scaled_mads_per_task():
    flagged = checks.outlying_seeds(_results(SLOPES))
    assert flagged.loc[flagged["outlying"], ["task", "seed"]].values.tolist() == [["pathfinder", 4]]
    assert flagged.loc[flagged["task"] == "pathfinder", "median"].iloc[0] == pytest.approx(-0.242)
    assert not checks.outlying_seeds(_results(SLOPES), mads=100.0)["outlying"].any()


def test_batch_mean_slopes_fit_the_mean_spectrum_over_the_declared_indices():
    spectra = _spectra(SLOPES)
    spectra.loc[spectra["index"] == 1, "mean"] = 1e3  # sigma_1 is not fitted
    slopes = checks.batch_mean_slopes(spectra)
    assert slopes[("pathfinder", 256, 4)] == pytest.approx(-0.35)
    assert slopes[("listops", 256, 0)] == pytest.approx(-0.22)


def test_sensitivity_variants_against_the_declared_difference():
    results, spectra = _results(SLOPES), _spectra({t: [v / 2 for v in s] for t, s in SLOPES.items()})
    table = checks.sensitivity(results, spectra).set_index("variant")
    declared = lra_svd.ordering(results)["difference"]
    assert table.iloc[0]["difference"] == pytest.approx(declared)
    welch = stats.welch_interval(SLOPES["pathfinder"], SLOPES["listops"])
    assert (table.iloc[0]["low"], table.iloc[0]["high"]) == pytest.approx((welch.low, welch.high))
    assert table.iloc[1]["difference"] == pytest.approx(np.median(SLOPES["pathfinder"]) - np.median(SLOPES["listops"]))
    assert math.isnan(table.iloc[1]["low"])
    assert table.iloc[2]["seeds"] == "4 and 5"  # the outlying Pathfinder seed left out
    assert table.iloc[2]["difference"] == pytest.approx(np.mean(SLOPES["pathfinder"][:4]) - np.mean(SLOPES["listops"]))
    assert table.iloc[3]["difference"] == pytest.approx(declared / 2)  # the batch-mean spectra's slopes


def test_input_rank_bound_is_the_rank_of_the_models_input():
    """The bound equals the rank of a float64 model's embedding of a generated Pathfinder image (2-D positions)
    and of a ListOps sequence (learned positions)."""
    for entry in lra_svd.build_config()["tasks"]:
        batch = seeded_task(entry["task"], entry["n"], 2, 1, 0, "test", **entry["options"]).batches[0]
        model = TinyEncoder(vocab_size=256, n=entry["n"], num_classes=10, positions=entry["positions"],
                            generator=torch.Generator().manual_seed(0), **lra_svd.grid.MODEL).double()
        with torch.no_grad():
            x = model.token_embedding(batch.input_ids[0]) + model._position_vectors(entry["n"], "cpu")
            sigma = torch.linalg.svdvals(x[batch.mask[0]])
        rank = int((sigma > 1e-12 * sigma[0]).sum())
        assert rank == checks.input_rank_bound(entry, 64) == {"pathfinder": 33, "listops": 64}[entry["task"]]


def test_summary_carries_the_bug_check():
    config = lra_svd.build_config()
    results, spectra, training = _results(SLOPES), _spectra(SLOPES), _training(SLOPES)
    text = "\n".join(report_text.summary_lines(config, results, spectra, training, "approxlab lra-svd"))
    assert "### Checked against our own bug" in text
    assert "Pathfinder seed 4: slope -0.350 (median -0.242)" in text
    assert "ListOps' 5 gate-passing seeds end at validation accuracy 0.340 (majority class 0.160" in text
    assert "they trained and did not collapse to one class" in text
    assert "Pathfinder (2d positions): at most 33 of 64" in text
    assert "| without the outlying seeds | 4 and 5 |" in text
