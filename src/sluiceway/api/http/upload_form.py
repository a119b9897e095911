"""`multipart/form-data` bodies read into fields and files, refused with a 400
that names the malformed part and what is wrong with it.

quart's parser drops the whole form when any part is malformed (the decoder's
ValueError is swallowed): an upload whose filename was not UTF-8 read as one
with no parts at all, and was answered "purpose must be 'batch'". This reader
drives the same werkzeug decoder, checks each part's headers as they arrive,
and closes the files it spooled when it fails part way.
"""

from __future__ import annotations

import re
from typing import IO, Any, NoReturn
from urllib.parse import unquote_to_bytes

import attrs
from quart_trio.formparser import TrioFormDataParser
from werkzeug.datastructures import Headers, MultiDict
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import (
    HEADER_CONTINUATION_RE,
    Data,
    Epilogue,
    Field,
    File,
    MultipartDecoder,
    NeedData,
    State,
)

from sluiceway.api.http import errors
from sluiceway.api.http.errors import APIError

MULTIPART = "multipart/form-data"
_EXTENDED_FILENAME = re.compile(r"filename\*\s*=\s*([^;]*)", re.IGNORECASE)
# The charsets a part's Content-Type may name for a field's value (quart's list).
_FIELD_CHARSETS = {"ascii", "us-ascii", "utf-8", "iso-8859-1"}


def _is_utf8(latin1: str) -> bool:
    """Whether header text decoded as Latin-1 (byte for byte) was UTF-8."""
    try:
        latin1.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _label(number: int, name: str | None) -> str:
    return f"the '{name}' part" if name else f"part {number}"


def _malformed(message: str, param: str | None) -> APIError:
    return errors.invalid_request(message[0].upper() + message[1:], param)


def _not_utf8(number: int, raw: bytes) -> APIError:
    """The 400 for part `number`, whose header block `raw` is not UTF-8: it names
    the part's name or filename, or else the header, that is not."""
    headers = [
        line.partition(":")
        for line in HEADER_CONTINUATION_RE.sub(b" ", raw).decode("latin-1").splitlines()
    ]
    disposition = next(
        (value for header, _, value in headers if header.strip().lower() == "content-disposition"),
        "",
    )
    params = parse_options_header(disposition)[1]
    name = params.get("name")
    if name is not None and not _is_utf8(name):
        return _malformed(f"part {number}'s name is not valid UTF-8.", None)
    if not _is_utf8(params.get("filename", "")):
        return _malformed(f"{_label(number, name)}'s filename is not valid UTF-8.", name)
    bad = next((header.strip() for header, _, value in headers if not _is_utf8(header + value)), "")
    what = f"{bad} header" if bad else "headers"
    return _malformed(f"{_label(number, name)}'s {what} is not valid UTF-8.", name)


def _check_disposition(number: int, headers: Headers) -> None:
    """Raises the 400 for part `number` unless its Content-Disposition is
    form-data with a name, and any filename in it UTF-8."""
    value = headers.get("content-disposition")
    if value is None:
        raise _malformed(
            f"part {number} has no Content-Disposition header; each part needs "
            "'Content-Disposition: form-data; name=\"...\"'.",
            None,
        )
    kind, params = parse_options_header(value)
    name = params.get("name") or None
    if kind.lower() != "form-data":
        raise _malformed(
            f"{_label(number, name)}'s Content-Disposition is {value!r}; it must be "
            "'form-data; name=\"...\"'.",
            name,
        )
    if name is None:
        raise _malformed(
            f"part {number} has no name: its Content-Disposition ({value!r}) needs "
            "name=\"...\" ('file' or 'purpose').",
            None,
        )
    # werkzeug decodes an RFC 2231 filename (filename*=UTF-8''%FF) with
    # replacement characters: a name the client did not send.
    extended = _EXTENDED_FILENAME.search(value)
    if extended is not None:
        charset, _, rest = extended[1].strip().strip('"').partition("'")
        try:
            unquote_to_bytes(rest.partition("'")[2]).decode(charset or "utf-8")
        except (LookupError, UnicodeDecodeError):
            raise _malformed(
                f"{_label(number, name)}'s filename is not valid {charset or 'UTF-8'}.", name
            ) from None


class _PartDecoder(MultipartDecoder):
    """werkzeug's decoder, with each part's headers checked as they arrive."""

    parts = 0

    def _parse_headers(self, data: bytes | bytearray) -> Headers:
        self.parts += 1
        try:
            bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise _not_utf8(self.parts, bytes(data)) from None
        headers = super()._parse_headers(data)
        _check_disposition(self.parts, headers)
        return headers


