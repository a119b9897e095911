"""The Responses API through the official `openai` client (sync, in worker
threads) against the server on the scripted runner: objects, named stream
events in order, stored conversations, and errors naming their parameter."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from typing import Any, Literal

import attrs
import httpx
import openai
import pytest
import trio

from polling import eventually
from sluiceway import protocol
from sluiceway.api.responses.input_items import chat_messages
from sluiceway.api.responses.output import ResponseOutput
from sluiceway.api.responses.store import MemoryResponseStore, SqliteResponseStore, StoredResponse
from sluiceway.engine.batch import SampledToken, StepBatch

from .conftest import MODEL, in_thread
from .fakes import ScriptedRunner


async def test_a_response_is_cut_by_max_output_tokens(oai: openai.OpenAI) -> None:
    response = await in_thread(
        lambda: oai.responses.create(
            model=MODEL, input="hi", max_output_tokens=4, instructions="Be brief."
        )
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text and message.content[0].text == response.output_text
    assert response.usage is not None and response.usage.output_tokens == 4
    assert response.usage.total_tokens == response.usage.input_tokens + 4
    assert response.instructions == "Be brief." and response.max_output_tokens == 4


async def test_a_stored_response_continues_and_can_be_fetched_and_deleted(
    oai: openai.OpenAI,
) -> None:
    first = await in_thread(
        lambda: oai.responses.create(model=MODEL, input="hi", max_output_tokens=3)
    )
    assert first.usage is not None
    second = await in_thread(
        lambda: oai.responses.create(
            model=MODEL, input="and then?", previous_response_id=first.id, max_output_tokens=3
        )
    )
    alone = await in_thread(
        lambda: oai.responses.create(
            model=MODEL, input="and then?", max_output_tokens=3, store=False
        )
    )
    assert second.previous_response_id == first.id
    # The continued prompt holds the first exchange: it is longer than the same
    # input alone by at least the first answer's tokens.
    assert second.usage is not None and alone.usage is not None
    assert second.usage.input_tokens >= alone.usage.input_tokens + first.usage.output_tokens
    fetched = await in_thread(lambda: oai.responses.retrieve(first.id))
    assert fetched.output_text == first.output_text and fetched.status == first.status
    await in_thread(lambda: oai.responses.delete(first.id))
    with pytest.raises(openai.NotFoundError):
        await in_thread(lambda: oai.responses.retrieve(first.id))
    with pytest.raises(openai.NotFoundError):  # store=False kept nothing
        await in_thread(lambda: oai.responses.retrieve(alone.id))
    with pytest.raises(openai.NotFoundError):
        await in_thread(
            lambda: oai.responses.create(model=MODEL, input="x", previous_response_id=first.id)
        )


async def test_a_streamed_response_sends_openais_events_in_order(oai: openai.OpenAI) -> None:
    def run() -> list[Any]:
        with oai.responses.stream(model=MODEL, input="hello", max_output_tokens=5) as stream:
            return list(stream)

    events = await in_thread(run)
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[4:9] == ["response.output_text.delta"] * 5
    assert types[9:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == 5


async def test_bad_input_is_a_400_naming_the_item(client: httpx.AsyncClient) -> None:
    async def error(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        r = await client.post("/v1/responses", json={"model": MODEL, **body})
        return r.status_code, r.json()["error"]

    status, err = await error({"input": [{"role": "user", "content": "hi"}, {"type": "image"}]})
    assert status == 400 and err["param"] == "input[1].type"
    status, err = await error({"input": [{"type": "function_call_output", "output": "1"}]})
    assert status == 400 and err["param"] == "input[0].call_id"
    status, err = await error({"input": "hi", "tools": [{"type": "web_search"}]})
    assert status == 400 and err["param"] == "tools[0].type"
    status, err = await error({"input": "hi", "text": {"format": {"type": "yaml"}}})
    assert status == 400 and err["param"] == "text.format.type"
    status, err = await error({"input": []})
    assert status == 400 and err["param"] == "input"
    status, err = await error({"input": "hi", "model": "other"})
    assert status == 404
    for method in (client.get, client.delete):
        r = await method("/v1/responses/resp_missing")
        assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"


def test_input_items_become_chat_messages() -> None:
    items = [
        {"role": "developer", "content": "Use tools."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Weather?"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    messages = chat_messages(items)
    assert messages[:2] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather?"},
    ]
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]  # one assistant turn
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}


def test_text_then_a_function_call_are_two_items_with_their_events() -> None:
    events: list[dict[str, Any]] = []
    out = ResponseOutput(events.append)
    call = protocol.DeltaToolCall
    fn = protocol.DeltaFunctionCall
    out.feed(protocol.ChatCompletionChunkChoice(0, protocol.DeltaMessage(content="Let me check.")))
    out.feed(
        protocol.ChatCompletionChunkChoice(
            0,
            protocol.DeltaMessage(
                tool_calls=[call(0, "call_1", "function", fn("get_weather", ""))]
            ),
        )
    )
    out.feed(
        protocol.ChatCompletionChunkChoice(
            0,
            protocol.DeltaMessage(tool_calls=[call(0, function=fn(arguments='{"city": "Paris"}'))]),
            finish_reason="tool_calls",
        )
    )
    items = out.close()
    assert [i["type"] for i in items] == ["message", "function_call"]
    assert items[1]["call_id"] == "call_1" and items[1]["arguments"] == '{"city": "Paris"}'
    assert [(e["type"], e.get("output_index")) for e in events] == [
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.output_text.delta", 0),
        ("response.output_text.done", 0),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.done", 1),
        ("response.output_item.done", 1),
    ]
    # The output replays as the chat turn it was.
    [assistant] = chat_messages(items)[1:]
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"


async def test_a_background_response_runs_after_its_request_and_completes(
    start_server: Any,
) -> None:
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 3, "background": True}
        queued = (await client.post("/v1/responses", json=body)).json()
        assert queued["status"] == "queued" and queued["background"] is True
        url = f"/v1/responses/{queued['id']}"

        running = server.state.background_runs.get(queued["id"])
        with trio.fail_after(20):
            if running is not None:  # not already over
                await running.done.wait()
        done = (await client.get(url)).json()
        assert done["status"] == "incomplete"  # cut at 3 tokens
        assert done["usage"]["output_tokens"] == 3 and done["output"][0]["type"] == "message"
        # Cancelling a finished background response answers it as it is.
        assert (await client.post(url + "/cancel")).json()["status"] == "incomplete"


async def test_cancelling_a_background_response_frees_the_engine(
    start_server: Any, runner: ScriptedRunner
) -> None:
    runner.gated = True
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 1500, "background": True}
        queued = (await client.post("/v1/responses", json=body)).json()
        url = f"/v1/responses/{queued['id']}"
        engine = server.state.engine
        with trio.fail_after(20):
            runner.allow(3)
            await eventually(lambda: engine.stats().num_running_seqs == 1)
            cancelled = (await client.post(url + "/cancel")).json()
            assert cancelled["status"] == "cancelled"
            assert server.state.background_runs == {}
            runner.open()  # the engine drops the aborted sequence at its next step
            await engine.wait_idle()
        stats = engine.stats()
        assert stats.num_running_seqs == 0 and stats.kv_blocks_used == 0
        assert stats.generation_tokens_total < 20  # not 1,500: no zombie decoding
        assert (await client.get(url)).json()["status"] == "cancelled"


async def test_a_streamed_background_response_outlives_its_reader_and_streams_again(
    start_server: Any, runner: ScriptedRunner
) -> None:
    runner.gated = True
    async with start_server() as server:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as oai:

            def first_events() -> list[Any]:
                events = []
                with oai.responses.create(
                    model=MODEL, input="hi", max_output_tokens=6, background=True, stream=True
                ) as stream:
                    for event in stream:
                        events.append(event)
                        if event.type == "response.output_text.delta":
                            break  # the reader leaves; the response must not
                return events

            runner.allow(2)  # the prompt and the first token
            first = await in_thread(first_events)
            response_id = first[0].response.id
            kinds = ["response.created", "response.queued", "response.in_progress"]
            assert [e.type for e in first[:3]] == kinds
            assert first[0].response.status == "queued" and first[0].response.background
            assert first[2].response.status == "in_progress"
            runner.open()
            running = server.state.background_runs.get(response_id)
            with trio.fail_after(20):
                if running is not None:
                    await running.done.wait()
            again = await in_thread(
                lambda: list(
                    oai.responses.retrieve(
                        response_id, stream=True, starting_after=first[-1].sequence_number
                    )
                )
            )
            everything = await in_thread(
                lambda: list(oai.responses.retrieve(response_id, stream=True))
            )
            stored = await in_thread(lambda: oai.responses.retrieve(response_id))
    assert again[0].sequence_number == first[-1].sequence_number + 1
    assert [e.sequence_number for e in everything] == list(range(len(everything)))
    assert [e.model_dump() for e in everything] == [e.model_dump() for e in first + again]
    assert again[-1].type == "response.incomplete"  # cut by max_output_tokens, not by the reader
    deltas = "".join(e.delta for e in everything if e.type == "response.output_text.delta")
    assert stored.output_text == deltas and stored.usage is not None
    assert stored.usage.output_tokens == 6


async def test_background_needs_store_and_cancel_needs_background(
    client: httpx.AsyncClient,
) -> None:
    body = {"model": MODEL, "input": "hi", "background": True, "store": False}
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"
    # Only a response created streamed in the background streams again.
    plain = (await client.post("/v1/responses", json={"model": MODEL, "input": "hi"})).json()
    r = await client.get(f"/v1/responses/{plain['id']}", params={"stream": "true"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    streamed = {"model": MODEL, "input": "hi", "max_output_tokens": 2}
    async with client.stream(
        "POST", "/v1/responses", json=streamed | {"background": True, "stream": True}
    ) as events:
        response_id = None
        async for line in events.aiter_lines():
            if line.startswith("data: ") and response_id is None:
                response_id = json.loads(line[6:])["response"]["id"]
    for bad in ("-3", "soon"):
        r = await client.get(
            f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": bad}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "starting_after"
    plain = (
        await client.post(
            "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2}
        )
    ).json()
    r = await client.post(f"/v1/responses/{plain['id']}/cancel")
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_id"
    r = await client.post("/v1/responses/resp_missing/cancel")
    assert r.status_code == 404


def _entry(response_id: str, status: str = "completed") -> StoredResponse:
    response = protocol.Response(id=response_id, created_at=1, model=MODEL, status=status)
    return StoredResponse(response, ({"role": "user", "content": response_id},))


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_store_keeps_the_most_recently_used(tmp_path: Any, kind: str) -> None:
    store = (
        MemoryResponseStore(2) if kind == "memory" else SqliteResponseStore(tmp_path / "r.db", 2)
    )

    def get(response_id: str) -> StoredResponse | None:
        return store.get(response_id, owner=None)

    store.put(_entry("a"), owner=None)
    store.put(_entry("b"), owner=None)
    assert get("a") is not None  # a is now the more recent
    store.put(_entry("c"), owner=None)
    assert get("b") is None and get("a") == _entry("a") and get("c") is not None
    assert store.delete("a", owner=None) and not store.delete("a", owner=None)
    assert get("a") is None


def test_the_sqlite_store_outlives_its_process_and_fails_what_it_left_running(
    tmp_path: Any,
) -> None:
    store = SqliteResponseStore(tmp_path / "r.db")
    store.put(_entry("done"), owner=None)
    store.put(_entry("running", status="in_progress"), owner=None)
    store.close()
    again = SqliteResponseStore(tmp_path / "r.db")
    assert again.get("done", owner=None) == _entry("done")
    running = again.get("running", owner=None)
    assert running is not None and running.response.status == "failed"
    assert running.response.error is not None
    assert running.response.error.code == "server_restarted"


async def test_a_conversation_continues_across_a_restart(start_server: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "responses.db")
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 3}
    async with start_server(response_store=path) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            first = (await client.post("/v1/responses", json=body)).json()
    async with start_server(response_store=path) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            kept = (await client.get(f"/v1/responses/{first['id']}")).json()
            assert kept["output"] == first["output"] and kept["usage"] == first["usage"]
            follow = {**body, "input": "more", "previous_response_id": first["id"]}
            second = await client.post("/v1/responses", json=follow)
            assert second.status_code == 200
            assert second.json()["usage"]["input_tokens"] > first["usage"]["input_tokens"]


# ---- output items: status and the order of their events ---------------------------


@attrs.define
class _AnswerRunner:
    """Every sequence's output is `answer` (token ids), then end of sequence (or
    the length limit). With tools the engine checks each token against the
    request's grammar, so the answer must be a well-formed one."""

    eos: int
    answer: tuple[int, ...] = ()
    num_blocks: int = 512
    block_size: int = 16
    _given: dict[int, int] = attrs.field(factory=dict)  # seq id -> tokens given

    def step(self, batch: StepBatch) -> list[SampledToken]:
        if batch.token_masks is not None:
            batch.token_masks.wait()
        out = []
        for c in batch.chunks:
            if c.sample:
                i = self._given[c.seq_id] = self._given.get(c.seq_id, 0) + 1
                token = self.answer[i - 1] if i <= len(self.answer) else self.eos
                out.append(SampledToken(c.seq_id, token, -0.25, ()))
        return out


