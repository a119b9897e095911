"""The Responses API through the official `openai` client (sync, in worker
threads) against the server on the scripted runner: objects, named stream
events in order, stored conversations, and errors naming their parameter."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import trio

from server_helpers import eventually
from sluiceway import protocol
from sluiceway.api.response_input import chat_messages
from sluiceway.api.response_output import ResponseOutput
from sluiceway.api.response_store import MemoryResponseStore, SqliteResponseStore, StoredResponse

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
    store.put(_entry("a"))
    store.put(_entry("b"))
    assert store.get("a") is not None  # a is now the more recent
    store.put(_entry("c"))
    assert store.get("b") is None and store.get("a") == _entry("a") and store.get("c") is not None
    assert store.delete("a") and not store.delete("a") and store.get("a") is None


def test_the_sqlite_store_outlives_its_process_and_fails_what_it_left_running(
    tmp_path: Any,
) -> None:
    store = SqliteResponseStore(tmp_path / "r.db")
    store.put(_entry("done"))
    store.put(_entry("running", status="in_progress"))
    store.close()
    again = SqliteResponseStore(tmp_path / "r.db")
    assert again.get("done") == _entry("done")
    running = again.get("running")
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
