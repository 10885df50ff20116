"""The --quick versions of the singular-value and instability studies, on real data, as CI
runs them: each writes its tables, figure and summary offline."""

from approxlab.cli import main
from approxlab.studies.engine import read_results


def test_sv_decay_quick(tmp_path):
    """Skyformer App. B / spectral-shifting Fig. 2: `approxlab sv-decay --quick`."""
    assert main(["sv-decay", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    for name in ("results.csv", "spectra.csv.gz", "config.json", "sv_decay.png", "sv_decay.pdf", "summary.md"):
        assert (tmp_path / name).is_file(), name
    results = read_results(tmp_path / "results.csv")
    assert len(results) > 0 and not results["matrix"].isna().any()


def test_instability_quick(tmp_path):
    """Skyformer App. F / Table 3: `approxlab instability --quick` (1 task, 2 seeds, 5 steps)."""
    assert main(["instability", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    for name in ("results.csv", "ratios.csv", "table.md", "config.json"):
        assert (tmp_path / name).is_file(), name
    ratios = read_results(tmp_path / "ratios.csv")
    assert set(ratios["seed"]) == {0, 1}
    assert (ratios.loc[ratios["attention"] == "softmax", "ratio"] == 1.0).all()
