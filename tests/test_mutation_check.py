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
