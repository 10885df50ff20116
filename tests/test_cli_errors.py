"""Bad command lines: one stderr line naming the parameter, exit status 2, never a traceback.

The table runs in-process (``approxlab.cli.main``) with the engine's ``run_steps``
replaced by a function that fails the test: a check that does not fire shows up as
"computation started", never as a long run. The corpus's token count is pinned to the
real 273,178 (MiniLM/BERT uncased tokenizer) so the table does not read the corpus;
``test_corpus_tokens_is_the_real_count`` checks that number against the corpus. A few
invocations run as real processes (``python -m approxlab``) to check the real exit path.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

from approxlab import cli
from approxlab.errors import StudyError
from approxlab.studies import STUDIES, checks
from approxlab.studies.engine import runner
from approxlab.tasks.mlm import load_tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS_TOKENS = 273_178
REAL_TOKEN_COUNT = checks._token_count


def _closed_port() -> int:
    """A local TCP port with nothing listening (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# (study, arguments, the parameter the error line must name)
CASES = [
    ("figure1", ["--windows", "1000"], "--windows"),
    ("figure1", ["--windows", "0"], "--windows"),
    ("figure1", ["--n", "100000000"], "--n"),
    ("figure1", ["--n", "0"], "--n"),
    ("figure1", ["--n", "abc"], "--n"),
    ("figure1", ["--num-features", "-4"], "--num-features"),
    ("figure1", ["--methods", "nope"], "--methods"),
    ("figure1", ["--conditions", "warm"], "--conditions"),
    ("figure1", ["--seeds", "-1"], "--seeds"),
    ("figure1", ["--stat-heads", "99"], "--stat-heads"),
    ("figure1", ["--matrix-free-above", "0"], "--matrix-free-above"),
    ("figure1", ["--dtypes", "float16"], "--dtypes"),
    ("figure1", ["--workers", "0"], "--workers"),
    ("figure1", ["--device", "tpu"], "--device"),
    ("figure1", ["--out", "/proc/approxlab-cannot-be-here"], "--out"),
    ("figure1", ["--out", "{file}"], "--out"),
    ("figure1", ["--plot-only", "--out", "{missing}"], "--plot-only"),
    ("bench", ["--plot-only", "--out", "{missing}"], "--plot-only"),
    ("figure1", ["--data-dir", "/nonexistent/approxlab-data"], "--data-dir"),
    ("figure1", ["--data-dir", "{empty}"], "--data-dir"),
    ("figure1", ["--cache-dir", "/proc/approxlab-cannot-be-here"], "--cache-dir"),
    ("figure1", ["--scheduler", "tcp://127.0.0.1:{port}"], "--scheduler"),
    ("figure1", ["--scheduler", "tcp://localhost:notaport"], "--scheduler"),
    ("figure1", ["--no-such-option"], "--no-such-option"),
    ("figure1", ["--threads", "2147483648"], "--threads: an integer from 1 to"),  # overflowed inside torch
    ("figure1", ["--threads", "100000"], "--threads: an integer from 1 to"),  # crashed the process at exit
    ("figure1", ["--threads", "0"], "--threads"),
    ("sv-decay", ["--n", "8192", "--windows", "64"], "--n"),
    ("sv-decay", ["--windows", "100"], "--windows"),
    ("sv-decay", ["--heads", "99"], "--heads"),
    ("sv-decay", ["--heads", "0"], "--heads"),
    ("sv-decay", ["--layers", "top"], "--layers"),
    ("sv-decay", ["--n", "1"], "--n"),
    ("sv-decay", ["--methods", "nope"], "--methods"),
    ("sv-decay", ["--num-features", "0"], "--num-features"),
    ("sv-decay", ["--data-dir", "/nonexistent/approxlab-data"], "--data-dir"),
    ("instability", ["--tasks", "listops:abc:4"], "--tasks"),
    ("instability", ["--tasks", "nope:100:2"], "--tasks"),
    ("instability", ["--tasks", "wikitext-mlm:300000:2"], "--tasks"),
    ("instability", ["--tasks", "wikitext-mlm:4096:8", "--steps", "20"], "--tasks"),
    ("instability", ["--attentions", "nope"], "--attentions"),
    ("instability", ["--lr", "0"], "--lr"),
    ("instability", ["--lr", "nan"], "--lr"),
    ("instability", ["--steps", "0"], "--steps"),
    ("instability", ["--seeds", "x"], "--seeds"),
    ("instability", ["--dtype", "float16"], "--dtype"),
    ("bench", ["--head", "99"], "--head"),
    ("bench", ["--head", "-1"], "--head"),
    ("bench", ["--source", "synthetic", "--head", "99"], "--head"),
    ("bench", ["--error-method", "nope"], "--error-method"),
    ("bench", ["--forward-methods", "exact"], "--forward-methods"),
    ("bench", ["--source", "synthetic", "--num-features", "100000"], "--num-features"),
    ("bench", ["--scale-n", "300000"], "--scale-n"),
    ("bench", ["--accuracy-n", "1"], "--accuracy-n"),
    ("bench", ["--tol", "0"], "--tol"),
    ("bench", ["--parts", "speed"], "--parts"),
    ("bench", ["--workers", "2"], "--workers"),
    ("bench", ["--repeats", "0"], "--repeats: an integer >= 5, got '0'"),  # was raised to 5 without a word
    ("bench", ["--source", "synthetic", "--training-features", "100000"], "--training-features: at most 1024"),
    # the KV-cache form compresses the first half of the window: a budget of 40 at n = 64 was lowered to 32 silently
    ("bench", ["--parts", "causal", "--causal-n", "64", "--causal-budget", "40"], "--causal-budget: at most 32"),
    ("lra-svd", ["--tasks", "nope:1000"], "--tasks"),
    ("lra-svd", ["--tasks", "listops:0"], "--tasks"),
    ("lra-svd", ["--steps", "0"], "--steps"),
    ("lra-svd", ["--seeds", "0"], "--seeds"),
    ("lra-svd", ["--steps", "x"], "--steps"),
    ("lra-svd", ["--device", "cuda"], "--device"),
    ("decoder", ["--layers", "top"], "--layers"),
    ("decoder", ["--layers", "-1"], "--layers"),
    ("decoder", ["--n", "2"], "--n"),
    ("decoder", ["--methods", "yoso"], "--methods"),
    ("decoder", ["--methods", "nope"], "--methods"),
    ("decoder", ["--conditions", "warm"], "--conditions"),
    ("decoder", ["--windows", "0"], "--windows"),
    ("decoder", ["--num-features", "0"], "--num-features"),
    ("decoder", ["--rank-max-n", "-1"], "--rank-max-n"),
    ("decoder", ["--plot-only", "--out", "{missing}"], "--plot-only"),
    ("perplexity", ["--methods", "linformer"], "--methods"),
    ("perplexity", ["--encoder-methods", "h2o"], "--encoder-methods"),
    ("perplexity", ["--methods", "exact,performer"],
     "--methods: methods other than 'exact', which always runs as the control, got exact,performer"),
    ("perplexity", ["--layer-settings", "top"], "--layer-settings"),
    ("perplexity", ["--n", "512,1024"], "--n"),
    ("perplexity", ["--continuation", "1"], "--continuation"),
    ("perplexity", ["--context", "0"], "--context"),
    ("perplexity", ["--compare-with", "{missing}"], "--compare-with"),
    ("perplexity", ["--compare-with", "{empty}"], "--compare-with"),
    # claim (p3) would compare nothing: it dropped the folder without a word
    ("perplexity", ["--layer-settings", "all", "--compare-with", "figures/decoder"],
     "--compare-with: a run with a single-layer --layer-settings"),
    ("perplexity", ["--quick", "--num-features", "8", "--compare-with", "figures/decoder"], "--compare-with: result folders with a d of this run"),
    ("long-context", ["--policies", "topk"], "--policies: cache policies"),
    ("long-context", ["--lengths", "128"], "--lengths: lengths of at least 256"),
    ("long-context", ["--lengths", "16384"], "--lengths: at most the model's context"),
    ("long-context", ["--ruler-tasks", "qa"], "--ruler-tasks"),
    ("long-context", ["--ratios", "1.0"], "--ratios"),
    ("long-context", ["--texts", "1000"], "--texts: at most the corpus's"),
]


@pytest.fixture
def no_compute(monkeypatch):
    """The engine's ``run_steps`` fails the test; the corpus count is pinned (see the module docstring)."""

    def refuse(*args, **kwargs):
        raise AssertionError("computation started: the bad option was not caught before computing")

    monkeypatch.setattr(runner, "run_steps", refuse)
    monkeypatch.setattr(checks, "_token_count", lambda data_dir, cache_dir: CORPUS_TOKENS)


def run_main(argv, capsys):
    """``approxlab <argv>`` in-process: (exit status, stderr)."""
    try:
        status = cli.main(argv)
    except SystemExit as exit_info:  # argparse exits; main returns for everything else
        status = exit_info.code
    return status, capsys.readouterr().err


def assert_one_line_error(status, err, study, parameter):
    assert status == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"approxlab {study}: error: "), err
    assert parameter in lines[0], err


