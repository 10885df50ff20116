"""Two simultaneous runs into one ``--out``: the second exits 2 at once, naming the first."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The first run is the real command line (cli.main: parse, check, lock --out) with a study
# whose computation is a long sleep, so the test does not depend on how fast a study is.
FIRST_RUN = """
import sys, time
from approxlab import cli
from approxlab.studies import driver

def slow_run(study, args):
    print("computing", flush=True)
    time.sleep(120)
    return 0

driver.run = slow_run
sys.exit(cli.main(sys.argv[1:]))
"""


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _timed(arguments):
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "approxlab", *arguments], cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=300)
    return result, time.monotonic() - start


def test_second_run_into_the_same_out_exits_2_at_once_naming_the_first(tmp_path):
    out = tmp_path / "out"
    arguments = ["bench", "--source", "synthetic", "--quick", "--out", str(out)]
    # What starting Python and importing the study costs on this machine (no lock involved).
    _, startup = _timed(["bench", "--help"])
    first = subprocess.Popen([sys.executable, "-c", FIRST_RUN, *arguments], cwd=ROOT, env=_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "computing", first.stderr.read()
        second, seconds = _timed(arguments)
        assert first.poll() is None  # the first run is still going
    finally:
        first.kill()
        first.wait()
        first.stdout.close()
        first.stderr.close()
    assert second.returncode == 2, second.stderr
    lines = second.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
    assert lines[0].startswith("approxlab bench: error: --out: a folder no other run is writing to, got ")
    assert f"locked by process {first.pid} " in lines[0]
    assert seconds < startup + 5.0, (seconds, startup)
    assert not (out / "results.csv").exists()
