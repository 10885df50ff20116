"""The ``approxlab`` command line: lazy subcommands, common options, clear errors."""

from __future__ import annotations

import pytest
import torch

from approxlab import cli
from approxlab.studies import STUDIES, registry

COMMON = ["--out", "--quick", "--device", "--data-dir", "--cache-dir", "--restart", "--no-progress",
          "--scheduler", "--workers", "--plot-only"]


def help_text(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_lists_every_study(capsys):
    text = help_text(["--help"], capsys)
    for name in STUDIES:
        assert name in text


def test_help_of_each_available_study_has_the_common_options(capsys):
    available = [name for name in STUDIES if registry.describe(name) is not None]
    assert "figure1" in available
    for name in available:
        text = help_text([name, "--help"], capsys)
        for option in COMMON:
            assert option in text, (name, option)


def test_figure1_help_has_grid_overrides(capsys):
    text = help_text(["figure1", "--help"], capsys)
    for option in ["--methods", "--n", "--num-features", "--windows", "--seeds"]:
        assert option in text


def test_missing_study_module_does_not_break_the_others(monkeypatch, capsys):
    monkeypatch.setitem(STUDIES, "ghost", "approxlab.studies.does_not_exist")
    assert "ghost" in help_text(["--help"], capsys)  # listed, marked not available
    help_text(["figure1", "--help"], capsys)  # other subcommands still work
    assert cli.main(["ghost"]) == 2
    assert "not available" in capsys.readouterr().err


def test_cuda_without_cuda_is_a_clear_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["figure1", "--device", "cuda", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--device cuda was requested but CUDA is not available" in err
    assert not any(tmp_path.iterdir())  # nothing was computed or written


def test_bad_option_values_are_rejected(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["figure1", "--workers", "0"])
    assert exit_info.value.code == 2
    assert "--workers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["figure1", "--workers", "2", "--scheduler", "tcp://localhost:8786"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["figure1", "--device", "tpu"])
    assert "invalid choice" in capsys.readouterr().err


def test_unknown_method_is_a_clear_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["figure1", "--methods", "nope", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--methods: registered method names among" in capsys.readouterr().err
