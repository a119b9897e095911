"""A malformed multipart upload to POST /v1/files is a 400 (413 for a field over
the form's memory bound) that names the part and what is wrong with it, in the
OpenAI error shape; it was read as an empty form ("purpose must be 'batch'") or
with the malformed part left out."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

FILES = "/v1/files"
MULTIPART = "multipart/form-data; boundary=sep"


def part(headers: bytes, data: bytes = b"") -> bytes:
    return b"--sep\r\n" + headers + b"\r\n\r\n" + data + b"\r\n"


def form(*parts: bytes, closed: bool = True) -> bytes:
    return b"".join(parts) + (b"--sep--\r\n" if closed else b"")


PURPOSE = part(b'Content-Disposition: form-data; name="purpose"', b"batch")
LINE = b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}\n'


def file_part(disposition: bytes, content_type: bytes = b"application/jsonl") -> bytes:
    return part(b"Content-Disposition: " + disposition + b"\r\nContent-Type: " + content_type, LINE)


FILE = file_part(b'form-data; name="file"; filename="in.jsonl"')


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (
            form(PURPOSE, file_part(b'form-data; name="file"; filename="\xff.jsonl"')),
            "file",
            "The 'file' part's filename is not valid UTF-8.",
        ),
        (
            form(PURPOSE, file_part(b"form-data; name=\"file\"; filename*=UTF-8''%FF.jsonl")),
            "file",
            "The 'file' part's filename is not valid UTF-8.",
        ),
        (
            form(file_part(b'form-data; name="\xfffile"; filename="in.jsonl"'), PURPOSE),
            None,
            "Part 1's name is not valid UTF-8.",
        ),
        (
            form(PURPOSE, file_part(b'form-data; name="file"; filename="in.jsonl"', b"text/\xff")),
            "file",
            "The 'file' part's Content-Type header is not valid UTF-8.",
        ),
        (
            form(PURPOSE, file_part(b'form-data; filename="in.jsonl"')),
            None,
            "Part 2 has no name",
        ),
        (
            form(PURPOSE, part(b"Content-Type: application/jsonl", LINE)),
            None,
            "Part 2 has no Content-Disposition header",
        ),
        (
            form(PURPOSE, file_part(b'attachment; name="file"; filename="in.jsonl"')),
            "file",
            "The 'file' part's Content-Disposition is 'attachment; name=\"file\"; "
            "filename=\"in.jsonl\"'; it must be 'form-data",
        ),
        (form(PURPOSE, file_part(b";;;")), None, "Part 2's Content-Disposition is ';;;'"),
        (
            form(PURPOSE, FILE, closed=False),
            None,
            "The multipart body ends in the 'file' part, without its closing boundary '--sep--'.",
        ),
        (b"no boundary here", None, "The multipart body ends before any part"),
        (
            PURPOSE + b'--sep\r\nContent-Disposition: form-data; name="file"',
            None,
            "The multipart body ends in the headers of part 2",
        ),
        (
            form(PURPOSE, part(b'Content-Disposition: form-data; name="file"', LINE)),
            "file",
            "The 'file' part is a plain field",
        ),
        (form(FILE), "purpose", "The upload has no 'purpose' part"),
        (form(PURPOSE), "file", "The upload has no 'file' part."),
        # A good file before the bad part: its spooled file is closed (warnings are errors).
        (form(FILE, file_part(b'form-data; filename="x"')), None, "Part 2 has no name"),
    ],
    ids=[
        "filename not UTF-8",
        "RFC 2231 filename not UTF-8",
        "name not UTF-8",
        "other header not UTF-8",
        "no name",
        "no Content-Disposition",
        "not form-data",
        "Content-Disposition garbage",
        "no closing boundary",
        "no part at all",
        "ends in a part's headers",
        "file as a plain field",
        "no purpose",
        "no file",
        "good file then a bad part",
    ],
)
async def test_a_malformed_upload_names_what_is_wrong(
    client: httpx.AsyncClient, body: bytes, param: str | None, says: str
) -> None:
    r = await client.post(FILES, content=body, headers={"content-type": MULTIPART})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(says), error["message"]
    assert error["param"] == param


@pytest.mark.parametrize(
    ("content_type", "says"),
    [
        ("multipart/form-data", "The multipart/form-data Content-Type has no boundary"),
        ("application/json", "Files are uploaded as multipart/form-data"),
    ],
)
async def test_an_upload_that_is_not_a_multipart_form_says_so(
    client: httpx.AsyncClient, content_type: str, says: str
) -> None:
    r = await client.post(
        FILES, content=form(PURPOSE, FILE), headers={"content-type": content_type}
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith(says)


async def test_a_field_over_a_form_memory_bound_is_named(
    client: httpx.AsyncClient, server: Any
) -> None:
    # The server sets no bound of its own (the body's is the one); one set in the
    # app's config is kept, with a 413 that names the part.
    limit = server.app.config["MAX_FORM_MEMORY_SIZE"] = 100
    big = part(b'Content-Disposition: form-data; name="purpose"', b"b" * (limit + 1))
    r = await client.post(FILES, content=form(big, FILE), headers={"content-type": MULTIPART})
    assert r.status_code == 413
    error = r.json()["error"]
    assert error["param"] == "purpose" and error["code"] == "request_too_large"
    assert error["message"].startswith(f"The 'purpose' part holds more than {limit} bytes")


async def test_a_well_formed_upload_keeps_its_filename(client: httpx.AsyncClient) -> None:
    utf8 = file_part('form-data; name="file"; filename="lignes-été.jsonl"'.encode())
    extended = file_part(b"form-data; name=\"file\"; filename*=UTF-8''l%C3%A9.jsonl")
    for body, name in (
        (form(PURPOSE, utf8), "lignes-été.jsonl"),
        (form(extended, PURPOSE), "lé.jsonl"),
    ):
        r = await client.post(FILES, content=body, headers={"content-type": MULTIPART})
        assert r.status_code == 200, r.text
        assert r.json()["filename"] == name and r.json()["bytes"] == len(LINE)
