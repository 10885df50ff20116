"""The studies' engine: resume, config hash, atomic writes, per-cell seeds, Dask executor, several tables."""

from __future__ import annotations

import os
import pathlib

import pandas as pd
import pytest
import torch

from approxlab import _io as atomic
from approxlab.errors import CorruptResultsError, StudyError
from approxlab.studies import Step, Table, engine
from approxlab.studies.engine import cell_key, cell_seed, config_hash, run_cells, run_steps

KEYS = ("a", "b")
CONFIG = {"grid": "toy", "a": [0, 1, 2], "b": ["x", "y"]}


def toy_cells(marker_dir=None):
    cells = [{"a": a, "b": b} for a in CONFIG["a"] for b in CONFIG["b"]]
    if marker_dir is not None:
        for cell in cells:
            cell["marker_dir"] = str(marker_dir)
    return cells


def toy_compute(cell):
    """Two rows per cell, random values drawn from the cell's own seed."""
    generator = torch.Generator().manual_seed(cell_seed(cell["a"], cell["b"]))
    values = torch.randn(2, generator=generator, dtype=torch.float64)
    return [{"rep": rep, "value": float(values[rep])} for rep in range(2)]


def killing_compute(cell):
    """Like toy_compute, but the first attempt at cell (1, "y") kills its worker process."""
    marker = pathlib.Path(cell["marker_dir"]) / "killed"
    if (cell["a"], cell["b"]) == (1, "y") and not marker.exists():
        marker.write_text("killed once")
        os._exit(1)
    return toy_compute(cell)


class Interrupt(Exception):
    pass


def interrupted_compute(limit):
    calls = {"n": 0}

    def compute(cell):
        if calls["n"] >= limit:
            raise Interrupt("simulated Ctrl-C")
        calls["n"] += 1
        return toy_compute(cell)

    return compute


def run(tmp_path, compute=toy_compute, **kwargs):
    kwargs.setdefault("config", CONFIG)
    kwargs.setdefault("cells", toy_cells())
    return run_cells(compute=compute, results_path=tmp_path / "results.csv", key_columns=KEYS,
                     progress=False, flush_every_seconds=0.0, **kwargs)


def no_temp_files(directory):
    return not any(p.name.startswith(atomic.TEMP_PREFIX) for p in pathlib.Path(directory).iterdir())


def test_run_writes_table_and_config(tmp_path):
    df = run(tmp_path)
    assert len(df) == 12 and list(df.columns[:2]) == ["a", "b"]
    saved = engine.read_json(tmp_path / "config.json")
    assert saved["config_hash"] == config_hash(CONFIG)
    assert saved["config"] == CONFIG and saved["tables"] == ["results.csv"]
    assert {"approxlab_version", "created", "updated"} <= set(saved)
    pd.testing.assert_frame_equal(df, engine.read_results(tmp_path / "results.csv"))
    assert no_temp_files(tmp_path)


def test_resume_after_interruption_has_no_duplicates_or_gaps(tmp_path):
    reference = run(tmp_path / "clean")
    with pytest.raises(Interrupt):
        run(tmp_path / "resumed", compute=interrupted_compute(limit=4))
    partial = engine.read_results(tmp_path / "resumed" / "results.csv")
    assert len(partial) == 8  # the 4 finished cells, 2 rows each, were saved
    assert no_temp_files(tmp_path / "resumed")
    calls = []

    def counting(cell):
        calls.append(cell_key(cell, KEYS))
        return toy_compute(cell)

    resumed = run(tmp_path / "resumed", compute=counting)
    assert len(calls) == 2  # only the missing cells were computed
    assert not resumed.duplicated(["a", "b", "rep"]).any()
    pd.testing.assert_frame_equal(resumed, reference)
    # A third run computes nothing.
    calls.clear()
    run(tmp_path / "resumed", compute=counting)
    assert calls == []


