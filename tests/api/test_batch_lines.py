"""Batch input lines are read as request bodies are: the same decoder, the same
limits (nesting, size, numbers, surrogates, UTF-8), and each line's body runs as
the bytes it holds. So any body gets the same verdict as an HTTP request and as
a batch line, and a line that is not JSON fails the batch at validation, naming
the line, never a 500 and never a late failure at an offset of bytes the user
did not write."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluiceway import protocol
from sluiceway.api.batches.input_lines import read_lines
from sluiceway.api.http.errors import APIError
from sluiceway.api.http.wire import MAX_JSON_DEPTH, decode

from .conftest import MODEL

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def line_of(body: bytes, custom_id: bytes = b'"a"', url: str = CHAT) -> bytes:
    """A batch line around `body`, its bytes as given."""
    return b'{"custom_id":%s,"method":"POST","url":"%s","body":%s}\n' % (
        custom_id,
        url.encode(),
        body,
    )


def chat_body(content: bytes = b'"hi"', extra: bytes = b"") -> bytes:
    return b'{"model":"%s","messages":[{"role":"user","content":%s}],"max_tokens":2%s}' % (
        MODEL.encode(),
        content,
        extra,
    )


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def upload(client: httpx.AsyncClient, content: bytes) -> str:
    r = await client.post(
        "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
    )
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


async def create_batch(client: httpx.AsyncClient, content: bytes, url: str = CHAT) -> Any:
    file_id = await upload(client, content)
    r = await client.post(
        "/v1/batches", json={"input_file_id": file_id, "endpoint": url, "completion_window": "24h"}
    )
    assert r.status_code == 200, r.text
    return r.json()


def errors_of(batch: dict[str, Any]) -> list[tuple[str, int | None]]:
    assert batch["status"] == "failed", batch
    return [(e["code"], e["line"]) for e in batch["errors"]["data"]]


# --- the three 500s, and the late failures -------------------------------------------


async def test_a_lone_surrogate_custom_id_fails_the_line_not_the_server(
    start_server: Any,
) -> None:
    content = line_of(chat_body(), b'"ok"') + line_of(chat_body(), b'"\\ud800"')
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        batch = await create_batch(client, content)
    assert errors_of(batch) == [("invalid_json", 2)]
    assert "surrogate" in batch["errors"]["data"][0]["message"]


async def test_a_line_nested_thousands_deep_fails_the_line_not_the_server(
    start_server: Any,
) -> None:
    deep = chat_body(extra=b',"x":' + nested(5000))
    deep_id = line_of(chat_body(), custom_id=nested(5000))
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        body_deep = await create_batch(client, line_of(chat_body(), b'"ok"') + line_of(deep))
        line_deep = await create_batch(client, deep_id)
    assert errors_of(body_deep) == [("invalid_json", 2)]
    assert errors_of(line_deep) == [("invalid_json", 1)]
    assert "nested deeper than 512" in body_deep["errors"]["data"][0]["message"]


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        (chat_body(extra=b',"temperature":NaN'), b"NaN"),
        (chat_body(extra=b',"x":Infinity'), b"Infinity"),
        (chat_body(content=b'"\\ud800"'), b"\\ud800"),
        (chat_body(content=b'"\\udfff and more"'), b"\\udfff"),
    ],
    ids=["NaN", "Infinity", "high surrogate", "low surrogate"],
)
async def test_a_body_that_is_not_json_fails_at_validation_naming_the_line(
    start_server: Any, bad: bytes, where: bytes
) -> None:
    content = line_of(chat_body(), b'"ok"') + line_of(bad, b'"bad"')
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        batch = await create_batch(client, content)
        as_request = await client.post(CHAT, content=bad)
    assert errors_of(batch) == [("invalid_json", 2)]
    # An offset, where msgspec gives one, is into the line the user wrote.
    message = batch["errors"]["data"][0]["message"]
    offset = message.rpartition("(byte ")[2].rstrip(").")
    if offset.isdigit():
        start = line_of(bad, b'"bad"').index(where)
        assert start <= int(offset) <= start + len(where)
    assert as_request.status_code == 400
    assert as_request.json()["error"]["message"].startswith("The request body is not valid JSON")


async def test_a_line_runs_its_body_as_the_bytes_it_holds(start_server: Any) -> None:
    # Read and written again by Python's json, 1e400 became Infinity: a late "not
    # valid JSON" at an offset into that copy, where the request says which field.
    body = chat_body(extra=b',"temperature":1e400')
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        batch = await create_batch(client, line_of(body))
        await batch_done(server)
        done = (await client.get(f"/v1/batches/{batch['id']}")).json()
        failed = (await client.get(f"/v1/files/{done['error_file_id']}/content")).text
        as_request = await client.post(CHAT, content=body)
    answer = json.loads(failed)["response"]
    assert as_request.status_code == answer["status_code"] == 400
    assert answer["body"] == as_request.json()
    assert answer["body"]["error"]["param"] == "temperature"


# --- read_lines on its own ----------------------------------------------------------------


def test_nesting_is_bounded_alike_for_a_request_and_a_line() -> None:
    def as_request(depth: int) -> bool:
        try:
            decode(chat_body(extra=b',"x":' + nested(depth)), protocol.ChatCompletionRequest)
        except APIError:
            return False
        return True

    def as_line(depth: int) -> bool:
        _, problems = read_lines(line_of(chat_body(extra=b',"x":' + nested(depth))), CHAT)
        return not problems

    # The body object is one level, "x"'s arrays the rest.
    assert as_request(MAX_JSON_DEPTH - 1) and as_line(MAX_JSON_DEPTH - 1)
    assert not as_request(MAX_JSON_DEPTH) and not as_line(MAX_JSON_DEPTH)


def test_a_line_that_is_not_utf8_is_named_with_its_line() -> None:
    content = line_of(chat_body(), b'"ok"') + line_of(chat_body(extra=b',"x":"\xff"'), b'"b"')
    _, problems = read_lines(content, CHAT)
    assert [(p.code, p.line) for p in problems] == [("invalid_json", 2)]
    assert "UTF-8" in problems[0].message


def test_a_line_body_over_the_body_limit_is_refused() -> None:
    body = chat_body(content=b'"' + b"x" * 200 + b'"')
    _, problems = read_lines(line_of(body), CHAT, max_body_bytes=100)
    assert [(p.code, p.line, p.param) for p in problems] == [("request_too_large", 1, "body")]
    assert read_lines(line_of(body), CHAT, max_body_bytes=len(body))[1] == []


def test_a_custom_id_out_of_range_is_a_custom_id_error() -> None:
    _, problems = read_lines(line_of(chat_body(), custom_id=b"1e400"), CHAT)
    assert [(p.code, p.param) for p in problems] == [("missing_custom_id", "custom_id")]


def test_broken_json_after_a_refused_value_is_reported_as_broken_json() -> None:
    # msgspec stops at the first refused value; the verdict must not depend on
    # whether the broken part comes before or after it.
    for body in (
        b'{"model":5,"messages":[],"x":NaN}',
        b'{"x":NaN,"model":5,"messages":[]}',
        # A number out of range is JSON: the check goes on past it.
        b'{"messages":[{"role":"user","content":1e400}],"x":NaN}',
    ):
        with pytest.raises(APIError) as err:
            decode(body, protocol.ChatCompletionRequest)
        assert err.value.message.startswith("The request body is not valid JSON")


# --- the property: one verdict for the same bytes on both routes ------------------------

VALUES = st.one_of(
    st.sampled_from(
        [
            b"NaN",
            b"Infinity",
            b"-Infinity",
            b"1e400",
            b"-1e400",
            b"1e-400",
            b"123456789012345678901234567890",
            b'"\\ud800"',
            b'"\\udc00x"',
            b'"\\ud800\\u0041"',
            b'"\\ud83d\\ude00"',
            b'"a\\u0000b"',
            b'"\xff"',
            b'"\xed\xa0\x80"',
            b'"\xe2\x80\xa8 \xc2\x85"',
            b"[1,]",
            b'{"a":1,}',
            b'{"a":1,"a":[2]}',
            b"01",
            b"tru",
            b'"\t"',
            b"2",
            b"2.0",
            b"-1",
            b"null",
            b'"x"',
            b"[]",
            b"{}",
        ]
    ),
    st.sampled_from([1, 10, 508, 509, 510, 511, 512, 600, 1000, 3000]).map(nested),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
        max_leaves=6,
    ).map(lambda v: json.dumps(v).encode()),
)
# Where a value goes: the prompt or message text, an integer field (already in the
# body: a duplicate key), a float field, a mapping, or a field the request type
# does not know (msgspec skips it).
PLACES = st.sampled_from(["text", "max_tokens", "temperature", "metadata", "x"])


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    endpoint = draw(st.sampled_from([CHAT, COMPLETIONS]))
    text = b'"hi"'
    fields = [(b"model", b'"%s"' % MODEL.encode()), (b"max_tokens", b"2")]
    for place, value in draw(st.lists(st.tuples(PLACES, VALUES), min_size=1, max_size=2)):
        if place == "text":
            text = value
        else:
            fields.append((place.encode(), value))
    if endpoint == CHAT:
        fields.append((b"messages", b'[{"role":"user","content":%s}]' % text))
    else:
        fields.append((b"prompt", text))
    ordered = draw(st.permutations(fields))
    return endpoint, b"{" + b",".join(b'"%s":%s' % kv for kv in ordered) + b"}"


def verdict_of_request(r: httpx.Response) -> tuple[Any, ...]:
    if r.status_code == 200:
        return ("accepted",)
    error = r.json()["error"]
    if r.status_code == 400 and error["message"].startswith("The request body is not valid JSON"):
        return ("not json",)
    return ("refused", r.status_code, error)


async def batch_done(server: Any) -> None:
    with trio.fail_after(30):
        await server.batch_runner.idle.wait()


async def test_a_body_gets_one_verdict_as_a_request_and_as_a_batch_line(
    start_server: Any,
) -> None:
    async with start_server() as server:

        def verdict_of_line(client: httpx.Client, endpoint: str, body: bytes) -> tuple[Any, ...]:
            content = line_of(body, url=endpoint)
            files = {"file": ("in.jsonl", content)}
            r = client.post("/v1/files", files=files, data={"purpose": "batch"})
            assert r.status_code == 200, r.text
            spec = {"input_file_id": r.json()["id"], "endpoint": endpoint}
            r = client.post("/v1/batches", json=spec | {"completion_window": "24h"})
            assert r.status_code == 200, r.text
            batch = r.json()
            if batch["status"] == "failed":
                assert errors_of(batch) == [("invalid_json", 1)]
                return ("not json",)
            trio.from_thread.run(batch_done, server)
            done = client.get(f"/v1/batches/{batch['id']}").json()
            result_file = done["output_file_id"] or done["error_file_id"]
            result = json.loads(client.get(f"/v1/files/{result_file}/content").text)
            response = result["response"]
            if response["status_code"] == 200:
                return ("accepted",)
            return ("refused", response["status_code"], response["body"]["error"])

        def check_every_example() -> None:
            with httpx.Client(base_url=server.url, timeout=30) as client:

                @settings(
                    max_examples=150,
                    deadline=None,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                )
                @given(bodies())
                def same_verdict(case: tuple[str, bytes]) -> None:
                    endpoint, body = case
                    as_request = verdict_of_request(client.post(endpoint, content=body))
                    as_line = verdict_of_line(client, endpoint, body)
                    assert as_line == as_request, (endpoint, body)
                    seen.add(as_request[0])

                same_verdict()

        seen: set[str] = set()

        await trio.to_thread.run_sync(check_every_example)
    # Not a property that holds only because every body got one verdict.
    assert seen == {"accepted", "not json", "refused"}
