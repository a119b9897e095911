"""Pure tests of request validation: no server, no engine."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluiceway.api.http.errors import APIError
from sluiceway.api.pipeline.validation import (
    parse_chat_request,
    parse_completion_request,
    parse_json,
)

VOCAB = 1000
MSG = [{"role": "user", "content": "hi"}]


def test_chat_defaults_and_mapping() -> None:
    req = parse_chat_request(
        {
            "messages": MSG,
            "max_completion_tokens": 7,
            "max_tokens": 3,
            "top_k": -1,
            "stop": "x",
            "logprobs": True,
            "top_logprobs": 2,
            "logit_bias": {"5": -100},
            "seed": 4,
            "n": 3,
        },
        VOCAB,
    )
    assert not req.batched and req.n == 3 and req.conversations == (tuple(MSG),)
    p = req.params
    assert p.max_tokens == 7 and p.top_k == 0 and p.stop == ("x",) and p.logprobs == 2
    assert p.logit_bias == ((5, -100.0),) and p.seed == 4
    assert parse_chat_request({"messages": MSG}, VOCAB).params.max_tokens is None


def test_batch_chat_and_content_parts() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    req = parse_chat_request({"messages": [MSG, [{"role": "user", "content": parts}]]}, VOCAB)
    assert req.batched and len(req.conversations) == 2
    assert req.conversations[1][0]["content"] == "a\nb"


def test_completion_prompt_forms() -> None:
    def prompts(p: Any) -> Any:
        return parse_completion_request({"prompt": p}, VOCAB).prompts

    assert prompts("a") == ("a",)
    assert prompts(["a", "b"]) == ("a", "b")
    assert prompts([1, 2]) == ((1, 2),)
    assert prompts([[1], [2, 3]]) == ((1,), (2, 3))
    assert prompts(["a", [4]]) == ("a", (4,))
    assert parse_completion_request({"prompt": "a"}, VOCAB).params.max_tokens == 16


def test_integral_float_is_accepted_as_int() -> None:
    assert (
        parse_completion_request({"prompt": "a", "max_tokens": 4.0}, VOCAB).params.max_tokens == 4
    )


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "a", "n": 1.5}, "n"),
        ({"prompt": "a", "temperature": float("nan")}, "temperature"),
        ({"prompt": "a", "seed": 2**70}, "seed"),
        ({"prompt": "a", "stop": ["x"] * 65}, "stop"),
        ({"prompt": [[1], [VOCAB]]}, "prompt"),
    ],
)
def test_rejections(body: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as err:
        parse_completion_request(body, VOCAB)
    assert err.value.status == 400 and err.value.param == param


def test_parse_json_errors() -> None:
    for raw in (b"{", b"\xff", b"[" * 50_000):
        with pytest.raises(APIError):
            parse_json(raw)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(
    [
        "messages",
        "prompt",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "echo",
        "stream",
        "stream_options",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_tokens",
        "ignore_eos",
        "model",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "structured_outputs",
        "suffix",
        "best_of",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, JSON, max_size=6), st.booleans())
def test_any_json_is_accepted_or_a_400(body: dict[str, Any], chat: bool) -> None:
    """Whatever the client sends, validation answers with a request or an APIError(400)."""
    try:
        (parse_chat_request if chat else parse_completion_request)(body, VOCAB)
    except APIError as err:
        assert err.status == 400
