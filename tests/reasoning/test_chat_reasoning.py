"""Reasoning over the OpenAI surfaces, through the openai SDK: thinking in
`reasoning_content` (whole and streamed, the tags cut across tokens), per choice
for n > 1 and batch chat, reasoning tokens in usage, `chat_template_kwargs` and
the server's defaults reaching the template, a grammar that starts after the
thinking, a thinking budget, and the Responses API's reasoning item."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import jsonschema
import pytest

from .conftest import MODEL, TEMPLATE, in_thread, oai

THINKING = "The sky scatters blue light {most}."
ANSWER = "Blue."
SCRIPT = f"<think>\n{THINKING}\n</think>\n\n{ANSWER}"
ASK = [{"role": "user", "content": "What colour is the sky?"}]


def tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_the_closing_tag_is_cut_across_tokens(tokenizer: Any) -> None:
    # What the streaming tests below rely on to mean anything.
    pieces = [tokenizer.decode([t]) for t in tokenizer.encode(SCRIPT, add_special_tokens=False)]
    assert "</think>" not in pieces and "</" in pieces


async def test_whole_answer_splits_thinking_from_content(serve_texts: Any, tokenizer: Any) -> None:
    async with serve_texts([SCRIPT]) as (server, _):
        with oai(server) as client:
            completion = await in_thread(
                lambda: client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64)
            )
    message = completion.choices[0].message
    assert message.content == ANSWER
    assert message.model_extra == {"reasoning_content": THINKING}
    usage = completion.usage
    assert usage is not None and usage.completion_tokens_details is not None
    thinking_tokens = tokens(tokenizer, SCRIPT[: SCRIPT.index("</think>") + len("</think>")])
    assert usage.completion_tokens_details.reasoning_tokens == thinking_tokens
    assert usage.completion_tokens == tokens(tokenizer, SCRIPT) + 1  # and EOS


async def test_stream_sends_thinking_then_content(serve_texts: Any) -> None:
    async with serve_texts([SCRIPT]) as (server, _):
        with oai(server) as client:

            def chunks() -> list[Any]:
                return list(
                    client.chat.completions.create(
                        model=MODEL,
                        messages=ASK,
                        max_tokens=64,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                )

            stream = await in_thread(chunks)
    order = []
    reasoning, content = [], []
    for chunk in stream:
        for choice in chunk.choices:
            extra = (choice.delta.model_extra or {}).get("reasoning_content")
            if extra:
                reasoning.append(extra)
                order.append("r")
            if choice.delta.content:
                content.append(choice.delta.content)
                order.append("c")
            assert not (extra and choice.delta.content)
    assert "".join(reasoning) == THINKING and "".join(content) == ANSWER
    assert order == sorted(order, key=lambda k: k == "c")  # all thinking before the answer
    assert len(reasoning) > 3  # streamed as it came, not at the end
    usage = stream[-1].usage
    assert usage is not None and usage.completion_tokens_details.reasoning_tokens > 0


async def test_each_choice_and_each_conversation_is_split_on_its_own(serve_texts: Any) -> None:
    other = "<think>\nShort.\n</think>\n\nGrey."
    async with serve_texts([SCRIPT, other]) as (server, _):
        with oai(server) as client:
            whole = await in_thread(
                lambda: client.chat.completions.create(
                    model=MODEL, messages=ASK, max_tokens=64, n=2
                )
            )
            streamed = await in_thread(
                lambda: list(
                    client.chat.completions.create(
                        model=MODEL, messages=ASK, max_tokens=64, n=2, stream=True
                    )
                )
            )
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            batch = await http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [ASK, ASK], "max_tokens": 64},
            )
    got = {
        c.index: (c.message.model_extra["reasoning_content"], c.message.content)
        for c in whole.choices
    }
    # The engine numbers sequences across requests: which choice wrote which text
    # depends on the request's place, not on the choice.
    assert sorted(got.values()) == sorted([(THINKING, ANSWER), ("Short.", "Grey.")])
    texts: dict[int, dict[str, str]] = {}
    for chunk in streamed:
        for choice in chunk.choices:
            parts = texts.setdefault(choice.index, {"r": "", "c": ""})
            parts["r"] += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            parts["c"] += choice.delta.content or ""
    assert sorted((p["r"], p["c"]) for p in texts.values()) == sorted(got.values())
    assert batch.status_code == 200
    answers = [
        (c["message"]["reasoning_content"], c["message"]["content"])
        for c in batch.json()["choices"]
    ]
    assert sorted(answers) == sorted(got.values())


async def test_template_kwargs_reach_the_template(serve_texts: Any, tokenizer: Any) -> None:
    async with serve_texts([ANSWER]) as (server, _):
        with oai(server) as client:

            def ask(**extra: Any) -> Any:
                return client.chat.completions.create(
                    model=MODEL, messages=ASK, max_tokens=16, extra_body=extra
                )

            off = await in_thread(lambda: ask(chat_template_kwargs={"enable_thinking": False}))
            persona = await in_thread(lambda: ask(chat_template_kwargs={"persona": "a pirate"}))
            plain = await in_thread(ask)
            with pytest.raises(Exception) as bad:
                await in_thread(lambda: ask(chat_template_kwargs=["enable_thinking"]))
    # The thinking is off: an empty block in the prompt, the answer all content.
    assert off.choices[0].message.content == ANSWER
    assert (off.choices[0].message.model_extra or {}).get("reasoning_content") is None
    assert off.usage.completion_tokens_details.reasoning_tokens == 0
    assert off.usage.prompt_tokens == plain.usage.prompt_tokens + tokens(
        tokenizer, "<think>\n\n</think>\n\n"
    )
    assert persona.usage.prompt_tokens > plain.usage.prompt_tokens  # an unknown key passed through
    assert getattr(bad.value, "status_code", None) == 400


async def test_server_default_kwargs_and_a_request_that_overrides_them(serve_texts: Any) -> None:
    async with serve_texts([SCRIPT], default_chat_template_kwargs={"enable_thinking": False}) as (
        server,
        _,
    ):
        with oai(server) as client:
            default = await in_thread(
                lambda: client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64)
            )
            on = await in_thread(
                lambda: client.chat.completions.create(
                    model=MODEL,
                    messages=ASK,
                    max_tokens=64,
                    extra_body={"chat_template_kwargs": {"enable_thinking": True}},
                )
            )
    # Thinking off by default: the prompt closed the block, so the tags are text.
    assert default.choices[0].message.content == SCRIPT
    assert on.choices[0].message.content == ANSWER


async def test_a_grammar_applies_after_the_thinking(serve_texts: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "maxLength": 6}},
        "required": ["colour"],
    }
    # The thinking holds what JSON would refuse; the scripted answer is not JSON,
    # so what follows the thinking is the grammar's.
    async with serve_texts([SCRIPT]) as (server, _):
        with oai(server) as client:
            completion = await in_thread(
                lambda: client.chat.completions.create(
                    model=MODEL,
                    messages=ASK,
                    max_tokens=200,
                    temperature=0,
                    response_format={
                        "type": "json_schema",
                        "json_schema": {"name": "c", "schema": schema},
                    },
                )
            )
    message = completion.choices[0].message
    assert message.model_extra == {"reasoning_content": THINKING}
    jsonschema.validate(json.loads(message.content or ""), schema)
    assert completion.choices[0].finish_reason == "stop"


async def test_a_thinking_budget_closes_the_thinking(serve_texts: Any, tokenizer: Any) -> None:
    endless = "<think>\n" + "and then " * 60
    async with serve_texts([endless]) as (server, _):
        with oai(server) as client:
            completion = await in_thread(
                lambda: client.chat.completions.create(
                    model=MODEL,
                    messages=ASK,
                    max_tokens=40,
                    temperature=0,
                    extra_body={"max_reasoning_tokens": 6},
                )
            )
            effort = await in_thread(
                lambda: client.chat.completions.create(
                    model=MODEL, messages=ASK, max_tokens=40, temperature=0, reasoning_effort="none"
                )
            )
    message = completion.choices[0].message
    budget = tokenizer.decode(
        tokenizer.encode("\n" + "and then " * 60, add_special_tokens=False)[:6]
    )
    assert message.model_extra == {"reasoning_content": budget.strip()}
    assert message.content  # the answer came after the forced closing tag
    assert effort.choices[0].message.model_extra == {"reasoning_content": ""}


async def test_without_a_parser_thinking_stays_in_the_content(serve_texts: Any) -> None:
    async with serve_texts([SCRIPT], reasoning_parser="none") as (server, _):
        with oai(server) as client:
            completion = await in_thread(
                lambda: client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64)
            )
    assert completion.choices[0].message.content == SCRIPT
    assert completion.usage.completion_tokens_details is None


async def test_auto_picks_a_parser_from_the_template_and_says_so(
    serve_texts: Any, caplog: pytest.LogCaptureFixture
) -> None:
    thinking_template = TEMPLATE + "{# a model that writes <think>...</think> #}"
    with caplog.at_level(logging.INFO):
        async with serve_texts(
            [SCRIPT], reasoning_parser="auto", chat_template=thinking_template
        ) as (server, _):
            with oai(server) as client:
                completion = await in_thread(
                    lambda: client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=64)
                )
    assert completion.choices[0].message.content == ANSWER
    assert any("reasoning parser think" in r.getMessage() for r in caplog.records)


async def test_responses_put_a_reasoning_item_before_the_message(serve_texts: Any) -> None:
    async with serve_texts([SCRIPT]) as (server, _):
        with oai(server) as client:
            response = await in_thread(
                lambda: client.responses.create(
                    model=MODEL, input="What colour is the sky?", max_output_tokens=64
                )
            )
            events = await in_thread(
                lambda: list(
                    client.responses.create(
                        model=MODEL,
                        input="What colour is the sky?",
                        max_output_tokens=64,
                        stream=True,
                    )
                )
            )
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and message.type == "message"
    assert reasoning.summary == [] and reasoning.content[0].text == THINKING
    assert response.output_text == ANSWER
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    kinds = [e.type for e in events]
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert streamed == THINKING
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert len(done) == 1 and done[0].text == THINKING
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"]


async def test_tokenize_renders_with_the_servers_template(serve_texts: Any) -> None:
    async with (
        serve_texts([ANSWER], default_chat_template_kwargs={"enable_thinking": False}) as (
            server,
            _,
        ),
        httpx.AsyncClient(base_url=server.url, timeout=30) as http,
    ):
        counted = await http.post("/tokenize", json={"model": MODEL, "messages": ASK})
        with oai(server) as client:
            completion = await in_thread(
                lambda: client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4)
            )
    assert counted.status_code == 200
    assert counted.json()["count"] == completion.usage.prompt_tokens


async def test_continue_final_message(serve_texts: Any, tokenizer: Any) -> None:
    prefill = [*ASK, {"role": "assistant", "content": "<think>\nIt is"}]
    async with (
        serve_texts([" blue.\n</think>\n\nBlue."]) as (server, _),
        httpx.AsyncClient(base_url=server.url, timeout=30) as http,
    ):
        with oai(server) as client:
            continued = await in_thread(
                lambda: client.chat.completions.create(
                    model=MODEL,
                    messages=prefill,
                    max_tokens=32,
                    extra_body={"continue_final_message": True},
                )
            )
        both = await http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": prefill,
                "continue_final_message": True,
                "add_generation_prompt": True,
            },
        )
        user_last = await http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": ASK, "continue_final_message": True},
        )
    # The prompt opened the thinking: the output starts inside it.
    assert continued.choices[0].message.model_extra == {"reasoning_content": "blue."}
    assert continued.choices[0].message.content == "Blue."
    for response in (both, user_last):
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "continue_final_message"