def test_changed_config_is_refused_unless_restart(tmp_path):
    run(tmp_path)
    with pytest.raises(StudyError, match="different configuration.*--out.*--restart"):
        run(tmp_path, config={**CONFIG, "grid": "other"})
    df = run(tmp_path, config={**CONFIG, "grid": "other"}, restart=True)
    assert len(df) == 12
    assert engine.read_json(tmp_path / "config.json")["config_hash"] == config_hash({**CONFIG, "grid": "other"})


def test_a_run_extended_along_its_growing_entries_computes_only_the_new_cells(tmp_path, capsys):
    run(tmp_path)
    calls = []

    def counting(cell):
        calls.append(cell_key(cell, KEYS))
        return toy_compute(cell)

    wider = {**CONFIG, "a": [0, 1, 2, 3]}
    cells = [{"a": a, "b": b} for a in wider["a"] for b in wider["b"]]
    with pytest.raises(StudyError, match="different configuration"):  # not declared as growing
        run(tmp_path, config=wider, cells=cells)
    table = run(tmp_path, config=wider, cells=cells, compute=counting, grows=("a",))
    assert sorted(calls) == [(3, "x"), (3, "y")] and len(table) == 16
    assert "extending the saved run (a: [0, 1, 2] -> [0, 1, 2, 3])" in capsys.readouterr().err
    assert engine.read_json(tmp_path / "config.json")["config_hash"] == config_hash(wider)
    with pytest.raises(StudyError, match="different configuration"):  # shrinking is not growing
        run(tmp_path, grows=("a",))


def test_an_extension_is_recorded_in_the_config_and_only_added_entries_extend(tmp_path, capsys):
    """A config whose lists only gained entries resumes the saved run (only the new cells run) and ``config.json``
    records what was added and when; a changed setting, a removed entry or a changed number inside a grown dict is
    refused as before."""
    nested = {**CONFIG, "configs": {"budget": 64, "methods": {"snapkv": [1, 2]}}}
    run(tmp_path, config=nested)
    calls = []

    def counting(cell):
        calls.append(cell_key(cell, KEYS))
        return toy_compute(cell)

    wider = {**nested, "a": [0, 1, 2, 3], "configs": {"budget": 64, "methods": {"snapkv": [1, 2, 3], "h2o": [1]}}}
    cells = [{"a": a, "b": b} for a in wider["a"] for b in wider["b"]]
    grows = ("a", "configs")
    table = run(tmp_path, config=wider, cells=cells, compute=counting, grows=grows)
    assert sorted(calls) == [(3, "x"), (3, "y")] and len(table) == 16
    record = engine.read_json(tmp_path / "config.json")
    assert record["config_hash"] == config_hash(wider) and len(record["extensions"]) == 1
    extension = record["extensions"][0]
    assert extension["from_config_hash"] == config_hash(nested) and extension["extended"] >= record["created"]
    assert extension["added"] == {"a": [3], "configs": {"methods": {"snapkv": [3], "h2o": [1]}}}
    assert "extending the saved run" in capsys.readouterr().err
    calls.clear()
    run(tmp_path, config=wider, cells=cells, compute=counting, grows=grows)  # the same config: nothing to add
    assert calls == [] and len(engine.read_json(tmp_path / "config.json")["extensions"]) == 1
    for changed in ({**wider, "grid": "other"}, {**wider, "a": [0, 1, 3]},
                    {**wider, "configs": {**wider["configs"], "budget": 128}},
                    {**wider, "configs": {"budget": 64, "methods": {"snapkv": [1, 2, 3]}}}):
        with pytest.raises(StudyError, match="different configuration"):
            run(tmp_path, config=changed, cells=cells, grows=grows)
    assert engine.read_json(tmp_path / "config.json")["config_hash"] == config_hash(wider)


