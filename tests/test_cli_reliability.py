"""Damaged result folders, contradictory or empty options, a failing disk, Dask's dashboard port.

Each case runs ``approxlab figure1`` in-process on the synthetic Q/K/V of ``tests/test_figure1.py``
(a tiny grid: 4 cells) against a folder copied from one good run and then damaged, and asserts
either the one error line (exit 2, naming the file or option and what is wrong) or, where the
damage is the kind an interrupted write leaves, a recomputed table equal to the good one.
"""

from __future__ import annotations

import errno
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys

import pandas as pd
import pytest

from approxlab import _io
from approxlab.cli import main
from approxlab.studies import STUDIES, checks, engine
from approxlab.studies.inputs import wikitext

from conftest import DASK_DEFAULT_DASHBOARD_PORT, hold_port
from test_cli_errors import assert_one_line_error, run_main
from test_figure1 import synthetic_data  # noqa: F401,F811  (fixture)

ROOT = pathlib.Path(__file__).resolve().parents[1]
GRID = ["--n", "32", "--num-features", "4,8", "--methods", "skyformer-softmax,nystromformer", "--windows", "1",
        "--seeds", "1", "--dtypes", "float64", "--conditions", "initialized,pretrained", "--no-progress"]
PLOT_ONLY = ["--plot-only", "--no-progress"]
RESULTS = "results.csv.bz2"
"""figure1's cells' table (bzip2-compressed): the damage below is done to its text, then compressed again."""


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    """One finished run of the tiny grid (its folder is copied, never changed)."""
    out = tmp_path_factory.mktemp("good") / "run"
    with pytest.MonkeyPatch.context() as patch:
        from test_figure1 import synthetic_loader

        patch.setattr(wikitext, "load_qkv", synthetic_loader)
        wikitext.clear_caches()
        assert main(["figure1", "--out", str(out), *GRID]) == 0
    return out


def _table(path) -> pd.DataFrame:
    return engine.read_results(path).drop(columns="seconds")


def _read(path) -> str:
    """The text of ``path`` (decompressed for a ``.gz`` or ``.bz2`` name)."""
    data, codec = path.read_bytes(), _io.compression(path)
    return (codec[2](data) if codec else data).decode()


def _save(path, data) -> None:
    """Write ``data`` (text or bytes) to ``path``, compressed for a ``.gz`` or ``.bz2`` name unless it is empty."""
    data, codec = (data if isinstance(data, bytes) else data.encode()), _io.compression(path)
    path.write_bytes(codec[1](data) if data and codec else data)


def _write(name, data):
    def mutate(out):
        target = out / name
        if target.is_dir():
            target.rmdir()
        else:
            _save(target, data)
    return mutate


def _raw(name, data):
    """Write ``data`` as it is, never compressed (e.g. text where gzip data belongs)."""
    return lambda out: (out / name).write_bytes(data)


def _cut(name, keep):
    """Keep the first ``keep`` characters of ``name`` (negative: drop that many from the end)."""
    def mutate(out):
        _save(out / name, _read(out / name)[:keep])
    return mutate


def _rows(name, count):
    def mutate(out):
        lines = _read(out / name).splitlines(keepends=True)
        _save(out / name, "".join(lines[: 1 + count]))
    return mutate


def _directory(name):
    def mutate(out):
        (out / name).unlink()
        (out / name).mkdir()
    return mutate


def _delete(name):
    return lambda out: (out / name).unlink()


def _all_failed(out):
    table = pd.read_csv(out / RESULTS)
    for column in table.columns:
        if column.startswith(("error_", "relative_error_")) and column not in ("error_heads", "error_blowups"):
            table[column] = float("inf")
    table["error_heads"], table["status"] = "inf inf", "FloatingPointError: synthetic"
    table.to_csv(out / RESULTS, index=False)


FOREIGN = "condition,n,layer,head,window,sigma\ninitialized,512,0,0,0,1.0\n"
BINARY = bytes(range(256)) * 2

