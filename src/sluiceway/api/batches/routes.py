"""The Files and Batch APIs: `POST /v1/files` (a JSONL file of requests, purpose
`batch`), `GET /v1/files[/{id}[/content]]`, `DELETE /v1/files/{id}`,
`POST /v1/batches`, `GET /v1/batches[/{id}]` and `POST /v1/batches/{id}/cancel`.

A batch's lines are checked when it is created (a file with a bad line makes a
`failed` batch that lists what is wrong, as OpenAI's does); its requests then
run in the server's `BatchRunner`, at background priority.

Files and batches are their creator's (`owners.py`): another key's lists leave
them out, and its every call naming one gets the 404 of an unknown id."""

from __future__ import annotations

import time
import uuid

import attrs
import trio
from quart import Blueprint, Response, request
from werkzeug.exceptions import RequestEntityTooLarge

from sluiceway.api.batches.input_lines import read_lines
from sluiceway.api.batches.runner import BatchRunner, current_batch_runner
from sluiceway.api.batches.store import UNFINISHED
from sluiceway.api.http import errors
from sluiceway.api.http.json_body import json_response
from sluiceway.api.http.upload_form import MULTIPART
from sluiceway.api.keys.owners import current_owner
from sluiceway.api.keys.rate_limits import budgeted_key
from sluiceway.api.pipeline import prompts
from sluiceway.api.state import current_state
from sluiceway.protocol.batches import (
    BATCH_ENDPOINTS,
    Batch,
    BatchCreateRequest,
    BatchErrors,
    BatchList,
    FileDeleted,
    FileList,
    FileObject,
)

blueprint = Blueprint("batches", __name__)

# Files above this size are read into lines on a worker thread.
_INLINE_FILE_BYTES = 64 << 10


def _runner() -> BatchRunner:
    return current_batch_runner()


def _file(file_id: str) -> FileObject:
    file = _runner().store.file(file_id, owner=current_owner())
    if file is None:
        raise errors.not_found("file", file_id, "file_id")
    return file


def _batch(batch_id: str) -> Batch:
    batch = _runner().store.batch(batch_id, owner=current_owner())
    if batch is None:
        raise errors.not_found("batch", batch_id, "batch_id")
    return batch


@blueprint.post("/v1/files")
async def upload_file() -> Response:
    """A multipart upload: `file`, and `purpose` "batch" (the one purpose served).
    A malformed part is a 400 naming it (`upload_form`)."""
    try:
        form = await request.form
        uploads = await request.files
    except RequestEntityTooLarge:
        # The body's own limit raises `errors.body_too_large`; what is left is
        # the form's bound on its number of parts.
        raise errors.too_many_form_parts(request.max_form_parts or 0) from None
    if not form and not uploads and request.mimetype != MULTIPART:
        raise errors.invalid_request(
            f"Files are uploaded as {MULTIPART} with 'file' and 'purpose' parts; this "
            f"request's Content-Type is '{request.mimetype or 'missing'}'."
        )
    purpose = form.get("purpose")
    if purpose is None:
        raise errors.invalid_request(
            "The upload has no 'purpose' part; it must be 'batch'.", "purpose"
        )
    if purpose != "batch":
        raise errors.invalid_request(
            "Only files for the Batch API are stored here: purpose must be 'batch'.", "purpose"
        )
    upload = uploads.get("file")
    if upload is None and "file" in form:
        raise errors.invalid_request(
            "The 'file' part is a plain field: a file needs a filename in its "
            'Content-Disposition (\'form-data; name="file"; filename="..."\').',
            "file",
        )
    if upload is None:
        raise errors.invalid_request("The upload has no 'file' part.", "file")
    content = upload.read()
    file = _runner().store.add_file(
        upload.filename or "upload.jsonl", purpose, content, owner=current_owner()
    )
    return json_response(file.to_dict())


@blueprint.get("/v1/files")
async def list_files() -> Response:
    files = _runner().store.files(request.args.get("purpose"), owner=current_owner())
    return json_response(FileList(files).to_dict())


