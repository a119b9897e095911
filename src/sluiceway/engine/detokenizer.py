"""Incremental detokenization with UTF-8 and stop-string hold-back.

Pure Python over a `decode(ids) -> str` callable, so it can be tested with a
fake tokenizer and run wherever the engine step runs (a worker thread).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

Decode = Callable[[Sequence[int]], str]

# A few prompt tokens give the decoder the context it needs for leading spaces
# (SentencePiece/byte-level BPE) without decoding the whole prompt each time.
_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


@attrs.frozen
class DetokenizedText:
    """Text that may be shown now, and the stop string that ended the choice, if any."""

    text: str
    stop: str | None = None


@attrs.define
class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Promises: the concatenation of every delta equals the decoded output up to the
    stop (or the end), never contains a partial UTF-8 character, and never shows
    text that could still become the start of a stop string.
    """

    decode: Decode
    stop_strings: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    _ids: list[int] = attrs.field(factory=list)
    _prefix_offset: int = 0
    _read_offset: int = 0
    _held: str = ""

    @classmethod
    def for_prompt(
        cls,
        decode: Decode,
        prompt_token_ids: Sequence[int],
        stop_strings: tuple[str, ...] = (),
        include_stop_str_in_output: bool = False,
    ) -> IncrementalDetokenizer:
        context = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        return cls(
            decode,
            stop_strings,
            include_stop_str_in_output,
            ids=context,
            prefix_offset=0,
            read_offset=len(context),
        )

    def add_token(self, token_id: int) -> DetokenizedText:
        """Feed one generated token; returns the text that became safe to show."""
        self._ids.append(token_id)
        return self._release(self._decode_new())

    def flush(self) -> DetokenizedText:
        """The choice is ending: release everything still held (cut at a stop string)."""
        tail = self.decode(self._ids[self._prefix_offset :])
        already = self.decode(self._ids[self._prefix_offset : self._read_offset])
        rest = tail[len(already) :] if tail.startswith(already) else ""
        self._prefix_offset = self._read_offset = len(self._ids)
        buffer, self._held = self._held + rest, ""
        found = _earliest_stop(buffer, self.stop_strings)
        if found is None:
            return DetokenizedText(buffer)
        index, stop = found
        end = index + len(stop) if self.include_stop_str_in_output else index
        return DetokenizedText(buffer[:end], stop)

    def _decode_new(self) -> str:
        before = self.decode(self._ids[self._prefix_offset : self._read_offset])
        after = self.decode(self._ids[self._prefix_offset :])
        if len(after) <= len(before) or after.endswith(_REPLACEMENT_CHAR):
            return ""  # an incomplete UTF-8 sequence, or nothing printable yet
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return after[len(before) :]

    def _release(self, new_text: str) -> DetokenizedText:
        buffer = self._held + new_text
        if not self.stop_strings:
            self._held = ""
            return DetokenizedText(buffer)
        found = _earliest_stop(buffer, self.stop_strings)
        if found is not None:
            index, stop = found
            end = index + len(stop) if self.include_stop_str_in_output else index
            self._held = ""
            return DetokenizedText(buffer[:end], stop)
        keep = _longest_stop_prefix_suffix(buffer, self.stop_strings)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return DetokenizedText(buffer[: len(buffer) - keep])


def _earliest_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for stop in stops:
        index = text.find(stop)
        if index != -1 and (best is None or index < best[0]):
            best = (index, stop)
    return best


def _longest_stop_prefix_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:length]):
                longest = length
                break
    return longest
