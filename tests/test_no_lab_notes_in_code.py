"""Measurements belong in docs/benchmarks.md, not in the code that they once
justified: the code says why in words, and a commit hash or a date in a comment
goes stale the day the code changes.

The README and the other docs state what is true now: no commit hashes, no
dates, no diary ("today", "this session"). docs/benchmarks.md is where a
measurement names the commit and the date it was taken at, so there a hash or a
date may stand only in a paragraph, list or table that holds a measurement."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import sluiceway

SOURCES = sorted(
    p
    for p in Path(sluiceway.__file__).parent.rglob("*")
    if p.suffix in {".py", ".c", ".h"} and p.is_file()
)

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
PRESENT_TENSE_DOCS = [p for p in DOCS if p != BENCHMARKS]

# A short commit hash: 7 to 12 hex digits, with at least one letter and one digit,
# standing alone (not inside a number such as 1.44269504e-4 or 0x7fffffff).
_COMMIT = re.compile(r"(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![\w.])")
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# Words that date a text to the day or the sitting it was written in. "session"
# and "turn" alone are product words (session affinity, a conversation's turns).
_DIARY = re.compile(
    r"\b(?:today|yesterday|tonight|last night|this (?:morning|afternoon|evening)"
    r"|(?:this|last|next|previous|earlier|our|my) (?:session|turn))\b",
    re.IGNORECASE,
)
# A measured quantity: a number with a unit, a percentage, a ratio (x1.03, 2.2x,
# 8 times) or a number in a table's cell.
_MEASUREMENT = re.compile(
    r"\d(?:[\d.,]*)\s?(?:ms|µs|us|s|tok/s|lines/s|MiB|GiB|MB|GB/s|%)(?![\w])"
    r"|(?<![\w.])x\d+(?:\.\d+)?\b|\b\d+(?:\.\d+)?x\b|\b\d+ times\b"
    r"|^\|.*\|\s*\d+(?:\.\d+)?\s*(?:,\s*\d+(?:\.\d+)?\s*)*\|",
    re.MULTILINE,
)


def _findings(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for path in SOURCES:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in pattern.finditer(line):
                found.append(f"{path.name}:{number}: {match.group()}")
    return found


def _doc_findings(text: str, pattern: re.Pattern[str]) -> list[str]:
    return [
        f"{number}: {match.group()}"
        for number, line in enumerate(text.splitlines(), 1)
        for match in pattern.finditer(line)
    ]


def _blocks(text: str) -> list[tuple[int, str]]:
    """The paragraphs, lists, tables and code blocks of a markdown text (runs of
    non-blank lines), each with the number of its first line."""
    blocks: list[tuple[int, str]] = []
    lines: list[str] = []
    for number, line in enumerate([*text.splitlines(), ""], 1):
        if line.strip():
            lines.append(line)
        elif lines:
            blocks.append((number - len(lines), "\n".join(lines)))
            lines = []
    return blocks


def _undated_measurement_findings(text: str) -> list[str]:
    """Hashes and dates with no measurement beside them: none in their block, the
    block before it or the two after it (a paragraph that introduces a command
    and then its table)."""
    found = []
    blocks = _blocks(text)
    for index, (first_line, block) in enumerate(blocks):
        beside = "\n\n".join(block for _, block in blocks[max(index - 1, 0) : index + 3])
        if _MEASUREMENT.search(beside):
            continue
        for offset, line in enumerate(block.splitlines()):
            for pattern in (_COMMIT, _DATE):
                for match in pattern.finditer(line):
                    found.append(f"{first_line + offset}: {match.group()}")
    return found


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_patterns_catch_what_they_are_for():
    assert _COMMIT.search("measured at d8a44e6 and 62d3a83")
    assert not _COMMIT.search("p = 1.535336188319500e-4f; mask 0x7fffffff; deadbeef")
    assert _DATE.search("(2026-12-03)")
    assert _DIARY.search("Measured today on the AVX2 machine")
    assert _DIARY.search("as the last session found")
    assert not _DIARY.search("session affinity keeps each turn of a conversation together")
    assert _MEASUREMENT.search("one stream 61.9 tok/s")
    assert _MEASUREMENT.search("x1.031 over the committed server")
    assert not _MEASUREMENT.search("Five sweeps of f1fa025 (2026-12-04)")


def test_a_hash_or_date_needs_a_measurement_beside_it():
    text = (
        "Sweeps of f1fa025, 2026-12-04.\n\n"
        "See the README.\n\n"
        "Or the changelog.\n\n"
        "Or git.\n\n"
        "One stream (bcb965e, 2026-12-04):\n\n"
        "| streams | tok/s |\n|---|---|\n| 1 | 268.6, 270.1 |\n"
    )
    assert _undated_measurement_findings(text) == ["1: f1fa025", "1: 2026-12-04"]
    assert _MEASUREMENT.search("| 8 | 35.0 | 71aba43 |")
    assert not _MEASUREMENT.search("| family | yes | C |")


def test_no_commit_hashes_in_the_source():
    assert SOURCES
    assert _findings(_COMMIT) == []


def test_no_dates_in_the_source():
    assert _findings(_DATE) == []


def test_the_docs_are_found():
    assert ROOT / "README.md" in PRESENT_TENSE_DOCS
    assert BENCHMARKS in DOCS
    assert len(PRESENT_TENSE_DOCS) >= 5


@pytest.mark.parametrize("path", PRESENT_TENSE_DOCS, ids=_relative)
def test_no_commit_hashes_or_dates_in_the_docs(path: Path):
    text = path.read_text()
    assert _doc_findings(text, _COMMIT) == []
    assert _doc_findings(text, _DATE) == []


@pytest.mark.parametrize("path", DOCS, ids=_relative)
def test_no_diary_in_the_docs(path: Path):
    assert _doc_findings(path.read_text(), _DIARY) == []


def test_benchmarks_date_only_measurements():
    assert _undated_measurement_findings(BENCHMARKS.read_text()) == []
