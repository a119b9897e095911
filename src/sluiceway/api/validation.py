"""Request JSON -> validated request objects and `SamplingParams`.

Everything a client can get wrong is caught here (or when the prompt is tokenized)
and reported as a 400 `APIError` naming the offending field, so a bad request never
reaches the engine and never becomes a 500. Unknown fields are ignored, as the
OpenAI API does; known fields with the wrong JSON type are rejected (a JSON `true`
is not an integer here, and `1.5` is not an integer either).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from sluiceway.api.errors import APIError, invalid_request
from sluiceway.engine.sampling_params import InvalidParameterError, SamplingParams

MAX_N = 128
# Prompts x n per request, unless the caller says otherwise: the server passes
# `ServerConfig.max_choices_per_request` (`--max-choices-per-request`, default 128).
MAX_CHOICES = 128
MAX_PROMPTS = 1024
MAX_STOP = 64
MAX_LOGPROBS = 20
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_MISSING = object()


@attrs.frozen
class StreamOptions:
    include_usage: bool = False
    continuous_usage_stats: bool = False


@attrs.frozen(kw_only=True)
class CommonRequest:
    """Fields shared by both generation endpoints. `n` choices per prompt."""

    model: str | None
    n: int
    stream: bool
    stream_options: StreamOptions
    params: SamplingParams


@attrs.frozen(kw_only=True)
class CompletionRequest(CommonRequest):
    """`prompts`: each a string or a tuple of token ids, in request order."""

    prompts: tuple[str | tuple[int, ...], ...]
    echo: bool


@attrs.frozen(kw_only=True)
class ChatRequest(CommonRequest):
    """`conversations`: one for a plain request, several for batch chat (`batched`).

    Each message is normalized to `{"role", "content"[, "name"]}` with string content.
    `top_logprobs` is meaningful only when `logprobs` is true.
    """

    conversations: tuple[tuple[dict[str, str], ...], ...]
    batched: bool
    logprobs: bool
    top_logprobs: int
    add_generation_prompt: bool


class Fields:
    """Typed access to a request object's fields; each getter raises a 400 naming the field."""

    def __init__(self, body: Any) -> None:
        if not isinstance(body, Mapping):
            raise invalid_request("The request body must be a JSON object.")
        self._body = body

    def raw(self, name: str) -> Any:
        value = self._body.get(name, _MISSING)
        return _MISSING if value is None else value

    def has(self, name: str) -> bool:
        return self.raw(name) is not _MISSING

    def int(self, name: str, default: Any, lo: int | None = None, hi: int | None = None) -> Any:
        value = self.raw(name)
        if value is _MISSING:
            return default
        if isinstance(value, float) and value.is_integer() and not isinstance(value, bool):
            value = int(value)
        if not _is_int(value):
            raise invalid_request(f"'{name}' must be an integer, got {_kind(value)}.", name)
        _check_range(name, value, lo, hi)
        return value

    def number(
        self, name: str, default: Any, lo: float | None = None, hi: float | None = None
    ) -> Any:
        value = self.raw(name)
        if value is _MISSING:
            return default
        if not _is_number(value):
            raise invalid_request(f"'{name}' must be a number, got {_kind(value)}.", name)
        _check_range(name, value, lo, hi)
        return float(value)

    def bool(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            raise invalid_request(f"'{name}' must be a boolean, got {_kind(value)}.", name)
        return value

    def str(self, name: str, default: Any) -> Any:
        value = self.raw(name)
        if value is _MISSING:
            return default
        if not isinstance(value, str):
            raise invalid_request(f"'{name}' must be a string, got {_kind(value)}.", name)
        return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _kind(value: Any) -> str:
    names = {bool: "a boolean", str: "a string", list: "an array", dict: "an object"}
    for typ, name in names.items():
        if isinstance(value, typ):
            return name
    if isinstance(value, float):
        return "a number" if math.isfinite(value) else "a non-finite number"
    return "an integer" if isinstance(value, int) else type(value).__name__


def _check_range(name: str, value: float, lo: float | None, hi: float | None) -> None:
    if lo is not None and value < lo:
        raise invalid_request(f"'{name}' must be at least {lo}, got {value}.", name)
    if hi is not None and value > hi:
        raise invalid_request(f"'{name}' must be at most {hi}, got {value}.", name)


def _stop(fields: Fields) -> tuple[str, ...]:
    value = fields.raw("stop")
    if value is _MISSING:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        if len(value) > MAX_STOP:
            raise invalid_request(f"'stop' may hold at most {MAX_STOP} strings.", "stop")
        return tuple(value)
    raise invalid_request("'stop' must be a string or an array of strings.", "stop")


def _int_list(fields: Fields, name: str, vocab_size: int) -> tuple[int, ...]:
    value = fields.raw(name)
    if value is _MISSING:
        return ()
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise invalid_request(f"'{name}' must be an array of integers.", name)
    check_token_ids(value, vocab_size, name)
    return tuple(value)


def check_token_ids(ids: Sequence[int], vocab_size: int, param: str) -> None:
    for token_id in ids:
        if not 0 <= token_id < vocab_size:
            raise invalid_request(
                f"Token id {token_id} in '{param}' is outside the vocabulary [0, {vocab_size}).",
                param,
            )


def _logit_bias(fields: Fields, vocab_size: int) -> dict[int, float]:
    value = fields.raw("logit_bias")
    if value is _MISSING:
        return {}
    if not isinstance(value, Mapping):
        raise invalid_request("'logit_bias' must be an object of token id -> bias.", "logit_bias")
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token_id = int(key)
        except ValueError:
            raise invalid_request(
                f"'logit_bias' key {key!r} is not a token id.", "logit_bias"
            ) from None
        if not _is_number(bias):
            raise invalid_request("'logit_bias' values must be numbers.", "logit_bias")
        out[token_id] = float(bias)
    check_token_ids(list(out), vocab_size, "logit_bias")
    return out


def _stream_options(fields: Fields, stream: bool) -> StreamOptions:
    value = fields.raw("stream_options")
    if value is _MISSING:
        return StreamOptions()
    if not stream:
        raise invalid_request(
            "'stream_options' is only allowed when 'stream' is true.", "stream_options"
        )
    inner = Fields(value) if isinstance(value, Mapping) else None
    if inner is None:
        raise invalid_request("'stream_options' must be an object.", "stream_options")
    return StreamOptions(
        include_usage=inner.bool("include_usage", False),
        continuous_usage_stats=inner.bool("continuous_usage_stats", False),
    )


def _sampling_params(
    fields: Fields, vocab_size: int, max_tokens: int | None, logprobs: int | None
) -> SamplingParams:
    top_k = fields.int("top_k", 0, lo=-1)
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=fields.number("temperature", 1.0, lo=0.0, hi=2.0),
            top_p=fields.number("top_p", 1.0),
            top_k=max(top_k, 0),
            min_p=fields.number("min_p", 0.0),
            seed=fields.int("seed", None, lo=-(1 << 63), hi=(1 << 64) - 1),
            stop=_stop(fields),
            stop_token_ids=_int_list(fields, "stop_token_ids", vocab_size),
            include_stop_str_in_output=fields.bool("include_stop_str_in_output", False),
            ignore_eos=fields.bool("ignore_eos", False),
            min_tokens=fields.int("min_tokens", 0),
            presence_penalty=fields.number("presence_penalty", 0.0),
            frequency_penalty=fields.number("frequency_penalty", 0.0),
            repetition_penalty=fields.number("repetition_penalty", 1.0),
            logit_bias=_logit_bias(fields, vocab_size),
            logprobs=logprobs,
        )
    except InvalidParameterError as exc:
        raise invalid_request(str(exc), exc.param) from None