def _call_text(name: str, arguments: dict[str, Any]) -> str:
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


_TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
    {"type": "function", "name": "now", "parameters": {"type": "object", "properties": {}}},
]


def _item_events(kind: str, index: int) -> list[tuple[str, int]]:
    """The events of one whole output item as OpenAI sends them (a run of deltas
    counted once), each with its `output_index`."""
    if kind == "message":
        names = [
            "output_item.added",
            "content_part.added",
            "output_text.delta",
            "output_text.done",
            "content_part.done",
            "output_item.done",
        ]
    else:
        names = [
            "output_item.added",
            "function_call_arguments.delta",
            "function_call_arguments.done",
            "output_item.done",
        ]
    return [(f"response.{name}", index) for name in names]


def _event_order(events: list[Any]) -> list[tuple[str, int | None]]:
    """Each event's type and output index, a run of deltas of one item as one."""
    order: list[tuple[str, int | None]] = []
    for e in events:
        entry = (e.type, getattr(e, "output_index", None))
        if not (e.type.endswith(".delta") and order and order[-1] == entry):
            order.append(entry)
    return order


@pytest.fixture
def answer_runner(tokenizer: Any) -> _AnswerRunner:
    return _AnswerRunner(eos=tokenizer.eos_token_id)


@pytest.fixture
async def answer_sdk(
    answer_runner: _AnswerRunner, serve_runner: Any
) -> AsyncIterator[openai.OpenAI]:
    async with serve_runner(answer_runner) as server:
        with openai.OpenAI(
            base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30
        ) as client:
            yield client


