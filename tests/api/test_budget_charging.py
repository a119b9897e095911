"""A key's token budget pays for what each request used: before it runs, what it
may cost (its prompts, and `max_tokens` or the rest of the context for each
choice); when it ends, done or cut short, what it did cost. Batch lines are paid
by the key that created the batch, and wait for its budget, also in a process
that resumes the batch (the store records a salted hash of the key, never the
key). An estimate above a minute's budget is refused at once.

The clock is a `MockClock` that stands still unless a test moves it, so a budget
holds exactly what was charged: nothing refills behind a test's back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest
import trio
import trio.testing

from server_helpers import CHAT, COMPLETIONS, RawStream, chat, count_content
from sluiceway.api.batches.store import BatchStore
from sluiceway.api.keys.rate_limits import RateLimits, hold_tokens, load_key_budgets
from sluiceway.config import EngineConfig, KeyBudget

from .conftest import MODEL, in_thread, record_finished_lines
from .fakes import PoolingRunner, ScriptedRunner

KEY = "budgeted"
LIMIT = 3000  # tokens a minute: more than one request's whole context (2048)
CONTEXT = 2048  # the test servers' max_model_len
# No burst window: it waits on the clock, which stands still here.
STILL = EngineConfig(burst_window=0)


def budgets(tokens: int = LIMIT, requests: int | None = None) -> dict[str, KeyBudget]:
    return {KEY: KeyBudget(requests_per_minute=requests, tokens_per_minute=tokens)}


def remaining(server: Any, kind: str = "tokens") -> int:
    return int(dict(server.state.rate_limits.headers(KEY))[f"x-ratelimit-remaining-{kind}"])


@asynccontextmanager
async def client_of(server: Any, key: str = KEY) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=headers) as client:
        yield client


async def test_a_charge_settles_once_to_what_was_used(autojump_clock: Any) -> None:
    limits = RateLimits({KEY: KeyBudget(tokens_per_minute=600)})
    charge = await hold_tokens(limits, KEY, 500, model=MODEL)
    assert dict(limits.headers(KEY))["x-ratelimit-remaining-tokens"] == "100"
    charge.settle(120)
    charge.settle(0)  # a second way out of the same request changes nothing
    assert dict(limits.headers(KEY))["x-ratelimit-remaining-tokens"] == "480"
    # What is given back never fills a budget beyond a minute's worth.
    await trio.sleep(60)
    charge = await hold_tokens(limits, KEY, 500, model=MODEL)
    await trio.sleep(60)
    charge.settle(0)
    assert dict(limits.headers(KEY))["x-ratelimit-remaining-tokens"] == "600"


async def test_a_streamed_chat_without_max_tokens_pays_for_what_it_generated(
    start_server: Any, runner: ScriptedRunner, mock_clock: Any
) -> None:
    runner.eos_after = 40
    body = chat("hi", stream=True, stream_options={"include_usage": True})
    async with (
        start_server(api_key_budgets=budgets(), engine_config=STILL) as server,
        client_of(server) as client,
    ):
        async with client.stream("POST", CHAT, json=body) as response:
            assert response.status_code == 200
            held = int(response.headers["x-ratelimit-remaining-tokens"])
            lines = [line async for line in response.aiter_lines()]
        await server.state.wait_idle()
        left = remaining(server)
    chunks = [json.loads(each[6:]) for each in lines if each.startswith("data: {")]
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] > 40
    # While it ran, it held the whole context (the prompt and what may follow it).
    assert held == LIMIT - CONTEXT
    assert left == LIMIT - usage["total_tokens"]


@pytest.mark.parametrize("n", [1, 3])
async def test_a_chat_pays_for_what_its_choices_generated_and_its_headers_say_so(
    start_server: Any, runner: ScriptedRunner, mock_clock: Any, n: int
) -> None:
    runner.eos_after = 3  # well before max_tokens
    async with (
        start_server(api_key_budgets=budgets(), engine_config=STILL) as server,
        client_of(server) as client,
    ):
        response = await client.post(CHAT, json=chat("hi", max_tokens=50, n=n))
        left = remaining(server)
    assert response.status_code == 200
    usage = response.json()["usage"]
    assert usage["completion_tokens"] < 50 * n
    assert left == LIMIT - usage["total_tokens"]
    assert response.headers["x-ratelimit-remaining-tokens"] == str(left)


async def test_a_stream_whose_client_hangs_up_pays_for_the_tokens_it_got(
    start_server: Any, runner: ScriptedRunner, mock_clock: Any
) -> None:
    async with start_server(
        api_keys=("free",), api_key_budgets=budgets(), engine_config=STILL
    ) as server:
        async with client_of(server, "free") as free:
            probe = await free.post(CHAT, json=chat("hi", max_tokens=1))
        prompt_tokens = probe.json()["usage"]["prompt_tokens"]
        runner.gated = True
        request = RawStream.request_bytes(server.url, CHAT, chat("hi", stream=True))
        request = request.replace(
            b"\r\n\r\n", f"\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode(), 1
        )
        raw = await RawStream.connect(server.url)
        await raw.sock.send_all(request)
        runner.allow(3)  # the prompt's step and two more: three tokens, then none
        await raw.read_until(lambda buffer: count_content(buffer) == 3)
        await raw.aclose()
        await server.state.wait_idle()
        left = remaining(server)
    assert left == LIMIT - (prompt_tokens + 3)


async def test_a_request_above_the_minutes_budget_is_refused_at_once(
    start_server: Any, runner: ScriptedRunner, word_ids: tuple[int, ...], mock_clock: Any
) -> None:
    prompt = (list(word_ids) * 4)[:35]
    async with (
        start_server(api_key_budgets=budgets(tokens=300), engine_config=STILL) as server,
        client_of(server) as client,
    ):
        refused = await client.post(
            COMPLETIONS, json={"model": MODEL, "prompt": prompt, "max_tokens": 800}
        )
        # Without max_tokens a request may take the rest of the context.
        without_max = await client.post(CHAT, json=chat("hi"))
        many = await client.post(CHAT, json=chat("hi", n=16))
        left = remaining(server)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    assert "Request too large for test-model" in error["message"]
    assert "Limit 300, Requested 835" in error["message"]
    assert "Retry-After" not in refused.headers  # waiting would not help
    assert refused.headers["x-ratelimit-remaining-tokens"] == "300"
    for response in (without_max, many):
        assert response.status_code == 429
        assert response.json()["error"]["type"] == "tokens"
    assert f"Requested {CONTEXT}" in without_max.json()["error"]["message"]
    assert left == 300 and runner.steps == 0


async def test_a_response_pays_for_what_it_generated_in_the_foreground_and_background(
    start_server: Any, runner: ScriptedRunner, mock_clock: Any
) -> None:
    runner.eos_after = 3
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 50}
    async with (
        start_server(api_key_budgets=budgets(), engine_config=STILL) as server,
        client_of(server) as client,
    ):
        now = await client.post("/v1/responses", json=body)
        after_now = remaining(server)
        queued = await client.post("/v1/responses", json=body | {"background": True})
        running = server.state.background_runs.get(queued.json()["id"])
        if running is not None:
            await running.done.wait()
        later = await client.get(f"/v1/responses/{queued.json()['id']}")
        after_later = remaining(server)
    assert now.status_code == 200 and later.json()["status"] == "completed"
    assert now.json()["usage"]["output_tokens"] < 50
    assert after_now == LIMIT - now.json()["usage"]["total_tokens"]
    assert now.headers["x-ratelimit-remaining-tokens"] == str(after_now)
    assert after_later == after_now - later.json()["usage"]["total_tokens"]


async def test_embeddings_pay_for_their_inputs(
    serve_runner: Any, tokenizer: Any, mock_clock: Any
) -> None:
    runner = PoolingRunner(vocab=(5, 6), eos=tokenizer.eos_token_id)
    body = {"model": MODEL, "input": ["one", "two words"]}
    async with (
        serve_runner(runner, api_key_budgets=budgets(), engine_config=STILL) as server,
        client_of(server) as client,
    ):
        response = await client.post("/v1/embeddings", json=body)
        left = remaining(server)
    assert left == LIMIT - response.json()["usage"]["total_tokens"]
    assert response.headers["x-ratelimit-remaining-tokens"] == str(left)


def line(custom_id: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(each) + "\n" for each in lines).encode()


def openai_client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=30)


async def run_batch(server: Any, url: Any, lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Each line's response by custom_id, once the batch has run, made by `KEY`."""
    with openai_client(server) as oai:
        upload = await in_thread(lambda: oai.files.create(file=jsonl(lines), purpose="batch"))
        batch = await in_thread(
            lambda: oai.batches.create(
                input_file_id=upload.id, endpoint=url, completion_window="24h"
            )
        )
        await server.batch_runner.idle.wait()
        return await in_thread(lambda: batch_results(oai, batch.id))


