"""The Files and Batch APIs through the official `openai` client (sync, in worker
threads) against the server on scripted runners: a batch's output equals what
each line alone answers, bad lines fail the batch naming them, a cancel aborts
the lines in flight, and a restart on the same store resumes a batch without
losing or repeating a line."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import trio

from polling import eventually
from sluiceway.config import EngineConfig

from .conftest import MODEL, in_thread, record_finished_lines
from .fakes import PoolingRunner, ScriptedRunner

C = "/v1/chat/completions"
# Background work may fill a step, so that a line's prompt is one step and its
# steps can be counted.
WHOLE_STEPS = EngineConfig(background_step_tokens=1024)


def chat_line(custom_id: str, content: str, **body: Any) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
    } | body
    return {"custom_id": custom_id, "method": "POST", "url": C, "body": body}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def client_for(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


async def batch_done(server: Any) -> None:
    runner = server.batch_runner
    with trio.fail_after(30):
        await runner.idle.wait()


def results(oai: openai.OpenAI, file_id: str | None) -> dict[str, Any]:
    if file_id is None:
        return {}
    rows = [json.loads(line) for line in oai.files.content(file_id).text.splitlines()]
    assert len({r["custom_id"] for r in rows}) == len(rows)  # each line once
    return {r["custom_id"]: r["response"] for r in rows}


async def test_a_batch_answers_every_line_as_the_endpoint_would(start_server: Any) -> None:
    lines = [chat_line(f"line-{i}", f"question {i}") for i in range(6)]
    lines.append(chat_line("bad", "x", max_tokens=-1))
    async with start_server() as server:
        with client_for(server) as oai:
            upload = await in_thread(
                lambda: oai.files.create(file=("batch.jsonl", jsonl(lines)), purpose="batch")
            )
            assert upload.purpose == "batch" and upload.bytes == len(jsonl(lines))
            batch = await in_thread(
                lambda: oai.batches.create(
                    input_file_id=upload.id,
                    endpoint=C,
                    completion_window="24h",
                    metadata={"job": "nightly"},
                )
            )
            assert batch.status == "validating" and batch.request_counts.total == 7
            await batch_done(server)
            done = await in_thread(lambda: oai.batches.retrieve(batch.id))
            output = await in_thread(lambda: results(oai, done.output_file_id))
            failed = await in_thread(lambda: results(oai, done.error_file_id))
            alone = [
                await in_thread(lambda body=line["body"]: oai.chat.completions.create(**body))
                for line in lines[:6]
            ]
            listed = await in_thread(lambda: oai.batches.list(limit=5))
    assert done.status == "completed" and done.metadata == {"job": "nightly"}
    assert (done.request_counts.completed, done.request_counts.failed) == (6, 1)
    assert done.in_progress_at is not None and done.completed_at is not None
    assert sorted(output) == [f"line-{i}" for i in range(6)]
    for i, answer in enumerate(alone):
        response = output[f"line-{i}"]
        assert response["status_code"] == 200
        assert response["body"]["choices"][0]["message"] == answer.choices[0].message.model_dump(
            exclude_none=True
        )
        assert response["body"]["usage"]["completion_tokens"] == answer.usage.completion_tokens
    assert failed["bad"]["status_code"] == 400
    assert failed["bad"]["body"]["error"]["param"] == "max_tokens"
    assert [b.id for b in listed.data] == [batch.id]


async def test_embedding_lines_run_in_a_batch(serve_runner: Any, tokenizer: Any) -> None:
    runner = PoolingRunner(vocab=(5, 6), eos=tokenizer.eos_token_id)
    lines = [
        {"custom_id": str(i), "method": "POST", "url": "/v1/embeddings", "body": {"input": text}}
        for i, text in enumerate(["one", "two words", "three words here"])
    ]
    async with serve_runner(runner) as server:
        with client_for(server) as oai:
            upload = await in_thread(lambda: oai.files.create(file=jsonl(lines), purpose="batch"))
            batch = await in_thread(
                lambda: oai.batches.create(
                    input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h"
                )
            )
            await batch_done(server)
            done = await in_thread(lambda: oai.batches.retrieve(batch.id))
            output = await in_thread(lambda: results(oai, done.output_file_id))
            direct = await in_thread(
                lambda: oai.embeddings.create(
                    input="two words", model=MODEL, encoding_format="float"
                )
            )
    assert done.request_counts.completed == 3 and done.error_file_id is None
    assert output["1"]["body"]["data"][0]["embedding"] == direct.data[0].embedding


@pytest.mark.parametrize(
    ("content", "code", "line"),
    [
        (
            b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\nnot json\n',
            "invalid_json",
            2,
        ),
        (jsonl([chat_line("a", "x"), chat_line("a", "y")]), "duplicate_custom_id", 2),
        (jsonl([chat_line("a", "x") | {"url": "/v1/completions"}]), "mismatched_url", 1),
        (jsonl([chat_line("a", "x") | {"method": "GET"}]), "invalid_method", 1),
        (jsonl([{"method": "POST", "url": C, "body": {}}]), "missing_custom_id", 1),
        (b"\n\n", "empty_file", None),
    ],
)
async def test_a_bad_input_file_fails_the_batch_naming_the_line(
    start_server: Any, content: bytes, code: str, line: int | None
) -> None:
    async with start_server() as server:
        with client_for(server) as oai:
            upload = await in_thread(lambda: oai.files.create(file=content, purpose="batch"))
            batch = await in_thread(
                lambda: oai.batches.create(
                    input_file_id=upload.id, endpoint=C, completion_window="24h"
                )
            )
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.errors is not None
    assert [(e.code, e.line) for e in batch.errors.data] == [(code, line)]


async def test_bad_requests_to_the_files_and_batch_apis(start_server: Any) -> None:
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        r = await client.post(
            "/v1/files", files={"file": ("a.jsonl", b"{}")}, data={"purpose": "fine-tune"}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"
        r = await client.post("/v1/files", data={"purpose": "batch"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "file"
        for path in (
            "/v1/files/file-nope",
            "/v1/files/file-nope/content",
            "/v1/batches/batch_nope",
        ):
            r = await client.get(path)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = await client.post(
            "/v1/batches",
            json={"input_file_id": "file-nope", "endpoint": C, "completion_window": "24h"},
        )
        assert r.status_code == 404 and r.json()["error"]["param"] == "input_file_id"
        uploaded = (
            await client.post(
                "/v1/files",
                files={"file": ("a.jsonl", jsonl([chat_line("a", "x")]))},
                data={"purpose": "batch"},
            )
        ).json()
        for field, value in (("endpoint", "/v1/responses"), ("completion_window", "1h")):
            body = {"input_file_id": uploaded["id"], "endpoint": C, "completion_window": "24h"} | {
                field: value
            }
            r = await client.post("/v1/batches", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == field
        r = await client.post("/v1/batches", json={"endpoint": C})
        assert r.status_code == 400
        r = await client.get("/v1/batches", params={"limit": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "limit"
        # A finished batch cannot be cancelled; a deleted file is gone.
        batch = (
            await client.post(
                "/v1/batches",
                json={"input_file_id": uploaded["id"], "endpoint": C, "completion_window": "24h"},
            )
        ).json()
        await batch_done(server)
        r = await client.post(f"/v1/batches/{batch['id']}/cancel")
        assert r.status_code == 409
        assert (await client.delete(f"/v1/files/{uploaded['id']}")).json()["deleted"] is True
        assert (await client.get(f"/v1/files/{uploaded['id']}")).status_code == 404
        listed = (await client.get("/v1/files")).json()["data"]
        assert [f["purpose"] for f in listed] == ["batch_output"]


async def test_a_cancel_aborts_the_lines_in_flight(
    start_server: Any, runner: ScriptedRunner
) -> None:
    runner.gated = True
    lines = [chat_line(f"line-{i}", f"question {i}", max_tokens=50) for i in range(10)]
    async with start_server(batch_concurrency=2, engine_config=WHOLE_STEPS) as server:
        with client_for(server) as oai:
            upload = await in_thread(lambda: oai.files.create(file=jsonl(lines), purpose="batch"))
            batch = await in_thread(
                lambda: oai.batches.create(
                    input_file_id=upload.id, endpoint=C, completion_window="24h"
                )
            )
            runner.allow(3)  # the two first lines are in the engine, mid-generation
            engine = server.state.engine
            await eventually(lambda: engine.stats().num_running_seqs == 2 and runner.steps == 3)
            cancelling = await in_thread(lambda: oai.batches.cancel(batch.id))
            assert cancelling.status == "cancelling"
            await batch_done(server)
            done = await in_thread(lambda: oai.batches.retrieve(batch.id))
            runner.open()  # the step in flight ends; the aborts are taken at its end
            with trio.fail_after(10):
                await engine.wait_idle()
            assert engine.stats().num_running_seqs == 0 and engine.stats().kv_blocks_used == 0
            assert runner.steps == 4  # no step after the one in flight
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert done.request_counts.completed == 0 and done.output_file_id is None


async def test_a_restart_resumes_a_batch_without_losing_or_repeating_a_line(
    start_server: Any, runner: ScriptedRunner, tmp_path: Any
) -> None:
    path = str(tmp_path / "batches.sqlite")
    lines = [chat_line(f"line-{i}", f"question {i}", max_tokens=3) for i in range(8)]
    answered: list[list[str]] = [[], []]

    three_done = trio.Event()
    runner.gated = True
    async with start_server(
        batch_store=path, batch_concurrency=1, engine_config=WHOLE_STEPS
    ) as server:
        record_finished_lines(server.batch_runner.store, answered[0], three_done, 3)
        with client_for(server) as oai:
            upload = await in_thread(lambda: oai.files.create(file=jsonl(lines), purpose="batch"))
            batch = await in_thread(
                lambda: oai.batches.create(
                    input_file_id=upload.id, endpoint=C, completion_window="24h"
                )
            )
        # Lines one at a time, four steps each (the prompt, then three tokens):
        # three lines and part of the fourth, then the server stops.
        runner.allow(14)
        with trio.fail_after(30):
            await three_done.wait()
    runner.open()
    async with start_server(batch_store=path) as server:
        record_finished_lines(server.batch_runner.store, answered[1])
        await batch_done(server)
        with client_for(server) as oai:
            done = await in_thread(lambda: oai.batches.retrieve(batch.id))
            output = await in_thread(lambda: results(oai, done.output_file_id))
    assert done.status == "completed" and done.request_counts.completed == 8
    assert answered[0] == ["line-0", "line-1", "line-2"]
    assert sorted(answered[0] + answered[1]) == sorted(output) == [f"line-{i}" for i in range(8)]


def test_a_line_may_hold_any_unicode_a_json_string_may():
    from sluiceway.api.batches.input_lines import read_lines

    line = chat_line("a", "one\u2028two\u0085three")
    content = (json.dumps(line, ensure_ascii=False) + "\r\n").encode()
    lines, problems = read_lines(content, C)
    assert problems == [] and len(lines) == 1
    assert json.loads(lines[0].body)["messages"][0]["content"] == "one\u2028two\u0085three"


async def test_a_line_has_no_request_timeout_and_a_queued_batch_cancels_at_once(
    start_server: Any, runner: ScriptedRunner
) -> None:
    runner.gated = True
    async with (
        start_server(request_timeout=0.5, engine_config=WHOLE_STEPS) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        with client_for(server) as oai:
            upload = await in_thread(
                lambda: oai.files.create(file=jsonl([chat_line("slow", "x")]), purpose="batch")
            )
            first = await in_thread(
                lambda: oai.batches.create(
                    input_file_id=upload.id, endpoint=C, completion_window="24h"
                )
            )
            second = await in_thread(
                lambda: oai.batches.create(
                    input_file_id=upload.id, endpoint=C, completion_window="24h"
                )
            )
            # The second waits behind the first: cancelling it ends it at once.
            cancelled = await in_thread(lambda: oai.batches.cancel(second.id))
            assert cancelled.status == "cancelled" and cancelled.request_counts.completed == 0
            # An interactive request times out meanwhile; the line, in the engine
            # as long, does not.
            r = await client.post(C, json=chat_line("x", "y")["body"])
            assert r.status_code == 504
            runner.open()
            await batch_done(server)
            done = await in_thread(lambda: oai.batches.retrieve(first.id))
            assert (await in_thread(lambda: oai.batches.retrieve(second.id))).status == "cancelled"
    assert done.status == "completed" and done.request_counts.completed == 1


async def test_a_drain_stops_the_lines_in_flight_and_leaves_them_pending(
    start_server: Any, runner: ScriptedRunner, tmp_path: Any
) -> None:
    runner.gated = True
    lines = [chat_line(f"line-{i}", f"question {i}") for i in range(4)]
    async with start_server(
        batch_store=str(tmp_path / "b.sqlite"), engine_config=WHOLE_STEPS
    ) as server:
        with client_for(server) as oai:
            upload = await in_thread(lambda: oai.files.create(file=jsonl(lines), purpose="batch"))
            batch = await in_thread(
                lambda: oai.batches.create(
                    input_file_id=upload.id, endpoint=C, completion_window="24h"
                )
            )
            engine = server.state.engine
            await eventually(lambda: engine.stats().num_running_seqs == 4)
            server.state.start_draining()
            with trio.fail_after(10):
                await server.state.wait_idle()  # at once, not after the grace period
            runner.open()
            await engine.wait_idle()
            stored = server.batch_runner.store.batch(batch.id, owner=None)
    assert stored.status == "in_progress" and stored.request_counts.completed == 0
    assert len(server.batch_runner.store.pending_lines(batch.id)) == 4
