"""What ``approxlab`` does when the user says nothing: where results go, how many threads, what it prints.

* ``--out`` defaults to ``approxlab-results/<study>[-quick]`` in the current directory: a study run
  in a clone of the repository leaves ``git status`` clean (the committed ``figures/`` untouched);
* one torch thread per process unless ``--threads`` or ``$OMP_NUM_THREADS`` says otherwise;
* ``approxlab`` alone lists the studies, one line each (exit 0), ``--version`` prints the version;
* the progress bars of transformers and huggingface_hub are off while a study runs.

The study runs use the tiny synthetic grid of ``tests/test_cli_reliability.py`` (in-process).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest
import torch

import approxlab
from approxlab import cli
from approxlab.studies import STUDIES, driver, registry
from approxlab.studies.engine import environment
from approxlab.studies.inputs import wikitext

from test_cli_errors import assert_one_line_error, run_main
from test_cli_reliability import GRID
from test_figure1 import synthetic_data, synthetic_loader  # noqa: F401 (fixture)

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def synthetic_figure1(monkeypatch):
    """``approxlab figure1`` on synthetic Q/K/V (no model, no corpus)."""
    monkeypatch.setattr(wikitext, "load_qkv", synthetic_loader)
    wikitext.clear_caches()
    yield
    wikitext.clear_caches()


def _git(*arguments, cwd):
    return subprocess.run(["git", *arguments], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def clone(tmp_path):
    """A clone of this repository's committed tree (shares its objects: no copy of the history)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of approxlab")
    _git("clone", "--quiet", "--shared", str(ROOT), str(tmp_path / "clone"), cwd=tmp_path)
    return tmp_path / "clone"


def test_a_study_run_in_a_clone_leaves_git_status_clean(clone, synthetic_figure1, monkeypatch, capsys):
    monkeypatch.chdir(clone)
    assert cli.main(["figure1", "--quick", *GRID]) == 0, capsys.readouterr().err
    assert (clone / "approxlab-results" / "figure1-quick" / "results.csv.bz2").is_file()
    assert (clone / "approxlab-results" / "figure1-quick" / "summary.md").is_file()
    assert _git("status", "--porcelain", "--untracked-files=all", cwd=clone) == ""


