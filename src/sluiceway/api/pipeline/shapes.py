"""Per-endpoint shapes of chunks and full responses (chat vs legacy completions)."""

from __future__ import annotations

from typing import Any

import attrs

from sluiceway import protocol
from sluiceway.api.pipeline import formatting as fmt
from sluiceway.api.pipeline import tool_calls
from sluiceway.api.pipeline.request_run import ChoiceState, RequestRun
from sluiceway.api.pipeline.validation import ValidatedChatRequest, ValidatedCompletionRequest
from sluiceway.engine.outputs import ChoiceDelta
from sluiceway.reasoning import ReasoningSplitter

_EMPTY_DELTA = protocol.DeltaMessage()


@attrs.frozen
class ChatShape:
    """Chat chunks and responses. For a reasoning model (`request.reasoning`), each
    choice's text is split into `reasoning_content` and content by a splitter of
    its own, before any tool-call parsing of the content."""

    request: ValidatedChatRequest
    token_text: fmt.TokenText
    id_prefix: str = "chatcmpl-"
    chunk_type: type[protocol.ChatCompletionChunk] = protocol.ChatCompletionChunk
    # Each choice's reasoning splitter, by choice index (owned by its consumer).
    _splitters: dict[int, ReasoningSplitter] = attrs.field(factory=dict, init=False)

    def _splitter(self, choice: ChoiceState, fresh: bool = False) -> ReasoningSplitter | None:
        setup = self.request.reasoning
        if setup is None:
            return None
        splitter = None if fresh else self._splitters.get(choice.index)
        if splitter is None:
            prompt_state = setup.states[choice.index // self.request.n]
            splitter = ReasoningSplitter.for_prompt(setup.format, prompt_state)
            self._splitters[choice.index] = splitter
        return splitter

    def _split(self, choice: ChoiceState, delta: ChoiceDelta) -> tuple[str, str]:
        """The delta's (content, thinking)."""
        splitter = self._splitter(choice)
        if splitter is None:
            return delta.text, ""
        split = splitter.feed(delta.text, len(delta.token_ids))
        content, reasoning = split.content, split.reasoning
        if delta.finish_reason is not None:
            last = splitter.finish()
            content, reasoning = content + last.content, reasoning + last.reasoning
        return content, reasoning

    def usage(self, run: RequestRun) -> protocol.Usage:
        """The run's token counts; for a reasoning model, with its thinking's."""
        usage = fmt.usage(run.prompt_tokens, run.completion_tokens, run.cached_tokens)
        thinking = self.reasoning_tokens()
        if thinking is None:
            return usage
        details = protocol.CompletionTokensDetails(thinking)
        return attrs.evolve(usage, completion_tokens_details=details)

    def reasoning_tokens(self) -> int | None:
        """The thinking's tokens over every choice so far; None without a parser."""
        if self.request.reasoning is None:
            return None
        return sum(s.reasoning_tokens for s in self._splitters.values())

    def _logprobs(self, choice_logprobs: Any) -> list[protocol.ChatTokenLogprob] | None:
        if not self.request.logprobs:
            return None
        return fmt.chat_logprobs(choice_logprobs, self.token_text, self.request.top_logprobs)

    @property
    def parses_tool_calls(self) -> bool:
        use = self.request.tool_use
        return use is not None and use.parse_calls

    def open_choice(self, choice: ChoiceState) -> protocol.ChatCompletionChunkChoice | None:
        """The first chunk of every choice carries the role, as OpenAI sends it."""
        return protocol.ChatCompletionChunkChoice(
            choice.index, protocol.DeltaMessage(role="assistant", content="")
        )

    def text_only_delta(self, choice: ChoiceState, delta: ChoiceDelta) -> str | None:
        """`delta.text` when `delta_choice` would give just `text_choice(choice.index,
        delta.text)`; None otherwise. Changes nothing (see CompletionShape's)."""
        if (
            not self.parses_tool_calls
            and delta.text
            and delta.finish_reason is None
            and not (self.request.logprobs and delta.logprobs)
        ):
            splitter = self._splitter(choice)
            if splitter is None or splitter.passes_through:
                return delta.text
        return None

    def text_choice(self, index: int, text: str) -> protocol.ChatCompletionChunkChoice:
        return protocol.ChatCompletionChunkChoice(index, protocol.DeltaMessage(content=text))

    def delta_choice(
        self, choice: ChoiceState, delta: ChoiceDelta
    ) -> protocol.ChatCompletionChunkChoice | None:
        finish: str | None = delta.finish_reason
        text, reasoning = self._split(choice, delta)
        if self.parses_tool_calls:
            body, finish = self._tool_delta(choice, text, finish)
        else:
            body = protocol.DeltaMessage(content=text or None)
        if reasoning:
            body = attrs.evolve(body, reasoning_content=reasoning)
        logprobs = self._logprobs(delta.logprobs) if delta.logprobs else None
        if body == _EMPTY_DELTA and logprobs is None and finish is None:
            return None
        return protocol.ChatCompletionChunkChoice(
            choice.index,
            body,
            finish,
            None if logprobs is None else protocol.ChatLogprobs(logprobs),
            delta.stop_reason,
        )

    @staticmethod
    def _tool_delta(
        choice: ChoiceState, text: str, finish: str | None
    ) -> tuple[protocol.DeltaMessage, str | None]:
        """The content and tool-call pieces of a delta's `text`, and its finish
        reason: a choice that stopped after making calls finishes with "tool_calls"."""
        parser = choice.tool_parser
        if parser is None:
            parser = choice.tool_parser = tool_calls.ToolCallParser()
        content, calls = parser.feed(text)
        if finish is not None:
            content += parser.finish()
            if finish == "stop" and parser.calls:
                finish = "tool_calls"
        return protocol.DeltaMessage(content=content or None, tool_calls=calls or None), finish

    def final_choice(self, choice: ChoiceState) -> protocol.ChatCompletionChoice:
        logprobs = self._logprobs(choice.logprobs)
        text, reasoning = self._final_split(choice)
        content: str | None = text
        calls: list[protocol.ToolCall] = []
        finish: str | None = choice.finish_reason
        if self.parses_tool_calls:
            content, calls = tool_calls.parse(text)
            if calls and finish == "stop":
                finish = "tool_calls"
        return protocol.ChatCompletionChoice(
            index=choice.index,
            message=protocol.ChatMessage("assistant", content, calls or None, reasoning),
            finish_reason=finish,
            logprobs=None if logprobs is None else protocol.ChatLogprobs(logprobs),
            stop_reason=choice.stop_reason,
        )

    def _final_split(self, choice: ChoiceState) -> tuple[str, str | None]:
        """A finished choice's (content, thinking), its parts fed as they came, so
        that its reasoning tokens count as a stream's do; thinking None when the
        output has none."""
        splitter = self._splitter(choice, fresh=True)
        if splitter is None:
            return choice.text, None
        content, reasoning = [], []
        # Every part is split; a part whose tokens were not recorded counts none.
        counts = [*choice.part_tokens, *[0] * (len(choice.text_parts) - len(choice.part_tokens))]
        for part, count in zip(choice.text_parts, counts, strict=False):
            split = splitter.feed(part, count)
            content.append(split.content)
            reasoning.append(split.reasoning)
        last = splitter.finish()
        content.append(last.content)
        reasoning.append(last.reasoning)
        return "".join(content), "".join(reasoning) if splitter.thought else None

    def full_response(self, **fields: Any) -> protocol.ChatCompletion:
        return protocol.ChatCompletion(**fields)


@attrs.frozen
class CompletionShape:
    request: ValidatedCompletionRequest
    token_text: fmt.TokenText
    id_prefix: str = "cmpl-"
    chunk_type: type[protocol.CompletionChunk] = protocol.CompletionChunk

    def open_choice(self, choice: ChoiceState) -> protocol.CompletionChoice | None:
        if not (self.request.echo and choice.prompt.text):
            return None
        return protocol.CompletionChoice(choice.index, choice.prompt.text)

    def text_only_delta(self, choice: ChoiceState, delta: ChoiceDelta) -> str | None:
        """`delta.text` when `delta_choice` would give just `text_choice(choice.index,
        delta.text)`, having advanced the choice's text offset as it would; None
        otherwise, changing nothing."""
        if (
            delta.text
            and delta.finish_reason is None
            and not (self.request.params.logprobs is not None and delta.logprobs)
        ):
            choice.text_offset += len(delta.text)
            return delta.text
        return None

    def text_choice(self, index: int, text: str) -> protocol.CompletionChoice:
        return protocol.CompletionChoice(index, text)

    def delta_choice(self, choice: ChoiceState, delta: ChoiceDelta) -> protocol.CompletionChoice | None:
        logprobs = None
        if self.request.params.logprobs is not None and delta.logprobs:
            logprobs = fmt.completion_logprobs(delta.logprobs, self.token_text, choice.text_offset)
        choice.text_offset += len(delta.text)
        if not delta.text and logprobs is None and delta.finish_reason is None:
            return None
        return protocol.CompletionChoice(
            choice.index, delta.text, delta.finish_reason, logprobs, delta.stop_reason
        )

    def usage(self, run: RequestRun) -> protocol.Usage:
        return fmt.usage(run.prompt_tokens, run.completion_tokens, run.cached_tokens)

    def final_choice(self, choice: ChoiceState) -> protocol.CompletionChoice:
        logprobs = None
        if self.request.params.logprobs is not None:
            logprobs = fmt.completion_logprobs(choice.logprobs, self.token_text, 0)
        text = choice.text
        if self.request.echo:
            text = choice.prompt.text + text
        return protocol.CompletionChoice(
            choice.index, text, choice.finish_reason, logprobs, choice.stop_reason
        )

    def full_response(self, **fields: Any) -> protocol.Completion:
        return protocol.Completion(**fields)


Shape = ChatShape | CompletionShape
ChunkChoice = protocol.ChatCompletionChunkChoice | protocol.CompletionChoice


def full_response(shape: Shape, run: RequestRun, request_id: str, created: int) -> dict[str, Any]:
    """The non-streamed response body, built from the protocol types."""
    # The choices first: a chat shape counts their thinking as it shapes them.
    choices = [shape.final_choice(c) for c in sorted(run.choices, key=lambda c: c.index)]
    response = shape.full_response(
        id=request_id,
        model=run.served_name,
        choices=choices,
        created=created,
        usage=shape.usage(run),
    )
    return response.to_dict()