def test_results_without_config_are_refused(tmp_path):
    run(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(StudyError, match="cannot be resumed safely"):
        run(tmp_path)


def test_config_hash_ignores_key_order_and_sees_values():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_cell_seed_is_deterministic_and_distinct():
    assert cell_seed("pretrained", 512, 3) == cell_seed("pretrained", 512, 3)
    seeds = {cell_seed(a, b) for a in range(10) for b in "xyz"}
    assert len(seeds) == 30
    assert cell_seed(1, base_seed=0) != cell_seed(1, base_seed=1)
    assert 0 <= cell_seed("a") < 2**63


def test_rows_do_not_depend_on_cell_order(tmp_path):
    forward = run(tmp_path / "forward")
    backward = run(tmp_path / "backward", cells=toy_cells()[::-1])
    key = ["a", "b", "rep"]
    pd.testing.assert_frame_equal(forward.sort_values(key).reset_index(drop=True),
                                  backward.sort_values(key).reset_index(drop=True))


def test_input_validation(tmp_path):
    with pytest.raises(TypeError, match="non-empty list of dicts"):
        run(tmp_path / "empty", compute=lambda cell: [])
    with pytest.raises(StudyError, match=r"the grid holds the cell \(a=0, b='x'\) twice: a value of a list option "
                                         "is given twice, perhaps written two ways"):
        run(tmp_path / "dup", cells=toy_cells() + toy_cells()[:1])  # one cell twice: a grid value given twice
    with pytest.raises(ValueError, match="share the key"):
        run(tmp_path / "clash", cells=toy_cells() + [{**toy_cells()[0], "other": 1}])  # a bug of the study's cells
    with pytest.raises(ValueError, match="at most one of `scheduler` and `workers`"):
        run(tmp_path / "both", scheduler="tcp://localhost:1", workers=2)
    with pytest.raises(ValueError, match="`workers` must be an integer >= 1"):
        run(tmp_path / "zero", workers=0)
    with pytest.raises(KeyError, match="lacks key column"):
        run(tmp_path / "nokey", cells=[{"a": 1}])
    with pytest.raises(ValueError, match="rows must belong to their cell"):
        run(tmp_path / "wrong", compute=lambda cell: [{"a": 99, "value": 1.0}])


def test_atomic_write_leaves_no_temp_file_and_keeps_old_content(tmp_path, monkeypatch):
    target = tmp_path / "file.txt"
    atomic.atomic_write_text(target, "old")

    def failing_replace(src, dst):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(atomic.os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated"):
        atomic.atomic_write_text(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert no_temp_files(tmp_path)
    with pytest.raises(TypeError, match="`data` must be bytes"):
        atomic.atomic_write_bytes(target, "text")
    with pytest.raises(FileNotFoundError, match="run the study's compute step first"):
        engine.read_results(tmp_path / "missing.csv")


def test_csv_round_trip_is_exact(tmp_path):
    df = pd.DataFrame({"x": [0.1, 1 / 3, 2.0**-40], "name": ["a", "b", "c"], "n": [1, 2, 3]})
    atomic.write_csv_atomic(df, tmp_path / "t.csv")
    pd.testing.assert_frame_equal(engine.read_results(tmp_path / "t.csv"), df)


@pytest.mark.parametrize(("suffix", "magic", "name"), [(".gz", b"\x1f\x8b", "gzip"), (".bz2", b"BZh9", "bzip2")])
def test_a_compressed_table_is_the_same_bytes_each_write_and_reads_back_exactly(tmp_path, suffix, magic, name):
    """A table named ``.csv.gz`` (sv-decay's ``spectra.csv.gz``) or ``.csv.bz2`` (Figure 1's ``results.csv.bz2``) is
    written compressed with no time stamp, so writing it again gives the same bytes; it reads back equal (pandas reads
    it as it is), and a damaged one is refused naming it and its format."""
    import bz2
    import gzip

    df = pd.DataFrame({"x": [0.1, 1 / 3, 2.0**-40], "name": ["a", "b", "c"], "n": [1, 2, 3]})
    path = engine.write_table(df, tmp_path / f"t.csv{suffix}", ["n"])
    first = path.read_bytes()
    decompress = {".gz": gzip.decompress, ".bz2": bz2.decompress}[suffix]
    assert first.startswith(magic) and decompress(first).decode() == df.to_csv(index=False)
    engine.write_table(df, path, ["n"])
    assert path.read_bytes() == first
    pd.testing.assert_frame_equal(engine.read_results(path), df)
    pd.testing.assert_frame_equal(pd.read_csv(path), df)
    path.write_bytes(first[: len(first) // 2])
    with pytest.raises(CorruptResultsError, match=rf"t\.csv\{suffix}.*not whole {name} data"):
        engine.read_results(path)


def test_a_table_saved_under_another_compression_is_resumed_and_renamed(tmp_path, capsys):
    """A folder saved when the study named its table ``results.csv`` resumes under ``results.csv.gz``: its finished
    cells, the journal's too, are kept and not computed again, the old table, manifest and journal are removed, and
    ``config.json`` lists the new name; ``stored_as`` finds the old table for a report that only reads."""
    reference = run(tmp_path / "clean")
    out = tmp_path / "saved"
    with pytest.raises(Interrupt):
        run(out, compute=interrupted_compute(limit=3))
    cell = toy_cells()[3]  # a fourth cell finished after the last write: in the journal only
    engine.append_journal(out / "results.csv", {"key_columns": list(KEYS), "key": [cell["a"], cell["b"]],
                                                "rows": [{**cell, **row} for row in toy_compute(cell)]})
    assert engine.stored_as(out / "results.csv.gz") == out / "results.csv"
    calls = []

    def counting(cell):
        calls.append(cell_key(cell, KEYS))
        return toy_compute(cell)

    resumed = run_cells(compute=counting, results_path=out / "results.csv.gz", key_columns=KEYS, progress=False,
                        flush_every_seconds=0.0, config=CONFIG, cells=toy_cells())
    assert len(calls) == 2
    assert "results.csv is now results.csv.gz" in capsys.readouterr().err
    pd.testing.assert_frame_equal(resumed, reference)
    pd.testing.assert_frame_equal(engine.read_results(out / "results.csv.gz"), reference)
    assert sorted(path.name for path in out.glob("results*")) == ["results.csv.gz", "results.csv.gz.cells"]
    assert engine.read_json(out / "config.json")["tables"] == ["results.csv.gz"]
    assert engine.stored_as(out / "results.csv") == out / "results.csv.gz"
    run(out)  # and back; then a restart discards the table under either name
    assert not (out / "results.csv.gz").exists() and (out / "results.csv").exists()
    calls.clear()
    run_cells(compute=counting, results_path=out / "results.csv.gz", key_columns=KEYS, progress=False,
              flush_every_seconds=0.0, config={**CONFIG, "grid": "other"}, cells=toy_cells(), restart=True)
    assert len(calls) == 6 and not (out / "results.csv").exists() and (out / "results.csv.gz").exists()


def test_a_table_name_must_end_in_a_table_suffix():
    with pytest.raises(ValueError, match=r"`name` must be a file name ending in \.csv, \.csv\.gz, \.csv\.bz2; "
                                         r"got 't\.csv\.xz'"):
        Table("t.csv.xz", ("a",))


def test_dask_local_cluster_matches_in_process_and_survives_a_killed_worker(tmp_path):
    """Two single-threaded worker processes: the CSV equals the in-process one byte for byte,
    even when a worker dies mid-sweep (Dask reschedules its cell; no duplicates, no gaps)."""
    reference = run(tmp_path / "inprocess", cells=toy_cells(tmp_path))
    run(tmp_path / "dask", compute=killing_compute, cells=toy_cells(tmp_path), workers=2)
    assert (tmp_path / "killed").exists()  # a worker really died
    assert (tmp_path / "dask" / "results.csv").read_bytes() == (tmp_path / "inprocess" / "results.csv").read_bytes()
    assert len(reference) == 12 and not reference.duplicated(["a", "b", "rep"]).any()


def plugin_compute(cell):
    """A cell that needs ``top-k``, a method only a ``--plugin`` module registers (not this module)."""
    import approxlab
    from approxlab.synthetic import synthetic_qkv

    q, k, v = synthetic_qkv((1,), 12, 4, generator=torch.Generator().manual_seed(cell_seed(cell["a"], cell["b"])))
    return [{"value": float(approxlab.approximate("top-k", q, k, v, num_features=3).output.sum())}]


def test_dask_workers_import_the_plugin_modules(tmp_path, top_k_plugin, monkeypatch):
    """`--plugin` modules loaded in the main process are imported in every Dask worker before its
    cells (without that, the workers do not know the method: the control below)."""
    from approxlab.methods import load_plugin
    from approxlab.studies.engine import executors

    load_plugin(top_k_plugin)
    reference = run(tmp_path / "inprocess", compute=plugin_compute, cells=toy_cells())
    on_dask = run(tmp_path / "dask", compute=plugin_compute, cells=toy_cells(), workers=2)
    pd.testing.assert_frame_equal(on_dask, reference)
    monkeypatch.setattr(executors, "with_plugins", lambda compute: compute)
    with pytest.raises(ValueError, match=r"`method` must be one of \[.*\]; got 'top-k'"):
        run(tmp_path / "control", compute=plugin_compute, cells=toy_cells(), workers=2)


# ------------------------------------------------------------- lock and stale files

HOLD_LOCK = """
import sys, time
from approxlab.studies.engine import output_lock
with output_lock(sys.argv[1], command="holder"):
    print("locked", flush=True)
    time.sleep(120)
"""


def _hold_lock(directory):
    """A separate process holding the lock of ``directory``; returns it once the lock is taken."""
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(directory)], stdout=subprocess.PIPE,
                              text=True, env=env)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_folder_locked_by_another_process_is_refused_naming_it(tmp_path):
    holder = _hold_lock(tmp_path)
    try:
        with pytest.raises(engine.OutputLockedError, match=f"process {holder.pid} on .*`holder`") as info:
            run(tmp_path)
        assert info.value.owner["pid"] == holder.pid
        assert not (tmp_path / "results.csv").exists()  # nothing was computed or written
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert len(run(tmp_path)) == 12  # the OS dropped the lock with its process


def test_the_lock_is_reentrant_and_released(tmp_path):
    with engine.output_lock(tmp_path, command="outer"):
        assert engine.read_json(tmp_path / (engine.LOCK_NAME + ".json"))["pid"] == os.getpid()
        assert len(run(tmp_path)) == 12  # run_cells inside a held lock (as under the CLI)
        assert (tmp_path / (engine.LOCK_NAME + ".json")).exists()  # the inner release kept the outer lock
    assert not (tmp_path / (engine.LOCK_NAME + ".json")).exists()
    with engine.output_lock(tmp_path, timeout=0):  # free again
        pass


def test_stale_temporary_files_are_removed_when_a_run_starts(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    stale = tmp_path / f"{atomic.TEMP_PREFIX}killed.csv"
    stale.write_text("a,b\n0,")  # what a run killed mid-write leaves
    other = tmp_path / "notes.txt"
    other.write_text("keep me")
    run(tmp_path)
    assert not stale.exists() and other.exists()
    assert no_temp_files(tmp_path)


# ------------------------------------------------------------------------ progress


def test_progress_without_a_terminal_logs_every_tenth(tmp_path, capsys):
    cells = [{"a": a, "b": "x"} for a in range(20)]
    run_cells(cells, toy_compute, results_path=tmp_path / "results.csv", key_columns=KEYS, config=CONFIG,
              progress=True)  # capsys: stderr is not a terminal
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"{tmp_path.name}/results.csv: 0/20 cells done, 20 to compute"
    done = [int(line.split(": ")[1].split("/")[0]) for line in lines[1:]]
    assert done == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]  # every 10% of the cells
    assert all("elapsed 0:00:" in line for line in lines[1:])
    assert all("remaining ~" in line for line in lines[1:-1]) and "remaining" not in lines[-1]
    assert "(10%)" in lines[1] and "(100%)" in lines[-1]


def test_a_long_tenth_still_gets_a_line_once_the_heartbeat_has_passed(monkeypatch):
    """Between two tenths, a cell that finishes ``heartbeat`` seconds or more after the last line writes one; one
    finishing sooner does not."""
    import io

    from approxlab.studies.engine import progress

    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    stream = io.StringIO()
    log = progress.ProgressLog(100, description="out/results.csv", stream=stream, heartbeat=600.0)
    for seconds in (599.0, 1.0, 300.0, 299.0, 301.0):  # the cell's finish, that long after the one before
        now[0] += seconds
        log.update()
    lines = stream.getvalue().splitlines()
    assert [line.split(": ")[1].split(",")[0] for line in lines] == ["0/100 cells done", "2/100 cells done (2%)",
                                                                     "5/100 cells done (5%)"]
    assert lines[1].endswith("elapsed 0:10:00, remaining ~8:10:00")


def test_the_remaining_time_weighs_the_cells_by_the_steps_cost(tmp_path, capsys, monkeypatch):
    """A step declaring ``cost``: its log's remaining time extrapolates the time per unit of cost, so cells four
    times as dear still ahead are not promised at the pace of the cheap ones done (without the cost, the log would
    say ~0:00:30 after the first cheap cell of a grid whose rest takes 0:01:30)."""
    from approxlab.studies.engine import progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])

    def timed(cell):
        now[0] += 10.0 * cell["n"]  # a cell takes 10 s per unit of its cost
        return [{"value": 1.0}]

    cells = [{"a": a, "b": "x", "n": n} for a, n in enumerate((1, 1, 4, 4))]
    step = Step((Table("results.csv", KEYS),), timed, cost=lambda cell: cell["n"])
    run_steps([(step, cells)], tmp_path / "out", config=CONFIG, progress=True, flush_every_seconds=0.0)
    lines = [line.split(": ", 1)[1] for line in capsys.readouterr().err.splitlines()]
    assert lines[1] == "1/4 cells done (25%), elapsed 0:00:10, remaining ~0:01:30"
    assert lines[2] == "2/4 cells done (50%), elapsed 0:00:20, remaining ~0:01:20"
    with pytest.raises(TypeError, match="`cost` must be callable or None; got int"):
        Step((Table("results.csv", KEYS),), timed, cost=4)


def test_a_terminal_bar_fills_by_the_cells_cost(tmp_path, capsys, monkeypatch):
    """On a terminal the tqdm bar's fill (and so its remaining time) follows the declared cost, the cells counted
    beside it: cells of cost 1, 1, 4, 4 fill a tenth, a fifth, three fifths, all (a bar counting cells: quarters)."""
    import io

    from approxlab.studies.engine import progress

    stream = io.StringIO()
    bar = progress.CostBar(5, 1, "out/results.csv", work=10.0, file=stream)
    fills = []
    for cost in (1, 1, 4, 4):
        progress.advance(bar, cost)
        fills.append(bar.bar.n / bar.bar.total)
    bar.close()
    assert fills == [0.1, 0.2, 0.6, 1.0]
    assert "1/5 cells]" in stream.getvalue() and stream.getvalue().rstrip().endswith("5/5 cells]")
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: True)
    step = Step((Table("results.csv", KEYS),), toy_compute, cost=lambda cell: 1 + cell["a"])
    run_steps([(step, toy_cells())], tmp_path / "out", config=CONFIG, progress=True, flush_every_seconds=0.0)
    err = capsys.readouterr().err
    assert "out/results.csv: 100%|" in err and err.rstrip().endswith("6/6 cells]")


