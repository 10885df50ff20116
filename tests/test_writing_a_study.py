"""A study written outside approxlab: the example of "Writing a study" (docs/studies/toy_study.py) run as a
user runs it -- a ``--plugin`` module, listed by ``approxlab``, computed in-process and on two Dask
workers, stopped and resumed, with its tables, figure and summary with a claim verdict -- and the
installed kind (an entry point), loaded only when needed."""

from __future__ import annotations

import dataclasses
import os
import re
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


def _no_cell_runs(cell):
    raise AssertionError("no cell may run")


def _cells_without_b(config, settings):
    return [{"a": 0}]


def _one_cell_twice(config, settings):
    return [{"a": 0, "b": 1}, {"a": 0, "b": 1}]


def _a_study(**changes):
    from approxlab.studies import Step, Study, Table

    fields = {"name": "faulty", "description": "A study declared wrongly.", "full": {}, "quick": {},
              "configure": lambda args: {"study": "faulty"},
              "steps": (Step((Table("results.csv", ("a", "b")),), _no_cell_runs, _one_cell_twice),)}
    return Study(**{**fields, **changes})


def _declarations():
    from approxlab.studies import Step, Table
    from approxlab.studies.options import METHODS, N

    step = Step((Table("results.csv", ("a", "b")),), _no_cell_runs, _one_cell_twice)
    return {
        "option-twice": ({"options": (METHODS, N, METHODS)},
                         r"study 'faulty': `options` declares --methods twice \(in the options with flags "
                         r"\['--methods'\] and \['--methods'\]\); declare each option once\."),
        "dest-twice": ({"options": (METHODS, N.but(flags=("--lengths",), dest="methods"))},
                       r"study 'faulty': `options` declares dest='methods' twice"),
        "a-common-option": ({"options": (N.but(flags=("--out",), dest="where"),)},
                            r"study 'faulty': `options` declares --out \(the option with flags \['--out'\]\), which "
                            r"every study already has"),
        "two-steps-one-table": ({"steps": (step, step)},
                                r"study 'faulty': `steps` 0 and 1 both write 'results.csv'; each table is written "
                                r"by one step\."),
    }


@pytest.mark.parametrize("case", ["option-twice", "dest-twice", "a-common-option", "two-steps-one-table"])
def test_a_declaration_that_cannot_run_is_refused_at_registration(case, fresh_registry, tmp_path, monkeypatch,
                                                                  capsys):
    """An option declared twice raised argparse.ArgumentError when the command line was built, and two steps
    writing one table were refused only when the study ran: each is one line naming the study, the field and
    what came in, when the study is registered -- through --plugin: one line naming the plugin, exit status 2."""
    changes, message = _declarations()[case]
    with pytest.raises(ValueError, match=message):
        registry.register(_a_study(**changes))
    assert "faulty" not in registry.available()
    plugin = f"faulty_{case.replace('-', '_')}"
    (tmp_path / f"{plugin}.py").write_text(textwrap.dedent(f"""
        from test_writing_a_study import _a_study, _declarations
        from approxlab.studies import register
        register(_a_study(**_declarations()[{case!r}][0]))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    status, err = _run(["faulty", "--plugin", plugin, "--out", str(tmp_path / "out")], capsys)
    assert status == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"approxlab faulty: error: --plugin: ") and plugin in err, err
    assert re.search(message, err), err
    sys.modules.pop(plugin, None)


def _run(argv, capsys):
    try:
        status = main(argv)
    except SystemExit as exit_info:
        status = exit_info.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("case", ["configure-none", "cells-without-a-key", "one-cell-twice"])
def test_cells_and_a_config_a_study_cannot_run_are_refused_before_any_cell(case, fresh_registry, tmp_path, capsys):
    """`configure` returning None, `cells()` missing a key column (a KeyError traceback) and one cell given twice
    (refused as "a value of a list option is given twice") are one line naming the study, where it is defined,
    the field and what came in, before any cell runs."""
    from approxlab.studies import Step, Table

    where = r"study 'faulty' \(defined in test_writing_a_study\): "
    changes, message = {
        "configure-none": ({"configure": lambda args: None},
                           where + r"`configure` must return the config, a dict; got None\."),
        "cells-without-a-key": ({"steps": (Step((Table("results.csv", ("a", "b")),), _no_cell_runs,
                                                _cells_without_b),)},
                                where + r"`cells` of the step writing \['results.csv'\] must give every cell the key "
                                        r"columns \['a', 'b'\]; cell 0 lacks \['b'\] \(it has \['a'\]\)\."),
        "one-cell-twice": ({}, where + r"`cells` of the step writing \['results.csv'\] must give each cell once; got "
                                       r"the cell \(a=0, b=1\) twice\."),
    }[case]
    registry.register(_a_study(**changes))
    try:
        status, err = _run(["faulty", "--out", str(tmp_path / "out"), "--no-progress"], capsys)
    finally:
        registry.unregister("faulty")
    assert status == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert re.fullmatch("approxlab faulty: error: " + message + "\n", err), err
