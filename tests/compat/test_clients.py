"""Structured outputs and tools through real client libraries against the default
model: the official `openai` client (`parse` with pydantic, every `tool_choice`,
streamed calls), LangChain (`with_structured_output` both ways, `bind_tools`),
instructor (TOOLS and JSON_SCHEMA modes), the OpenAI Agents SDK with its chat and
its default Responses model class, and the client's Responses API. Greedy, so
each run asks the same; the grammar is what makes every answer parse."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
QUESTION = "What is the weather in Paris today?"
MAX_TOKENS = 60  # every constrained answer here takes 20-30 tokens


class Weather(BaseModel):
    """The weather in one city."""

    city: str = Field(max_length=24)
    temperature_c: int = Field(ge=-50, le=60)
    sky: Literal["clear", "cloudy", "rain", "snow"]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}


@pytest.fixture(scope="module")
def oai(server_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=server_url + "/v1", api_key="unused", max_retries=0, timeout=120
    ) as client:
        yield client


def ask() -> list[dict[str, str]]:
    return [{"role": "user", "content": QUESTION}]


def test_openai_parse_with_a_pydantic_model(oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.parse(
        model=MODEL, messages=ask(), response_format=Weather, temperature=0, max_tokens=MAX_TOKENS
    )
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Weather)


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}, "auto", "none"],
)
def test_openai_tools_with_each_tool_choice(oai: openai.OpenAI, tool_choice: object) -> None:
    completion = oai.chat.completions.create(
        model=MODEL,
        messages=ask(),
        tools=[WEATHER_TOOL, TIME_TOOL],  # type: ignore[list-item]
        tool_choice=tool_choice,  # type: ignore[arg-type]
        parallel_tool_calls=False,  # one call: the small model would repeat it to max_tokens
        temperature=0,
        max_tokens=MAX_TOKENS if tool_choice != "none" else 16,
    )
    choice = completion.choices[0]
    calls = choice.message.tool_calls or []
    if tool_choice == "none":
        assert not calls and choice.message.content
    if tool_choice not in ("auto", "none"):
        assert calls and choice.finish_reason == "tool_calls"
    if isinstance(tool_choice, dict):
        assert {c.function.name for c in calls} == {"get_weather"}
    for call in calls:
        assert call.type == "function" and call.id
        arguments = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert set(arguments) == {"city"} and len(arguments["city"]) <= 24


def test_openai_streamed_tool_call_reassembles(oai: openai.OpenAI) -> None:
    # One call: left free, the small model calls again and again until max_tokens.
    kwargs = dict(
        model=MODEL,
        messages=ask(),
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=MAX_TOKENS,
    )
    whole = oai.chat.completions.create(**kwargs).choices[0].message.tool_calls  # type: ignore[call-overload]
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in oai.chat.completions.create(stream=True, **kwargs):  # type: ignore[call-overload]
        for choice in chunk.choices:
            for piece in choice.delta.tool_calls or []:
                entry = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += piece.id or ""
                if piece.function is not None:
                    entry["name"] += piece.function.name or ""
                    entry["arguments"] += piece.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and whole
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (w.function.name, json.loads(w.function.arguments)) for w in whole
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_a_conversation_continues_after_the_tool_answers(oai: openai.OpenAI) -> None:
    first = oai.chat.completions.create(
        model=MODEL, messages=ask(), tools=[WEATHER_TOOL], tool_choice="required", temperature=0, max_tokens=MAX_TOKENS  # type: ignore[list-item]
    ).choices[0].message
    assert first.tool_calls
    call = first.tool_calls[0]
    follow_up = [
        *ask(),
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    answer = oai.chat.completions.create(
        model=MODEL, messages=follow_up, tools=[WEATHER_TOOL], tool_choice="none", temperature=0, max_tokens=30  # type: ignore[arg-type,list-item]
    )
    assert answer.choices[0].message.content


def test_langchain_structured_output_and_bind_tools(server_url: str) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=MODEL, base_url=server_url + "/v1", api_key="unused", temperature=0, max_tokens=MAX_TOKENS, max_retries=0  # type: ignore[arg-type]
    )
    for method in ("json_schema", "function_calling"):
        result = llm.with_structured_output(Weather, method=method).invoke(QUESTION)  # type: ignore[arg-type]
        assert isinstance(result, Weather), method

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "sunny"

    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(QUESTION)
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"  # type: ignore[attr-defined]
    assert isinstance(message.tool_calls[0]["args"]["city"], str)  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode_name", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_modes(oai: openai.OpenAI, mode_name: str) -> None:
    import instructor

    client = instructor.from_openai(oai, mode=getattr(instructor.Mode, mode_name))
    weather = client.chat.completions.create(
        model=MODEL,
        response_model=Weather,
        messages=ask(),  # type: ignore[arg-type]
        temperature=0,
        max_tokens=MAX_TOKENS,
        max_retries=0,  # valid the first time, or the test fails
    )
    assert isinstance(weather, Weather)


@pytest.mark.parametrize(
    "model_class",
    # The chat model class, and the SDK's default, which speaks the Responses API:
    # a required call comes back as a function_call item.
    ["OpenAIChatCompletionsModel", "OpenAIResponsesModel"],
)
def test_agents_sdk_calls_a_function_tool(server_url: str, model_class: str) -> None:
    import asyncio

    import agents
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # no trace export to a hosted service
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        seen.append(city)
        return f"18 C and sunny in {city}"

    async def run() -> object:
        client = openai.AsyncOpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0)
        async with client:  # closed on this loop, before asyncio.run closes it
            agent = Agent(
                name="weather",
                instructions="Answer with the weather tool.",
                tools=[get_weather],
                model=getattr(agents, model_class)(model=MODEL, openai_client=client),
                # One call: with parallel calls allowed, this small model greedily
                # repeats the same call until max_tokens, and the Responses model
                # takes a response cut by max_output_tokens ("incomplete") as a
                # failure.
                model_settings=ModelSettings(
                    tool_choice="required",
                    temperature=0,
                    max_tokens=MAX_TOKENS,
                    parallel_tool_calls=False,
                ),
                tool_use_behavior="stop_on_first_tool",
            )
            return (await Runner.run(agent, QUESTION, max_turns=3)).final_output

    final_output = asyncio.run(run())
    assert seen and final_output == f"18 C and sunny in {seen[0]}"


def test_openai_responses_with_a_schema_and_a_stream(oai: openai.OpenAI) -> None:
    parsed = oai.responses.parse(
        model=MODEL,
        input=QUESTION,
        text_format=Weather,
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert isinstance(parsed.output_parsed, Weather)
    with oai.responses.stream(
        model=MODEL, input=QUESTION, max_output_tokens=8, temperature=0
    ) as stream:
        events = list(stream)
    # Cut by max_output_tokens: the last event is response.incomplete (the SDK's
    # get_final_response waits for response.completed only).
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    assert final.output_text == "".join(deltas) and final.usage.output_tokens == 8


def test_openai_and_langchain_embeddings(oai: openai.OpenAI, server_url: str) -> None:
    from langchain_openai import OpenAIEmbeddings

    texts = ["Paris is the capital of France.", "Rain is expected tomorrow.", "hi"]
    batch = oai.embeddings.create(model=MODEL, input=texts)  # base64, decoded by the client
    assert [d.index for d in batch.data] == [0, 1, 2]
    assert batch.usage.prompt_tokens > len(texts)
    for item in batch.data:
        assert len(item.embedding) == 576  # SmolLM2-135M's hidden size
        assert sum(v * v for v in item.embedding) == pytest.approx(1.0, rel=1e-4)
    # The same bits alone as in a batch, on whichever precision path this host
    # serves (both base64: "float" keeps more digits than float32's).
    alone = oai.embeddings.create(model=MODEL, input=texts[1])
    assert alone.data[0].embedding == batch.data[1].embedding
    # LangChain sends its own token ids unless told not to (they would be tiktoken's).
    langchain = OpenAIEmbeddings(
        model=MODEL,
        base_url=server_url + "/v1",
        api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
    )
    vectors = langchain.embed_documents(texts)
    for vector, item in zip(vectors, batch.data, strict=True):
        assert vector == pytest.approx(item.embedding, abs=1e-4)
    assert langchain.embed_query(texts[2]) == pytest.approx(batch.data[2].embedding, abs=1e-4)


def test_openai_batch_of_chat_lines(oai: openai.OpenAI) -> None:
    import time

    questions = ["Name a fruit.", "Name a color.", "Name an animal."]
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": q}],
                "max_tokens": 8,
                "temperature": 0,
            },
        }
        for i, q in enumerate(questions)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = oai.files.create(file=("questions.jsonl", content), purpose="batch")
    batch = oai.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "cancelled"):  # as its users poll
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
        batch = oai.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 3
    assert batch.output_file_id is not None and batch.error_file_id is None
    rows = [json.loads(line) for line in oai.files.content(batch.output_file_id).text.splitlines()]
    assert [r["custom_id"] for r in rows] == ["q0", "q1", "q2"]
    for row in rows:
        completion = openai.types.chat.ChatCompletion.model_validate(row["response"]["body"])
        assert row["response"]["status_code"] == 200
        assert completion.choices[0].message.content
        assert 0 < completion.usage.completion_tokens <= 8  # type: ignore[union-attr]
