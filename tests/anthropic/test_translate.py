"""A Messages body becomes the chat request it means, or a 400: for any JSON
shaped roughly like a Messages request (hypothesis), decoding, translating and
validating end in a validated chat request or an `invalid_request_error`, never
another exception; and the translation of each kind of turn."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluiceway.api.anthropic.translate import chat_body, conversation
from sluiceway.api.http.errors import APIError
from sluiceway.api.http.wire import decode
from sluiceway.api.pipeline.validation import chat_request
from sluiceway.protocol import anthropic as wire

scalars = st.none() | st.booleans() | st.integers(-3, 5) | st.floats(-1, 3) | st.text(max_size=6)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
block_types = st.sampled_from(
    ["text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image", "nope"]
)
blocks = st.fixed_dictionaries(
    {"type": block_types},
    optional={
        "text": st.text(max_size=8) | values,
        "id": st.text(max_size=4),
        "name": st.sampled_from(["f", "g", ""]),
        "input": st.dictionaries(st.text(max_size=3), values, max_size=2) | values,
        "tool_use_id": st.text(max_size=4),
        "content": st.text(max_size=8)
        | st.lists(
            st.fixed_dictionaries({"type": block_types, "text": st.text(max_size=4)}), max_size=2
        ),
        "thinking": st.text(max_size=8),
        "signature": st.text(max_size=4),
        "data": st.text(max_size=4),
        "source": values,
    },
)
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system"]),
            "content": st.text(max_size=8) | st.lists(blocks, max_size=3),
        }
    ),
    max_size=4,
)
tools = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["f", "g", "bad name"])},
        optional={
            "input_schema": st.just({"type": "object"}) | values,
            "type": st.sampled_from(["custom", "web_search_20250305"]),
            "description": st.text(max_size=5),
        },
    ),
    max_size=2,
)
bodies = st.fixed_dictionaries(
    {"model": st.just("m"), "max_tokens": st.integers(-1, 64) | values, "messages": messages},
    optional={
        "system": st.text(max_size=8)
        | st.lists(
            st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=5)}),
            max_size=2,
        )
        | values,
        "tools": tools,
        "tool_choice": st.fixed_dictionaries(
            {"type": st.sampled_from(["auto", "any", "tool", "none", "required"])},
            optional={
                "name": st.sampled_from(["f", "h"]),
                "disable_parallel_tool_use": st.booleans(),
            },
        ),
        "thinking": st.fixed_dictionaries(
            {"type": st.sampled_from(["enabled", "disabled", "adaptive"])},
            optional={"budget_tokens": st.integers(-5, 100)},
        ),
        "stop_sequences": st.lists(st.text(max_size=3), max_size=2),
        "temperature": st.floats(-1, 2),
        "top_k": st.integers(-2, 50),
        "stream": st.booleans(),
    },
)


# Derandomized: the same bodies every run; generating them is not what is timed.
@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(body=bodies)
def test_any_body_is_a_chat_request_or_a_400(body: dict[str, Any]) -> None:
    try:
        request = decode(json.dumps(body), wire.MessageCreateRequest)
        validated = chat_request(chat_body(request), vocab_size=1000)
    except APIError as exc:
        assert exc.status == 400 and exc.type == "invalid_request_error", exc
        assert exc.message
        return
    assert validated.params.max_tokens == body["max_tokens"]
    assert validated.n == 1 and len(validated.conversations) == 1


def test_turns_become_chat_messages() -> None:
    request = decode(
        json.dumps(
            {
                "model": "m",
                "max_tokens": 8,
                "system": [{"type": "text", "text": "Be brief."}],
                "messages": [
                    {"role": "user", "content": "Weather?"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "thinking", "thinking": "use the tool", "signature": ""},
                            {"type": "text", "text": "Checking."},
                            {
                                "type": "tool_use",
                                "id": "toolu_1",
                                "name": "get",
                                "input": {"city": "Paris"},
                            },
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                            {"type": "text", "text": "And tomorrow?"},
                        ],
                    },
                ],
            }
        ),
        wire.MessageCreateRequest,
    )
    turns = [m.for_template() for m in conversation(request.system, request.messages)]
    assert turns == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "And tomorrow?"},
    ]
