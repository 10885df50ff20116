"""A study written outside approxlab: the example of "Writing a study" (docs/studies/toy_study.py) run as a
user runs it -- a ``--plugin`` module, listed by ``approxlab``, computed in-process and on two Dask
workers, stopped and resumed, with its tables, figure and summary with a claim verdict -- and the
installed kind (an entry point), loaded only when needed."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import textwrap
import warnings

import pandas as pd
import pytest

from approxlab.cli import main
from approxlab.errors import PluginWarning
from approxlab.studies import driver, registry
from approxlab.studies.engine import read_results

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "studies" / "toy_study.py"
MODULE = "toy_study_plugin"
TABLES = ("errors.csv", "outputs.csv")


@pytest.fixture
def toy(tmp_path, monkeypatch, fresh_registry):
    """The example, copied into a module of a temporary folder that Python (and Dask's workers) can import."""
    (tmp_path / f"{MODULE}.py").write_text(EXAMPLE.read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    yield ["landmarks", "--quick", "--plugin", MODULE, "--no-progress"]
    if "landmarks" in registry.available():
        registry.unregister("landmarks")
    sys.modules.pop(MODULE, None)


def _tables(out) -> dict:
    return {name: read_results(out / name) for name in TABLES}


def _replace_compute(function) -> None:
    """The registered study with ``function`` as its compute (and no figure: drawn once, in the first run)."""
    study = registry.unregister("landmarks")
    registry.register(dataclasses.replace(study, steps=(dataclasses.replace(study.steps[0], compute=function),),
                                          figures=()))


def test_the_example_study_runs_resumes_and_reports(toy, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*toy, "--out", str(out)]) == 0
    for name in (*TABLES, "config.json", "verdicts.csv", "landmarks.png", "landmarks.pdf", "summary.md"):
        assert (out / name).is_file(), name
    tables = _tables(out)
    assert len(tables["errors.csv"]) == 2 * 3 * 2 and len(tables["outputs.csv"]) == 2 * 3  # methods x seeds (x d)
    summary = (out / "summary.md").read_text()
    verdicts = read_results(out / "verdicts.csv")
    assert set(verdicts["verdict"]) <= {"reproduced", "not reproduced", "inconclusive"} and len(verdicts) == 2
    assert "## Claim" in summary and "falls markedly as d grows" in summary and "| inconclusive |" in summary

    capsys.readouterr()
    assert main(["--plugin", MODULE]) == 0  # listed by `approxlab`, one line
    listed = [line.split(None, 1)[1] for line in capsys.readouterr().out.splitlines()
              if line.split()[:1] == ["landmarks"]]
    assert listed == [registry.get("landmarks").description]

    compute, calls = registry.get("landmarks").steps[0].compute, []

    def stopped_after_two(cell):
        calls.append(cell["seed"])
        if len(calls) > 2:
            raise driver.Stopped(2)
        return compute(cell)

    _replace_compute(stopped_after_two)
    assert main([*toy, "--out", str(tmp_path / "stopped")]) == 130
    _replace_compute(lambda cell: calls.append(cell["seed"]) or compute(cell))
    calls.clear()
    assert main([*toy, "--out", str(tmp_path / "stopped")]) == 0
    assert len(calls) == 6 - 2  # the two finished cells were kept
    for name, table in _tables(tmp_path / "stopped").items():
        pd.testing.assert_frame_equal(table, tables[name])

    _replace_compute(compute)
    assert main([*toy, "--workers", "2", "--out", str(tmp_path / "dask")]) == 0
    for name in TABLES:
        assert (tmp_path / "dask" / name).read_bytes() == (out / name).read_bytes()
    assert (tmp_path / "dask" / "summary.md").read_text() == summary
    capsys.readouterr()


def test_an_installed_study_is_loaded_only_when_needed_and_a_broken_one_warns(tmp_path, monkeypatch, capsys):
    """Entry points of the group ``approxlab.studies``: the working one runs, the broken one warns when loaded
    and leaves every other study available, and nothing is imported to list the names."""
    info = tmp_path / "toy_studies-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-studies\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(f"""\
        [approxlab.studies]
        landmarks = {MODULE}:STUDY
        broken = broken_study_xyz
        """))
    (tmp_path / f"{MODULE}.py").write_text(EXAMPLE.read_text().replace("STUDY = register(", "STUDY = ("))
    (tmp_path / "broken_study_xyz.py").write_text("raise RuntimeError('not today')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert {"landmarks", "broken"} <= set(registry.available()) and MODULE not in sys.modules
        assert main(["landmarks", "--quick", "--no-progress", "--out", str(tmp_path / "run")]) == 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert registry.describe("broken") is None and registry.describe("figure1") is not None
        capsys.readouterr()
        with pytest.warns(PluginWarning, match="'broken' = 'broken_study_xyz'.*RuntimeError: not today"):
            assert main(["broken"]) == 2
        assert "study 'broken' is not available" in capsys.readouterr().err
        assert not caught  # describing a broken study for a listing stays quiet
    finally:
        if "landmarks" in registry.available() and registry.get("landmarks"):
            registry.unregister("landmarks")
        sys.modules.pop(MODULE, None)
