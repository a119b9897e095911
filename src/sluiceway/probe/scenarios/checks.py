"""Checks shared by the scenarios that read choices out of one stream."""

from __future__ import annotations

from sluiceway.probe.record import StreamRecord

FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})


def choice_problems(record: StreamRecord, expected: int) -> list[str]:
    """What is wrong with the choices of one stream that asked for ``expected``:
    every index from 0 has output and exactly one finish_reason, on its last entry;
    no other index appears; no chunk carries one index twice; ``[DONE]`` ends it."""
    problems = []
    extra = sorted(i for i in record.choices if not 0 <= i < expected)
    if extra:
        problems.append(f"indices {extra} outside 0..{expected - 1}")
    missing = [i for i in range(expected) if i not in record.choices]
    if missing:
        problems.append(f"no entries for indices {missing}")
    if record.duplicate_entries:
        problems.append(f"{record.duplicate_entries} chunks carried one index twice")
    for i, trace in sorted(record.choices.items()):
        if len(trace.finish_reasons) != 1:
            problems.append(f"index {i} got {len(trace.finish_reasons)} finish_reasons")
        elif trace.finish_reason not in FINISH_REASONS:
            problems.append(f"index {i} finish_reason {trace.finish_reason!r}")
        if trace.entries_after_finish:
            problems.append(f"index {i} had {trace.entries_after_finish} entries after finishing")
    if not record.done:
        problems.append("no [DONE]")
    return problems


def durations(records: list[StreamRecord]) -> list[float]:
    """Seconds from sending to ``[DONE]`` of each finished stream."""
    return [round(r.closed_at - r.opened_at, 4) for r in records if r.closed_at is not None]


def first_output_s(record: StreamRecord) -> float | None:
    firsts = [t.first_at for t in record.choices.values() if t.first_at is not None]
    return round(min(firsts) - record.opened_at, 4) if firsts else None
