"""A committed run's report re-derives from its committed tables: ``--plot-only`` on a copy of the folder, with the
present code, writes every summary and table of the report byte for byte as committed.

A report goes stale when the code that writes it changes after the run was committed (a new column, a claim added,
a rule changed); a stale summary says what the code no longer says. The studies whose report takes seconds are
checked here; the others (``figure1``, ``decoder``, ``sv_decay``, ``perplexity``: 0.5-8 minutes each) were redrawn
and compared the same way when their code last changed.
"""

import pathlib
import shutil

import pytest

from approxlab import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAST = {"lra_svd": "lra-svd", "long_context": "long-context", "long_context-scale": "long-context",
        "long_context-gate-8192": "long-context", "long_context-gate-2048": "long-context",
        "long_context-noise-gate-2048": "long-context",
        "instability": "instability", "bench": "bench"}
TEXT = (".md", ".csv")


@pytest.mark.parametrize("folder", sorted(FAST))
def test_a_committed_report_rederives_from_its_tables(folder, tmp_path):
    committed = ROOT / "figures" / folder
    copy = tmp_path / folder
    shutil.copytree(committed, copy)
    assert cli.main([FAST[folder], "--plot-only", "--no-progress", "--out", str(copy)]) == 0
    written = sorted(path.name for path in copy.iterdir() if path.suffix in TEXT and not path.name.endswith(".cells"))
    assert any(name.endswith(".md") for name in written), written
    stale = [name for name in written if (copy / name).read_bytes() != (committed / name).read_bytes()]
    assert not stale, f"figures/{folder}: {stale} differ from what --plot-only writes from the committed tables"
