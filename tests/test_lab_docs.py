"""docs/lab.md's Python snippets that print numbers, run as written, their output held to the
lines the page quotes: the page says what was run, as printed. A figure below 1e-6 is float32
rounding, which the machine may order otherwise: any such figure matches another."""

import contextlib
import io
import re

import pytest
from conftest import ROOT

LAB = (ROOT / "docs" / "lab.md").read_text()
# each snippet followed by "prints" and the lines it prints
BLOCK = r"((?:(?!```).)*)"  # a fenced block's text, which holds no fence
QUOTED = re.findall(rf"```python\n{BLOCK}```\n\nprints\n\n```\n{BLOCK}```", LAB, re.S)
NUMBER = r"-?\d+\.\d+(?:e[-+]\d+)?"


def same_line(printed: str, quoted: str) -> bool:
    if re.sub(NUMBER, "#", printed) != re.sub(NUMBER, "#", quoted):
        return False
    pairs = zip(map(float, re.findall(NUMBER, printed)), map(float, re.findall(NUMBER, quoted)), strict=True)
    return all(a == b or (abs(a) < 1e-6 and abs(b) < 1e-6) for a, b in pairs)


def test_the_page_quotes_its_snippets_output():
    assert len(QUOTED) >= 2


@pytest.mark.parametrize("snippet, quoted", QUOTED, ids=[f"snippet{i}" for i in range(len(QUOTED))])
def test_a_snippet_prints_what_the_page_quotes(snippet, quoted):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "docs/lab.md", "exec"), {})
    printed, lines = out.getvalue().splitlines(), quoted.splitlines()
    assert len(printed) == len(lines) and all(map(same_line, printed, lines)), (printed, lines)
