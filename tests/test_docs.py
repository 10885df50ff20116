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
