"""`previous_response_id` of a response that has not ended normally: one still
queued or in progress is a 400 naming its state; one that failed, was cancelled
or was cut short continues from its input and whatever output it had."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from polling import eventually
from sluiceway import protocol
from sluiceway.api.responses.store import StoredResponse

from .conftest import MODEL
from .fakes import ScriptedRunner

BODY = {"model": MODEL, "input": "hi", "max_output_tokens": 50}


async def read_to_the_end(client: httpx.AsyncClient, ids: list[str], first: trio.Event) -> None:
    """Streams a background response to its end, its id in `ids` with the first event."""
    async with client.stream(
        "POST", "/v1/responses", json=BODY | {"background": True, "stream": True}
    ) as events:
        async for line in events.aiter_lines():
            if line.startswith("data: ") and not first.is_set():
                ids.append(json.loads(line[6:])["response"]["id"])
                first.set()


def conversation(server: Any, response_id: str) -> tuple[dict[str, Any], ...]:
    stored = server.state.response_store.get(response_id, owner=None)
    assert stored is not None
    return stored.conversation


async def test_continuing_a_response_not_yet_ended_is_a_400_naming_its_state(
    start_server: Any, runner: ScriptedRunner
) -> None:
    runner.gated = True
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        running = (await client.post("/v1/responses", json=BODY | {"background": True})).json()
        queued = protocol.Response(id="resp_queued", created_at=1, model=MODEL, status="queued")
        server.state.response_store.put(StoredResponse(queued, ()), owner=None)
        # (In the background, so that a server that took it would answer at once.)
        for response_id, status in ((running["id"], "in_progress"), ("resp_queued", "queued")):
            follow = BODY | {"previous_response_id": response_id, "background": True}
            r = await client.post("/v1/responses", json=follow)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert error["param"] == "previous_response_id" and status in error["message"]
        url = f"/v1/responses/{running['id']}"
        assert (await client.get(url)).json()["status"] == "in_progress"
        assert (await client.post(url + "/cancel")).json()["status"] == "cancelled"


@pytest.mark.parametrize("ending", ["cancelled", "failed"])
async def test_a_response_ended_early_continues_from_its_output_so_far(
    start_server: Any, runner: ScriptedRunner, ending: str
) -> None:
    runner.gated = True
    # A request timeout is what fails it here, once it has said something.
    timeout = {"request_timeout": 2.0} if ending == "failed" else {}
    async with (
        start_server(**timeout) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
        trio.open_nursery() as nursery,
    ):
        ids: list[str] = []
        first = trio.Event()
        nursery.start_soon(read_to_the_end, client, ids, first)
        await first.wait()
        run = server.state.background_runs[ids[0]]
        runner.allow(3)  # the prompt and two more tokens
        await eventually(
            lambda: sum(e["type"] == "response.output_text.delta" for e in run.events or ()) == 3
        )
        if ending == "cancelled":
            await client.post(f"/v1/responses/{ids[0]}/cancel")
        with trio.fail_after(20):
            await run.done.wait()
        ended = (await client.get(f"/v1/responses/{ids[0]}")).json()
        assert ended["status"] == ending
        said = ended["output"][0]["content"][0]["text"]
        assert said
        runner.open()
        follow = BODY | {"input": "and then?", "previous_response_id": ids[0]}
        follow |= {"max_output_tokens": 2}
        second = await client.post("/v1/responses", json=follow)
        assert second.status_code == 200, second.text
    assert conversation(server, second.json()["id"])[:3] == (
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": said},
        {"role": "user", "content": "and then?"},
    )


async def test_a_response_a_restart_failed_continues_from_its_input(
    start_server: Any, runner: ScriptedRunner, tmp_path: Any
) -> None:
    path = str(tmp_path / "responses.db")
    runner.gated = True
    async with (
        start_server(response_store=path) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        running = (await client.post("/v1/responses", json=BODY | {"background": True})).json()
    runner.open()
    async with (
        start_server(response_store=path) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        failed = (await client.get(f"/v1/responses/{running['id']}")).json()
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_restarted"
        follow = BODY | {"input": "again", "previous_response_id": running["id"]}
        second = await client.post("/v1/responses", json=follow | {"max_output_tokens": 2})
        assert second.status_code == 200
        assert conversation(server, second.json()["id"])[:2] == (
            {"role": "user", "content": "hi"},
            {"role": "user", "content": "again"},
        )