def test_the_table_is_large_and_covers_every_study():
    assert len(CASES) >= 30
    assert {study for study, _, _ in CASES} == set(STUDIES)


@pytest.mark.parametrize(("study", "arguments", "parameter"), CASES,
                         ids=[f"{s}{' '.join([''] + a)}" for s, a, _ in CASES])
def test_bad_invocation_is_one_line(study, arguments, parameter, no_compute, capsys, tmp_path):
    places = {"file": tmp_path / "a-file", "missing": tmp_path / "missing", "empty": tmp_path / "empty",
              "port": _closed_port()}
    places["file"].write_text("not a folder")
    places["empty"].mkdir()
    arguments = [a.format(**places) for a in arguments]
    if "--out" not in arguments:
        arguments += ["--out", str(tmp_path / "out")]
    status, err = run_main([study, *arguments], capsys)
    assert_one_line_error(status, err, study, parameter)
    assert not (tmp_path / "out").exists()  # a refused run leaves no folder behind


def test_scheduler_error_names_the_address_and_comes_fast(no_compute, capsys, tmp_path):
    address = f"tcp://127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    status, err = run_main(["figure1", "--scheduler", address, "--out", str(tmp_path)], capsys)
    assert time.monotonic() - start < checks.SCHEDULER_TIMEOUT + 5
    assert_one_line_error(status, err, "figure1", address)