def _common(
    fields: Fields, n_prompts: int, prompt_param: str, max_choices: int
) -> tuple[str | None, int, bool, StreamOptions]:
    model = fields.str("model", None)
    n = fields.int("n", 1, lo=1, hi=MAX_N)
    if n * n_prompts > max_choices:
        raise invalid_request(
            f"This request asks for {n * n_prompts} choices ({n_prompts} prompt(s) x n={n}); "
            f"this server allows at most {max_choices} per request "
            "(--max-choices-per-request).",
            "n" if n > 1 else prompt_param,
        )
    stream = fields.bool("stream", False)
    return model, n, stream, _stream_options(fields, stream)


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_int(t) for t in value)


def _prompts(value: Any) -> tuple[str | tuple[int, ...], ...]:
    bad = invalid_request(
        "'prompt' must be a string, an array of strings, an array of token ids, "
        "or an array of token-id arrays.",
        "prompt",
    )
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not value:
        raise bad
    if all(_is_int(t) for t in value):
        prompts: tuple[str | tuple[int, ...], ...] = (tuple(value),)
    elif all(isinstance(p, str) or _is_token_list(p) for p in value):
        # strings and token-id lists may be mixed in one batch
        prompts = tuple(p if isinstance(p, str) else tuple(p) for p in value)
    else:
        raise bad
    if len(prompts) > MAX_PROMPTS:
        raise invalid_request(f"A request may hold at most {MAX_PROMPTS} prompts.", "prompt")
    return prompts


def parse_completion_request(
    body: Any, vocab_size: int, *, max_choices: int = MAX_CHOICES
) -> CompletionRequest:
    """Validate a `/v1/completions` body. Raises `APIError` (400) on any bad field,
    or when prompts x n exceeds `max_choices`."""
    fields = Fields(body)
    if not fields.has("prompt"):
        raise invalid_request("'prompt' is required.", "prompt")
    prompts = _prompts(fields.raw("prompt"))
    for p in prompts:
        if not isinstance(p, str):
            check_token_ids(p, vocab_size, "prompt")
    model, n, stream, stream_options = _common(fields, len(prompts), "prompt", max_choices)
    max_tokens = fields.int("max_tokens", 16, lo=1)
    logprobs = fields.int("logprobs", None, lo=0, hi=MAX_LOGPROBS)
    echo = fields.bool("echo", False)
    if echo and logprobs is not None:
        raise invalid_request("'echo' together with 'logprobs' is not supported.", "echo")
    params = _sampling_params(fields, vocab_size, max_tokens, logprobs)
    return CompletionRequest(
        model=model,
        n=n,
        stream=stream,
        stream_options=stream_options,
        params=params,
        prompts=prompts,
        echo=echo,
    )


