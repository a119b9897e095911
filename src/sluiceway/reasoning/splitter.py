"""Splitting a reasoning model's output into its thinking and its answer, fed the
text deltas of one choice as the detokenizer releases them.

The tags may arrive cut anywhere (`"</th"` + `"ink>"`): the splitter holds back
any tail that could still become a tag, and releases it as soon as it cannot.
Whitespace around the thinking and before the answer is dropped, as a template
writes it (`"<think>\\n...\\n</think>\\n\\n"`); the whole-text split is the same
splitter fed one delta, so a streamed and a non-streamed choice agree.
"""

from __future__ import annotations

import enum

import attrs

from sluiceway.reasoning.formats import PromptState, ReasoningFormat


class Phase(enum.Enum):
    OPENING = "opening"  # not yet known whether the output opens with the tag
    THINKING = "thinking"
    ANSWER = "answer"


@attrs.frozen
class Split:
    """What one fed delta adds: to the thinking, to the answer (either may be '')."""

    reasoning: str = ""
    content: str = ""


def _tag_prefix_len(text: str, tag: str) -> int:
    """The length of the longest tail of `text` that `tag` starts with (the tag may
    be completed by the next delta)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


@attrs.define
class ReasoningSplitter:
    """One choice's splitter. `feed` each delta (with the number of tokens it
    holds), then `finish` once; `reasoning_tokens` counts the tokens of deltas that
    went to the thinking, the delta that closes it included."""

    format: ReasoningFormat
    phase: Phase
    reasoning_tokens: int = 0
    #: The output has thinking (an opened block, or a prompt that opened it).
    thought: bool = False
    _pending: str = ""
    _opening_tokens: int = 0  # tokens fed while OPENING: thinking if it opens
    _thinking_started: bool = False  # non-blank thinking has been released
    _answer_started: bool = True  # False right after the end tag: drop blanks

    @classmethod
    def for_prompt(cls, fmt: ReasoningFormat, state: PromptState) -> ReasoningSplitter:
        """A splitter for an output that follows a prompt in `state`."""
        if state == "closed":
            return cls(fmt, Phase.ANSWER)
        if state == "open":
            return cls(fmt, Phase.THINKING, thought=True)
        return cls(fmt, Phase.OPENING)

    def feed(self, delta: str, tokens: int = 1) -> Split:
        """The thinking and answer text `delta` releases (text held back for a tag
        that may be completing is released by a later feed or by `finish`)."""
        was = self.phase
        self._pending += delta
        reasoning: list[str] = []
        content: list[str] = []
        self._run(reasoning, content)
        if was is Phase.OPENING and self.phase is Phase.OPENING:
            self._opening_tokens += tokens
        elif was is Phase.OPENING:
            if self.thought:
                self.reasoning_tokens += self._opening_tokens + tokens
            self._opening_tokens = 0
        elif was is Phase.THINKING:
            self.reasoning_tokens += tokens
        return Split("".join(reasoning), "".join(content))

    @property
    def passes_through(self) -> bool:
        """Whether the next delta is all answer, as it comes: the thinking is over
        and nothing is held back (a caller may skip `feed` for such deltas)."""
        return self.phase is Phase.ANSWER and self._answer_started and not self._pending

    def finish(self) -> Split:
        """Release what is held back: an unfinished tag is text of the part it was
        in; an output that never closed its thinking is all thinking."""
        text, self._pending = self._pending, ""
        if self.phase is Phase.OPENING:
            if self.format.implicit_start:
                self.thought = True
                self.reasoning_tokens += self._opening_tokens
                return Split(reasoning=text.strip())
            return Split(content=text)
        if self.phase is Phase.THINKING:
            return Split(reasoning=text.strip() if not self._thinking_started else text.rstrip())
        return Split(content=text if self._answer_started else text.lstrip())

    def _run(self, reasoning: list[str], content: list[str]) -> None:
        fmt = self.format
        while True:
            if self.phase is Phase.OPENING:
                head = self._pending.lstrip()
                if head.startswith(fmt.start):
                    self._pending = head[len(fmt.start) :]
                    self.phase, self.thought = Phase.THINKING, True
                elif fmt.start.startswith(head):
                    return  # blank, or the opening tag so far: wait
                elif fmt.implicit_start:
                    self.phase, self.thought = Phase.THINKING, True
                else:
                    self.phase = Phase.ANSWER
            elif self.phase is Phase.THINKING:
                if not self._thinking_started:
                    # A model may repeat the opening tag its prompt already wrote.
                    self._pending = self._pending.lstrip()
                    if self._pending.startswith(fmt.start):
                        self._pending = self._pending[len(fmt.start) :].lstrip()
                    elif self._pending and fmt.start.startswith(self._pending):
                        return
                at = self._pending.find(fmt.end)
                if at >= 0:
                    reasoning.append(self._pending[:at].rstrip())
                    self._pending = self._pending[at + len(fmt.end) :]
                    self.phase = Phase.ANSWER
                    self._answer_started = False
                    continue
                held = _tag_prefix_len(self._pending, fmt.end)
                ready = self._pending[: len(self._pending) - held]
                released = ready.rstrip()  # trailing blanks wait: they may precede the tag
                self._pending = ready[len(released) :] + self._pending[len(ready) :]
                if released:
                    reasoning.append(released)
                    self._thinking_started = True
                return
            else:
                if not self._answer_started:
                    self._pending = self._pending.lstrip()
                    if not self._pending:
                        return
                    self._answer_started = True
                content.append(self._pending)
                self._pending = ""
                return


def split_text(fmt: ReasoningFormat, state: PromptState, text: str) -> tuple[str | None, str]:
    """A whole output as (thinking, answer): thinking None when the output has
    none (as `reasoning_content` is null then)."""
    splitter = ReasoningSplitter.for_prompt(fmt, state)
    first = splitter.feed(text)
    last = splitter.finish()
    reasoning = first.reasoning + last.reasoning
    return (reasoning if splitter.thought else None), first.content + last.content