@pytest.mark.parametrize(
    ("answer", "kinds"),
    [
        (
            "Let me check.\n"
            + _call_text("get_weather", {"city": "Oslo"})
            + "\n"
            + _call_text("now", {}),
            ["message", "function_call", "function_call"],
        ),
        (
            _call_text("now", {})
            + "\n"
            + _call_text("get_weather", {"city": "Oslo"})
            + "\n"
            + _call_text("now", {}),
            ["function_call", "function_call", "function_call"],
        ),
    ],
    ids=["message-then-calls", "calls"],
)
async def test_each_output_item_is_done_before_the_next_is_added(
    answer_sdk: openai.OpenAI,
    answer_runner: _AnswerRunner,
    tokenizer: Any,
    answer: str,
    kinds: list[str],
) -> None:
    answer_runner.answer = tuple(tokenizer.encode(answer, add_special_tokens=False))

    def run() -> list[Any]:
        with answer_sdk.responses.stream(
            model=MODEL, input="weather?", tools=_TOOLS, max_output_tokens=300
        ) as stream:
            return list(stream)

    events = await in_thread(run)
    expected: list[tuple[str, int | None]] = [
        ("response.created", None),
        ("response.in_progress", None),
    ]
    for index, kind in enumerate(kinds):
        expected += _item_events(kind, index)
    expected.append(("response.completed", None))
    assert _event_order(events) == expected
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.id, i.status) for i in final.output] == [(i.id, i.status) for i in done]
    assert [i.type for i in final.output] == kinds
    assert all(i.status == "completed" for i in final.output)
    calls = [i for i in final.output if i.type == "function_call"]
    assert all(isinstance(json.loads(c.arguments), dict) for c in calls)
    assert len({c.call_id for c in calls}) == len({c.id for c in calls}) == len(calls)