def test_the_default_folder_is_in_the_current_directory(synthetic_figure1, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["figure1", *GRID]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["approxlab-results"]
    assert [p.name for p in (tmp_path / "approxlab-results").iterdir()] == ["figure1"]
    assert "-> approxlab-results/figure1" in capsys.readouterr().out


def test_a_refused_run_leaves_no_default_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    status, err = run_main(["figure1", "--methods", "nope", "--no-progress"], capsys)
    assert_one_line_error(status, err, "figure1", "--methods")
    assert not any(tmp_path.iterdir())


def test_no_arguments_lists_every_study_one_line_each(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    for name in STUDIES:
        lines = [line for line in out.splitlines() if line.split()[:1] == [name]]
        assert len(lines) == 1, (name, out)
        assert registry.describe(name) in lines[0]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"approxlab {approxlab.__version__}"
    assert approxlab.__version__[0].isdigit()


@pytest.mark.parametrize(("option", "environ", "expected"), [
    (None, {}, (1, "default")),
    (None, {"MKL_NUM_THREADS": "3"}, (3, "$MKL_NUM_THREADS")),
    (None, {"OMP_NUM_THREADS": "2,1", "MKL_NUM_THREADS": "3"}, (2, "$OMP_NUM_THREADS")),
    (4, {"OMP_NUM_THREADS": "2"}, (4, "--threads")),
])
def test_requested_threads(option, environ, expected):
    assert environment.requested_threads(option, environ) == expected


def _recorded_threads(out) -> int:
    return json.loads((out / "config.json").read_text())["run"]["threads"]


def test_a_study_computes_with_one_thread_unless_told(synthetic_figure1, tmp_path, monkeypatch, capsys):
    for name in environment.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    assert cli.main(["figure1", "--out", str(tmp_path / "default"), *GRID]) == 0, capsys.readouterr().err
    assert _recorded_threads(tmp_path / "default") == 1
    assert cli.main(["figure1", "--out", str(tmp_path / "two"), "--threads", "2", *GRID]) == 0
    assert _recorded_threads(tmp_path / "two") == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cli.main(["figure1", "--out", str(tmp_path / "env"), *GRID]) == 0
    assert _recorded_threads(tmp_path / "env") == 2
    assert torch.get_num_threads() == before  # a library user's setting is restored


@pytest.mark.parametrize("value", ["0", "many", "-1"])
def test_a_bad_thread_variable_is_one_line(value, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    status, err = run_main(["figure1", "--out", str(tmp_path / "run"), "--no-progress"], capsys)
    assert_one_line_error(status, err, "figure1", "$OMP_NUM_THREADS")
    assert repr(value) in err


def test_local_workers_start_with_the_thread_count(monkeypatch):
    import dask

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with environment.study_threads(1, local_workers=True):
        assert dask.config.get("distributed.nanny.pre-spawn-environ.OMP_NUM_THREADS") == 1
        assert dask.config.get("distributed.nanny.pre-spawn-environ.MKL_NUM_THREADS") == 1
        assert dask.config.get("distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_") is None
        os.environ["OMP_NUM_THREADS"] = "1"  # as Dask's nanny writes it before it starts a worker
    assert "OMP_NUM_THREADS" not in os.environ


def test_third_party_bars_are_off_while_a_study_runs(monkeypatch):
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as transformers_logging

    for name in environment.WORKER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not are_progress_bars_disabled() and transformers_logging.is_progress_bar_enabled()
    with environment.third_party_bars_off():
        assert are_progress_bars_disabled()
        assert not transformers_logging.is_progress_bar_enabled()
        assert all(os.environ[name] == value for name, value in environment.WORKER_VARIABLES.items())
    assert not are_progress_bars_disabled() and transformers_logging.is_progress_bar_enabled()
    assert not set(environment.WORKER_VARIABLES) & set(os.environ)


def test_the_cli_runs_a_study_with_the_bars_off(synthetic_figure1, tmp_path, monkeypatch, capsys):
    from huggingface_hub.utils import are_progress_bars_disabled

    seen = []
    original = driver.run
    monkeypatch.setattr(driver, "run", lambda study, args: seen.append(are_progress_bars_disabled())
                        or original(study, args))
    assert cli.main(["figure1", "--out", str(tmp_path / "run"), *GRID]) == 0, capsys.readouterr().err
    assert seen == [True]
    assert not are_progress_bars_disabled()


def _worker_environment(cell):
    return {name: os.environ.get(name) for name in cell["names"]}


def test_a_local_worker_starts_without_a_malloc_threshold(monkeypatch):
    """Dask's default ``MALLOC_TRIM_THRESHOLD_`` switches glibc's dynamic mmap threshold off (every large tensor
    a fresh mmap: 2.3x the CPU time of a study cell); a study's local worker starts without it."""
    from approxlab.studies.engine.executors import Executor

    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    found = []
    with environment.study_threads(1, local_workers=True), Executor(workers=1) as executor:
        executor.run([("key", {"names": ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS")})], _worker_environment,
                     lambda key, cell, rows: found.append(rows))
    assert found == [{"MALLOC_TRIM_THRESHOLD_": None, "OMP_NUM_THREADS": "1"}]


def test_numpy_blas_computes_with_the_study_thread_count():
    """A study's reports multiply many small numpy matrices; numpy's BLAS keeps to ``--threads`` in the block (its
    threads waiting on busy cores cost 20x), and gets its former count back afterwards."""
    from threadpoolctl import threadpool_info

    def blas_threads():
        return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]

    before = blas_threads()
    assert before, "numpy loads a BLAS"
    with environment.study_threads(1):
        assert set(blas_threads()) == {1}
    assert blas_threads() == before


def test_a_dask_cell_hands_its_freed_memory_back_after_it_ran_or_failed(monkeypatch):
    """Without Dask's malloc threshold a worker keeps the heap its cells freed, and a long run's workers crept to
    Dask's pause threshold; each cell on Dask is now followed by glibc's ``malloc_trim(0)``, also when it fails."""
    from approxlab.studies.engine import executors

    trimmed = []
    monkeypatch.setattr(environment, "release_memory", lambda: trimmed.append(True) or True)
    assert executors._trimmed(lambda cell: cell + 1, 1) == 2 and trimmed == [True]
    with pytest.raises(ZeroDivisionError):
        executors._trimmed(lambda cell: 1 / cell, 0)
    assert trimmed == [True, True]
    monkeypatch.undo()
    assert environment.release_memory() is (environment._malloc_trim() is not None)