@blueprint.get("/v1/files/<file_id>")
async def get_file(file_id: str) -> Response:
    return json_response(_file(file_id).to_dict())


@blueprint.get("/v1/files/<file_id>/content")
async def get_file_content(file_id: str) -> Response:
    content = _runner().store.file_content(file_id, owner=current_owner())
    if content is None:
        raise errors.not_found("file", file_id, "file_id")
    return Response(content, content_type="application/octet-stream")


@blueprint.delete("/v1/files/<file_id>")
async def delete_file(file_id: str) -> Response:
    if not _runner().store.delete_file(file_id, owner=current_owner()):
        raise errors.not_found("file", file_id, "file_id")
    return json_response(FileDeleted(file_id).to_dict())


@blueprint.post("/v1/batches")
async def create_batch() -> Response:
    state = current_state()
    state.check_accepting()
    runner = _runner()
    data = await request.get_data(cache=False)
    req = prompts.parse_body(data, BatchCreateRequest)
    if req.endpoint not in BATCH_ENDPOINTS:
        raise errors.invalid_request(
            f"Batches may call {', '.join(BATCH_ENDPOINTS)}; not {req.endpoint}.", "endpoint"
        )
    if req.completion_window != "24h":
        raise errors.invalid_request("The completion_window must be '24h'.", "completion_window")
    owner = current_owner()
    file = runner.store.file(req.input_file_id, owner=owner)
    if file is None:
        raise errors.not_found("file", req.input_file_id, "input_file_id")
    if file.purpose != "batch":
        raise errors.invalid_request(
            f"The file {file.id} has purpose '{file.purpose}', not 'batch'.", "input_file_id"
        )
    content = runner.store.file_content(file.id, owner=owner) or b""
    limit = state.server_config.max_body_bytes
    if len(content) > _INLINE_FILE_BYTES:
        lines, problems = await trio.to_thread.run_sync(read_lines, content, req.endpoint, limit)
    else:
        lines, problems = read_lines(content, req.endpoint, limit)
    now = int(time.time())
    batch = Batch(
        id=f"batch_{uuid.uuid4().hex}",
        endpoint=req.endpoint,
        input_file_id=file.id,
        completion_window=req.completion_window,
        status="validating",
        created_at=now,
        metadata=req.metadata,
    )
    if problems:
        batch = attrs.evolve(batch, status="failed", failed_at=now, errors=BatchErrors(problems))
        lines = []
    runner.store.add_batch(batch, lines, owner=owner, payer=budgeted_key())
    if not problems:
        runner.submit(batch.id)
    stored = runner.store.batch(batch.id, owner=owner)
    assert stored is not None
    return json_response(stored.to_dict())


@blueprint.get("/v1/batches")
async def list_batches() -> Response:
    try:
        limit = int(request.args.get("limit", "20"))
    except ValueError:
        raise errors.invalid_request("limit must be a whole number.", "limit") from None
    if not 1 <= limit <= 100:
        raise errors.invalid_request("limit must be between 1 and 100.", "limit")
    found = _runner().store.batches(limit + 1, request.args.get("after"), owner=current_owner())
    page = found[:limit]
    body = BatchList(
        page,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
        has_more=len(found) > limit,
    )
    return json_response(body.to_dict())


@blueprint.get("/v1/batches/<batch_id>")
async def get_batch(batch_id: str) -> Response:
    return json_response(_batch(batch_id).to_dict())


@blueprint.post("/v1/batches/<batch_id>/cancel")
async def cancel_batch(batch_id: str) -> Response:
    """Cancels a batch still running: it is `cancelling` until its lines in flight
    have left the engine, then `cancelled`, with the lines done by then as its
    output. A finished batch cannot be cancelled (409)."""
    batch = _batch(batch_id)
    if batch.status == "cancelling":
        return json_response(batch.to_dict())
    if batch.status not in UNFINISHED:
        raise errors.APIError(
            409,
            f"Cannot cancel a batch with status '{batch.status}'.",
            "invalid_request_error",
            "batch_id",
            "batch_not_cancellable",
        )
    return json_response(_runner().cancel(batch).to_dict())