def batch_results(oai: openai.OpenAI, batch_id: str) -> dict[str, Any]:
    done = oai.batches.retrieve(batch_id)
    rows = []
    for file_id in (done.output_file_id, done.error_file_id):
        if file_id is not None:
            rows += [json.loads(row) for row in oai.files.content(file_id).text.splitlines()]
    return {row["custom_id"]: row["response"] for row in rows}


async def test_batch_lines_are_paid_by_the_key_that_created_the_batch(
    start_server: Any, runner: ScriptedRunner, mock_clock: Any
) -> None:
    runner.eos_after = 3
    lines = [line(str(i), CHAT, chat(f"question {i}", max_tokens=20)) for i in range(2)]
    async with start_server(api_key_budgets=budgets(requests=10), engine_config=STILL) as server:
        answers = await run_batch(server, CHAT, lines)
        tokens_left, requests_left = remaining(server), remaining(server, "requests")
    assert [answers[str(i)]["status_code"] for i in range(2)] == [200, 200]
    used = sum(answers[str(i)]["body"]["usage"]["total_tokens"] for i in range(2))
    assert tokens_left == LIMIT - used
    # The upload, the batch and each of its lines is one request of the key's.
    assert requests_left == 10 - 4


async def test_embedding_lines_are_paid_by_the_key_that_created_the_batch(
    serve_runner: Any, tokenizer: Any, mock_clock: Any
) -> None:
    runner = PoolingRunner(vocab=(5, 6), eos=tokenizer.eos_token_id)
    body = {"model": MODEL, "input": ["one", "two words"]}
    async with serve_runner(runner, api_key_budgets=budgets(), engine_config=STILL) as server:
        answers = await run_batch(server, "/v1/embeddings", [line("a", "/v1/embeddings", body)])
        left = remaining(server)
    assert left == LIMIT - answers["a"]["body"]["usage"]["total_tokens"]


