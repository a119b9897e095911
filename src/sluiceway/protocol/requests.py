"""Request bodies of the generation and tokenizer endpoints, as the server accepts them.

Every optional field is nullable, and `null` means the same as leaving the field
out (the server's default applies), as the OpenAI API treats it. Unknown fields
are ignored. What one field cannot say alone (`top_logprobs` needs `logprobs`,
token ids below the served model's vocabulary size, prompts times `n` within the
server's limit) the server checks after decoding.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import attrs
from msgspec import Meta

from sluiceway.protocol.constraints import (
    MAX_STOP,
    Bias,
    ChoicesN,
    Count,
    LogprobCount,
    NonNegative,
    Penalty,
    Probability,
    RepetitionPenalty,
    StopString,
    Temperature,
    TokenId,
    TopK,
    TopP,
)
from sluiceway.protocol.messages import ChatMessageParam
from sluiceway.protocol.tools import ResponseFormat, StructuredOutputs, Tool, ToolChoice

Conversation = Annotated[list[ChatMessageParam], Meta(min_length=1)]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]
TokenIds = Annotated[list[TokenId], Meta(min_length=1)]
Messages = Annotated[list[ChatMessageParam | Conversation], Meta(min_length=1)]
"""One conversation, or a batch of them (never both in one list: the server checks)."""


@attrs.frozen
class StreamOptions:
    """Only with `stream: true`. `continuous_usage_stats` (vLLM) puts usage in every chunk."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


@attrs.frozen(kw_only=True)
class SamplingFields:
    """Fields both generation endpoints take (OpenAI's, then vLLM's extensions)."""

    model: str | None = None
    n: ChoicesN | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: int | None = None
    stop: StopString | Annotated[list[StopString], Meta(max_length=MAX_STOP)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[int, Bias] | None = None
    # vLLM extensions
    top_k: TopK | None = None
    min_p: Probability | None = None
    min_tokens: NonNegative | None = None
    repetition_penalty: RepetitionPenalty | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None


@attrs.frozen(kw_only=True)
class ChatCompletionRequest(SamplingFields):
    """`POST /v1/chat/completions`. `messages` is one conversation, or a list of
    conversations (batch chat: choice index = conversation index * n + j)."""

    messages: Messages
    max_completion_tokens: Count | None = None
    logprobs: bool | None = None
    top_logprobs: LogprobCount | None = None
    add_generation_prompt: bool | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Reasoning models: what the chat template is given besides the messages
    # (`{"enable_thinking": false}`; every key passes through, as in vLLM), and a
    # cap on the thinking, after which its closing tag is written.
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: the last (assistant) message is left open and continued.
    continue_final_message: bool | None = None
    reasoning_effort: ReasoningEffort | None = None
    max_reasoning_tokens: NonNegative | None = None


@attrs.frozen(kw_only=True)
class CompletionRequest(SamplingFields):
    """`POST /v1/completions`. `prompt` is a string, a list of token ids, or a list
    of prompts (strings or token-id lists; choice index = prompt index * n + j)."""

    prompt: str | Annotated[list[str | TokenId | TokenIds], Meta(min_length=1)]
    logprobs: LogprobCount | None = None
    echo: bool | None = None
    # OpenAI fields that would change the result and are not supported: refused
    # rather than ignored (the server checks).
    suffix: str | None = None
    best_of: int | None = None


@attrs.frozen(kw_only=True)
class TokenizeRequest:
    """`POST /tokenize`: a `prompt`, or one conversation in `messages`."""

    model: str | None = None
    prompt: str | None = None
    add_special_tokens: bool | None = None
    messages: Conversation | None = None
    add_generation_prompt: bool | None = None


@attrs.frozen(kw_only=True)
class DetokenizeRequest:
    """`POST /detokenize`."""

    tokens: list[TokenId]
    model: str | None = None