async def test_the_item_cut_by_max_output_tokens_is_incomplete(
    oai: openai.OpenAI, runner: ScriptedRunner
) -> None:
    whole = await in_thread(
        lambda: oai.responses.create(model=MODEL, input="hi", max_output_tokens=4)
    )
    assert whole.status == "incomplete" and [i.status for i in whole.output] == ["incomplete"]
    stored = await in_thread(lambda: oai.responses.retrieve(whole.id))
    assert [i.status for i in stored.output] == ["incomplete"]

    def run() -> list[Any]:
        with oai.responses.stream(model=MODEL, input="hi", max_output_tokens=4) as stream:
            return list(stream)

    events = await in_thread(run)
    [added] = [e.item for e in events if e.type == "response.output_item.added"]
    [done] = [e.item for e in events if e.type == "response.output_item.done"]
    assert added.status == "in_progress" and done.status == "incomplete"
    final = events[-1].response
    assert final.status == "incomplete" and [i.status for i in final.output] == ["incomplete"]
    streamed = await in_thread(lambda: oai.responses.retrieve(final.id))
    assert [i.status for i in streamed.output] == ["incomplete"]
    # An output that ends on its own leaves its item completed.
    runner.eos_after = 2
    ended = await in_thread(
        lambda: oai.responses.create(model=MODEL, input="hi", max_output_tokens=40)
    )
    assert ended.status == "completed" and [i.status for i in ended.output] == ["completed"]