async def test_a_batch_line_waits_for_its_keys_budget_and_one_too_large_fails(
    start_server: Any,
    runner: ScriptedRunner,
    word_ids: tuple[int, ...],
    mock_clock: trio.testing.MockClock,
) -> None:
    prompt = [*word_ids, word_ids[0]]  # 10 tokens
    lines = [
        line("too-large", COMPLETIONS, {"model": MODEL, "prompt": prompt, "max_tokens": 500}),
        *(
            line(name, COMPLETIONS, {"model": MODEL, "prompt": prompt, "max_tokens": 90})
            for name in ("a", "b", "c")
        ),
    ]
    finished: list[str] = []
    third_done = trio.Event()
    async with start_server(
        api_key_budgets=budgets(tokens=200), engine_config=STILL, batch_concurrency=1
    ) as server:
        store: BatchStore = server.batch_runner.store
        finish = store.finish_line

        def finish_line(batch_id: str, number: int, status: Any, result: str) -> None:
            finished.append(json.loads(result)["custom_id"])
            finish(batch_id, number, status, result)
            if len(finished) == 3:
                third_done.set()

        store.finish_line = finish_line  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            results: dict[str, Any] = {}

            async def run() -> None:
                results.update(await run_batch(server, COMPLETIONS, lines))

            nursery.start_soon(run)
            await third_done.wait()
            # a and b (100 tokens each) spent the minute's 200; c waits for the
            # refill, the time standing still, rather than failing.
            await trio.testing.wait_all_tasks_blocked()
            assert finished == ["too-large", "a", "b"] and remaining(server) == 0
            assert not server.batch_runner.idle.is_set()
            mock_clock.jump(30)  # 100 tokens come back
    assert finished == ["too-large", "a", "b", "c"]
    assert [results[name]["status_code"] for name in ("a", "b", "c")] == [200, 200, 200]
    assert results["too-large"]["status_code"] == 429
    assert results["too-large"]["body"]["error"]["type"] == "tokens"
    assert "Limit 200, Requested 510" in results["too-large"]["body"]["error"]["message"]


