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


def test_readme_example_output_matches():
    text = README.read_text()
    code = _block_after("<!-- readme-example", text)
    expected = _block_after("<!-- readme-output -->", text).strip()
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    assert buffer.getvalue().strip() == expected