async def test_a_function_call_cut_by_max_output_tokens_is_incomplete(
    answer_sdk: openai.OpenAI, answer_runner: _AnswerRunner, tokenizer: Any
) -> None:
    answer = _call_text("now", {}) + "\n" + _call_text("get_weather", {"city": "Oslo"})
    tokens = tokenizer.encode(answer, add_special_tokens=False)
    answer_runner.answer = tuple(tokens)
    first = len(tokenizer.encode(_call_text("now", {}) + "\n", add_special_tokens=False))

    def run() -> list[Any]:
        with answer_sdk.responses.stream(
            model=MODEL, input="weather?", tools=_TOOLS, max_output_tokens=len(tokens) - 3
        ) as stream:
            return list(stream)

    assert first < len(tokens) - 3  # the cut falls inside the second call
    events = await in_thread(run)
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.type, i.status) for i in done] == [
        ("function_call", "completed"),
        ("function_call", "incomplete"),
    ]
    final = events[-1].response
    assert final.status == "incomplete"
    assert [i.status for i in final.output] == ["completed", "incomplete"]
    assert final.output[1].name == "get_weather"


def test_a_delta_that_ends_a_call_and_then_holds_text_keeps_that_order() -> None:
    events: list[dict[str, Any]] = []
    out = ResponseOutput(events.append)
    call, fn = protocol.DeltaToolCall, protocol.DeltaFunctionCall
    first = [call(0, "call_1", "function", fn("now", '{"a"'))]
    out.feed(protocol.ChatCompletionChunkChoice(0, protocol.DeltaMessage(tool_calls=first)))
    # The call's last piece and the text after it arrive in one delta.
    rest = [call(0, function=fn(arguments=": 1}"))]
    out.feed(
        protocol.ChatCompletionChunkChoice(
            0, protocol.DeltaMessage(content="Done.", tool_calls=rest), finish_reason="stop"
        )
    )
    items = out.close()
    assert [(i["type"], i["status"]) for i in items] == [
        ("function_call", "completed"),
        ("message", "completed"),
    ]
    assert items[0]["arguments"] == '{"a": 1}'
    assert [(e["type"], e["output_index"]) for e in events] == [
        ("response.output_item.added", 0),
        ("response.function_call_arguments.delta", 0),
        ("response.function_call_arguments.delta", 0),
        ("response.function_call_arguments.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.content_part.added", 1),
        ("response.output_text.delta", 1),
        ("response.output_text.done", 1),
        ("response.content_part.done", 1),
        ("response.output_item.done", 1),
    ]


