"""Every shared option means the same in every study: the same flags, type, nargs and action, and the same
error message for the same bad value. Parsing only: no study runs."""

from __future__ import annotations

import contextlib
import io

import pytest

from approxlab.cli import build_parser
from approxlab.studies import STUDIES
from approxlab.studies.options import SHARED

BAD_VALUES = {
    "methods": ["nope"], "conditions": ["warm"], "n": ["0"], "num_features": ["-4"], "windows": ["0"],
    "seeds": ["x"], "steps": ["1.5"], "tasks": [","], "layers": ["top"], "positions": ["rope"],
}
"""A value each shared option refuses at parse time (``--checkpoint`` takes any name: the model checks it)."""


def _parsers() -> dict:
    return {name: build_parser(name).study_parser for name in STUDIES}


def _action(parser, dest):
    return next((a for a in parser._actions if a.dest == dest and a.option_strings), None)


def _error(parser, argv) -> str:
    """The one error line of ``parser`` for ``argv``, less the study's name."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exit_info:
        parser.parse_args(argv)
    assert exit_info.value.code == 2
    line, = stderr.getvalue().splitlines()
    return line.split(": error: ", 1)[1]


def test_each_shared_option_is_the_same_in_every_study_that_takes_it():
    parsers = _parsers()
    taken = {}
    for dest, option in SHARED.items():
        seen = {name: _action(parser, dest) for name, parser in parsers.items()}
        seen = {name: action for name, action in seen.items() if action is not None}
        taken[dest] = sorted(seen)
        for name, action in seen.items():
            assert action.option_strings[0] == option.flags[0], (dest, name)
            assert (action.type, action.nargs, type(action), action.choices, action.metavar) == (
                option.type, option.nargs, type(_action(_shared_parser(option), dest)), option.choices,
                option.metavar), (dest, name)
        if dest in BAD_VALUES:
            messages = {name: _error(parsers[name], [option.flags[0], *BAD_VALUES[dest]]) for name in seen}
            assert len(set(messages.values())) == 1, (dest, messages)
            assert next(iter(messages.values())).startswith(f"argument {option.flags[0]}"), messages
    # the options the studies share: each in at least two of them
    for dest in ("methods", "conditions", "n", "num_features", "windows", "seeds", "steps", "tasks", "layers",
                 "positions", "checkpoint"):
        assert len(taken[dest]) >= 2, (dest, taken[dest])


def _shared_parser(option):
    import argparse

    parser = argparse.ArgumentParser()
    option.add_to(parser)
    return parser


def test_a_list_option_takes_spaces_and_commas_alike():
    parsers = _parsers()
    for name in ("figure1", "sv-decay", "decoder"):
        parser = parsers[name]
        assert parser.parse_args(["--n", "512", "1024"]).n == parser.parse_args(["--n", "512,1024"]).n == [512, 1024]


def test_a_renamed_option_keeps_its_old_flag_until_the_next_minor_version(capsys):
    """sv-decay's --approximations became --methods without notice (the old flag was refused): it works again, as
    a deprecated alias that prints one line on stderr and is hidden from --help; any option can declare one."""
    import argparse

    from approxlab.cli import build_parser
    from approxlab.studies import Option
    from approxlab.studies.options import REMOVED_IN

    assert REMOVED_IN == "0.2.0"
    parser = build_parser("sv-decay")
    args, unknown = parser.parse_known_args(["sv-decay", "--approximations", "performer,nystromformer", "skyformer"])
    assert args.methods == ["performer", "nystromformer", "skyformer"] and unknown == []
    assert capsys.readouterr().err == ("approxlab sv-decay: FutureWarning: --approximations is deprecated and will be "
                                       "removed in approxlab 0.2.0; use --methods\n")
    assert "--approximations" not in parser.study_parser.format_help()
    generic = argparse.ArgumentParser(prog="approxlab toy")
    Option(("--count",), "count", "a count", type=int, default=1, deprecated={"--number": "9.0.0"}).add_to(generic)
    Option(("--fast",), "fast", "go fast", action="store_true", default=False, deprecated={"--quickly": "9.0.0"}).add_to(generic)
    assert vars(generic.parse_args(["--number", "3", "--quickly"])) == {"count": 3, "fast": True}
    assert capsys.readouterr().err.splitlines() == [
        "approxlab toy: FutureWarning: --number is deprecated and will be removed in approxlab 9.0.0; use --count",
        "approxlab toy: FutureWarning: --quickly is deprecated and will be removed in approxlab 9.0.0; use --fast"]
    assert vars(generic.parse_args([])) == {"count": 1, "fast": False} and capsys.readouterr().err == ""


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_an_option_given_twice_or_with_its_deprecated_flag_is_refused_not_dropped(study, capsys, tmp_path):
    """``sv-decay --approximations A --methods B`` ran B alone and dropped A without a word (argparse keeps the
    last); so did ``--methods A --methods B``. Every list option of every study, and every option with a deprecated
    flag, by any of its flags, in either order: one line naming both uses, exit 2, nothing created (a one-value
    option given again takes the last value; options that gather, ``--plugin``, may repeat)."""
    from approxlab.studies import registry
    from test_cli_errors import assert_one_line_error, run_main

    declared, out = registry.get(study), tmp_path / "out"
    pairs = [(option.flags[0], option.flags[0]) for option in declared.options if option.nargs in ("+", "*")]
    pairs += [(old, option.flags[0]) for option in declared.options for old in option.deprecated]
    pairs += [(new, old) for old, new in pairs if old != new]
    if not pairs:  # a study with no list option
        return
    parser = build_parser(study).study_parser
    for first, second in pairs:
        action = _action(parser, next(o.dest for o in declared.options if first in (*o.flags, *o.deprecated)))
        value = [] if action.nargs == 0 else [_valid(declared, action)]
        message = _error(parser, [first, *value, second, *value, "--out", str(out)])
        assert message.startswith(f"argument {action.option_strings[0]}: given once"), message
        assert f"got '{first}" in message and f"' and '{second}" in message, message
    old, new = pairs[-1]
    status, err = run_main([study, old, *value, new, *value, "--out", str(out)], capsys)
    assert_one_line_error(status, err, study, f"argument {action.option_strings[0]}: given once")
    assert not out.exists()


def _valid(declared, action) -> str:
    """A value ``action`` parses (the value itself does not matter: the second use is refused first)."""
    from test_cli_reliability import _sample

    try:
        return _sample(declared, action)
    except AssertionError:  # not in the quick grid: the option's own default, else 1 (bench --patch-layer)
        default = action.default
        return str(default) if isinstance(default, (str, int, float)) and not isinstance(default, bool) else "1"


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_every_help_default_is_read_from_the_declared_grid(study):
    """``perplexity --help`` stated an old grid's defaults (d 16,64,256; 6 windows; context 512; continuation 256)
    where the declared ones were five budgets, 12 windows, 384 and 128. Every option of every study that the grid
    holds shows the grid's value and the --quick one; a default an option's own text writes in figures is its own
    ``default`` (an option outside the grid)."""
    import re

    from approxlab.studies import registry
    from approxlab.studies.options import shown_default

    declared = registry.get(study)
    text = "".join(build_parser(study).study_parser.format_help().split())  # argparse wraps inside long words
    checked = 0
    for option in declared.options:
        written = re.search(r"default (\d+)", option.help)  # a default written by hand: the option's own, off the grid
        assert not written or (option.dest not in declared.full and written.group(1) == str(option.default)), (
            option.flags[0], option.help)
        value = declared.full.get(option.dest)
        if option.dest not in declared.full or value is None:
            continue
        default, short = shown_default(value), shown_default(declared.quick.get(option.dest, value))
        shown = f"(default {default}{'' if short == default else f'; --quick {short}'})"
        assert "".join(shown.split()) in text, (option.flags[0], shown)
        checked += 1
    assert checked >= min(3, len(declared.options))