@attrs.define
class _FormReader:
    """One multipart body being read: the part being read and what is done."""

    parser: UploadFormParser
    decoder: _PartDecoder
    boundary: str
    content_length: int | None
    opened: list[IO[bytes]] = attrs.Factory(list)
    fields: list[tuple[str, str]] = attrs.Factory(list)
    files: list[tuple[str, Any]] = attrs.Factory(list)
    part: Field | File | None = None
    chunks: list[bytes] = attrs.Factory(list)
    field_bytes: int = 0
    stream: IO[bytes] | None = None

    def feed(self, data: bytes | None) -> None:
        """Take `data` (None: the body has ended) and every event it completes."""
        self.decoder.receive_data(data)
        while True:
            try:
                event = self.decoder.next_event()
            except ValueError:
                self._ended_early()
            if isinstance(event, NeedData | Epilogue):
                return
            if isinstance(event, Field | File):
                self._start(event)
            elif isinstance(event, Data):
                self._take(event)

    def _ended_early(self) -> NoReturn:
        # The one ValueError left once headers are checked: the body ends before
        # the closing boundary (or before the first one).
        if self.decoder.state == State.PART:
            where = f"in the headers of part {self.decoder.parts + 1}"
        elif self.part is not None:
            where = f"in {_label(self.decoder.parts, self.part.name)}"
        else:
            where = "before any part"
        raise _malformed(
            f"the multipart body ends {where}, without its closing boundary '--{self.boundary}--'.",
            None,
        )

    def _start(self, part: Field | File) -> None:
        self.part = part
        self.chunks = []
        self.field_bytes = 0
        self.stream = None
        if isinstance(part, File):
            try:
                size = int(part.headers["content-length"])
            except (KeyError, ValueError):
                size = 0
            content_type = part.headers.get("content-type")
            self.stream = self.parser.stream_factory(
                self.content_length, content_type, part.filename, size
            )
            self.opened.append(self.stream)

    def _take(self, event: Data) -> None:
        assert self.part is not None
        if self.stream is not None:
            self.stream.write(event.data)
        else:
            self.chunks.append(event.data)
            self.field_bytes += len(event.data)
            limit = self.parser.max_form_memory_size
            if limit is not None and self.field_bytes > limit:
                raise APIError(
                    413,
                    f"The '{self.part.name}' part holds more than {limit} bytes; only a "
                    "file part may be larger.",
                    "invalid_request_error",
                    self.part.name,
                    "request_too_large",
                    (("Connection", "close"),),
                )
        if event.more_data:
            return
        if self.stream is not None:
            assert isinstance(self.part, File)
            self.stream.seek(0)
            storage = self.parser.file_storage_class(
                self.stream, self.part.filename, self.part.name, headers=self.part.headers
            )
            self.files.append((self.part.name, storage))
        else:
            # A value not in its charset is kept, with replacement characters: a
            # field such as `purpose` is then refused for its value, by its name.
            value = b"".join(self.chunks).decode(self._charset(), "replace")
            self.fields.append((self.part.name, value))

    def _charset(self) -> str:
        assert self.part is not None
        content_type = self.part.headers.get("content-type")
        charset = parse_options_header(content_type)[1].get("charset", "").lower()
        return charset if charset in _FIELD_CHARSETS else "utf-8"


class UploadFormParser(TrioFormDataParser):
    """quart's form parser, but a malformed multipart body is a 400 naming the
    part and what is wrong with it, never an empty form."""

    async def parse(
        self,
        body: Any,
        mimetype: str,
        content_length: int | None,
        options: dict[str, str] | None = None,
    ) -> tuple[MultiDict, MultiDict]:
        if mimetype != MULTIPART:
            return await super().parse(body, mimetype, content_length, options)
        boundary = (options or {}).get("boundary", "")
        if not boundary or not boundary.isascii():
            raise _malformed(
                "the multipart/form-data Content-Type has no boundary parameter "
                "(or one that is not ASCII).",
                None,
            )
        decoder = _PartDecoder(
            boundary.encode("ascii"), self.max_content_length, max_parts=self.max_form_parts
        )
        reader = _FormReader(self, decoder, boundary, content_length)
        try:
            async for data in body:
                reader.feed(data)
            reader.feed(None)
        except BaseException:
            # quart leaves spooled files open when a parse fails: a temporary
            # file, and a ResourceWarning, per failed upload.
            for stream in reader.opened:
                stream.close()
            raise
        cls = self.cls or MultiDict
        return cls(reader.fields), cls(reader.files)
