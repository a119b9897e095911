"""protocol.py: from_dict/to_dict round trips and lenient parsing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sluiceway import protocol as p

SAMPLES: list[Any] = [
    p.ErrorObject("bad", "invalid_request_error", "messages", "x"),
    p.Usage(3, 4, 7, p.PromptTokensDetails(2)),
    p.ChatCompletion(
        "id1",
        "m",
        [
            p.ChatCompletionChoice(
                1,
                p.ChatMessage("assistant", "hi"),
                "stop",
                p.ChatLogprobs(
                    [
                        p.ChatTokenLogprob(
                            "hi", -0.5, [104, 105], [p.TopLogprob("ho", -1.0, [104, 111])]
                        )
                    ]
                ),
                stop_reason="\n",
            )
        ],
        created=5,
        usage=p.Usage(1, 1, 2),
    ),
    p.ChatCompletionChunk(
        "id2", "m", [p.ChatCompletionChunkChoice(0, p.DeltaMessage("assistant", ""), None)]
    ),
    p.ChatCompletionChunk("id2", "m", [], usage=p.Usage(1, 2, 3)),
    p.Completion(
        "id3",
        "m",
        [
            p.CompletionChoice(
                2,
                "text",
                "length",
                p.CompletionLogprobs(
                    ["te", "xt"], [-0.1, -0.2], [{"te": -0.1}, {"xt": -0.2}], [0, 2]
                ),
            )
        ],
    ),
    p.CompletionChunk("id4", "m", [p.CompletionChoice(0, "a")]),
    p.ModelList([p.Model("m", 1, "sluiceway", max_model_len=8192)]),
    p.TokenizeResponse([1, 2], 2, 100),
]


@pytest.mark.parametrize("obj", SAMPLES, ids=lambda o: type(o).__name__)
def test_round_trip_through_json(obj: Any) -> None:
    wire = json.loads(json.dumps(obj.to_dict()))
    assert type(obj).from_dict(wire) == obj


def test_to_dict_matches_openai_shape() -> None:
    choice = p.ChatCompletionChoice(0, p.ChatMessage(content="x"), "stop")
    assert choice.to_dict() == {
        "index": 0,
        "message": {"role": "assistant", "content": "x"},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert p.ErrorObject("m").to_dict() == {
        "error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}
    }
    chunk = p.ChatCompletionChunkChoice(3, p.DeltaMessage(content="y"))
    assert chunk.to_dict()["delta"] == {"content": "y"}
    assert chunk.text == "y"


def test_from_dict_is_lenient() -> None:
    chunk = p.ChatCompletionChunk.from_dict(
        {
            "id": "x",
            "model": "m",
            "future_field": 1,
            "choices": [{"index": 1, "delta": {"content": "a", "tool_calls": None}, "extra": 2}],
        }
    )
    assert chunk.choices[0].text == "a" and chunk.choices[0].finish_reason is None
    assert p.ErrorObject.from_dict({"error": "plain"}).message == "plain"
    assert p.ErrorObject.from_dict({"message": "inner", "type": "t"}).type == "t"


def test_from_dict_takes_nulls_and_missing_fields_as_defaults() -> None:
    """Other servers send null for fields that are never null here, or leave out
    fields sluiceway always sends."""
    completion = p.ChatCompletion.from_dict(
        {
            "id": "x",
            "choices": [{"index": None, "message": {"role": None, "content": "hi"}}],
            "created": None,
            "object": None,
        }
    )
    assert completion == p.ChatCompletion(
        "x", "", [p.ChatCompletionChoice(0, p.ChatMessage("assistant", "hi"))]
    )
    chunk = p.CompletionChunk.from_dict({"choices": [{"text": None}], "usage": None})
    assert chunk.choices == [p.CompletionChoice(0, "")] and chunk.usage_null
    assert not p.CompletionChunk.from_dict({"choices": []}).usage_null
    models = p.ModelList.from_dict({"data": [{"id": "gpt", "created": None}], "object": None})
    assert models == p.ModelList([p.Model("gpt", 0, owned_by="")])
    assert p.TokenizeResponse.from_dict({"tokens": [1, 2, 3]}).count == 3
    assert p.ErrorObject.from_dict({"error": {"message": "m", "type": None}}).type == "error"


def test_to_dict_writes_openai_key_order_and_omits_extensions_while_none() -> None:
    chunk = p.ChatCompletionChunk("c", "m", [p.ChatCompletionChunkChoice(0)], usage_null=True)
    assert json.dumps(chunk.to_dict()) == (
        '{"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", '
        '"system_fingerprint": null, "choices": [{"index": 0, "delta": {}, '
        '"logprobs": null, "finish_reason": null}], "usage": null}'
    )
    assert "usage" not in p.ChatCompletionChunk("c", "m", []).to_dict()
    assert p.Completion("c", "m", []).to_dict()["usage"] is None
    assert p.ChatLogprobs([]).to_dict() == {"content": [], "refusal": None}
    assert list(p.Model("m").to_dict()) == ["id", "object", "created", "owned_by"]
    assert list(p.Usage(1, 2, 3).to_dict()) == [
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
    ]
