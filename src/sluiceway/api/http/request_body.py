"""Request bodies bounded by `--max-body-size`, with a 413 that says so.

quart's body turns a body over the limit into a bare `RequestEntityTooLarge`
(no limit, no flag in the message), and counts only the bytes it still holds: a
body read as it arrives, as the multipart parser of `POST /v1/files` reads it,
is cleared after each read, so a chunked upload went past the limit unchecked.
This body counts every byte received and fails with `errors.body_too_large`.
"""

from __future__ import annotations

from quart_trio.wrappers.request import TrioBody, TrioRequest

from sluiceway.api.http import errors
from sluiceway.api.http.upload_form import UploadFormParser


class LimitedBody(TrioBody):
    def __init__(self, expected_content_length: int | None, max_content_length: int | None) -> None:
        super().__init__(expected_content_length, max_content_length)
        self._received = 0
        if self._must_raise is not None:
            # Only a Content-Length over the limit fails before any byte arrives.
            assert max_content_length is not None
            self._must_raise = errors.body_too_large(max_content_length, expected_content_length)

    def append(self, data: bytes) -> None:
        if data == b"" or self._must_raise is not None:
            return
        self._received += len(data)
        limit = self._max_content_length
        if limit is not None and self._received > limit:
            # Raised where the route reads the body; what it holds is not wanted.
            self._data.clear()
            self._must_raise = errors.body_too_large(limit, None)
            self.set_complete()
            return
        super().append(data)

    async def __anext__(self) -> bytes:
        try:
            return await super().__anext__()
        except StopAsyncIteration:
            # quart checks for a failure only before it waits for more data, so a
            # reader already waiting when the limit is crossed would see a clean end.
            if self._must_raise is not None:
                raise self._must_raise from None
            raise


class LimitedRequest(TrioRequest):
    body_class = LimitedBody
    form_data_parser_class = UploadFormParser
