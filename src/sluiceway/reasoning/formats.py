"""How a reasoning model marks its thinking: a tag pair, and what an output that
does not open with the tag means. One `ReasoningFormat` per parser name; the
registry and the per-family choice are in `registry`."""

from __future__ import annotations

from typing import Literal

import attrs

PromptState = Literal["open", "closed", "fresh"]
"""Where the rendered prompt leaves the thinking: `open` (the template wrote the
opening tag, so the output starts inside the thinking), `closed` (it wrote a whole,
empty block: thinking is off, the output is all answer), `fresh` (the model opens
the block itself, or does not think)."""


@attrs.frozen
class ReasoningFormat:
    """A parser: thinking is the text between `start` and `end`.

    `implicit_start`: an output that does not open with `start` is still thinking
    until `end` (DeepSeek-R1, whose templates may put the opening tag in the prompt
    or leave it out); otherwise such an output is all answer (Qwen3 with thinking
    switched off in a way the prompt does not show)."""

    name: str
    start: str = "<think>"
    end: str = "</think>"
    implicit_start: bool = False

    def __attrs_post_init__(self) -> None:
        if not self.start or not self.end or self.start == self.end:
            raise ValueError(f"reasoning parser {self.name!r}: two different, non-empty tags")

    @property
    def closer(self) -> str:
        """What is written to end the thinking when its budget runs out."""
        return f"\n{self.end}\n\n"

    def prompt_state(self, prompt: str) -> PromptState:
        """Where `prompt` (the rendered chat template) leaves the thinking."""
        if prompt.rstrip().endswith(self.end):
            return "closed"
        if prompt.rfind(self.start) > prompt.rfind(self.end):
            return "open"
        return "fresh"
