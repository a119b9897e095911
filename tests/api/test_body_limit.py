"""A request body over `--max-body-size` gets a 413 whose message names the limit
and the flag, however the body came: with a Content-Length over the limit, chunked
past it, or as a multipart upload to /v1/files either way. The connection closes
after it (the rest of the body is not read) and the server goes on serving."""

from __future__ import annotations

import json
from typing import Any

import httpx

from server_helpers import CHAT, chat

LIMIT = 10_000
FLAG = "(raise it with --max-body-size)"
EXCEEDS = f"The request body exceeds the limit of {LIMIT} bytes {FLAG}."
FILES = "/v1/files"
LINE = json.dumps({"custom_id": "a", "method": "POST", "url": CHAT, "body": chat("hi")}) + "\n"


def sized(size: int) -> str:
    return f"The request body is {size} bytes; the limit is {LIMIT} bytes {FLAG}."


def assert_413(response: httpx.Response, message: str) -> None:
    assert response.status_code == 413, response.text
    assert response.json() == {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }
    assert response.headers["connection"] == "close"


class InPieces:
    """`data` as a body of unknown length: httpx sends it chunked. An iterator
    object, not an async generator: the server answers 413 before the body has
    all been sent, and an async generator left unexhausted warns when it is
    collected (which fails the test whenever the collector runs)."""

    def __init__(self, data: bytes, size: int = 1_000) -> None:
        self._pieces = iter([data[start : start + size] for start in range(0, len(data), size)])

    def __aiter__(self) -> InPieces:
        return self

    async def __anext__(self) -> bytes:
        try:
            return next(self._pieces)
        except StopIteration:
            raise StopAsyncIteration from None


def multipart(files: dict[str, Any], data: dict[str, str]) -> tuple[bytes, str]:
    """A multipart body as httpx would send it, and its content type."""
    request = httpx.Request("POST", "http://x" + FILES, files=files, data=data)
    return request.read(), request.headers["content-type"]


async def still_serves(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=chat("small", max_tokens=2))
    assert r.status_code == 200, r.text


async def test_a_content_length_over_the_limit(start_server: Any) -> None:
    async with (
        start_server(max_body_bytes=LIMIT) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        body = json.dumps(chat("x" * LIMIT)).encode()
        r = await client.post(CHAT, content=body, headers={"content-type": "application/json"})
        assert_413(r, sized(len(body)))
        await still_serves(client)


async def test_a_chunked_body_that_grows_past_the_limit(start_server: Any) -> None:
    async with (
        start_server(max_body_bytes=LIMIT) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        body = json.dumps(chat("x" * LIMIT)).encode()
        r = await client.post(
            CHAT, content=InPieces(body), headers={"content-type": "application/json"}
        )
        assert "content-length" not in r.request.headers
        assert_413(r, EXCEEDS)
        await still_serves(client)
        # Just under the limit, chunked, is still accepted.
        small = json.dumps(chat("x", max_tokens=2)).encode()
        r = await client.post(
            CHAT, content=InPieces(small, 7), headers={"content-type": "application/json"}
        )
        assert r.status_code == 200, r.text


async def test_a_file_upload_over_the_limit_either_way(start_server: Any) -> None:
    async with (
        start_server(max_body_bytes=LIMIT) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        content = (LINE * (LIMIT // len(LINE) + 1)).encode()
        body, content_type = multipart({"file": ("b.jsonl", content)}, {"purpose": "batch"})
        headers = {"content-type": content_type}
        r = await client.post(FILES, content=body, headers=headers)
        assert_413(r, sized(len(body)))
        # Read part by part as it arrives, a chunked upload is counted all the same.
        r = await client.post(FILES, content=InPieces(body), headers=headers)
        assert_413(r, EXCEEDS)
        assert (await client.get(FILES)).json()["data"] == []
        small, content_type = multipart({"file": ("b.jsonl", LINE.encode())}, {"purpose": "batch"})
        r = await client.post(
            FILES, content=InPieces(small), headers={"content-type": content_type}
        )
        assert r.status_code == 200, r.text


async def test_a_form_field_is_bounded_by_the_body_alone(start_server: Any) -> None:
    # quart's own bound on a form field (500 kB) would make a 413 naming nothing.
    async with (
        start_server(max_body_bytes=1 << 20) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        data = {"purpose": "batch", "note": "x" * 600_000}
        r = await client.post(FILES, files={"file": ("b.jsonl", LINE.encode())}, data=data)
        assert r.status_code == 200, r.text


async def test_too_many_form_parts(start_server: Any) -> None:
    async with (
        start_server(max_body_bytes=1 << 20) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        data = {"purpose": "batch"} | {f"extra{i}": "x" for i in range(1_000)}
        # Sent as bytes: httpx streams `files=` from an async generator, which the
        # early 413 leaves unexhausted.
        body, content_type = multipart({"file": ("b.jsonl", LINE.encode())}, data)
        r = await client.post(FILES, content=body, headers={"content-type": content_type})
        assert_413(
            r, "The upload has more than 1000 form parts; it needs only 'file' and 'purpose'."
        )
        await still_serves(client)
