"""Measurements belong in docs/benchmarks.md, not in the code that they once
justified: the code says why in words, and a commit hash or a date in a comment
goes stale the day the code changes."""

from __future__ import annotations

import re
from pathlib import Path

import sluiceway

SOURCES = sorted(
    p
    for p in Path(sluiceway.__file__).parent.rglob("*")
    if p.suffix in {".py", ".c", ".h"} and p.is_file()
)

# A short commit hash: 7 to 12 hex digits, with at least one letter and one digit,
# standing alone (not inside a number such as 1.44269504e-4 or 0x7fffffff).
_COMMIT = re.compile(r"(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![\w.])")
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def _findings(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for path in SOURCES:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in pattern.finditer(line):
                found.append(f"{path.name}:{number}: {match.group()}")
    return found


def test_the_patterns_catch_what_they_are_for():
    assert _COMMIT.search("measured at d8a44e6 and 62d3a83")
    assert not _COMMIT.search("p = 1.535336188319500e-4f; mask 0x7fffffff; deadbeef")
    assert _DATE.search("(2026-12-03)")


def test_no_commit_hashes_in_the_source():
    assert SOURCES
    assert _findings(_COMMIT) == []


def test_no_dates_in_the_source():
    assert _findings(_DATE) == []