# (case, damage, extra arguments, the message the one error line must hold)
REFUSED = [
    ("config-cut-short", _write("config.json", '{"config": {"study": "fig'), GRID, r"config.json' .* not valid JSON"),
    ("config-binary", _write("config.json", BINARY), GRID, r"config.json' .* not UTF-8 text \(byte 128 is 0x80\)"),
    ("config-zero-bytes", _write("config.json", ""), GRID, r"config.json' .* it is empty \(0 bytes\)"),
    ("config-a-list", _write("config.json", "[1, 2]"), GRID, r"config.json' .* holds a JSON list, not an object"),
    ("config-foreign", _write("config.json", '{"config": {}}'), GRID,
     r"config.json' is not a config.json written by approxlab \(it has no config_hash\)"),
    ("config-a-directory", _directory("config.json"), GRID, r"config.json' is a directory where the study's config"),
    ("results-zero-bytes", _write(RESULTS, ""), GRID, r"results.csv.bz2' .* it is empty \(0 bytes\); pass --restart"),
    ("results-binary", _write(RESULTS, BINARY), GRID, r"results.csv.bz2' .* not UTF-8 text"),
    ("results-not-bzip2", _raw(RESULTS, FOREIGN.encode()), GRID, r"results.csv.bz2' .* not whole bzip2 data"),
    ("results-foreign", _write(RESULTS, FOREIGN), GRID,
     r"results.csv.bz2' lacks key columns \['condition', 'n', 'dtype', 'window', 'method'\] \(a table of another "),
    ("results-cut-in-header", _cut(RESULTS, 10), GRID, r"results.csv.bz2' .* first line is not a CSV header"),
    ("results-a-directory", _directory(RESULTS), GRID, r"results.csv.bz2' is a directory where the results table"),
    ("results-latin-1", _write(RESULTS, "condition,n\n\xe9t\xe9,1\n".encode("latin-1")), GRID,
     r"results.csv.bz2' .* not UTF-8 text \(byte 12 is 0xe9\)"),
    ("results-ragged-middle-line", lambda out: _save(out / RESULTS, _read(out / RESULTS).replace("\n", "\nx,y\n", 1)),
     GRID, r"results.csv.bz2' .* line 2 has 2 fields where its header has"),
    ("plot-only-half-written", _cut(RESULTS, -40), PLOT_ONLY,
     r"results.csv.bz2' .* its last row is cut short \(an interrupted write\).* rerun without --plot-only"),
    ("plot-only-zero-bytes", _write(RESULTS, ""), PLOT_ONLY, r"it is empty \(0 bytes\); rerun without --plot-only"),
    ("plot-only-garbage-config", _write("config.json", "not json"), PLOT_ONLY, r"config.json' .* not valid JSON"),
    ("plot-only-no-config", _delete("config.json"), PLOT_ONLY,
     r"config.json' does not exist, so results.csv.bz2 beside"),
    ("plot-only-config-without-config", _write("config.json", '{"config_hash": "x"}'), PLOT_ONLY,
     r"config.json' is not a config.json written by approxlab \(no `config` object\)"),
    ("plot-only-foreign-results", _write(RESULTS, FOREIGN), PLOT_ONLY,
     r"results.csv.bz2' .* it lacks the column\(s\) \['method', 'num_features', 'seed', 'status', 'error_mean'\]"),
    ("plot-only-binary-results", _write(RESULTS, BINARY), PLOT_ONLY, r"results.csv.bz2' .* not UTF-8 text"),
    ("plot-only-conditioning-garbage", _write("conditioning.csv", BINARY), PLOT_ONLY,
     r"conditioning.csv' .* not UTF-8 text"),
    ("plot-only-windows-half-row", _cut("windows.csv", -5), PLOT_ONLY, r"windows.csv' .* last row is cut short"),
    ("plot-only-header-only", _rows(RESULTS, 0), PLOT_ONLY, r"results.csv.bz2' holds no rows yet: nothing to plot"),
    ("plot-only-cut-at-a-line-end", _rows(RESULTS, 3), PLOT_ONLY,
     r"results.csv.bz2' .* 1 of its cells lack rows the table was written with \(cut short at a line end, or edited\)"),
    ("manifest-garbage", _write(RESULTS + ".cells", '{"cells": 3}'), GRID,
     r"results.csv.bz2.cells' .* it is not a cell manifest written by approxlab"),
    ("journal-damaged-inside", _write(RESULTS + ".journal", "{}\n{}\n"), GRID,
     r"results.csv.bz2.journal' .* line 1 is not a cell record"),
]


@pytest.mark.parametrize(("damage", "arguments", "message"), [case[1:] for case in REFUSED],
                         ids=[case[0] for case in REFUSED])
def test_a_damaged_folder_is_refused_in_one_line(damage, arguments, message, good_run, synthetic_data, tmp_path,
                                                 capsys):
    out = tmp_path / "run"
    shutil.copytree(good_run, out)
    damage(out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    status, err = run_main(["figure1", "--out", str(out), *arguments], capsys)
    assert_one_line_error(status, err, "figure1", "error")
    assert re.search(message, err), err
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name in before}
    assert after == before  # nothing rewritten, nothing discarded


