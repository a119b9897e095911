"""The Files and Batch APIs (`/v1/files`, `/v1/batches`): a JSONL file of
requests is uploaded, a batch runs every line through the server, and its
results come back as an output file and an error file."""

from __future__ import annotations

from typing import Annotated, Any

import attrs
from msgspec import Meta

from sluiceway.protocol._codec import Wire

BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
"""The endpoints a batch's lines may call."""


@attrs.frozen(kw_only=True)
class BatchCreateRequest:
    """`POST /v1/batches`: run every line of an uploaded `batch` file against
    `endpoint`. `completion_window` is "24h", the one OpenAI offers."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: Annotated[dict[str, str], Meta(max_length=16)] | None = None


@attrs.frozen
class FileObject(Wire):
    """An uploaded file (purpose `batch`) or a batch's output or error file
    (purpose `batch_output`)."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    object: str = "file"
    status: str = "processed"
    expires_at: int | None = None
    status_details: str | None = None

    wire_order = (
        "id",
        "object",
        "bytes",
        "created_at",
        "filename",
        "purpose",
        "status",
        "expires_at",
        "status_details",
    )


@attrs.frozen
class FileList(Wire):
    data: list[FileObject]
    object: str = "list"
    has_more: bool = False


@attrs.frozen
class FileDeleted(Wire):
    id: str
    object: str = "file"
    deleted: bool = True


@attrs.frozen
class BatchRequestCounts(Wire):
    total: int = 0
    completed: int = 0
    failed: int = 0


@attrs.frozen
class BatchError(Wire):
    """Why a batch's input was refused: `line` is 1-based, `param` the field."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None


@attrs.frozen
class BatchErrors(Wire):
    data: list[BatchError]
    object: str = "list"


@attrs.frozen(kw_only=True)
class Batch(Wire):
    """A batch and its progress. `status` goes validating, in_progress,
    finalizing, completed; or failed (its input was refused, see `errors`); or
    cancelling, cancelled."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    object: str = "batch"
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts = attrs.field(factory=BatchRequestCounts)
    metadata: dict[str, Any] | None = None

    wire_order = (
        "id",
        "object",
        "endpoint",
        "errors",
        "input_file_id",
        "completion_window",
        "status",
        "output_file_id",
        "error_file_id",
        "created_at",
        "in_progress_at",
        "expires_at",
        "finalizing_at",
        "completed_at",
        "failed_at",
        "expired_at",
        "cancelling_at",
        "cancelled_at",
        "request_counts",
        "metadata",
    )


@attrs.frozen
class BatchList(Wire):
    data: list[Batch]
    object: str = "list"
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