def test_a_port_where_no_dask_scheduler_answers_is_refused(no_compute, capsys, tmp_path):
    """Something listens (the TCP connect succeeds) but never speaks Dask: refused, not a hang."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        start = time.monotonic()
        status, err = run_main(["figure1", "--scheduler", address, "--out", str(tmp_path)], capsys)
    assert time.monotonic() - start < 2 * checks.SCHEDULER_TIMEOUT + 5
    assert_one_line_error(status, err, "figure1", address)
    assert "no Dask scheduler answered" in err


def test_a_running_dask_scheduler_passes_the_check():
    from distributed import LocalCluster

    from approxlab.studies.engine import DASHBOARD_ADDRESS

    with LocalCluster(n_workers=0, processes=False, dashboard_address=DASHBOARD_ADDRESS) as cluster:
        assert checks.check_scheduler(cluster.scheduler_address) == cluster.scheduler_address
        assert checks.check_scheduler(cluster.scheduler_address.removeprefix("tcp://")) == cluster.scheduler_address


def test_windows_beyond_the_pool_are_refused_not_truncated(no_compute, capsys, tmp_path):
    status, err = run_main(["figure1", "--windows", "1000", "--out", str(tmp_path)], capsys)
    assert_one_line_error(status, err, "figure1", "--windows")
    assert "at most 64" in err and "got 1000" in err


def test_a_bug_in_approxlab_still_shows_its_traceback(monkeypatch, tmp_path):
    from approxlab.studies import driver

    def broken(*args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(driver, "run", broken)
    with pytest.raises(ZeroDivisionError):
        cli.main(["bench", "--source", "synthetic", "--out", str(tmp_path)])


def test_corpus_tokens_is_the_real_count():
    # Either the corpus is found and has the documented 273,178 tokens, or its absence is a
    # one-line error naming --data-dir (never a traceback from inside the data module).
    try:
        assert checks.corpus_tokens() == CORPUS_TOKENS
    except StudyError as error:
        assert "--data-dir" in str(error) or "APPROXLAB_DATA" in str(error)
        assert "\n" not in str(error)


def _subprocess_env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("arguments", [
    ["bench", "--source", "synthetic", "--head", "99"],
    ["figure1", "--windows", "0"],
])
def test_real_exit_path(arguments, tmp_path):
    result = subprocess.run([sys.executable, "-m", "approxlab", *arguments, "--out", str(tmp_path)], cwd=ROOT,
                            env=_subprocess_env(), capture_output=True, text=True, timeout=300)
    assert_one_line_error(result.returncode, result.stderr, arguments[0], arguments[-2])
    assert result.stdout == ""


@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", "MKL_NUM_THREADS"])
def test_a_thread_variable_the_machine_cannot_run_is_refused(variable, no_compute, capsys, tmp_path, monkeypatch):
    """As ``--threads``: at most 4 threads per CPU of the process's affinity mask, said in one line."""
    from approxlab.studies.engine.environment import max_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(variable, "100000")
    status, err = run_main(["figure1", "--out", str(tmp_path / "out")], capsys)
    assert_one_line_error(status, err, "figure1", f"${variable}: an integer from 1 to {max_threads()} (at most 4 "
                                                  "threads per CPU this process may run on")


