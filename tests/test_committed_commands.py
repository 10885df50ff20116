"""Every committed run under ``figures/`` records the command that reproduces it from a clone: the
``--out`` it names is the committed folder itself (relative to the repository root), never a path of
the machine it ran on."""

import json
import pathlib
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNS = sorted(path.parent for path in (ROOT / "figures").glob("*/config.json"))


def _commands(folder: pathlib.Path) -> list[str]:
    config = json.loads((folder / "config.json").read_text())
    found = [config.get("run", {}).get("command")]
    timing = folder / "timing.json"
    if timing.is_file():
        found += [run.get("command") for run in json.loads(timing.read_text()).get("runs", [])]
    return [command for command in found if command]


@pytest.mark.parametrize("folder", RUNS, ids=[folder.name for folder in RUNS])
def test_a_committed_run_names_its_own_folder_as_out(folder):
    for command in _commands(folder):
        words = shlex.split(command)
        assert words[0] == "approxlab", command
        if "--out" in words:
            out = words[words.index("--out") + 1]
            assert out == f"figures/{folder.name}", f"{folder.name}: {command!r} writes elsewhere ({out!r})"
        assert not any(word.startswith(("/", "~")) for word in words), f"{folder.name}: a machine path in {command!r}"


def test_the_committed_runs_are_found():
    assert {"figure1", "instability", "lra_svd", "decoder", "perplexity"} <= {folder.name for folder in RUNS}
