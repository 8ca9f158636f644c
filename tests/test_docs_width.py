"""Prose in the repository's Markdown stays within 100 columns, like the code. Table rows, code
blocks, headings and a line that is a single link or URL may be longer: breaking them would
break what they are. docs/config.md is generated (``config_reference_markdown`` wraps its prose)
and benchmarks/results/ holds records, so neither is checked here."""

from __future__ import annotations

import re
from pathlib import Path

from dynamics.engine.config_docs import PROSE_WIDTH, config_reference_markdown, prose_lines

ROOT = Path(__file__).resolve().parents[1]
NOT_CHECKED = {ROOT / "docs" / "config.md"}
NOT_CHECKED_UNDER = (ROOT / "benchmarks" / "results",)
NOT_SOURCE = ("venv", "build", "dist", "node_modules", "runs")
"""Folders of installed or built files and the run folders the tool writes (runs/, where a model
card is a README.md), which a checkout may hold but nobody writes by hand."""

LINK = r"(\[[^\]]*\]\([^)\s]*\)|<[a-z]+://[^>\s]*>|[a-z]+://\S+|\[[^\]]+\]:\s*\S+)"
SINGLE_LINK = re.compile(rf"^\s*(?:[-*+] |\d+[.)] |> )?{LINK}[.,;:)]*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def markdown_files() -> list[Path]:
    files = []
    for path in sorted(ROOT.rglob("*.md")):
        parts = path.relative_to(ROOT).parts
        if any(part.startswith(".") or part in NOT_SOURCE for part in parts):
            continue
        if path in NOT_CHECKED or any(path.is_relative_to(d) for d in NOT_CHECKED_UNDER):
            continue
        files.append(path)
    return files


def long_prose_lines(text: str) -> list[int]:
    """Line numbers (from 1) of prose lines past PROSE_WIDTH columns."""
    found = []
    in_code = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code or len(line) <= PROSE_WIDTH:
            continue
        stripped = line.lstrip()
        if stripped.startswith(("|", "#")) or SINGLE_LINK.match(line):
            continue
        found.append(number)
    return found


def test_markdown_prose_is_within_100_columns():
    files = markdown_files()
    assert ROOT / "README.md" in files and ROOT / "docs" / "method.md" in files
    offending = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in files
        for number in long_prose_lines(path.read_text())
    ]
    assert not offending, f"prose lines over {PROSE_WIDTH} columns (wrap them):\n" + "\n".join(
        offending
    )


def test_tables_code_headings_and_single_links_may_be_longer():
    long = "word " * 30
    text = "\n".join(
        [
            f"| {long} |",
            "```",
            long,
            "```",
            f"## {long}",
            f"[{long}](https://example.org/{'x' * 100}),",
            f"- <https://example.org/{'x' * 100}>",
            f"  {long}",
        ]
    )
    assert long_prose_lines(text) == [8]


def test_the_generated_reference_wraps_its_prose():
    prose = [
        line for line in config_reference_markdown().splitlines() if not line.startswith(("|", "#"))
    ]
    assert len(prose) > 5
    assert max(len(line) for line in prose) <= PROSE_WIDTH


def test_a_paragraph_breaks_between_words_and_never_inside_a_code_span():
    span = "`dynamics scenarios config paper/s28`"
    text = " ".join(["a few words"] * 40 + [span, "and", "more"] * 10)
    lines = prose_lines(text)
    assert len(lines) > 3
    assert all(len(line) <= PROSE_WIDTH for line in lines)
    assert " ".join(lines) == text
    assert all(line.count("`") % 2 == 0 for line in lines)