def test_a_directory_where_the_token_cache_goes_is_one_line(no_compute, capsys, tmp_path, monkeypatch):
    """approxlab's own CachePathError used to show its traceback; it names the file and --cache-dir."""
    import torch

    from approxlab.data import tokens

    cache = tmp_path / "cache"
    with monkeypatch.context() as patch:  # the cache file, written fast (its content does not matter here)
        patch.setattr(tokens, "tokenize", lambda text, tokenizer: torch.arange(8))
        tokens.wikitext_token_ids(load_tokenizer(), cache_dir=cache)
    token_file, = (cache / "tokens").iterdir()
    token_file.unlink()
    token_file.mkdir()
    monkeypatch.setattr(checks, "_token_count", REAL_TOKEN_COUNT)  # read through the cache
    REAL_TOKEN_COUNT.cache_clear()
    try:
        status, err = run_main(["figure1", "--cache-dir", str(cache), "--out", str(tmp_path / "out")], capsys)
    finally:
        REAL_TOKEN_COUNT.cache_clear()
    assert_one_line_error(status, err, "figure1", f"cache file '{token_file}' is a directory, so it cannot be read or "
                                                  "written: remove or rename it, or choose another cache root with "
                                                  "cache_dir= (CLI: --cache-dir)")


def test_a_decoder_under_an_encoder_study_is_refused_from_its_config(no_compute, capsys, tmp_path, monkeypatch):
    """A GPT-2 checkpoint under figure1's --checkpoint: refused from its config alone (no weights loaded, no
    log record of transformers before the one line)."""
    from approxlab.data import models
    from test_models_qkv import save_tiny_checkpoint

    folder = save_tiny_checkpoint("gpt2", tmp_path / "gpt2")
    capsys.readouterr()

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded to refuse a checkpoint its config already rules out")

    monkeypatch.setattr(models, "_load_weights", no_weights)
    status, err = run_main(["figure1", "--checkpoint", str(folder), "--out", str(tmp_path / "out")], capsys)
    assert_one_line_error(status, err, "figure1", f"--checkpoint: a bidirectional encoder (bert, roberta, distilbert) "
                                                  f"for this study of non-causal attention, got '{folder}' (a causal "
                                                  "gpt2 model)")