def test_progress_counts_resumed_cells_and_reports_a_stop(tmp_path, capsys):
    cells = [{"a": a, "b": "x"} for a in range(7)]
    common = dict(results_path=tmp_path / "results.csv", key_columns=KEYS, config=CONFIG, progress=True,
                  flush_every_seconds=0.0)
    with pytest.raises(Interrupt):
        run_cells(cells, interrupted_compute(limit=3), **common)
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith(f"{tmp_path.name}/results.csv: 3/7 cells done (42%)")
    assert lines[-1].endswith("(stopped)")
    run_cells(cells, toy_compute, **common)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"{tmp_path.name}/results.csv: 3/7 cells done (3 saved before this run), 4 to compute"
    assert lines[-1].startswith(f"{tmp_path.name}/results.csv: 7/7 cells done (100%)")


def test_no_progress_and_terminals_get_no_log_lines(tmp_path, capsys, monkeypatch):
    run(tmp_path / "quiet")  # progress=False
    assert capsys.readouterr().err == ""
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)  # a terminal: tqdm's bar, not log lines
    from approxlab.studies.engine.progress import ProgressLog, progress_bar

    assert not isinstance(progress_bar(10, 0, True, "x"), ProgressLog)


# ------------------------------------------------------------------- several tables


def two_tables(cell):
    """Rows for two tables from one cell: a summary row and one row per rep."""
    rows = toy_compute(cell)
    return {"summary.csv": [{"total": sum(row["value"] for row in rows)}], "reps.csv": rows}


