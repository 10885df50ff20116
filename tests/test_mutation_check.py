"""The mutation table of tests/mutation_check.py stays current (fast; the mutations run in CI)."""

from pathlib import Path

import mutation_check

ROOT = Path(__file__).resolve().parent.parent


def test_table_targets_exist_exactly_once_and_tests_exist():
    """Each old text occurs exactly once in its file, differs from its new text, and each named
    test is defined in its file, so a refactor that moves code fails here, not silently in CI."""
    assert len(mutation_check.MUTATIONS) >= 12
    statements = [row[0] for row in mutation_check.MUTATIONS]
    assert len(set(statements)) == len(statements)
    for statement, path, old, new, tests in mutation_check.MUTATIONS:
        assert old != new, statement
        assert (ROOT / path).read_text().count(old) == 1, (statement, path, old)
        assert tests, statement
        for test in tests:
            file, name = test.split("::")
            assert f"def {name}(" in (ROOT / file).read_text(), (statement, test)


def test_the_theorems_page_states_the_tables_count():
    """docs/theorems.md says how many mutations run and what the check prints; both follow the table."""
    text = (ROOT / "docs" / "theorems.md").read_text()
    count = len(mutation_check.MUTATIONS)
    assert f"applies {count} targeted mutations" in text
    assert f"`{count} caught, 0 missed`" in text


def test_jobs_below_one_is_refused_in_one_line(capsys):
    import pytest

    with pytest.raises(SystemExit) as stop:
        mutation_check.main(["--jobs", "0"])
    assert stop.value.code == 2
    assert "--jobs must be at least 1; got 0" in capsys.readouterr().err