@pytest.mark.parametrize("damage", [_cut(RESULTS, -40), _rows(RESULTS, 0), _delete(RESULTS),
                                    _rows(RESULTS, 1)],
                         ids=["half-written-last-row", "header-only", "results-missing", "one-row-left"])
def test_damage_an_interrupted_write_leaves_is_recomputed(damage, good_run, synthetic_data, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(good_run, out)
    damage(out)
    assert main(["figure1", "--out", str(out), *GRID]) == 0
    err = capsys.readouterr().err
    pd.testing.assert_frame_equal(_table(out / RESULTS), _table(good_run / RESULTS))
    if "half" in str(damage.__qualname__) or err:
        assert "Traceback" not in err


def test_a_half_written_last_row_is_named_and_its_cell_recomputed(good_run, synthetic_data, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(good_run, out)
    _cut(RESULTS, -40)(out)
    assert main(["figure1", "--out", str(out), *GRID]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("approxlab:")]
    assert len(notes) == 1 and "results.csv.bz2: its last row was cut short (an interrupted write); recomputing 1 " \
                               "cell(s) (condition='pretrained', n=32, dtype='float64', window=" in notes[0]


def test_plot_only_draws_a_run_where_every_method_failed(good_run, synthetic_data, tmp_path, capsys):
    """A log axis with nothing finite and positive on it used to raise inside matplotlib."""
    out = tmp_path / "run"
    shutil.copytree(good_run, out)
    (out / "figure1.png").unlink()
    _all_failed(out)
    (out / (RESULTS + ".cells")).unlink()  # rewritten by hand above
    assert main(["figure1", "--out", str(out), *PLOT_ONLY]) == 0
    assert (out / "figure1.png").stat().st_size > 0
    assert "Traceback" not in capsys.readouterr().err


def test_plot_only_draws_a_stopped_run(synthetic_data, tmp_path, capsys, monkeypatch):
    """A run stopped after 3 of its 8 cells (Ctrl-C): exit 130 with the note, then --plot-only draws
    the 3 cells (from the table and its journal)."""
    from _helpers import replace_compute
    from approxlab.studies import driver, figure1

    compute, calls = figure1.compute_cell, {"count": 0}

    def stopped_after_three(cell):
        calls["count"] += 1
        if calls["count"] > 3:
            raise driver.Stopped(2)
        return compute(cell)

    replace_compute(monkeypatch, figure1, 0, stopped_after_three)
    out = tmp_path / "run"
    assert main(["figure1", "--out", str(out), *GRID]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        "approxlab figure1: stopped by SIGINT; every finished cell is saved. Rerun the same command to resume.")
    assert main(["figure1", "--out", str(out), *PLOT_ONLY]) == 0
    assert (out / "figure1.png").stat().st_size > 0
    assert len(engine.read_results(out / RESULTS)) == 3 * 2


def test_plot_only_on_an_empty_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    status, err = run_main(["figure1", "--out", str(tmp_path / "empty"), *PLOT_ONLY], capsys)
    assert_one_line_error(status, err, "figure1", "no results.csv.bz2 in")


# ------------------------------------------------------------------ options

OPTIONS = [
    ("figure1", ["--out", ""], "argument --out: a file or folder path, got ''"),
    ("figure1", ["--out", "  "], "argument --out: a file or folder path, got '  ' (an empty path is the current"),
    ("figure1", ["--data-dir", ""], "argument --data-dir: a file or folder path, got ''"),
    ("figure1", ["--cache-dir", ""], "argument --cache-dir: a file or folder path, got ''"),
    ("figure1", ["--checkpoint", ""], "--checkpoint: a non-empty value, got ''"),
    ("sv-decay", ["--checkpoint", " "], "--checkpoint: a non-empty value, got ' '"),
    ("figure1", ["--plot-only", "--restart"], "--restart: not with --plot-only (it discards the saved results"),
    ("figure1", ["--plot-only", "--n", "512"], "--n: not with --plot-only (the figure is redrawn from the saved"),
    ("figure1", ["--plot-only", "--workers", "2"], "--workers: not with --plot-only"),
    ("figure1", ["--plot-only", "--device", "cuda"], "--device: not with --plot-only"),
    ("figure1", ["--plot-only", "--cache-dir", "{tmp}"], "--cache-dir: not with --plot-only"),
    ("figure1", ["--plot-only", "--positions", "none"], "--positions: not with --plot-only"),
    ("sv-decay", ["--plot-only", "--heads", "2"], "--heads: not with --plot-only"),
    ("instability", ["--plot-only", "--lr", "0.1"], "--lr: not with --plot-only"),
    ("bench", ["--plot-only", "--source", "synthetic"], "--source: not with --plot-only"),
    ("lra-svd", ["--plot-only", "--steps", "3"], "--steps: not with --plot-only"),
    ("figure1", ["--num-features", "100000"], "--num-features: at most 1024 for skyformer-softmax at n=512, "
                                              "got 100000"),
    ("figure1", ["--quick", "--n", "16", "--num-features", "256"], "--num-features: at most 32 for "
                                                                   "skyformer-softmax at n=16, got 256"),
    ("figure1", ["--n", "16", "--num-features", "4,20", "--methods", "nystromformer,performer"],
     "--num-features: at most 16 for nystromformer at n=16, got 20"),
]


@pytest.mark.parametrize(("study", "arguments", "message"), OPTIONS,
                         ids=[f"{s}{' '.join([''] + a)}" for s, a, _ in OPTIONS])
def test_contradictory_or_empty_options_are_refused(study, arguments, message, capsys, tmp_path, monkeypatch):
    from test_cli_errors import CORPUS_TOKENS

    monkeypatch.setattr(checks, "_token_count", lambda data_dir, cache_dir: CORPUS_TOKENS)
    arguments = [a.format(tmp=tmp_path) for a in arguments]
    out = tmp_path / "out"
    (out if "--plot-only" in arguments else tmp_path).mkdir(exist_ok=True)
    if "--out" not in arguments:
        arguments += ["--out", str(out)]
    status, err = run_main([study, *arguments], capsys)
    assert_one_line_error(status, err, study, message)
    assert not any(p.name.endswith(".csv") for p in tmp_path.rglob("*"))


# ------------------------------------------------------------------- the disk

def test_a_full_disk_is_one_line_and_leaves_nothing_half_written(good_run, synthetic_data, tmp_path, capsys,
                                                                 monkeypatch):
    """ENOSPC from the fourth fsync on (a disk that fills mid-run): exit 2, no temporary file, every
    table on disk readable, and the rerun resumes to the table of an uninterrupted run."""
    out = tmp_path / "run"
    calls = {"count": 0}
    fsync = os.fsync

    def filling(fd):
        calls["count"] += 1
        if calls["count"] > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return fsync(fd)

    monkeypatch.setattr(_io.os, "fsync", filling)
    status, err = run_main(["figure1", "--out", str(out), *GRID], capsys)
    assert_one_line_error(status, err, "figure1", "No space left on device (ENOSPC); every cell finished before it is "
                                                  "saved, nothing is half-written")
    folder = re.escape(str(out))  # the file and --out, or --out itself (its fsync), are named
    assert re.search(rf"cannot write or read ('{folder}/[^']+' \(in --out '{folder}'\)|--out '{folder}'): ", err), err
    assert not [p for p in out.iterdir() if p.name.startswith(_io.TEMP_PREFIX)]
    for table in [*out.glob("*.csv"), *out.glob("*.csv.bz2")]:
        engine.read_results(table)  # whole, or not there
    monkeypatch.setattr(_io.os, "fsync", fsync)
    assert main(["figure1", "--out", str(out), *GRID]) == 0
    pd.testing.assert_frame_equal(_table(out / RESULTS), _table(good_run / RESULTS))


def test_a_journal_append_that_fails_leaves_no_half_line(tmp_path, monkeypatch):
    table = tmp_path / "results.csv"
    engine.append_journal(table, {"key_columns": ["a"], "key": [1], "rows": [{"a": 1, "x": 0.5}]})
    size = engine.journal_path(table).stat().st_size

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_io.os, "fsync", full)
    with pytest.raises(OSError, match="No space left on device"):
        engine.append_journal(table, {"key_columns": ["a"], "key": [2], "rows": [{"a": 2, "x": 1.5}]})
    assert engine.journal_path(table).stat().st_size == size
    assert engine.read_results(table).to_dict("records") == [{"a": 1, "x": 0.5}]


@pytest.mark.parametrize("error", [errno.EROFS, errno.EDQUOT, errno.EIO])
def test_the_environment_refusing_a_write_is_one_line(error, synthetic_data, tmp_path, capsys, monkeypatch):
    def refuse(fd):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(_io.os, "fsync", refuse)
    status, err = run_main(["figure1", "--out", str(tmp_path / "run"), *GRID], capsys)
    assert_one_line_error(status, err, "figure1", f"{os.strerror(error)} ({errno.errorcode[error]})")


@pytest.mark.parametrize(("setting", "message"), [
    ("/proc/approxlab-cache", "$APPROXLAB_CACHE: a folder this user can create and write to, got '/proc/approxlab"),
    ("{file}", "$APPROXLAB_CACHE: a folder this user can create and write to, got '{file}' (not a folder)"),
    ("{tmp}/" + "c" * 300, "$APPROXLAB_CACHE: a folder this user can create and write to, got '{tmp}/ccc"),
])
def test_an_unusable_cache_from_the_environment_is_refused(setting, message, capsys, tmp_path, monkeypatch):
    places = {"file": tmp_path / "a-file", "tmp": tmp_path}
    places["file"].write_text("not a folder")
    monkeypatch.setenv("APPROXLAB_CACHE", setting.format(**places))
    status, err = run_main(["figure1", "--out", str(tmp_path / "out"), "--no-progress"], capsys)
    assert_one_line_error(status, err, "figure1", message.format(**places))


@pytest.mark.parametrize("where", ["component", "total"])
def test_an_over_long_out_path_is_one_line(where, capsys, tmp_path):
    long = tmp_path / ("o" * 300) if where == "component" else tmp_path.joinpath(*(["d" * 200] * 25))
    status, err = run_main(["figure1", "--out", str(long), "--no-progress"], capsys)
    assert_one_line_error(status, err, "figure1", "--out: a folder this user can create and write to")
    assert "File name too long" in err


# ------------------------------------------------------------------- Dask

WORKERS_RUN = f"""
import sys
sys.path.insert(0, {str(pathlib.Path(__file__).resolve().parent)!r})
from approxlab import cli
from approxlab.studies.inputs import wikitext
from test_figure1 import synthetic_loader

wikitext.load_qkv = synthetic_loader
if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_workers_run_with_the_dashboard_port_taken_is_quiet(tmp_path):
    """Port 8787 is held: the local cluster picks a free loopback port, and a normal ``--workers``
    run prints no warning, log record or traceback (it exits 0)."""
    with hold_port(DASK_DEFAULT_DASHBOARD_PORT):
        _quiet_workers_run(tmp_path)


def _quiet_workers_run(tmp_path):
    with socket.socket() as probe, pytest.raises(OSError):
        probe.bind(("0.0.0.0", DASK_DEFAULT_DASHBOARD_PORT))  # taken
    script = tmp_path / "run_study.py"
    script.write_text(WORKERS_RUN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(script), "figure1", "--out", str(tmp_path / "out"), *GRID,
                             "--workers", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    assert len(engine.read_results(tmp_path / "out" / RESULTS)) == 2 * 2 * 2


# ------------------------------------------------ the other studies' plot step

OTHER_STUDIES = {"sv-decay": ("spectra.csv.gz",), "instability": (), "lra-svd": ("spectra.csv", "training.csv"),
                 "bench": ()}
CONFIG = '{"config": {"study": "x"}, "config_hash": "0"}'


@pytest.mark.parametrize("study", sorted(OTHER_STUDIES))
@pytest.mark.parametrize(("results", "config", "message"), [
    (FOREIGN.replace("condition", "unrelated"), CONFIG, r"results.csv' .* it lacks the column\(s\)"),
    (BINARY, CONFIG, r"results.csv' .* not UTF-8 text"),
    ("a,b\n1,2\n", '{"config_hash": "0"}', r"config.json' is not a config.json written by approxlab|lacks the column"),
    ("a,b\n1,2\n3", CONFIG, r"results.csv' .* its last row is cut short"),
], ids=["foreign-results", "binary-results", "config-without-config", "half-written-row"])
def test_every_study_refuses_a_damaged_folder_to_plot(study, results, config, message, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text(config.replace('"study": "x"', f'"study": "{study}"'))  # a folder of this study
    for name in ("results.csv", *OTHER_STUDIES[study]):
        (out / name).write_bytes(results if isinstance(results, bytes) else results.encode())
    status, err = run_main([study, "--out", str(out), *PLOT_ONLY], capsys)
    assert_one_line_error(status, err, study, "error")
    assert re.search(message, err), err


# ------------------------------------------------ rules that hold for every study's command line

SAMPLES = {"tasks": {"instability": "listops:64:2", "lra-svd": "listops:32"}, "layers": "first",
           "methods": "nystromformer", "num_features": "16", "compare_with": "figures/figure1",
           "long_methods": "streaming-llm", "kv_ratios": "0.5", "whole_ratios": "0.875", "whole_methods": "topk",
           "ratios": {"long-context": "0.5", "perplexity": "0.5"},
           "depths": {"long-context": "0.5", "perplexity": "0"}}
"""A valid value of a list option where the study's ``--quick`` grid does not give one."""


def _list_options(study: str) -> list:
    from approxlab.cli import build_parser
    from approxlab.studies.declaration import DeprecatedAlias

    parser = build_parser(study).study_parser  # a deprecated flag is its option's (named by the new flag)
    return [action for action in parser._actions if action.option_strings and action.nargs in ("+", "*")
            and not isinstance(action, DeprecatedAlias)]


def _sample(declared, action) -> str:
    sample = SAMPLES.get(action.dest)
    if isinstance(sample, dict):
        sample = sample.get(declared.name)
    if sample is None and action.choices is not None:
        sample = list(action.choices)[0]
    if sample is None:
        value = declared.quick.get(action.dest)
        sample = value[0] if isinstance(value, list) and value else value
    assert isinstance(sample, (str, int)) and not isinstance(sample, bool), (
        f"no valid value of {declared.name} {action.option_strings[0]} to repeat: add one to SAMPLES")
    return str(sample)


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_a_value_given_twice_is_refused_by_every_list_option(study, capsys, tmp_path):
    """``--methods performer,performer`` and its kin, in every study: one line, exit 2, nothing created, and the
    same words for a value given in code; entries equal once parsed (``listops:64:2``, ``listops:064:2``) too."""
    from approxlab.errors import UsageError
    from approxlab.studies import registry
    from approxlab.studies.options import Flatten

    declared, out = registry.get(study), tmp_path / "out"
    actions = _list_options(study)
    assert actions
    for action in actions:
        flag, value = action.option_strings[0], _sample(declared, action)
        message = f"{flag}: each value at most once, got '{value},{value}' ('{value}' given more than once)"
        for given in ([f"{value},{value}"], [value, value]) if isinstance(action, Flatten) else ([value, value],):
            status, err = run_main([study, flag, *given, "--out", str(out)], capsys)
            assert_one_line_error(status, err, study, message)
        in_code = [int(value) if value.isdigit() else value] * 2
        with pytest.raises(UsageError, match=re.escape(f"{flag}: each value at most once")):
            declared.configure(declared.arguments(quick=True, **{action.dest: in_code}))
    assert not out.exists()
    spelled = {"instability": "listops:64:2,listops:064:2", "lra-svd": "listops:32,listops:32:learned"}.get(study)
    if spelled:  # one entry written two ways: refused by the study's parsing, in one line naming --tasks
        status, err = run_main([study, "--tasks", spelled, "--out", str(out)], capsys)
        assert_one_line_error(status, err, study, "--tasks: ")
        assert not out.exists()


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_a_number_of_features_a_study_cannot_compute_is_refused_not_lowered(study, capsys, tmp_path, monkeypatch):
    """``--num-features 100000`` at n = 64 used to be lowered to 64 by sv-decay and instability (their summaries
    said d = 100000); every study refuses it in one line before a cell runs, so the d of config.json and the
    summary is the d computed. Studies without the option have nothing to lower."""
    from approxlab.studies import registry
    from test_cli_errors import CORPUS_TOKENS

    monkeypatch.setattr(engine.runner, "run_steps", _no_computation)
    monkeypatch.setattr(checks, "_token_count", lambda data_dir, cache_dir: CORPUS_TOKENS)
    if not any(action.dest == "num_features" for action in _list_options(study)):
        return
    lengths = {"sv-decay": ["--n", "64"], "instability": ["--tasks", "listops:64:2"], "bench": ["--source",
               "synthetic", "--accuracy-n", "64", "--forward-n", "64", "--parts", "accuracy", "forward"],
               "decoder": ["--n", "64", "--kv-context", "32", "--kv-continuation", "16"],
               "figure1": ["--n", "64"], "perplexity": ["--n", "64", "--context", "48", "--continuation", "16"]
               }.get(study, [])
    status, err = run_main([study, "--num-features", "100000", *lengths, "--out", str(tmp_path / "out")], capsys)
    assert_one_line_error(status, err, study, "--num-features: at most ")
    assert re.search(r"at most \d+ for [\w-]+ at n=64\b.*, got 100000$", err.strip()), err
    if study in ("sv-decay", "instability", "bench"):  # they hand min(d, n) to the methods: n is the limit
        assert "at most 64 for" in err
    declared = registry.get(study)
    if study == "instability":  # --quick's default d fits its task (it was 128 at n = 64, lowered without a word)
        args = declared.arguments(quick=True)
        declared.check(args, declared.configure(args))


def _no_computation(*args, **kwargs):
    raise AssertionError("computation started: the option was not refused before computing")


def test_features_a_method_ignores_are_not_bounded_by_n():
    checks.check_num_features("--num-features", 128, ["kernelized", "exact"], [64], at_most_n=True)
    with pytest.raises(Exception, match=r"--num-features: at most 64 for exact at n=64, got 128"):
        checks.check_num_features("--num-features", 128, ["exact"], [64])  # the method's own limit still holds


EXITING = {"zero": "import sys\nsys.exit(0)\n", "message": "import sys\nsys.exit('bye')\n"}


def _exiting_module(folder, kind, suffix) -> str:
    name = f"exiting_{kind}_{suffix}_{abs(hash(str(folder))):x}"
    (folder / f"{name}.py").write_text(EXITING[kind])
    return name


@pytest.mark.parametrize("kind", sorted(EXITING))
@pytest.mark.parametrize("how", ["--plugin", "--plugin --plot-only", "load_plugin", "method entry point",
                                 "study entry point"])
def test_a_plugin_that_calls_sys_exit_is_an_error_of_that_plugin(how, kind, tmp_path, monkeypatch, capsys,
                                                                 fresh_registry):
    """A plugin module that calls ``sys.exit`` used to end approxlab with its status (0) having run nothing:
    it is an error of that plugin, like any other exception it raises -- one line, exit 2, naming it on the
    command line; a RuntimeError from ``load_plugin``; a PluginWarning naming an entry point, whose methods or
    study are then missing while everything else works."""
    from approxlab.errors import PluginWarning
    from approxlab.methods import available, load_plugin
    from approxlab.studies import registry
    from test_registry import _install_distribution

    monkeypatch.syspath_prepend(str(tmp_path))
    module = _exiting_module(tmp_path, kind, how.replace(" ", "_").replace("-", ""))
    code = repr(0 if kind == "zero" else "bye")
    try:
        if how.startswith("--plugin"):
            extra = ["--plot-only"] if "plot-only" in how else ["--n", "64"]
            status, err = run_main(["figure1", "--plugin", module, *extra, "--out", str(tmp_path / "out")], capsys)
            assert_one_line_error(status, err, "figure1", f"--plugin: a module that imports and registers its "
                                                          f"methods or studies, got '{module}' (it called "
                                                          f"sys.exit({code}) while it was imported at ")
            assert not (tmp_path / "out").exists()
        elif how == "load_plugin":
            with pytest.raises(RuntimeError, match=rf"plugin module '{module}' called sys.exit\({re.escape(code)}\)"):
                load_plugin(module)
        elif how == "method entry point":
            _install_distribution(tmp_path, f"exiting-{kind}", f"[approxlab.methods]\nexiting = {module}\n", {})
            with pytest.warns(PluginWarning, match=rf"'exiting' = '{module}'.* failed to load \(SystemExit"):
                assert "nystromformer" in available() and "exiting" not in available()
        else:
            _install_distribution(tmp_path, f"exiting-{kind}", f"[approxlab.studies]\nexiting = {module}\n", {})
            with pytest.warns(PluginWarning, match=rf"'exiting' = '{module}'.* failed to load \(SystemExit"):
                assert main(["exiting"]) == 2
            assert "study 'exiting' is not available" in capsys.readouterr().err
            assert registry.describe("figure1") is not None
    finally:
        sys.modules.pop(module, None)


def _raises(q, k, v, *, num_features, generator=None):
    raise RuntimeError("the plugin's own bug")


def _wrong_shape(q, k, v, *, num_features, generator=None):
    return v[..., :1, :]  # one row where every query needs one


def _exits(q, k, v, *, num_features, generator=None):
    sys.exit(0)


FAILING = {
    "raises": (_raises, "RuntimeError: the plugin's own bug"),
    "wrong-shape": (_wrong_shape, r"MethodResultError: method 'wrong-shape' must return an output of shape "
                                  r"\(\*batch, n, p_v\) = \(2, 32, 8\); got \(2, 1, 8\)\."),
    "exits": (_exits, r"SystemExit: the method called sys.exit\(0\)"),
}
"""Registered methods that fail: the error each row must hold as its status."""


def test_a_registered_method_that_fails_gets_failed_rows_and_one_line(fresh_registry, synthetic_data, tmp_path,
                                                                     capsys):
    """As a built-in's numerical failure: rows with the error as their status (and inf errors), the run goes on
    to its report, and one line on stderr names each failing method -- never a traceback (one run of all)."""
    from approxlab.methods import register

    for name, (function, _) in FAILING.items():
        register(name, function, target="softmax", features="ignored", randomized=False)
    grid = [a if a != "skyformer-softmax,nystromformer" else ",".join([*FAILING, "nystromformer"]) for a in GRID]
    grid[grid.index("initialized,pretrained")] = "initialized"
    assert main(["figure1", "--out", str(tmp_path / "run"), *grid]) == 0
    results = engine.read_results(tmp_path / "run" / RESULTS)
    err = capsys.readouterr().err
    assert "Traceback" not in err and (results.loc[results["method"] == "nystromformer", "status"] == "ok").all()
    lines = [line for line in err.splitlines() if "failed in" in line]
    assert len(lines) == len(FAILING), err
    for (name, (_, status)), line in zip(FAILING.items(), lines):
        rows = results[results["method"] == name]
        assert len(rows) == 2 and rows["status"].str.fullmatch(status).all(), rows["status"].tolist()
        assert (rows["error_mean"] == float("inf")).all()
        assert re.fullmatch(rf"approxlab figure1: method '{name}' failed in 2 of its 2 rows of results\.csv\.bz2: "
                            rf"{status} \(those rows hold the error as their status\)", line), line
    assert (tmp_path / "run" / "summary.md").is_file() and (tmp_path / "run" / "figure1-extra.png").is_file()


def test_any_exception_of_a_method_is_its_failure_recorded_through_one_path():
    """Every study records any exception a method raises (a built-in's or a plugin's) as the failed rows' status,
    through :func:`method_status`; a KeyError of a built-in used to re-raise and end the run."""
    from approxlab.studies.engine import method_status

    assert method_status("nystromformer", ZeroDivisionError("x")) == "ZeroDivisionError: x"
    assert method_status("nystromformer", KeyError("a bug")) == "KeyError: 'a bug'"
    assert method_status("nystromformer", RuntimeError("two\nlines")) == "RuntimeError: two lines"


@pytest.mark.parametrize("plot_only", [True, False], ids=["plot-only", "compute"])
def test_a_folder_of_another_study_is_refused_in_one_line(plot_only, good_run, synthetic_data, tmp_path, capsys):
    """``figure1 --plot-only`` on a decoder folder raised KeyError: 'n' after writing figure1's products into it:
    the study is read from config.json and the folder refused, untouched, with or without --plot-only."""
    assert engine.read_json(good_run / "config.json")["run"]["study"] == "figure1"  # recorded by every run
    out = tmp_path / "decoder-run"
    out.mkdir()
    for name in ("config.json", "results.csv", "assumptions.csv"):
        shutil.copy(ROOT / "figures" / "decoder" / name, out / name)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    arguments = PLOT_ONLY if plot_only else [*GRID, "--restart"]
    status, err = run_main(["figure1", "--out", str(out), *arguments], capsys)
    assert_one_line_error(status, err, "figure1", f"--out: a folder of figure1 results, or a new one, got '{out}' "
                                                  "(its config.json is of the study 'decoder': `approxlab decoder")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != engine.LOCK_NAME} == before