STEPS = [Step(tables=(Table("summary.csv", KEYS), Table("reps.csv", KEYS)), compute=two_tables),
         Step(tables=(Table("results.csv", KEYS),), compute=toy_compute)]


def run_two(out, steps=STEPS, cells=None, **kwargs):
    cells = toy_cells() if cells is None else cells
    return run_steps([(step, list(cells)) for step in steps], out, config=CONFIG, progress=False,
                     flush_every_seconds=0.0, **kwargs)


def test_a_cell_writes_several_tables_and_steps_share_one_config(tmp_path):
    tables = run_two(tmp_path)
    assert sorted(tables) == ["reps.csv", "results.csv", "summary.csv"]
    assert len(tables["summary.csv"]) == 6 and len(tables["reps.csv"]) == 12
    pd.testing.assert_frame_equal(tables["reps.csv"], tables["results.csv"])
    assert engine.read_json(tmp_path / "config.json")["tables"] == ["reps.csv", "results.csv", "summary.csv"]
    with pytest.raises(TypeError, match=r"a dict \{table name: rows\} for the tables \['summary.csv', 'reps.csv'\]"):
        run_two(tmp_path / "wrong", steps=[Step(tables=STEPS[0].tables, compute=toy_compute)])
    with pytest.raises(ValueError, match=r"rows for the tables \['summary.csv', 'reps.csv'\]; it returned \['reps.csv'\]"):
        run_two(tmp_path / "half", steps=[Step(tables=STEPS[0].tables, compute=lambda c: {"reps.csv": [{}]})])


