"""Request bodies -> what the server runs: conversations or prompts, `n`, and
`SamplingParams`.

The body is decoded into its type from `sluiceway.protocol` (`wire.decode`), which
checks every field's type and range and names a bad one by its JSON path. What
no single field's type can say is checked here: limits that depend on the served
model or on the server's flags, and rules that join fields. Everything a client
can get wrong is a 400 `APIError`, so a bad request never reaches the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from sluiceway import protocol
from sluiceway.api.http.errors import APIError, invalid_request
from sluiceway.api.http.wire import decode, parse_json
from sluiceway.api.pipeline.structured import ToolUse, chat_constraint, output_constraint
from sluiceway.engine.sampling_params import InvalidParameterError, SamplingParams
from sluiceway.grammar.spec import GrammarSpec
from sluiceway.protocol.constraints import MAX_PROMPTS, as_int
from sluiceway.protocol.requests import Messages
from sluiceway.reasoning import PromptState, ReasoningFormat, thinking_budget

# Keys of `chat_template_kwargs` that are the renderer's own arguments, not the
# template's variables.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "return_dict",
        "return_tensors",
    }
)


@attrs.frozen
class ReasoningSetup:
    """A chat request to a reasoning model: its parser's format, and where each
    prompt leaves the thinking (`states[i]` for conversation i)."""

    format: ReasoningFormat
    states: tuple[PromptState, ...]


# Prompts x n per request, unless the caller says otherwise: the server passes
# `ServerConfig.max_choices_per_request` (`--max-choices-per-request`, default 128).
MAX_CHOICES = 128
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)

Conversation = tuple[dict[str, Any], ...]


@attrs.frozen(kw_only=True)
class ValidatedRequest:
    """A request body validated into what the pipeline runs (the wire body is the
    `protocol` type of the same name, less `Validated`): `n` choices per prompt. With a
    `grammar`, the output must match it (`grammar_param` is where the request
    asked for it); it is compiled into `params.grammar` before the engine runs."""

    model: str | None
    n: int
    stream: bool
    stream_options: protocol.StreamOptions
    params: SamplingParams
    grammar: GrammarSpec | None = None
    grammar_param: str | None = None


@attrs.frozen(kw_only=True)
class ValidatedCompletionRequest(ValidatedRequest):
    """`prompts`: each a string or a tuple of token ids, in request order."""

    prompts: tuple[str | tuple[int, ...], ...]
    echo: bool


@attrs.frozen(kw_only=True)
class ValidatedChatRequest(ValidatedRequest):
    """`conversations`: one for a plain request, several for batch chat (`batched`).

    Each message is `{"role", "content"[, "name"]}` with string content, as chat
    templates read it. `top_logprobs` is meaningful only when `logprobs` is true.
    """

    conversations: tuple[Conversation, ...]
    batched: bool
    logprobs: bool
    top_logprobs: int
    add_generation_prompt: bool
    tool_use: ToolUse | None = None
    # What the chat template is given besides the messages (the request's
    # `chat_template_kwargs`; the server's defaults are added when rendering).
    template_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    # Tokens a reasoning model may think before its closing tag is forced (None:
    # no limit); `reasoning` is how this model marks its thinking and where each
    # prompt leaves it (None: the server parses no thinking), set with the prompts.
    reasoning_budget: int | None = None
    reasoning: ReasoningSetup | None = None


def check_token_ids(ids: Sequence[int], vocab_size: int, param: str) -> None:
    """400 naming `param` unless every id is in the vocabulary [0, vocab_size)."""
    for token_id in ids:
        if not 0 <= token_id < vocab_size:
            raise invalid_request(
                f"Token id {token_id} in '{param}' is outside the vocabulary [0, {vocab_size}).",
                param,
            )


def _sampling_params(
    wire: protocol.SamplingFields, vocab_size: int, max_tokens: int | None, logprobs: int | None
) -> SamplingParams:
    if wire.seed is not None and not SEED_RANGE[0] <= wire.seed <= SEED_RANGE[1]:
        raise invalid_request(f"'seed' must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}].", "seed")
    stop_token_ids = tuple(wire.stop_token_ids or ())
    check_token_ids(stop_token_ids, vocab_size, "stop_token_ids")
    logit_bias = dict(wire.logit_bias or {})
    check_token_ids(list(logit_bias), vocab_size, "logit_bias")
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if wire.temperature is None else wire.temperature,
            top_p=1.0 if wire.top_p is None else wire.top_p,
            top_k=max(as_int(wire.top_k) or 0, 0),  # -1 and 0 both disable top-k
            min_p=wire.min_p or 0.0,
            seed=wire.seed,
            stop=wire.stop,
            stop_token_ids=stop_token_ids,
            include_stop_str_in_output=bool(wire.include_stop_str_in_output),
            ignore_eos=bool(wire.ignore_eos),
            min_tokens=as_int(wire.min_tokens) or 0,
            presence_penalty=wire.presence_penalty or 0.0,
            frequency_penalty=wire.frequency_penalty or 0.0,
            repetition_penalty=(
                1.0 if wire.repetition_penalty is None else wire.repetition_penalty
            ),
            logit_bias=logit_bias,
            logprobs=logprobs,
        )
    except InvalidParameterError as exc:
        raise invalid_request(str(exc), exc.param) from None


def _common(
    wire: protocol.SamplingFields, n_prompts: int, prompt_param: str, max_choices: int
) -> dict[str, Any]:
    n = as_int(wire.n) or 1
    if n * n_prompts > max_choices:
        raise invalid_request(
            f"This request asks for {n * n_prompts} choices ({n_prompts} prompt(s) x n={n}); "
            f"this server allows at most {max_choices} per request "
            "(--max-choices-per-request).",
            "n" if n > 1 else prompt_param,
        )
    stream = bool(wire.stream)
    if wire.stream_options is not None and not stream:
        raise invalid_request(
            "'stream_options' is only allowed when 'stream' is true.", "stream_options"
        )
    return {
        "model": wire.model,
        "n": n,
        "stream": stream,
        "stream_options": wire.stream_options or protocol.StreamOptions(),
    }


def prompt_list(
    value: str | list[Any], param: str = "prompt", limit: int = MAX_PROMPTS
) -> tuple[str | tuple[int, ...], ...]:
    """The prompts of a `prompt` (or embeddings `input`) field: a string, an array
    of strings, an array of token ids (one prompt), or an array of token-id arrays;
    strings and token-id arrays may be mixed. A 400 naming `param` otherwise, or
    beyond `limit` prompts."""
    if isinstance(value, str):
        return (value,)
    if all(isinstance(p, int) for p in value):
        return (tuple(value),)
    if any(isinstance(p, int) for p in value):
        raise invalid_request(
            f"'{param}' must be a string, an array of strings, an array of token ids, "
            "or an array of token-id arrays.",
            param,
        )
    prompts = tuple(p if isinstance(p, str) else tuple(p) for p in value)
    if len(prompts) > limit:
        raise invalid_request(f"A request may hold at most {limit} inputs in '{param}'.", param)
    return prompts


def parse_completion_request(
    body: Any, vocab_size: int, *, max_choices: int = MAX_CHOICES
) -> ValidatedCompletionRequest:
    """Decode and validate a `/v1/completions` body (raw JSON, or decoded JSON); see
    `completion_request`."""
    return completion_request(
        decode(body, protocol.CompletionRequest), vocab_size, max_choices=max_choices
    )


def completion_request(
    wire: protocol.CompletionRequest, vocab_size: int, *, max_choices: int = MAX_CHOICES
) -> ValidatedCompletionRequest:
    """What a decoded `/v1/completions` body asks the engine for. Raises `APIError`
    (400) for token ids outside the vocabulary, fields that contradict each other,
    or when prompts x n exceeds `max_choices`."""
    prompts = prompt_list(wire.prompt)
    for p in prompts:
        if not isinstance(p, str):
            check_token_ids(p, vocab_size, "prompt")
    common = _common(wire, len(prompts), "prompt", max_choices)
    max_tokens = as_int(wire.max_tokens) or 16
    logprobs = as_int(wire.logprobs)
    echo = bool(wire.echo)
    if echo and logprobs is not None:
        raise invalid_request("'echo' together with 'logprobs' is not supported.", "echo")
    if wire.suffix:
        raise invalid_request("'suffix' (insertion) is not supported by this server.", "suffix")
    if wire.best_of is not None and wire.best_of != common["n"]:
        raise invalid_request(
            "'best_of' other than 'n' is not supported by this server; ask for 'n' choices.",
            "best_of",
        )
    grammar, grammar_param = output_constraint(wire)
    params = _sampling_params(wire, vocab_size, max_tokens, logprobs)
    return ValidatedCompletionRequest(
        **common,
        params=params,
        prompts=prompts,
        echo=echo,
        grammar=grammar,
        grammar_param=grammar_param,
    )


def check_conversation(
    messages: Sequence[protocol.ChatMessageParam], max_messages: int | None, param: str
) -> Conversation:
    """One conversation as chat templates read it; a 400 naming `param` when it
    holds more than `max_messages` messages (each takes at least one token)."""
    if max_messages is not None and len(messages) > max_messages:
        raise invalid_request(
            f"A conversation may hold at most {max_messages} messages (this model's "
            f"context length in tokens; every message takes at least one); this one "
            f"holds {len(messages)}.",
            param,
        )
    return tuple(m.for_template() for m in messages)


def conversations(
    messages: Sequence[protocol.ChatMessageParam | Sequence[protocol.ChatMessageParam]],
    max_messages: int | None = None,
) -> tuple[tuple[Conversation, ...], bool]:
    """The conversations of a decoded `messages` field and whether it was a batch."""
    batched = isinstance(messages[0], list)
    for i, item in enumerate(messages):
        if isinstance(item, list) != batched:
            raise invalid_request(
                "'messages' must be an array of messages or an array of conversations "
                "(arrays of messages), not both.",
                f"messages[{i}]",
            )
    convs: Sequence[Any] = messages if batched else [messages]
    if len(convs) > MAX_PROMPTS:
        raise invalid_request(f"A batch may hold at most {MAX_PROMPTS} conversations.", "messages")
    return tuple(check_conversation(c, max_messages, "messages") for c in convs), batched


def parse_conversations(
    value: Any, max_messages: int | None = None
) -> tuple[tuple[Conversation, ...], bool]:
    """The conversations of a `messages` value (decoded JSON) and whether it was a batch."""
    decoded = decode(value, Messages, "messages")
    return conversations(decoded, max_messages)


def parse_chat_request(
    body: Any,
    vocab_size: int,
    *,
    max_choices: int = MAX_CHOICES,
    max_messages: int | None = None,
) -> ValidatedChatRequest:
    """Decode and validate a `/v1/chat/completions` body (raw JSON, or decoded
    JSON); see `chat_request`."""
    wire = decode(body, protocol.ChatCompletionRequest)
    return chat_request(wire, vocab_size, max_choices=max_choices, max_messages=max_messages)


def chat_request(
    wire: protocol.ChatCompletionRequest,
    vocab_size: int,
    *,
    max_choices: int = MAX_CHOICES,
    max_messages: int | None = None,
) -> ValidatedChatRequest:
    """What a decoded `/v1/chat/completions` body asks the engine for. Raises
    `APIError` (400) for token ids outside the vocabulary, fields that contradict
    each other, when conversations x n exceeds `max_choices`, or when a
    conversation holds more than `max_messages` messages."""
    convs, batched = conversations(wire.messages, max_messages)
    grammar, grammar_param, tool_use = chat_constraint(wire)
    common = _common(wire, len(convs), "messages", max_choices)
    max_tokens = as_int(
        wire.max_tokens if wire.max_completion_tokens is None else wire.max_completion_tokens
    )
    logprobs = bool(wire.logprobs)
    if wire.top_logprobs is not None and not logprobs:
        raise invalid_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
    top_logprobs = as_int(wire.top_logprobs) or 0
    params = _sampling_params(wire, vocab_size, max_tokens, top_logprobs if logprobs else None)
    kwargs = dict(wire.chat_template_kwargs or {})
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(kwargs))
    if reserved:
        raise invalid_request(
            f"'chat_template_kwargs' may not set {', '.join(map(repr, reserved))}: "
            "the request's own fields say that.",
            "chat_template_kwargs",
        )
    add_generation_prompt = wire.add_generation_prompt is not False
    if wire.continue_final_message:
        add_generation_prompt = _continued(wire, convs)
        # The renderer's own argument, set here from the request's field.
        kwargs["continue_final_message"] = True
    return ValidatedChatRequest(
        **common,
        params=params,
        conversations=convs,
        batched=batched,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        add_generation_prompt=add_generation_prompt,
        grammar=grammar,
        grammar_param=grammar_param,
        tool_use=tool_use,
        template_kwargs=kwargs,
        reasoning_budget=thinking_budget(as_int(wire.max_reasoning_tokens), wire.reasoning_effort),
    )


def _continued(wire: protocol.ChatCompletionRequest, convs: Sequence[Conversation]) -> bool:
    """`add_generation_prompt` for a request that continues its last message
    (always False); a 400 where that cannot be."""
    if wire.add_generation_prompt:
        raise invalid_request(
            "'continue_final_message' and 'add_generation_prompt' cannot both be true.",
            "continue_final_message",
        )
    for conv in convs:
        if conv[-1]["role"] != "assistant":
            raise invalid_request(
                "'continue_final_message' needs each conversation to end with an "
                "assistant message to continue.",
                "continue_final_message",
            )
    return False


__all__ = [
    "APIError",
    "ValidatedChatRequest",
    "ValidatedCompletionRequest",
    "chat_request",
    "check_conversation",
    "check_token_ids",
    "completion_request",
    "parse_chat_request",
    "parse_completion_request",
    "parse_conversations",
    "parse_json",
]
