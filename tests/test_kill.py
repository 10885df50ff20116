"""Kills at several moments of a run lose no finished cell, and the resumed table equals an uninterrupted one.

``approxlab figure1`` runs in a subprocess on the tests' synthetic Q/K/V (the stand-ins of
``tests/test_figure1.py``), each cell slowed by a short sleep so that there is time to aim. The
test watches the progress lines on stderr (``<out>/<table>: k/N cells``: the runner prints one
after each cell it has made durable) and sends ``SIGKILL``, ``SIGTERM`` or ``SIGINT`` after a
chosen line of a chosen table. Then:

* every cell reported done is on disk (the table plus its journal, as ``read_results`` reads them);
* ``SIGTERM`` and ``SIGINT`` exit 143 and 130 with a one-line note that rerunning resumes;
* rerunning the compute step of the same command finishes the run, and its tables equal those of
  an uninterrupted run (wall times excepted), with no journal or temporary file left.

The kills run concurrently (each in its own folder), so the whole test takes seconds.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import threading

import pandas as pd
import pytest

import test_figure1
from approxlab import _io
from approxlab.studies import compute, engine, figure1
from approxlab.studies.inputs import wikitext
from test_figure1 import synthetic_data  # noqa: F401,F811  (fixture)

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = pathlib.Path(__file__).resolve().parent
TABLES = ("results.csv.bz2", "conditioning.csv", "windows.csv")
KEYS = {"results.csv.bz2": ["condition", "n", "dtype", "window", "method"], "conditioning.csv": ["condition", "n"],
        "windows.csv": ["condition", "n", "window"]}
ARGUMENTS = ["--n", "32,48", "--num-features", "4,8", "--methods", "skyformer-softmax,nystromformer",
             "--windows", "1", "--seeds", "2", "--dtypes", "float64"]  # 8 + 4 + 4 cells
SECONDS_PER_CELL = 0.25

SCRIPT = f"""
import dataclasses, sys, time
sys.path.insert(0, {str(TESTS)!r})
from approxlab import cli
from approxlab.studies import figure1
from approxlab.studies.inputs import wikitext
from test_figure1 import synthetic_loader

wikitext.load_qkv = synthetic_loader

def slowed(compute):
    def run(cell):
        time.sleep({SECONDS_PER_CELL})
        return compute(cell)
    return run

figure1.STUDY = dataclasses.replace(figure1.STUDY, steps=tuple(dataclasses.replace(step, compute=slowed(step.compute))
                                                               for step in figure1.STUDY.steps))
sys.exit(cli.main(sys.argv[1:]))
"""

# (signal, table, progress count after which it is sent)
KILLS = [
    (signal.SIGKILL, "results.csv.bz2", 0),
    (signal.SIGKILL, "results.csv.bz2", 3),
    (signal.SIGKILL, "conditioning.csv", 2),
    (signal.SIGTERM, "results.csv.bz2", 1),
    (signal.SIGTERM, "windows.csv", 2),
    (signal.SIGINT, "results.csv.bz2", 5),
    (signal.SIGINT, "conditioning.csv", 1),
]
PROGRESS = re.compile(r"^(?P<folder>[^:]+)/(?P<table>[a-z_]+\.csv(?:\.gz|\.bz2)?): (?P<done>\d+)/(?P<total>\d+) cells")


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}


def _kill_at(out: pathlib.Path, signum, table: str, count: int) -> dict:
    """Run the study into ``out``; send ``signum`` after the progress line ``table: count/N``."""
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, "figure1", "--out", str(out), *ARGUMENTS],
                               cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    lines, sent = [], False
    with process:
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            match = PROGRESS.match(line)
            if not sent and match and match["table"] == table and int(match["done"]) >= count:
                process.send_signal(signum)
                sent = True
        returncode = process.wait(timeout=120)
    return {"returncode": returncode, "stderr": lines, "sent": sent}


def _reported(lines) -> dict:
    """The most cells each table reported done before the process ended."""
    done = {table: 0 for table in TABLES}
    for line in lines:
        match = PROGRESS.match(line)
        if match:
            done[match["table"]] = max(done[match["table"]], int(match["done"]))
    return done


def _on_disk(out: pathlib.Path, table: str) -> int:
    if not engine.has_results(out / table):
        return 0
    frame = engine.read_results(out / table, partial="drop")
    return len(frame.drop_duplicates(KEYS[table])) if len(frame) else 0


def _tables(out: pathlib.Path) -> dict:
    return {table: engine.read_results(out / table).drop(columns="seconds", errors="ignore") for table in TABLES}


def _compute(out: pathlib.Path) -> dict:
    """The compute step of the same command, in-process (the plot step is not under test here)."""
    config = figure1.build_config(n=[32, 48], num_features=[4, 8], methods=["skyformer-softmax", "nystromformer"],
                                  windows=1, seeds=2, dtypes=["float64"])
    compute(figure1.STUDY, config, out, progress=False)
    return _tables(out)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    wikitext.clear_caches()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wikitext, "load_qkv", test_figure1.synthetic_loader)
        yield _compute(tmp_path_factory.mktemp("uninterrupted"))
    wikitext.clear_caches()


@pytest.fixture(scope="module")
def killed_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("killed")
    runs = {}

    def one(index, kill):
        runs[index] = _kill_at(base / f"run{index}", *kill)

    threads = [threading.Thread(target=one, args=(i, kill)) for i, kill in enumerate(KILLS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    return base, runs


@pytest.mark.parametrize("index", range(len(KILLS)),
                         ids=[f"{signal.Signals(s).name}-after-{t}-{c}" for s, t, c in KILLS])
def test_a_kill_loses_no_reported_cell_and_the_resumed_table_equals_an_uninterrupted_one(
        index, killed_runs, uninterrupted, synthetic_data):
    base, runs = killed_runs
    signum, table, count = KILLS[index]
    run, out = runs[index], base / f"run{index}"
    assert run["sent"], "\n".join(run["stderr"])
    if signum == signal.SIGKILL:
        assert run["returncode"] == -signal.SIGKILL
    else:
        assert run["returncode"] == 128 + signum, "\n".join(run["stderr"])
        assert run["stderr"][-1] == (f"approxlab figure1: stopped by {signal.Signals(signum).name}; every finished "
                                     "cell is saved. Rerun the same command to resume.")
        assert not any("Traceback" in line for line in run["stderr"])
    reported = _reported(run["stderr"])
    assert reported[table] >= count
    for name in TABLES:
        assert _on_disk(out, name) >= reported[name], (name, reported, run["stderr"])

    resumed = _compute(out)
    for name in TABLES:
        pd.testing.assert_frame_equal(resumed[name], uninterrupted[name])
    leftovers = [p.name for p in out.iterdir() if p.name.endswith(engine.JOURNAL_SUFFIX)
                 or p.name.startswith(_io.TEMP_PREFIX)]
    assert leftovers == []


# ---------------------------------------------------------------- Ctrl-C of a --workers run

WORKERS_SCRIPT = f"""
import dataclasses, sys, time
sys.path.insert(0, {str(TESTS)!r})
from approxlab import cli
from approxlab.studies import figure1
from approxlab.studies.inputs import wikitext
from test_figure1 import synthetic_loader