def test_a_cell_missing_from_one_of_its_tables_is_computed_again_and_replaces_its_rows(tmp_path):
    reference = run_two(tmp_path / "clean")
    run_two(tmp_path / "damaged")
    reps = engine.read_results(tmp_path / "damaged" / "reps.csv")
    kept = reps[~((reps["a"] == 1) & (reps["b"] == "y"))]
    engine.write_table(kept, tmp_path / "damaged" / "reps.csv", KEYS)  # as if killed between the two tables
    calls = []

    def counting(cell):
        calls.append(cell_key(cell, KEYS))
        return two_tables(cell)

    again = run_two(tmp_path / "damaged", steps=[Step(tables=STEPS[0].tables, compute=counting), STEPS[1]])
    assert calls == [(1, "y")]
    for name in ("summary.csv", "reps.csv"):
        pd.testing.assert_frame_equal(again[name], reference[name])


def grouped_two_tables(cells):
    """:func:`two_tables` of each cell of one group (cells that share ``a``)."""
    assert len({cell["a"] for cell in cells}) == 1
    return [two_tables(cell) for cell in cells]


def test_a_step_with_a_group_computes_its_cells_together_and_saves_each(tmp_path):
    """Cells that agree on the step's ``group`` reach ``compute`` as one list; the tables are those of the cells
    computed one by one, in process and on Dask; a resumed run passes only the cells still to compute."""
    reference = run_two(tmp_path / "alone", steps=[STEPS[0]])
    calls = []

    def counting(cells):
        calls.append([cell_key(cell, KEYS) for cell in cells])
        return grouped_two_tables(cells)

    step = Step(tables=STEPS[0].tables, compute=counting, group=("a",))
    grouped = run_two(tmp_path / "grouped", steps=[step])
    assert calls == [[(0, "x"), (0, "y")], [(1, "x"), (1, "y")], [(2, "x"), (2, "y")]]
    for name in ("summary.csv", "reps.csv"):
        pd.testing.assert_frame_equal(grouped[name], reference[name])
        assert (tmp_path / "grouped" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes()
    summary = engine.read_results(tmp_path / "grouped" / "summary.csv")
    engine.write_table(summary[summary["b"] != "y"], tmp_path / "grouped" / "summary.csv", KEYS)
    calls.clear()
    run_two(tmp_path / "grouped", steps=[step])
    assert calls == [[(0, "y")], [(1, "y")], [(2, "y")]]
    on_dask = run_two(tmp_path / "dask", steps=[Step(STEPS[0].tables, grouped_two_tables, group=("a",))], workers=2)
    assert (tmp_path / "dask" / "reps.csv").read_bytes() == (tmp_path / "alone" / "reps.csv").read_bytes()
    assert len(on_dask["summary.csv"]) == 6
    with pytest.raises(TypeError, match=r"a list of one result per cell \(2\); it returned list of length 1"):
        run_two(tmp_path / "short", steps=[Step(STEPS[0].tables, lambda cells: [two_tables(cells[0])], group=("a",))])
    for group in ("a", ("c",)):
        with pytest.raises(ValueError, match=r"`group` must be a tuple of the key columns \('a', 'b'\)"):
            Step(STEPS[0].tables, grouped_two_tables, group=group)


def test_an_optional_table_may_get_no_rows_from_a_cell(tmp_path):
    """A cell may give an optional table no rows (the per-layer rows of a method that failed): it is done all the
    same and not computed again; a table that is not optional needs a row from every cell."""
    calls = []

    def compute(cell):
        calls.append(cell_key(cell, KEYS))
        return {"summary.csv": [{"total": 1.0}], "reps.csv": [] if cell["a"] == 1 else toy_compute(cell)}

    tables = (Table("summary.csv", KEYS), Table("reps.csv", KEYS, optional=True))
    found = run_two(tmp_path / "run", steps=[Step(tables, compute)])
    assert len(found["summary.csv"]) == 6 and sorted(set(found["reps.csv"]["a"])) == [0, 2] and len(calls) == 6
    run_two(tmp_path / "run", steps=[Step(tables, compute)])
    assert len(calls) == 6
    with pytest.raises(TypeError, match=r"a non-empty list of dicts \(one per result row\) for table reps.csv"):
        run_two(tmp_path / "required", steps=[Step((tables[0], Table("reps.csv", KEYS)), compute)])


@pytest.mark.parametrize("first_optional", [False, True])
def test_an_optional_table_missing_a_cell_does_not_recompute_it(tmp_path, first_optional):
    """A step's optional table (per-layer rows kept out of the repository, or added after the run was made) does not
    decide what is done: a cell the step's other table holds is not computed again to fill it; a cell it lacks is,
    and fills both. Where every table of the step is optional (rows of a policy added to a saved run beside their
    per-layer rows), the first one decides: a clone without the second computes no cell again."""
    tables = (Table("summary.csv", KEYS, optional=first_optional), Table("reps.csv", KEYS, optional=True))
    run_two(tmp_path, steps=[Step(tables=tables, compute=two_tables)])
    (tmp_path / "reps.csv").unlink()
    (tmp_path / "reps.csv.cells").unlink(missing_ok=True)
    summary = engine.read_results(tmp_path / "summary.csv")
    engine.write_table(summary[summary["a"] != 2], tmp_path / "summary.csv", KEYS)
    calls = []

    def counting(cell):
        calls.append(cell_key(cell, KEYS))
        return two_tables(cell)

    again = run_two(tmp_path, steps=[Step(tables=tables, compute=counting)])
    assert sorted(calls) == [(2, "x"), (2, "y")]
    assert len(again["summary.csv"]) == 6 and sorted(set(again["reps.csv"]["a"])) == [2]