async def test_a_batch_resumed_by_a_restart_is_paid_by_the_key_that_created_it(
    start_server: Any, runner: ScriptedRunner, mock_clock: Any, tmp_path: Any
) -> None:
    store = str(tmp_path / "batches.sqlite")
    budgets_file = tmp_path / "keys.json"
    budgets_file.write_text(
        json.dumps({"keys": {KEY: {"requests_per_minute": 10, "tokens_per_minute": LIMIT}}})
    )
    lines = [line(f"line-{i}", CHAT, chat(f"question {i}", max_tokens=3)) for i in range(6)]
    answered: list[list[str]] = [[], []]
    two_done = trio.Event()

    # Lines one at a time, four steps each (the prompt, then three tokens): two
    # lines and part of the third, then the server stops.
    whole_steps = EngineConfig(burst_window=0, background_step_tokens=1024)
    config = {"batch_store": store, "batch_concurrency": 1, "engine_config": whole_steps}
    runner.gated = True
    async with start_server(api_key_budgets=load_key_budgets(budgets_file), **config) as server:
        record_finished_lines(server.batch_runner.store, answered[0], two_done, 2)
        with openai_client(server) as oai:
            upload = await in_thread(lambda: oai.files.create(file=jsonl(lines), purpose="batch"))
            batch = await in_thread(
                lambda: oai.batches.create(
                    input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
                )
            )
        runner.allow(10)
        await two_done.wait()
    runner.open()
    async with start_server(api_key_budgets=load_key_budgets(budgets_file), **config) as server:
        record_finished_lines(server.batch_runner.store, answered[1])
        await server.batch_runner.idle.wait()
        tokens_left, requests_left = remaining(server), remaining(server, "requests")
        with openai_client(server) as oai:
            answers = await in_thread(lambda: batch_results(oai, batch.id))
    assert answered[0] == ["line-0", "line-1"] and len(answered[1]) == 4
    assert sorted(answers) == [f"line-{i}" for i in range(6)]
    # The new process's budget paid for each line it ran, as the first one's did.
    used = sum(answers[name]["body"]["usage"]["total_tokens"] for name in answered[1])
    assert tokens_left == LIMIT - used
    assert requests_left == 10 - 4


async def test_a_resumed_batch_whose_key_has_no_budget_now_runs_unbudgeted_and_says_so(
    start_server: Any,
    runner: ScriptedRunner,
    mock_clock: Any,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = {"batch_store": str(tmp_path / "batches.sqlite"), "engine_config": STILL}
    lines = [line(f"line-{i}", CHAT, chat(f"question {i}", max_tokens=3)) for i in range(3)]
    runner.gated = True  # no line ends in the first process
    async with start_server(api_key_budgets=budgets(), **config) as server:
        with openai_client(server) as oai:
            upload = await in_thread(lambda: oai.files.create(file=jsonl(lines), purpose="batch"))
            batch = await in_thread(
                lambda: oai.batches.create(
                    input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
                )
            )
    runner.open()
    others = {"other": KeyBudget(tokens_per_minute=LIMIT)}
    async with start_server(api_key_budgets=others, **config) as server:
        await server.batch_runner.idle.wait()
        done = server.batch_runner.store.batch(batch.id, owner=None)
        left = dict(server.state.rate_limits.headers("other"))["x-ratelimit-remaining-tokens"]
    assert done.status == "completed" and done.request_counts.completed == 3
    assert left == str(LIMIT)
    said = [r.getMessage() for r in caplog.records if "unbudgeted" in r.getMessage()]
    assert said == [
        f"batch {batch.id}: the key that created it has no budget in --api-key-budgets"
        " now; its lines run unbudgeted"
    ]


def test_the_batch_store_records_a_salted_hash_of_the_paying_key_never_the_key(
    tmp_path: Any,
) -> None:
    from sluiceway.api.keys.owners import Owner
    from sluiceway.protocol.batches import Batch

    key = "secret-payer-123"
    path = tmp_path / "b.db"
    batch = Batch(
        id="batch_1",
        endpoint=CHAT,
        input_file_id="file-1",
        completion_window="24h",
        status="validating",
        created_at=1,
    )
    store = BatchStore(path)
    # A project owns the batch: the key cannot be recovered from the owner.
    store.add_batch(batch, [], owner=Owner("project:team-a"), payer=key)
    recorded = store.batch_payer("batch_1")
    store.close()
    assert key.encode() not in path.read_bytes()
    for suffix in ("-wal", "-shm"):
        wal = path.with_name(path.name + suffix)
        assert not wal.exists() or key.encode() not in wal.read_bytes()
    store = BatchStore(path)  # the salt is the store's: a reopen hashes the key as before
    other = BatchStore(tmp_path / "other.db")
    try:
        assert recorded is not None and recorded == store.hash_payer(key)
        assert store.hash_payer("another-key") != recorded
        assert other.hash_payer(key) != recorded
    finally:
        store.close()
        other.close()
