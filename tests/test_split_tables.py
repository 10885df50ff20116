"""A table split by a key column: one file per value, read back as one table; resumed, split when saved whole,
recomputed where a part was cut short, removed by a restart."""

from __future__ import annotations

import pandas as pd
import pytest

from approxlab.studies import Step, Table, engine
from approxlab.studies.engine import run_steps
from approxlab.studies.engine.parts import part_path

KEY = ("n", "seed")
CELLS = [{"n": n, "seed": seed} for n in (64, 128, 1024) for seed in range(3)]
CONFIG = {"n": [64, 128, 1024], "seeds": 3}


def compute(cell):
    return [{"rep": rep, "value": cell["n"] * 10 + cell["seed"] + rep / 4} for rep in range(2)]


def run(out, split="n", cells=CELLS, counting=None, **kwargs):
    def counted(cell):
        if counting is not None:
            counting.append((cell["n"], cell["seed"]))
        return compute(cell)

    step = Step((Table("results.csv.gz", KEY, split=split),), counted)
    tables = run_steps([(step, cells)], out, config=CONFIG, progress=False, flush_every_seconds=0.0, **kwargs)
    return tables["results.csv.gz"]


def reference():
    rows = [{**cell, **row} for cell in CELLS for row in compute(cell)]
    return pd.DataFrame.from_records(rows)


def test_a_split_table_is_one_file_per_value_read_back_as_one(tmp_path):
    table = run(tmp_path)
    names = sorted(path.name for path in tmp_path.glob("results*"))
    assert names == ["results.n=1024.csv.gz", "results.n=1024.csv.gz.cells", "results.n=128.csv.gz",
                     "results.n=128.csv.gz.cells", "results.n=64.csv.gz", "results.n=64.csv.gz.cells"]
    assert [path.name for path in engine.part_paths(tmp_path / "results.csv.gz")] == [
        "results.n=64.csv.gz", "results.n=128.csv.gz", "results.n=1024.csv.gz"]  # by size, not by name
    pd.testing.assert_frame_equal(table, reference())
    pd.testing.assert_frame_equal(engine.read_results(tmp_path / "results.csv.gz"), reference())
    assert set(pd.read_csv(tmp_path / "results.n=128.csv.gz")["n"]) == {128}
    assert engine.read_json(tmp_path / "config.json")["tables"] == ["results.csv.gz"]


def test_a_table_saved_whole_is_split_by_the_next_run_and_nothing_is_computed_again(tmp_path):
    calls = []
    run(tmp_path, split=None, cells=CELLS[:5])
    assert (tmp_path / "results.csv.gz").exists()
    table = run(tmp_path, counting=calls)
    assert calls == [(cell["n"], cell["seed"]) for cell in CELLS[5:]]
    assert not (tmp_path / "results.csv.gz").exists() and not (tmp_path / "results.csv.gz.cells").exists()
    assert len(engine.part_paths(tmp_path / "results.csv.gz")) == 3
    pd.testing.assert_frame_equal(table, reference())
    calls.clear()
    run(tmp_path, counting=calls)  # all saved: nothing computed, the parts unchanged
    assert calls == []
    pd.testing.assert_frame_equal(engine.read_results(tmp_path / "results.csv.gz"), reference())


def test_a_whole_table_left_beside_parts_by_a_kill_is_the_one_read_and_split_again(tmp_path):
    """The whole table is removed only after every part is written: a kill in between leaves both, and the whole
    one (with the journal) holds every finished cell."""
    run(tmp_path)
    whole = reference()[lambda frame: frame["n"] < 1024]
    engine.store.write_csv_atomic(whole, tmp_path / "results.csv.gz")
    pd.testing.assert_frame_equal(engine.read_results(tmp_path / "results.csv.gz"), whole)
    calls = []
    table = run(tmp_path, counting=calls)
    assert calls == [(1024, seed) for seed in range(3)]
    assert not (tmp_path / "results.csv.gz").exists()
    pd.testing.assert_frame_equal(table, reference())
    engine.write_table(whole, tmp_path / "results.csv.gz", list(KEY))  # saved whole again: no part is left
    assert engine.part_paths(tmp_path / "results.csv.gz") == []


def test_a_part_cut_short_has_its_cell_computed_again(tmp_path):
    run(tmp_path)
    part = tmp_path / "results.n=128.csv.gz"
    rows = pd.read_csv(part)
    engine.store.write_csv_atomic(rows.iloc[:-1], part)  # the last cell of the part lost a row
    with pytest.raises(Exception, match="lack rows"):
        engine.read_results(tmp_path / "results.csv.gz")
    calls = []
    table = run(tmp_path, counting=calls)
    assert calls == [(128, 2)]
    pd.testing.assert_frame_equal(table, reference())


def test_a_restart_removes_every_part(tmp_path):
    run(tmp_path)
    calls = []
    run(tmp_path, cells=CELLS[:2], counting=calls, restart=True)
    assert calls == [(64, 0), (64, 1)]
    assert [path.name for path in engine.part_paths(tmp_path / "results.csv.gz")] == ["results.n=64.csv.gz"]


def test_the_split_column_must_be_a_key_column_and_make_a_file_name():
    with pytest.raises(ValueError, match=r"`split` must be one of the key columns \('n', 'seed'\) or None; got 'm'"):
        Table("results.csv", KEY, split="m")
    with pytest.raises(ValueError, match=r"a value of the split column 'task' must make a file name; got 'a/b'"):
        part_path("results.csv", "task", "a/b")
    with pytest.raises(ValueError, match=r"`split` must be one of the key columns \['n', 'seed'\]; got 'm'"):
        engine.write_table(reference(), "unused.csv", list(KEY), split="m")
