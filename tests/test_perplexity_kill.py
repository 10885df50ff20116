"""A perplexity run killed mid-way (SIGKILL, SIGTERM) loses no finished cell; resumed, it equals an uninterrupted run.

``approxlab perplexity`` runs in a subprocess on a tiny random Llama, its patched cells slowed by a short sleep so
that there is time to aim; the test sends the signal after a chosen progress line of ``perplexity.csv.gz`` (the runner
prints one after each cell it has made durable), then checks that every reported cell is on disk, resumes the
compute step in-process and compares every table with an uninterrupted run's (wall times excepted). The kills run
concurrently, each in its own folder.
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
from test_models_qkv import save_tiny_checkpoint

from approxlab.studies import compute, perplexity
from approxlab.studies.engine import has_results, read_results

ROOT = pathlib.Path(__file__).resolve().parents[1]
TABLES = {"baseline.csv": ["setting", "window"],
          "perplexity.csv.gz": ["setting", "layers", "method", "num_features", "window"],
          "layer_errors.csv": ["setting", "layers", "method", "num_features", "window"],
          "encoder.csv": ["method", "num_features", "window"], "cost.csv": ["method"]}
VALUES = {"n": [16], "context": 12, "continuation": 4, "num_features": [4], "methods": ["performer"],
          "encoder_methods": ["nystromformer"], "layer_settings": ["all"], "windows": 2,
          "long_n": []}
ARGUMENTS = ["--n", "16", "--context", "12", "--continuation", "4", "--num-features", "4", "--methods", "performer",
             "--encoder-methods", "nystromformer", "--layer-settings", "all", "--windows", "2",
             "--long-n", "0"]  # 8 patched cells
KILLS = [(signal.SIGKILL, 2), (signal.SIGTERM, 4)]
PROGRESS = re.compile(r"^(?P<folder>[^:]+)/perplexity\.csv\.gz: (?P<done>\d+)/(?P<total>\d+) cells")
TIMINGS = ["seconds", "cpu_seconds", "unpatched_seconds", "patched_seconds", "method_seconds", "layer_attention_seconds",
           "overhead_seconds", "ratio"]

SCRIPT = """
import dataclasses, sys, time
from approxlab import cli
from approxlab.studies import perplexity

def slowed(cell):
    time.sleep(0.4)
    return perplexity.cells.compute_decoder(cell)

steps = tuple(dataclasses.replace(step, compute=slowed) if step.tables[0].name == "perplexity.csv.gz" else step
              for step in perplexity.STUDY.steps)
perplexity.STUDY = dataclasses.replace(perplexity.STUDY, steps=steps)
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_tiny_checkpoint("llama", tmp_path_factory.mktemp("kill-llama") / "llama", tie_word_embeddings=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("kill-cache")


def _compute(out, llama, cache) -> dict:
    study = perplexity.STUDY
    config = study.configure(study.arguments(checkpoint=str(llama), cache_dir=str(cache), **VALUES))
    compute(study, config, out, cache_dir=cache, progress=False)
    return {name: read_results(out / name).drop(columns=TIMINGS, errors="ignore") for name in TABLES}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, llama, cache):
    return _compute(tmp_path_factory.mktemp("uninterrupted"), llama, cache)  # also fills the token cache


def _kill_at(out, llama, cache, signum, count) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", SCRIPT, "perplexity", "--checkpoint", str(llama), "--cache-dir", str(cache),
               "--out", str(out), *ARGUMENTS]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    lines, sent = [], False
    with process:
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            match = PROGRESS.match(line)
            if not sent and match and int(match["done"]) >= count:
                process.send_signal(signum)
                sent = True
        returncode = process.wait(timeout=120)
    reported = max((int(m["done"]) for m in map(PROGRESS.match, lines) if m), default=0)
    return {"returncode": returncode, "stderr": lines, "sent": sent, "reported": reported}


@pytest.fixture(scope="module")
def killed(tmp_path_factory, llama, cache, uninterrupted):
    base, runs = tmp_path_factory.mktemp("killed"), {}

    def one(index, signum, count):
        runs[index] = _kill_at(base / f"run{index}", llama, cache, signum, count)

    threads = [threading.Thread(target=one, args=(i, *kill)) for i, kill in enumerate(KILLS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    return base, runs


def test_a_kill_loses_no_finished_cell_and_the_resumed_run_equals_an_uninterrupted_one(killed, uninterrupted, llama,
                                                                                        cache):
    base, runs = killed
    for index, (signum, count) in enumerate(KILLS):
        run, out = runs[index], base / f"run{index}"
        assert run["sent"], "\n".join(run["stderr"])
        expected = -signal.SIGKILL if signum == signal.SIGKILL else 128 + signum
        assert run["returncode"] == expected, "\n".join(run["stderr"])
        assert not any("Traceback" in line for line in run["stderr"]), "\n".join(run["stderr"])
        table = out / "perplexity.csv.gz"
        saved = read_results(table, partial="drop") if has_results(table) else []
        assert count <= run["reported"] <= len(saved) < 8, (run["reported"], len(saved))
        resumed = _compute(out, llama, cache)
        for name in TABLES:
            pd.testing.assert_frame_equal(resumed[name], uninterrupted[name], obj=name)
