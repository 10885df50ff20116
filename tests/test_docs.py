"""The documentation builds offline, warnings as errors, and its pages load nothing from the network.

``python3 -m sphinx -W -b html docs docs/_build/html`` is the build command; this test runs it
(into a temporary folder) so that CI builds the documentation with the rest of the suite. The
gallery examples (``docs/examples/plot_*.py``) are executed by that build.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# a remote URL where a page *loads* something: scripts, stylesheets, fonts, images, iframes,
# CSS imports and url(...) in stylesheets (plain links <a href="https://..."> are fine)
_REMOTE = re.compile(
    r"""<(?:script|img|iframe|source)\b[^>]*\bsrc\s*=\s*["']?(?:https?:)?//"""
    r"""|<link\b(?=[^>]*\brel\s*=\s*["']?(?:stylesheet|preload|modulepreload|icon|preconnect|dns-prefetch))[^>]*\bhref\s*=\s*["']?(?:https?:)?//"""
    r"""|@import\s+(?:url\()?\s*["']?(?:https?:)?//"""
    r"""|url\(\s*["']?(?:https?:)?//""",
    re.I,
)


def remote_resources(folder: Path) -> list[str]:
    """``file: match`` for every resource a built page or stylesheet would fetch from the network."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.suffix in (".html", ".css") and path.is_file():
            for match in _REMOTE.finditer(path.read_text(errors="replace")):
                found.append(f"{path.relative_to(folder)}: {match.group(0)[:120]}")
    return found


def test_remote_resource_check_finds_what_a_page_would_download(tmp_path):
    (tmp_path / "a.html").write_text('<a href="https://example.org">a link is fine</a>'
                                     '<script src="_static/local.js"></script>')
    assert remote_resources(tmp_path) == []
    for bad in ('<script defer="defer" src="https://cdn.example.org/mathjax/tex-chtml.js"></script>',
                "<link href='//fonts.example.org/x.css' rel='stylesheet'>",
                '<link rel="preload" as="font" href="https://fonts.example.org/f.woff2">'):
        (tmp_path / "b.html").write_text(bad)
        assert len(remote_resources(tmp_path)) == 1, bad
    (tmp_path / "b.html").unlink()
    (tmp_path / "c.css").write_text('@font-face { src: url("https://fonts.example.org/f.woff2"); }')
    assert len(remote_resources(tmp_path)) == 1


@pytest.mark.slow
def test_docs_build_offline_with_warnings_as_errors(tmp_path):
    out = tmp_path / "html"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "APPROXLAB_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", "-d", str(tmp_path / "doctrees"),
         "docs", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert (out / "_static" / "mathjax" / "tex-chtml.js").is_file()  # MathJax served by the build itself
    assert remote_resources(out) == []
    pages = {p.relative_to(out).as_posix() for p in out.rglob("*.html")}
    for page in ("index.html", "quickstart.html", "error.html", "api.html", "methods/skyformer.html",
                 "studies/figure1.html", "auto_examples/index.html"):
        assert page in pages, page
    examples = sorted(p.stem for p in (ROOT / "docs" / "examples").glob("plot_*.py"))
    assert examples and all(f"auto_examples/{name}.html" in pages for name in examples)
    # a page whose source has a table shows one (docs/usage.md rendered its API table as code, and -W passed)
    for source in sorted((ROOT / "docs").rglob("*.md")):
        if "_build" in source.parts or not any(_TABLE_RULE.match(line) for line in source.read_text().splitlines()):
            continue
        page = out / source.relative_to(ROOT / "docs").with_suffix(".html")
        if page.is_file():  # else a fragment another page includes (studies/coverage.md)
            assert "<table" in page.read_text(encoding="utf-8"), page
    assert "<table" in (out / "usage.html").read_text(encoding="utf-8")


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_TABLE_RULE = re.compile(r"^\s*\|(?:\s*:?-{3,}:?\s*\|)+\s*$")
_HEADING = re.compile(r"^#{2,6} \S")  # a Python or shell comment starts with one #


def prose_in_code(text: str) -> list[str]:
    """``line: what`` for every place where a Markdown page's prose falls into a code block.

    Fences pair as CommonMark pairs them (a closing fence: the opening's character, at least as long, nothing after
    it). Reported: a fence left open at the end of the page (the rest of the page renders as code); inside a block,
    an opening fence with a language as long as the block's own (a block opened where one was meant to close), a
    table's rule line, or a Markdown heading of level 2 or more (a comment in code has one ``#``).
    """
    found, opened = [], None
    for number, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(line)
        if opened is None:
            if fence and not (fence.group(1)[0] == "`" and "`" in fence.group(2)):
                opened = (number, fence.group(1))
            continue
        start, marker = opened
        if fence and fence.group(1)[0] == marker[0] and len(fence.group(1)) >= len(marker) and not fence.group(2).strip():
            opened = None
        elif fence and fence.group(2).strip() and len(fence.group(1)) >= len(marker):
            found.append(f"{number}: a fence with a language inside the code block opened at line {start}")
        elif _TABLE_RULE.match(line):
            found.append(f"{number}: a table inside the code block opened at line {start}")
        elif _HEADING.match(line):
            found.append(f"{number}: a heading inside the code block opened at line {start}")
    if opened is not None:
        found.append(f"{opened[0]}: a code block left open to the end of the page")
    return found


def _markdown_sources() -> list[Path]:
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts),
            *sorted((ROOT / "benchmarks").rglob("*.md"))]


def test_the_check_for_prose_in_a_code_block_finds_the_broken_usage_page():
    """``docs/usage.md`` rendered as one code block (a stray output line and a lone fence swallowed its API table and
    "Your own method"), and neither ``sphinx -W`` nor this file noticed."""
    broken = ("# Using the library\n\nThe calls below.\n\nd_stat 182.3, core kappa 164\n```\n\nEverything takes "
              "tensors.\n\n| call | what |\n|---|---|\n| `a` | b |\n\n## Your own method\n\n```python\nimport x\n```\n")
    assert prose_in_code(broken) == ["11: a table inside the code block opened at line 6",
                                     "14: a heading inside the code block opened at line 6",
                                     "16: a fence with a language inside the code block opened at line 6"]
    assert prose_in_code(broken.rsplit("```python", 1)[0]) == [
        "11: a table inside the code block opened at line 6", "14: a heading inside the code block opened at line 6",
        "6: a code block left open to the end of the page"]
    fine = "# A page\n\n```python\n# a comment\nx = 1\n```\n\n````md\n```python\n```\n````\n\n~~~\n|---|\n~~~\n"
    assert prose_in_code(fine) == ["14: a table inside the code block opened at line 13"]
    assert prose_in_code(fine.replace("|---|", "x")) == []


@pytest.mark.parametrize("path", _markdown_sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_s_prose_falls_into_a_code_block(path):
    assert prose_in_code(path.read_text(encoding="utf-8")) == []
