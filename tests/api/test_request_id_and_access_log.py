"""`x-request-id` on every response, and the opt-in access log (`--access-log`)."""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from polling import eventually
from server_helpers import (
    RawStream,
    StreamResult,
    chat,
    completion,
    count_content,
    parse_event,
)
from sluiceway.api.observability.metrics import Metrics
from sluiceway.cli import build_parser
from sluiceway.config import EngineConfig, ServerConfig
from sluiceway.transport import access_log

from .fakes import ScriptedRunner

C = "/v1/chat/completions"
P = "/v1/completions"
ID = "x-request-id"


@pytest.fixture
def access_lines(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The access log records written during the test (caplog listens at the root)."""
    monkeypatch.setattr(access_log.logger, "propagate", True)
    caplog.set_level(logging.INFO, logger=access_log.logger.name)

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == access_log.logger.name]

    return lines


def _logfmt(line: str) -> dict[str, str]:
    """logfmt as a collector reads it (quoted values may hold spaces and escapes)."""
    fields = {}
    for part in shlex.split(line, posix=True):
        key, _, value = part.partition("=")
        fields[key] = value
    return fields


def _parse(style: str, line: str) -> dict[str, Any]:
    """Both styles, with values as JSON types (logfmt leaves out what has none)."""
    if style == "json":
        return json.loads(line)
    fields: dict[str, Any] = _logfmt(line)
    for key in ("status", "prompt_tokens", "completion_tokens"):
        if key in fields:
            fields[key] = int(fields[key])
    fields["duration_ms"] = float(fields["duration_ms"])
    return fields


async def _stream(client: httpx.AsyncClient, path: str, body: dict[str, Any], **kw: Any) -> Any:
    async with client.stream("POST", path, json=body | {"stream": True}, **kw) as response:
        result = StreamResult(response.status_code)
        async for line in response.aiter_lines():
            parse_event(line, result)
    return response, result


# --- the header -------------------------------------------------------------------


async def test_client_id_is_echoed_everywhere(client: httpx.AsyncClient) -> None:
    mine = {"X-Request-Id": "trace-42/abc:def"}
    responses = [
        await client.post(C, json=chat("hi", max_tokens=2), headers=mine),
        (await _stream(client, C, chat("hi", max_tokens=2), headers=mine))[0],
        await client.post(P, json=completion("hi", max_tokens=2), headers=mine),
        await client.get("/health", headers=mine),  # answered before quart
        await client.get("/health", headers=mine | {"Origin": "http://x"}),  # through quart
        await client.get("/v1/models", headers=mine),
        await client.get("/nowhere", headers=mine),
    ]
    assert [r.headers[ID] for r in responses] == ["trace-42/abc:def"] * len(responses)
    # The body keeps its own response id.
    assert responses[0].json()["id"].startswith("chatcmpl-")


@pytest.mark.parametrize(
    "sent", ["x" * 129, "has space", "tab\there", "", "caf\u00e9".encode().decode("latin1")]
)
async def test_unusable_client_id_is_replaced(client: httpx.AsyncClient, sent: str) -> None:
    headers = [("X-Request-Id", sent.encode("latin1"))]
    for r in (
        await client.post(C, json=chat("hi", max_tokens=2), headers=headers),
        await client.get("/health", headers=headers),
        await client.get("/v1/models", headers=headers),
    ):
        assert r.headers[ID] and r.headers[ID] != sent


async def test_longest_client_id_is_echoed(client: httpx.AsyncClient) -> None:
    sent = "".join(chr(c) for c in range(0x21, 0x7F))[:128].ljust(128, "~")
    r = await client.post(C, json=chat("hi", max_tokens=2), headers={"X-Request-Id": sent})
    assert r.headers[ID] == sent


async def test_generated_id_is_the_response_id(client: httpx.AsyncClient) -> None:
    r = await client.post(C, json=chat("hi", max_tokens=3, n=2))
    assert r.headers[ID] == r.json()["id"] and r.json()["id"].startswith("chatcmpl-")
    r = await client.post(P, json=completion(["a", "b"], max_tokens=3))
    assert r.headers[ID] == r.json()["id"] and r.json()["id"].startswith("cmpl-")
    for path, body, prefix in (
        (C, chat("hi", max_tokens=3, n=2), "chatcmpl-"),
        (P, completion(["a", "b"], max_tokens=3), "cmpl-"),
    ):
        response, result = await _stream(client, path, body)
        result.check_well_formed()
        assert {chunk["id"] for chunk in result.chunks} == {response.headers[ID]}
        assert response.headers[ID].startswith(prefix)


async def test_other_responses_get_fresh_ids(client: httpx.AsyncClient) -> None:
    ids = [(await client.get(path)).headers[ID] for path in ["/health", "/health", "/v1/models"]]
    assert len(set(ids)) == 3 and all(ids)


async def test_errors_carry_an_id(start_server: Any, runner: ScriptedRunner) -> None:
    runner.gated = True  # the first prompt of the 429 request holds its slots
    config = EngineConfig(max_num_seqs=1, max_waiting=2)
    async with (
        start_server(engine_config=config, api_keys=("k",), max_body_bytes=10_000) as server,
        httpx.AsyncClient(
            base_url=server.url, timeout=30, headers={"Authorization": "Bearer k"}
        ) as client,
    ):
        statuses = {}
        for expected, method, path, kw in [
            (400, "POST", C, {"json": {"model": "test-model", "messages": "nope"}}),
            (401, "POST", C, {"json": chat("hi"), "headers": {"Authorization": "Bearer bad"}}),
            (404, "POST", C, {"json": chat("hi") | {"model": "other"}}),
            (404, "GET", "/nowhere", {}),
            (405, "GET", C, {}),
            (413, "POST", C, {"content": b"x" * 20_000}),
            (429, "POST", P, {"json": completion(["a", "b"], n=2, max_tokens=2)}),
        ]:
            r = await client.request(method, path, **kw)
            assert r.status_code == expected, r.text
            statuses[r.headers[ID]] = expected
        assert len(statuses) == 7  # each its own id
        server.state.draining = True  # refuse new work, as after SIGTERM
        r = await client.post(C, json=chat("hi"), headers={"X-Request-Id": "late"})
        assert (r.status_code, r.headers[ID]) == (503, "late")
        r = await client.get("/health")
        assert r.status_code == 503 and r.headers[ID]


async def test_unexpected_error_logs_the_id(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Metrics) -> bytes:
        raise RuntimeError("scripted failure")

    monkeypatch.setattr(Metrics, "render", broken)
    r = await client.get("/metrics", headers={"X-Request-Id": "find-me"})
    assert r.status_code == 500 and r.headers[ID] == "find-me"
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "request_id=find-me" in record.getMessage()


# --- the access log ---------------------------------------------------------------


@pytest.mark.parametrize("style", ["logfmt", "json"])
async def test_access_log_lines(start_server: Any, access_lines: Any, style: str) -> None:
    async with (
        start_server(access_log=style) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        plain = await client.post(C, json=chat("hi", max_tokens=3, n=2))
        streamed, result = await _stream(
            client,
            P,
            completion(["a", "b c"], max_tokens=4, stream_options={"include_usage": True}),
            headers={"X-Request-Id": "stream one"},  # a space: not usable, replaced
        )
        health = await client.get("/health", headers={"X-Request-Id": "probe"})
        missing = await client.get("/nowhere?secret=1")
        bad = await client.post(C, json={"messages": []})
        await trio.testing.wait_all_tasks_blocked()
    assert health.headers[ID] == "probe"
    assert streamed.headers[ID].startswith("cmpl-")
    lines = access_lines()
    assert len(lines) == 5, lines
    if style == "json":
        assert all(set(json.loads(line)) == set(json.loads(lines[0])) for line in lines)
    fields = [_parse(style, line) for line in lines]
    by_id = {f["request_id"]: f for f in fields}
    assert set(by_id) == {
        plain.headers[ID],
        streamed.headers[ID],
        "probe",
        missing.headers[ID],
        bad.headers[ID],
    }
    usage = plain.json()["usage"]
    assert by_id[plain.headers[ID]] | {"time": "", "duration_ms": 0, "client": ""} == {
        "time": "",
        "request_id": plain.json()["id"],
        "method": "POST",
        "path": C,
        "status": 200,
        "duration_ms": 0,
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": 6,
        "finish": "done",
        "client": "",
    }
    line = by_id[streamed.headers[ID]]
    stream_usage = result.usage()
    assert (line["path"], line["status"], line["finish"]) == (P, 200, "done")
    assert line["prompt_tokens"] == stream_usage["prompt_tokens"]
    assert line["completion_tokens"] == stream_usage["completion_tokens"] == 8
    line = by_id["probe"]
    assert (line["method"], line["path"], line["status"]) == ("GET", "/health", 200)
    line = by_id[missing.headers[ID]]
    assert (line["path"], line["status"]) == ("/nowhere", 404)
    line = by_id[bad.headers[ID]]
    assert (line["path"], line["status"]) == (C, 400)
    for f in fields:
        assert f["duration_ms"] >= 0
        assert f["client"].startswith("127.0.0.1:")
        assert f["time"].endswith("Z") and "T" in f["time"]
        if f is not by_id[plain.headers[ID]] and f is not by_id[streamed.headers[ID]]:
            # Nothing was generated: no token counts (null in JSON, absent in logfmt).
            assert f.get("prompt_tokens") is None and f.get("completion_tokens") is None


@pytest.mark.parametrize("style", ["logfmt", "json"])
async def test_abandoned_stream_is_logged_at_its_end(
    start_server: Any, runner: ScriptedRunner, access_lines: Any, style: str
) -> None:
    runner.gated = True
    async with start_server(access_log=style) as server:
        with trio.fail_after(20):
            raw = await RawStream.post(server.url, C, chat("a", max_tokens=1000, stream=True))
            runner.allow(3)
            await raw.read_until(lambda buf: count_content(buf) >= 2)
            assert access_lines() == []  # still streaming
            await raw.aclose()
            await eventually(lambda: len(access_lines()) == 1)
            runner.open()
            await server.state.engine.wait_idle()
    [line] = access_lines()
    fields = _parse(style, line)
    head = raw.buffer.partition(b"\r\n\r\n")[0].decode().lower()
    assert f"{ID}: {fields['request_id']}" in head
    assert fields["request_id"].startswith("chatcmpl-")
    assert (fields["status"], fields["finish"]) == (200, "abort")
    assert fields["prompt_tokens"] > 0
    assert 2 <= fields["completion_tokens"] < 1000


async def test_client_gone_before_the_response_is_499(
    start_server: Any, runner: ScriptedRunner, access_lines: Any
) -> None:
    runner.gated = True  # a non-streaming request that never gets its answer
    async with start_server(access_log="logfmt") as server:
        with trio.fail_after(20):
            raw = await RawStream.post(server.url, C, chat("a", max_tokens=5))
            await eventually(lambda: server.state.active == 1)
            await raw.aclose()
            await eventually(lambda: len(access_lines()) == 1)
    fields = _logfmt(access_lines()[0])
    assert (fields["status"], fields["finish"]) == ("499", "abort")
    assert fields["request_id"].startswith("chatcmpl-")


async def test_nothing_logged_when_off(client: httpx.AsyncClient, access_lines: Any) -> None:
    await client.post(C, json=chat("hi", max_tokens=2))
    await _stream(client, C, chat("hi", max_tokens=2))
    await client.get("/health")
    await client.get("/nowhere")
    await trio.testing.wait_all_tasks_blocked()
    assert access_lines() == []


# --- pieces -----------------------------------------------------------------------


def test_logfmt_quotes_what_needs_it() -> None:
    line = access_log.format_line(
        "logfmt",
        {"a": "plain", "b": "two words", "c": 'q"uote', "d": "", "e": None, "f": 1.5, "g": "x=y"},
    )
    assert line == 'a=plain b="two words" c="q\\"uote" d="" f=1.5 g="x=y"'
    assert _logfmt(line) == {
        "a": "plain",
        "b": "two words",
        "c": 'q"uote',
        "d": "",
        "f": "1.5",
        "g": "x=y",
    }


def test_client_request_id_bounds() -> None:
    def of(value: bytes) -> str | None:
        return access_log.client_request_id([(b"host", b"h"), (b"x-request-id", value)])

    assert of(b"abc-123") == "abc-123"
    assert of(b"!" * 128) == "!" * 128
    assert of(b"!" * 129) is None
    assert of(b"") is None
    assert of(b"a b") is None
    assert of(b"caf\xc3\xa9") is None
    assert access_log.client_request_id([(b"host", b"h")]) is None


def test_access_log_flag() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve"]).access_log is None
    assert parser.parse_args(["serve", "--access-log"]).access_log == "logfmt"
    assert parser.parse_args(["serve", "--access-log", "json"]).access_log == "json"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--access-log", "xml"])
    with pytest.raises(ValueError):
        ServerConfig(access_log="xml")  # type: ignore[arg-type]


@pytest.fixture
def restored_access_logger() -> Iterator[logging.Logger]:
    logger = access_log.logger
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        yield logger
    finally:
        logger.handlers[:] = saved[0]
        logger.setLevel(saved[1])
        logger.propagate = saved[2]


def test_install_handler_writes_bare_lines(restored_access_logger: logging.Logger) -> None:
    logger = restored_access_logger
    logger.handlers.clear()
    access_log.install_handler()
    access_log.install_handler()  # once only
    [handler] = logger.handlers
    assert not logger.propagate and logger.isEnabledFor(logging.INFO)
    record = logging.LogRecord(logger.name, logging.INFO, __file__, 1, "a=1 b=2", None, None)
    assert handler.format(record) == "a=1 b=2"
