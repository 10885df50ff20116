"""Each built-in study's declared full grid passes the study's own checks, as ``approxlab <study>`` runs them.

A full grid is run rarely (hours), and its checks (:attr:`~approxlab.studies.Study.check`: the models, the corpus,
every budget at every length) run only when it starts: a declared value that the study itself refuses -- the
perplexity study's long-context budget 512, below half of its 1,024-token sequences -- would be found only then.
Here the command line runs each study with no options (the full grid, the packaged models, offline) through its
config and checks, and stops where the cells would start: nothing is computed.
"""

from __future__ import annotations

import pytest

from approxlab import cli
from approxlab.studies import STUDIES, driver


class _Checked(Exception):
    """Raised in place of computing the cells: the run passed its config and checks (``args[0]``: the config)."""


def _stop(study, config, out, **_):
    raise _Checked(config)


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_the_full_grid_passes_the_studys_own_checks(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(driver, "compute", _stop)
    monkeypatch.chdir(tmp_path)  # the default --out, approxlab-results/<study>, is new and empty
    try:
        status = cli.main([name])
    except _Checked as checked:
        config = checked.args[0]
    else:
        pytest.fail(f"`approxlab {name}` with no options (its declared full grid) stopped before computing, exit "
                    f"status {status}: {capsys.readouterr().err.strip()}")
    assert isinstance(config, dict) and config