# ---- GET /v1/responses/{id}/input_items ---------------------------------------------

_INPUT: list[Any] = [
    {"role": "developer", "content": "Answer in one word."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
    {
        "type": "function_call",
        "id": "fc_sent_back",  # an earlier output's item keeps its id
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": "{}",
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    {"role": "assistant", "content": "Sunny."},
    {"role": "user", "content": "And tomorrow?"},
]


async def test_input_items_are_listed_newest_first_with_ids_and_pages(
    oai: openai.OpenAI, client: httpx.AsyncClient
) -> None:
    response = await in_thread(
        lambda: oai.responses.create(
            model=MODEL, input=_INPUT, instructions="Be brief.", max_output_tokens=2
        )
    )
    listed = await in_thread(lambda: oai.responses.input_items.list(response.id))
    items = listed.data[::-1]  # newest first by default
    assert [i.type for i in items] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]
    assert listed.has_more is False
    ids = [i.id for i in items]
    assert len(set(ids)) == 6 and all(ids[k].startswith("msg_") for k in (0, 1, 4, 5))
    developer, user, call, output, assistant, last = items
    assert developer.role == "developer" and developer.status == "completed"
    assert [(p.type, p.text) for p in developer.content] == [("input_text", "Answer in one word.")]
    assert [(p.type, p.text) for p in user.content] == [("input_text", "Weather?")]
    assert (call.id, call.call_id, call.name) == ("fc_sent_back", "call_1", "get_weather")
    assert (output.call_id, output.output) == ("call_1", "sunny")
    assert assistant.role == "assistant"
    assert [(p.type, p.text) for p in assistant.content] == [("output_text", "Sunny.")]
    assert [p.text for p in last.content] == ["And tomorrow?"]  # instructions are not input
    raw = (await client.get(f"/v1/responses/{response.id}/input_items")).json()
    assert raw["object"] == "list" and [i["id"] for i in raw["data"]] == ids[::-1]
    assert (raw["first_id"], raw["last_id"], raw["has_more"]) == (ids[-1], ids[0], False)

    first = await in_thread(
        lambda: oai.responses.input_items.list(response.id, order="asc", limit=4)
    )
    assert [i.id for i in first.data] == ids[:4] and first.has_more is True
    rest = await in_thread(
        lambda: oai.responses.input_items.list(
            response.id, order="asc", limit=4, after=first.data[-1].id
        )
    )
    assert [i.id for i in rest.data] == ids[4:] and rest.has_more is False

    # The SDK follows `has_more` and the last id on its own, in either order.
    def walk(order: Literal["asc", "desc"]) -> list[str]:
        return [i.id for i in oai.responses.input_items.list(response.id, order=order, limit=2)]

    assert await in_thread(lambda: walk("asc")) == ids
    assert await in_thread(lambda: walk("desc")) == ids[::-1]
    after_third = await in_thread(
        lambda: oai.responses.input_items.list(response.id, after=ids[3], limit=1)
    )
    assert [i.id for i in after_third.data] == [ids[2]] and after_third.has_more is True
    included = await in_thread(
        lambda: oai.responses.input_items.list(
            response.id, include=["message.input_image.image_url", "message.output_text.logprobs"]
        )
    )
    assert [i.id for i in included.data] == ids[::-1]


async def test_a_continued_response_lists_only_its_own_input(oai: openai.OpenAI) -> None:
    first = await in_thread(
        lambda: oai.responses.create(model=MODEL, input="hi", max_output_tokens=2)
    )
    second = await in_thread(
        lambda: oai.responses.create(
            model=MODEL, input="and then?", previous_response_id=first.id, max_output_tokens=2
        )
    )
    [item] = (await in_thread(lambda: oai.responses.input_items.list(second.id))).data
    assert item.type == "message" and item.role == "user"
    assert [p.text for p in item.content] == ["and then?"]
    assert item.id.startswith("msg_")
    [earlier] = (await in_thread(lambda: oai.responses.input_items.list(first.id))).data
    assert [p.text for p in earlier.content] == ["hi"] and earlier.id != item.id


async def test_input_items_errors_name_their_parameter(
    oai: openai.OpenAI, client: httpx.AsyncClient
) -> None:
    response = await in_thread(
        lambda: oai.responses.create(model=MODEL, input="hi", max_output_tokens=2)
    )
    url = f"/v1/responses/{response.id}/input_items"
    for params, param in (
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"order": "sideways"}, "order"),
        ({"after": "msg_missing"}, "after"),
        ({"include[]": "bogus"}, "include"),
        ({"include": "bogus"}, "include"),
    ):
        r = await client.get(url, params=params)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, params
    with pytest.raises(openai.BadRequestError) as raised:
        await in_thread(lambda: oai.responses.input_items.list(response.id, limit=101))
    assert raised.value.param == "limit"
    with pytest.raises(openai.NotFoundError):
        await in_thread(lambda: oai.responses.input_items.list("resp_missing"))
    r = await client.get("/v1/responses/resp_missing/input_items")
    assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"
    await in_thread(lambda: oai.responses.delete(response.id))
    with pytest.raises(openai.NotFoundError):
        await in_thread(lambda: oai.responses.input_items.list(response.id))
    doc = (await client.get("/openapi.json")).json()
    operation = doc["paths"]["/v1/responses/{response_id}/input_items"]["get"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ResponseItemList"
    }
    assert [p["name"] for p in operation["parameters"]] == [
        "response_id",
        "after",
        "limit",
        "order",
        "include[]",
    ]
    assert "ResponseItemList" in doc["components"]["schemas"]