def _rows_a_dict(cell):
    return {"value": 1.0}


def _rows_empty(cell):
    return []


def _rows_of_another_cell(cell):
    return [{"a": cell["a"] + 1, "value": 1.0}]


def _two_cells_one_key(config, settings):
    return [{"a": 0, "b": 1}, {"a": 0, "b": 2}]


def _one_cell(config, settings):
    return [{"a": 0}]


@pytest.mark.parametrize(("compute", "cells", "message"), [
    (_rows_a_dict, _one_cell, r"`compute` must return rows for the tables \['results.csv'\]; it returned \['value'\]\."),
    (_rows_empty, _one_cell, r"`compute` must return a non-empty list of dicts .* it returned list of length 0\."),
    (_rows_of_another_cell, _one_cell, r"`compute` returned a row with a=1 for the cell with a=0; rows must belong"),
    (_rows_a_dict, _two_cells_one_key, r"two cells share the key \{'a': 0\}; cell keys must be unique\."),
], ids=["a-dict", "no-rows", "another-cell", "two-cells-one-key"])
def test_a_registered_study_whose_cells_return_what_the_runner_cannot_use_is_one_line(compute, cells, message,
                                                                                       tmp_path, capsys):
    """A study from a plugin is user code: what its cells return is checked against the shape it must have and
    refused in one line naming the study and where it is defined (a built-in study's keeps its traceback)."""
    from approxlab.studies import Step, Study, Table, register, unregister

    study = Study(name="bad-rows", description="A study whose cells return the wrong thing.", full={}, quick={},
                  configure=lambda args: {"study": "bad-rows"},
                  steps=(Step((Table("results.csv", ("a",)),), compute, cells),))
    register(study)
    try:
        status, err = run_main(["bad-rows", "--out", str(tmp_path / "out"), "--no-progress"], capsys)
    finally:
        unregister("bad-rows")
    assert_one_line_error(status, err, "bad-rows", "the study 'bad-rows' (defined in test_cli_reliability) returned "
                                                   "what the runner cannot use: ")
    assert re.search(message, err), err
