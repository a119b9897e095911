"""Stored responses, files and batches belong to the key that made them (or to its
project): another key gets the 404 of an unknown id from every endpoint and a
list without them; without keys nothing is anyone's; owners outlive a restart on
the SQLite stores, and a store written before owners were recorded opens with
objects that belong to no key."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from polling import eventually
from sluiceway import protocol
from sluiceway.api.batches.store import BatchStore
from sluiceway.api.keys.rate_limits import load_key_budgets
from sluiceway.api.responses.store import SqliteResponseStore, StoredResponse
from sluiceway.config import KeyBudget
from sluiceway.protocol.batches import Batch

from .conftest import MODEL
from .fakes import ScriptedRunner

C = "/v1/chat/completions"
KEYS = ("key-a", "key-b")
RESPONSE = {"model": MODEL, "input": "hi", "max_output_tokens": 2}


@asynccontextmanager
async def as_key(server: Any, key: str | None) -> AsyncIterator[httpx.AsyncClient]:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=headers) as client:
        yield client


def batch_file(*custom_ids: str) -> bytes:
    lines = [
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": C,
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 2,
            },
        }
        for custom_id in custom_ids
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def upload(client: httpx.AsyncClient, content: bytes) -> dict[str, Any]:
    r = await client.post(
        "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
    )
    assert r.status_code == 200, r.text
    return r.json()


async def create_batch(client: httpx.AsyncClient, file_id: str) -> httpx.Response:
    body = {"input_file_id": file_id, "endpoint": C, "completion_window": "24h"}
    return await client.post("/v1/batches", json=body)


async def batches_done(server: Any) -> None:
    with trio.fail_after(30):
        await server.batch_runner.idle.wait()


async def read_background_stream(
    client: httpx.AsyncClient, ids: list[str], first: trio.Event
) -> None:
    """Streams a background response to its end, its id in `ids` with the first event."""
    body = RESPONSE | {"background": True, "stream": True, "max_output_tokens": 50}
    async with client.stream("POST", "/v1/responses", json=body) as events:
        async for line in events.aiter_lines():
            if line.startswith("data: ") and not first.is_set():
                ids.append(json.loads(line[6:])["response"]["id"])
                first.set()


def assert_not_found(r: httpx.Response, param: str) -> None:
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "not_found" and r.json()["error"]["param"] == param


async def test_another_keys_responses_are_not_found(
    start_server: Any, runner: ScriptedRunner
) -> None:
    async with (
        start_server(api_keys=KEYS) as server,
        as_key(server, "key-a") as a,
        as_key(server, "key-b") as b,
        trio.open_nursery() as nursery,
    ):
        done = (await a.post("/v1/responses", json=RESPONSE)).json()
        runner.gated = True  # the background response stays unfinished
        ids: list[str] = []
        first = trio.Event()
        nursery.start_soon(read_background_stream, a, ids, first)
        await first.wait()
        running = ids[0]
        for response_id in (done["id"], running):
            url = f"/v1/responses/{response_id}"
            assert_not_found(await b.get(url), "response_id")
            assert_not_found(await b.get(url, params={"stream": "true"}), "response_id")
            assert_not_found(await b.get(url + "/input_items"), "response_id")
            assert_not_found(await b.post(url + "/cancel"), "response_id")
            assert_not_found(await b.delete(url), "response_id")
        follow = RESPONSE | {"previous_response_id": done["id"]}
        assert_not_found(await b.post("/v1/responses", json=follow), "previous_response_id")
        # The owner still has every one of them.
        url = f"/v1/responses/{running}"
        assert (await a.get(url)).json()["status"] == "in_progress"
        assert (await a.post(url + "/cancel")).json()["status"] == "cancelled"
        replay = await a.get(url, params={"stream": "true"})
        assert replay.status_code == 200 and "response.queued" in replay.text
        runner.open()
        assert (await a.get(f"/v1/responses/{done['id']}")).json() == done
        assert len((await a.get(f"/v1/responses/{done['id']}/input_items")).json()["data"]) == 1
        assert (await a.post("/v1/responses", json=follow)).status_code == 200
        assert (await a.delete(f"/v1/responses/{done['id']}")).json()["deleted"] is True


async def test_another_keys_files_and_batches_are_not_found(start_server: Any) -> None:
    async with start_server(api_keys=KEYS) as server, as_key(server, "key-a") as a:
        async with as_key(server, "key-b") as b:
            mine = await upload(a, batch_file("a1", "a2"))
            theirs = await upload(b, batch_file("b1"))
            batch = (await create_batch(a, mine["id"])).json()
            await batches_done(server)
            done = (await a.get(f"/v1/batches/{batch['id']}")).json()
            assert done["status"] == "completed"
            # A batch's output is its owner's, like its input.
            for file_id in (mine["id"], done["output_file_id"]):
                url = f"/v1/files/{file_id}"
                assert_not_found(await b.get(url), "file_id")
                assert_not_found(await b.get(url + "/content"), "file_id")
                assert_not_found(await b.delete(url), "file_id")
                assert_not_found(await create_batch(b, file_id), "input_file_id")
            assert [f["id"] for f in (await b.get("/v1/files")).json()["data"]] == [theirs["id"]]
            assert_not_found(await b.get(f"/v1/batches/{batch['id']}"), "batch_id")
            assert_not_found(await b.post(f"/v1/batches/{batch['id']}/cancel"), "batch_id")
            assert (await b.get("/v1/batches")).json()["data"] == []
            assert (await b.get("/v1/batches", params={"after": batch["id"]})).json()["data"] == []
            # The owner's view is whole.
            listed = [f["id"] for f in (await a.get("/v1/files")).json()["data"]]
            assert listed == [mine["id"], done["output_file_id"]]
            output = (await a.get(f"/v1/files/{done['output_file_id']}/content")).text
            assert sorted(json.loads(row)["custom_id"] for row in output.splitlines()) == [
                "a1",
                "a2",
            ]
            assert [x["id"] for x in (await a.get("/v1/batches")).json()["data"]] == [batch["id"]]
            assert (await a.delete(f"/v1/files/{mine['id']}")).json()["deleted"] is True
            assert (await b.get(f"/v1/files/{theirs['id']}")).status_code == 200


async def test_a_cancel_by_another_key_leaves_a_running_batch_alone(
    start_server: Any, runner: ScriptedRunner
) -> None:
    runner.gated = True
    async with start_server(api_keys=KEYS) as server, as_key(server, "key-a") as a:
        async with as_key(server, "key-b") as b:
            file = await upload(a, batch_file("a1"))
            batch = (await create_batch(a, file["id"])).json()
            engine = server.state.engine
            await eventually(lambda: engine.stats().num_running_seqs == 1)
            assert_not_found(await b.post(f"/v1/batches/{batch['id']}/cancel"), "batch_id")
            runner.open()
            await batches_done(server)
            assert (await a.get(f"/v1/batches/{batch['id']}")).json()["status"] == "completed"


async def test_keys_of_one_project_share_their_objects(start_server: Any) -> None:
    budgets = {
        "key-a": KeyBudget(project="team"),
        "key-c": KeyBudget(requests_per_minute=100, project="team"),
        "key-b": KeyBudget(),
    }
    async with start_server(api_key_budgets=budgets) as server, as_key(server, "key-a") as a:
        async with as_key(server, "key-c") as c, as_key(server, "key-b") as b:
            done = (await a.post("/v1/responses", json=RESPONSE)).json()
            file = await upload(a, batch_file("a1"))
            batch = (await create_batch(c, file["id"])).json()  # a's file, c's batch
            assert batch["status"] == "validating"
            await batches_done(server)
            assert (await c.get(f"/v1/responses/{done['id']}")).json() == done
            follow = RESPONSE | {"previous_response_id": done["id"]}
            assert (await c.post("/v1/responses", json=follow)).status_code == 200
            finished = (await a.get(f"/v1/batches/{batch['id']}")).json()
            listed = [f["id"] for f in (await c.get("/v1/files")).json()["data"]]
            assert listed == [file["id"], finished["output_file_id"]]
            assert (
                await a.get(f"/v1/files/{finished['output_file_id']}/content")
            ).status_code == 200
            # A key of no project, or of another, is someone else.
            assert_not_found(await b.get(f"/v1/responses/{done['id']}"), "response_id")
            assert_not_found(await b.get(f"/v1/files/{file['id']}"), "file_id")
            assert (await b.get("/v1/batches")).json()["data"] == []
            assert (await c.delete(f"/v1/files/{file['id']}")).json()["deleted"] is True


def test_the_budget_file_may_give_keys_a_project(tmp_path: Any) -> None:
    path = tmp_path / "keys.json"
    keys = {"a": {"project": "team", "requests_per_minute": 5}, "b": {}}
    path.write_text(json.dumps({"keys": keys}))
    assert load_key_budgets(path) == {
        "a": KeyBudget(requests_per_minute=5, project="team"),
        "b": KeyBudget(),
    }
    for bad in ("", 3):
        path.write_text(json.dumps({"keys": {"a": {"project": bad}}}))
        with pytest.raises(ValueError, match=r"keys\.a\.project must be a non-empty string"):
            load_key_budgets(path)


async def test_without_keys_every_object_is_everyones(start_server: Any) -> None:
    async with (
        start_server() as server,
        as_key(server, None) as anyone,
        as_key(server, "any-key-at-all") as other,
    ):
        done = (await anyone.post("/v1/responses", json=RESPONSE)).json()
        file = await upload(anyone, batch_file("x"))
        batch = (await create_batch(anyone, file["id"])).json()
        await batches_done(server)
        assert (await other.get(f"/v1/responses/{done['id']}")).json() == done
        follow = RESPONSE | {"previous_response_id": done["id"]}
        assert (await other.post("/v1/responses", json=follow)).status_code == 200
        listed = (await other.get("/v1/files")).json()["data"]
        assert [f["purpose"] for f in listed] == ["batch", "batch_output"]
        assert (await other.get(f"/v1/batches/{batch['id']}")).json()["status"] == "completed"
        assert (await other.delete(f"/v1/files/{file['id']}")).json()["deleted"] is True


async def test_owners_outlive_a_restart_on_the_sqlite_stores(
    start_server: Any, runner: ScriptedRunner, tmp_path: Any
) -> None:
    paths = {
        "response_store": str(tmp_path / "responses.db"),
        "batch_store": str(tmp_path / "batches.db"),
    }
    runner.gated = True  # the batch is left unfinished by the first process
    async with start_server(api_keys=KEYS, **paths) as server, as_key(server, "key-a") as a:
        runner.allow(2)
        done = (await a.post("/v1/responses", json=RESPONSE)).json()
        file = await upload(a, batch_file("a1", "a2"))
        batch = (await create_batch(a, file["id"])).json()
    async with start_server(api_keys=KEYS, **paths) as server, as_key(server, "key-a") as a:
        async with as_key(server, "key-b") as b:
            await batches_done(server)  # resumed, on behalf of its owner
            finished = (await a.get(f"/v1/batches/{batch['id']}")).json()
            assert finished["status"] == "completed"
            assert (await a.get(f"/v1/responses/{done['id']}")).json() == done
            assert (await a.get(f"/v1/files/{finished['output_file_id']}")).status_code == 200
            assert_not_found(await b.get(f"/v1/responses/{done['id']}"), "response_id")
            follow = RESPONSE | {"previous_response_id": done["id"]}
            assert_not_found(await b.post("/v1/responses", json=follow), "previous_response_id")
            for file_id in (file["id"], finished["output_file_id"]):
                assert_not_found(await b.get(f"/v1/files/{file_id}/content"), "file_id")
            assert_not_found(await b.get(f"/v1/batches/{batch['id']}"), "batch_id")
            assert (await b.get("/v1/files")).json()["data"] == []


def test_a_store_records_a_salted_hash_never_the_key(tmp_path: Any) -> None:
    from sluiceway.api.keys.owners import Owner

    owner = Owner.of_key("secret-key-123", {})
    responses = SqliteResponseStore(tmp_path / "r.db")
    response = protocol.Response(id="resp_1", created_at=1, model=MODEL, status="completed")
    responses.put(StoredResponse(response, ()), owner=owner)
    files = BatchStore(tmp_path / "b.db")
    file = files.add_file("in.jsonl", "batch", b"{}", owner=owner)
    responses.close()
    files.close()
    hashes = []
    for path, table in ((tmp_path / "r.db", "responses"), (tmp_path / "b.db", "files")):
        assert b"secret-key-123" not in path.read_bytes()
        with sqlite3.connect(path) as db:
            hashes += [db.execute(f"SELECT owner FROM {table}").fetchone()[0]]
    assert hashes[0] != hashes[1]  # each store has its own salt
    # ... kept in the store: the same key finds its objects after a reopen.
    responses = SqliteResponseStore(tmp_path / "r.db")
    files = BatchStore(tmp_path / "b.db")
    other = Owner.of_key("another-key", {})
    try:
        assert responses.get("resp_1", owner=owner) is not None
        assert responses.get("resp_1", owner=other) is None
        assert files.file(file.id, owner=owner) == file
        assert files.file(file.id, owner=other) is None
    finally:
        responses.close()
        files.close()


def _old_stores(tmp_path: Any) -> tuple[str, str]:
    """A response store and a batch store as the version before owners wrote them:
    one stored response, one uploaded file, one finished batch."""
    responses = str(tmp_path / "old-responses.db")
    db = sqlite3.connect(responses)
    db.execute(
        "CREATE TABLE responses (id TEXT PRIMARY KEY, response TEXT NOT NULL,"
        " conversation TEXT NOT NULL, used INTEGER NOT NULL,"
        " input_items TEXT NOT NULL DEFAULT '[]')"
    )
    response = protocol.Response(id="resp_old", created_at=1, model=MODEL, status="completed")
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    db.execute(
        "INSERT INTO responses VALUES (?, ?, ?, 1, '[]')",
        ("resp_old", json.dumps(response.to_dict()), json.dumps(conversation)),
    )
    db.commit()
    db.close()
    batches = str(tmp_path / "old-batches.db")
    db = sqlite3.connect(batches)
    db.execute(
        "CREATE TABLE files (id TEXT PRIMARY KEY, filename TEXT NOT NULL,"
        " purpose TEXT NOT NULL, created_at INTEGER NOT NULL, content BLOB NOT NULL)"
    )
    db.execute(
        "CREATE TABLE batches (id TEXT PRIMARY KEY, created_at INTEGER NOT NULL,"
        " batch TEXT NOT NULL)"
    )
    db.execute(
        "CREATE TABLE batch_lines (batch_id TEXT NOT NULL, line INTEGER NOT NULL,"
        " custom_id TEXT NOT NULL, body TEXT NOT NULL, status TEXT NOT NULL, result TEXT,"
        " PRIMARY KEY (batch_id, line))"
    )
    db.execute("INSERT INTO files VALUES ('file-old', 'in.jsonl', 'batch', 1, ?)", (b"{}\n",))
    batch = Batch(
        id="batch_old",
        endpoint=C,
        input_file_id="file-old",
        completion_window="24h",
        status="completed",
        created_at=1,
    )
    db.execute("INSERT INTO batches VALUES ('batch_old', 1, ?)", (json.dumps(batch.to_dict()),))
    db.commit()
    db.close()
    return responses, batches


async def test_stores_from_before_owners_open_with_objects_of_no_key(
    start_server: Any, tmp_path: Any
) -> None:
    responses, batches = _old_stores(tmp_path)
    paths = {"response_store": responses, "batch_store": batches}
    async with start_server(api_keys=KEYS, **paths) as server, as_key(server, "key-a") as a:
        assert_not_found(await a.get("/v1/responses/resp_old"), "response_id")
        follow = RESPONSE | {"previous_response_id": "resp_old"}
        assert_not_found(await a.post("/v1/responses", json=follow), "previous_response_id")
        assert_not_found(await a.get("/v1/files/file-old"), "file_id")
        assert_not_found(await a.get("/v1/batches/batch_old"), "batch_id")
        assert (await a.get("/v1/files")).json()["data"] == []
        assert (await a.get("/v1/batches")).json()["data"] == []
        # The migrated stores take new, owned objects.
        done = (await a.post("/v1/responses", json=RESPONSE)).json()
        assert (await a.get(f"/v1/responses/{done['id']}")).status_code == 200
        file = await upload(a, batch_file("a1"))
        assert (await a.get(f"/v1/files/{file['id']}")).status_code == 200
    async with start_server(**paths) as server, as_key(server, None) as anyone:
        old = (await anyone.get("/v1/responses/resp_old")).json()
        assert old["id"] == "resp_old" and old["status"] == "completed"
        continued = await anyone.post("/v1/responses", json=follow)
        assert continued.status_code == 200
        assert (await anyone.get("/v1/files/file-old/content")).content == b"{}\n"
        listed = (await anyone.get("/v1/batches")).json()["data"]
        assert [x["id"] for x in listed] == ["batch_old"]