async def test_input_items_outlive_a_restart_with_the_sqlite_store(
    start_server: Any, runner: ScriptedRunner, tmp_path: Any
) -> None:
    path = str(tmp_path / "responses.db")
    runner.gated = True
    async with start_server(response_store=path) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            body = {"model": MODEL, "input": _INPUT, "max_output_tokens": 2}
            done = (await client.post("/v1/responses", json=body | {"background": True})).json()
            # A queued response lists its input before it runs.
            queued = (await client.get(f"/v1/responses/{done['id']}/input_items")).json()
            assert len(queued["data"]) == len(_INPUT)
            runner.open()
            running = server.state.background_runs.get(done["id"])
            with trio.fail_after(20):
                if running is not None:
                    await running.done.wait()
            before = (await client.get(f"/v1/responses/{done['id']}/input_items")).json()
            assert before == queued
    async with start_server(response_store=path) as server:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as oai:
            after = await in_thread(
                lambda: oai.responses.input_items.list(done["id"], order="asc", limit=3)
            )
            walked = await in_thread(
                lambda: [i.model_dump(exclude_none=True) for i in after]  # every page
            )
    assert [i["id"] for i in walked] == [i["id"] for i in before["data"][::-1]]
    assert walked == [{k: v for k, v in i.items() if v is not None} for i in before["data"][::-1]]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_store_keeps_a_responses_input_items(tmp_path: Any, kind: str) -> None:
    store = MemoryResponseStore() if kind == "memory" else SqliteResponseStore(tmp_path / "r.db")
    items = ({"type": "message", "id": "msg_1", "role": "user", "content": []},)
    entry = attrs.evolve(_entry("a"), input_items=items)
    store.put(entry, owner=None)
    assert store.get("a", owner=None) == entry


def test_the_sqlite_store_opens_a_file_from_before_input_items_were_kept(tmp_path: Any) -> None:
    path = tmp_path / "r.db"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE responses (id TEXT PRIMARY KEY, response TEXT NOT NULL,"
        " conversation TEXT NOT NULL, used INTEGER NOT NULL)"
    )
    entry = _entry("old")
    old.execute(
        "INSERT INTO responses VALUES (?, ?, ?, 1)",
        ("old", json.dumps(entry.response.to_dict()), json.dumps(entry.conversation)),
    )
    old.commit()
    old.close()
    store = SqliteResponseStore(path)
    kept = store.get("old", owner=None)
    assert kept is not None and kept.conversation == entry.conversation
    assert kept.input_items == ()
    newer = attrs.evolve(_entry("new"), input_items=({"type": "message", "id": "msg_1"},))
    store.put(newer, owner=None)
    assert store.get("new", owner=None) == newer
