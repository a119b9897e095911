"""One streamed response as the probe saw it: every chunk with its arrival time,
summarised per choice index."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import attrs


@attrs.define
class ChoiceTrace:
    """One choice index across a stream: arrival times of its entries, its text,
    every finish_reason it was given, its tool-call deltas and logprob entries."""

    index: int
    times: list[float] = attrs.field(factory=list)
    text: str = ""
    finish_reasons: list[str] = attrs.field(factory=list)
    finished_at: float | None = None
    entries_after_finish: int = 0
    tool_deltas: list[dict[str, Any]] = attrs.field(factory=list)
    duplicate_tool_entries: int = 0  # deltas naming one tool-call index twice
    logprob_tokens: int = 0

    @property
    def first_at(self) -> float | None:
        return self.times[0] if self.times else None

    @property
    def finish_reason(self) -> str | None:
        return self.finish_reasons[-1] if self.finish_reasons else None


@attrs.define
class StreamRecord:
    """What one stream delivered. ``duplicate_entries`` counts chunks that carried
    more than one entry for the same choice index (clients keyed on the index
    overwrite or drop one of them); ``done`` is True once ``[DONE]`` came."""

    opened_at: float
    choices: dict[int, ChoiceTrace] = attrs.field(factory=dict)
    chunks: int = 0
    duplicate_entries: int = 0
    usage: dict[str, Any] | None = None
    usage_chunks: int = 0
    done: bool = False
    closed_at: float | None = None

    def add(self, chunk: dict[str, Any], now: float) -> list[int]:
        """Record one chunk; return the choice indices it carried."""
        self.chunks += 1
        if chunk.get("usage"):
            self.usage = chunk["usage"]
            self.usage_chunks += 1
        entries = chunk.get("choices") or []
        seen = Counter(int(e.get("index", 0)) for e in entries)
        self.duplicate_entries += sum(1 for c in seen.values() if c > 1)
        for entry in entries:
            self._add_entry(entry, now)
        return list(seen)

    def _add_entry(self, entry: dict[str, Any], now: float) -> None:
        index = int(entry.get("index", 0))
        trace = self.choices.setdefault(index, ChoiceTrace(index))
        if trace.finished_at is not None:
            trace.entries_after_finish += 1
        delta = entry.get("delta")
        if isinstance(delta, dict):
            trace.text += delta.get("content") or ""
            calls = delta.get("tool_calls") or []
            trace.tool_deltas.extend(calls)
            named = Counter(c.get("index") for c in calls if isinstance(c, dict))
            trace.duplicate_tool_entries += sum(1 for c in named.values() if c > 1)
        else:
            trace.text += entry.get("text") or ""
        trace.logprob_tokens += _logprob_tokens(entry.get("logprobs"))
        if _carries_output(entry):
            trace.times.append(now)
        if entry.get("finish_reason"):
            trace.finish_reasons.append(entry["finish_reason"])
            trace.finished_at = now

    # ------------------------------------------------------------ summaries

    def summary(self, since: float) -> dict[str, Any]:
        """What this stream had delivered: times in seconds from ``since``."""
        return {
            "opened_s": round(self.opened_at - since, 4),
            "chunks": self.chunks,
            "entries": {i: len(t.times) for i, t in sorted(self.choices.items())},
            "finished": self.finished(),
            "done": self.done,
        }

    def finished(self) -> list[int]:
        return sorted(i for i, t in self.choices.items() if t.finished_at is not None)

    def unfinished(self, expected: int) -> list[int]:
        return [
            i
            for i in range(expected)
            if self.choices.get(i) is None or self.choices[i].finished_at is None
        ]

    def peak_overlap(self) -> int:
        """The most choices that had begun and not yet finished at any moment:
        the number generating side by side (1 means one after another)."""
        events = []
        for trace in self.choices.values():
            if trace.first_at is None:
                continue
            end = trace.finished_at if trace.finished_at is not None else float("inf")
            events.append((trace.first_at, 1))
            events.append((end, -1))
        # An end and a start at the same instant do not overlap: ends sort first.
        events.sort(key=lambda e: (e[0], e[1]))
        live = peak = 0
        for _, step in events:
            live += step
            peak = max(peak, live)
        return peak


def peak_overlap(records: list[StreamRecord]) -> int:
    """`StreamRecord.peak_overlap` across several single-choice streams."""
    merged = StreamRecord(opened_at=0.0)
    for i, record in enumerate(records):
        trace = record.choices.get(0)
        if trace is not None:
            merged.choices[i] = trace
    return merged.peak_overlap()


def tool_call_problems(trace: ChoiceTrace) -> list[str]:
    """What is wrong with one choice's streamed tool calls, as OpenAI's clients
    read them: each call index starts with an id, type "function" and a name, and
    its argument pieces join into JSON."""
    problems = []
    if trace.duplicate_tool_entries:
        problems.append(f"{trace.duplicate_tool_entries} deltas named one tool-call index twice")
    calls: dict[int, dict[str, Any]] = {}
    for delta in trace.tool_deltas:
        if not isinstance(delta.get("index"), int):
            problems.append("a tool_calls delta without an integer index")
            continue
        fn = delta.get("function") or {}
        call = calls.get(delta["index"])
        if call is None:
            if not delta.get("id") or delta.get("type") != "function" or not fn.get("name"):
                problems.append(f"tool call {delta['index']}: first delta lacks id, type or name")
            calls[delta["index"]] = {"name": fn.get("name"), "arguments": fn.get("arguments") or ""}
        else:
            if delta.get("id") and fn.get("name"):
                problems.append(f"tool call {delta['index']}: id and name sent again")
            call["arguments"] += fn.get("arguments") or ""
    if not calls:
        problems.append("no tool call streamed")
    for index, call in calls.items():
        try:
            json.loads(call["arguments"])
        except ValueError:
            problems.append(
                f"tool call {index}: arguments are not JSON: {call['arguments'][:80]!r}"
            )
    return problems


def _carries_output(entry: dict[str, Any]) -> bool:
    delta = entry.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("tool_calls"))
    return bool(entry.get("text"))


def _logprob_tokens(logprobs: Any) -> int:
    if not isinstance(logprobs, dict):
        return 0
    content = logprobs.get("content")  # chat
    if isinstance(content, list):
        return len(content)
    tokens = logprobs.get("tokens")  # completions
    return len(tokens) if isinstance(tokens, list) else 0