def _content(value: Any, param: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise invalid_request("Only text content parts are supported.", param)
            if not isinstance(part.get("text"), str):
                raise invalid_request("A text content part needs a string 'text'.", param)
            texts.append(part["text"])
        return "\n".join(texts)
    raise invalid_request("Message 'content' must be a string or an array of text parts.", param)


def _message(value: Any, param: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise invalid_request("Each message must be an object with 'role' and 'content'.", param)
    role = value.get("role")
    if not isinstance(role, str) or role not in CHAT_ROLES:
        raise invalid_request(f"Message 'role' must be one of {sorted(CHAT_ROLES)}.", param)
    content = value.get("content")
    if content is None and role != "assistant":
        raise invalid_request("Message 'content' is required.", param)
    message = {"role": role, "content": "" if content is None else _content(content, param)}
    name = value.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise invalid_request("Message 'name' must be a string.", param)
        message["name"] = name
    return message


def parse_conversations(
    value: Any, max_messages: int | None = None
) -> tuple[tuple[tuple[dict[str, str], ...], ...], bool]:
    """The conversations of a `messages` field and whether it was a batch. A
    conversation longer than `max_messages` is a 400 before any message is checked."""
    if not isinstance(value, list) or not value:
        raise invalid_request("'messages' must be a non-empty array.", "messages")
    batched = isinstance(value[0], list)
    convs = value if batched else [value]
    if len(convs) > MAX_PROMPTS:
        raise invalid_request(f"A batch may hold at most {MAX_PROMPTS} conversations.", "messages")
    out = []
    for conv in convs:
        if not isinstance(conv, list) or not conv:
            raise invalid_request(
                "Batch 'messages' must be an array of non-empty message arrays.", "messages"
            )
        if max_messages is not None and len(conv) > max_messages:
            raise invalid_request(
                f"A conversation may hold at most {max_messages} messages (this model's "
                f"context length in tokens; every message takes at least one); this one "
                f"holds {len(conv)}.",
                "messages",
            )
        out.append(tuple(_message(m, "messages") for m in conv))
    return tuple(out), batched


def _reject_unsupported(fields: Fields) -> None:
    tools = fields.raw("tools")
    if tools is not _MISSING and tools != []:
        raise invalid_request("Tool calling is not supported by this server.", "tools")
    fmt = fields.raw("response_format")
    if fmt is not _MISSING and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        raise invalid_request(
            "Only response_format {'type': 'text'} is supported.", "response_format"
        )


def parse_chat_request(
    body: Any,
    vocab_size: int,
    *,
    max_choices: int = MAX_CHOICES,
    max_messages: int | None = None,
) -> ChatRequest:
    """Validate a `/v1/chat/completions` body. Raises `APIError` (400) on any bad field,
    when conversations x n exceeds `max_choices`, or when a conversation holds more
    than `max_messages` messages."""
    fields = Fields(body)
    if not fields.has("messages"):
        raise invalid_request("'messages' is required.", "messages")
    conversations, batched = parse_conversations(fields.raw("messages"), max_messages)
    _reject_unsupported(fields)
    model, n, stream, stream_options = _common(fields, len(conversations), "messages", max_choices)
    max_tokens = fields.int("max_completion_tokens", _MISSING, lo=1)
    if max_tokens is _MISSING:
        max_tokens = fields.int("max_tokens", None, lo=1)
    logprobs = fields.bool("logprobs", False)
    top_logprobs = fields.int("top_logprobs", 0, lo=0, hi=MAX_LOGPROBS)
    if fields.has("top_logprobs") and not logprobs:
        raise invalid_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
    params = _sampling_params(fields, vocab_size, max_tokens, top_logprobs if logprobs else None)
    return ChatRequest(
        model=model,
        n=n,
        stream=stream,
        stream_options=stream_options,
        params=params,
        conversations=conversations,
        batched=batched,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        add_generation_prompt=fields.bool("add_generation_prompt", True),
    )


# A JSON \u escape for a UTF-16 surrogate (D800-DFFF). Valid pairs are fine; a
# lone one decodes to a str that cannot be encoded as UTF-8 and breaks everything
# downstream (tokenizer, error messages), so it is a 400 at the edge.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def parse_json(data: bytes | str) -> Any:
    """Decode a request body; invalid JSON, non-UTF-8 or a lone surrogate is a 400."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}") from None
    raw = data.encode() if isinstance(data, str) else data
    if _SURROGATE_ESCAPE.search(raw) and not _encodable(value):
        raise invalid_request("The request body contains an unpaired UTF-16 surrogate escape.")
    return value


def _encodable(value: Any) -> bool:
    """Whether every string in a decoded JSON value is valid Unicode (no lone surrogates)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


__all__ = [
    "APIError",
    "ChatRequest",
    "CompletionRequest",
    "StreamOptions",
    "check_token_ids",
    "parse_chat_request",
    "parse_completion_request",
    "parse_json",
]