wikitext.load_qkv = synthetic_loader  # in the workers too: Dask's spawned processes import this file first


def slowed(compute):
    def run(cell):
        time.sleep(2.0)
        return compute(cell)
    return run

figure1.STUDY = dataclasses.replace(figure1.STUDY, steps=tuple(dataclasses.replace(step, compute=slowed(step.compute))
                                                               for step in figure1.STUDY.steps))
if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
"""


def test_ctrl_c_of_a_workers_run_prints_only_the_stop_line(tmp_path):
    """Ctrl-C reaches every process of the run's group, the local cluster's workers included, while cells run on
    them: the run exits 130 and stderr holds its progress lines and the one stop line, no worker's traceback, log
    record or cancellation warning."""
    script = tmp_path / "run_study.py"
    script.write_text(WORKERS_SCRIPT)
    process = subprocess.Popen([sys.executable, str(script), "figure1", "--out", str(tmp_path / "out"), *ARGUMENTS,
                                "--workers", "2"], cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines, sent = [], False
    with process:
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            match = PROGRESS.match(line)
            if not sent and match and int(match["done"]) >= 1:  # a cell done: the workers are in the next ones
                os.killpg(process.pid, signal.SIGINT)
                sent = True
        returncode = process.wait(timeout=120)
    assert sent, "\n".join(lines)
    assert returncode == 128 + signal.SIGINT, "\n".join(lines)
    assert lines[-1] == ("approxlab figure1: stopped by SIGINT; every finished cell is saved. Rerun the same command "
                         "to resume.")
    assert [line for line in lines[:-1] if not PROGRESS.match(line)] == []


class _StopsWhileCollected:
    """An object whose finalizer receives Ctrl-C: Python prints the exception raised there and goes on."""

    def __del__(self):
        signal.raise_signal(signal.SIGINT)


def test_ctrl_c_raised_where_python_swallows_it_still_stops_the_run_after_the_next_cell_and_prints_nothing(capfd):
    """A signal's exception raised in a finalizer (or a GC callback, as Dask's ``GCDiagnosis``) never reaches the
    run; the stop is remembered, the executor raises it once the cell in progress is saved, and no traceback is
    printed."""
    from approxlab.studies import driver
    from approxlab.studies.engine.executors import Executor

    computed, saved = [], []
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN where the tests run in the background

    def compute(cell):
        computed.append(cell)
        if cell == 0:
            _StopsWhileCollected()  # collected at once: its __del__ swallows the Stopped
        return cell

    with pytest.raises(driver.Stopped) as stopped, driver.orderly_stop():
        with Executor() as executor:
            executor.run([(f"key{cell}", cell) for cell in range(3)], compute,
                         lambda key, cell, result: saved.append(result))
    assert stopped.value.signum == signal.SIGINT
    assert (computed, saved) == ([0], [0])
    assert "Exception ignored" not in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) == before  # the handler of before the block, restored
