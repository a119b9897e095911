"""The OpenAPI 3.1 document of the server's endpoints.

Every request and response schema is generated from the types in
`sluiceway.protocol`, the same types the server decodes requests into (with the
same ranges), so a schema-driven fuzzer such as schemathesis fuzzes what the
server really accepts. This module adds only what the types cannot say: the
paths, their status codes, and the streamed form of the generation endpoints.
Unknown request fields are ignored, so objects stay open (no
`additionalProperties: false`).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec

from sluiceway import protocol
from sluiceway.protocol import anthropic
from sluiceway.protocol.responses import INCLUDABLE

_REF = "#/components/schemas/{name}"
_ERROR = {"$ref": _REF.format(name="Error")}

# Every type the document names, each once; schemas refer to the others by name.
_TYPES: tuple[Any, ...] = (
    protocol.ChatCompletionRequest,
    protocol.ChatCompletion,
    protocol.CompletionRequest,
    protocol.Completion,
    protocol.TokenizeRequest,
    protocol.TokenizeResponse,
    protocol.DetokenizeRequest,
    protocol.DetokenizeResponse,
    protocol.ResponseCreateRequest,
    protocol.Response,
    protocol.ResponseDeleted,
    protocol.ResponseItemList,
    protocol.EmbeddingRequest,
    protocol.EmbeddingList,
    protocol.FileObject,
    protocol.FileList,
    protocol.FileDeleted,
    protocol.BatchCreateRequest,
    protocol.Batch,
    protocol.BatchList,
    protocol.ModelList,
    protocol.Model,
    protocol.ErrorObject,
    anthropic.MessageCreateRequest,
    anthropic.Message,
    anthropic.CountTokensRequest,
    anthropic.TokenCount,
    anthropic.ErrorResponse,
)

_STATUS = {
    400: "Invalid request",
    401: "Missing or wrong API key",
    404: "Unknown model (or response, file or batch id)",
    409: "The batch has finished and cannot be cancelled",
    413: "Request body too large",
    429: "Waiting queue full (see Retry-After)",
    503: "Draining or engine unhealthy",
    504: "Request timeout",
}
_GENERATION_ERRORS = (400, 401, 404, 413, 429, 503, 504)
_TOKENIZER_ERRORS = (400, 401, 404, 413)


@cache
def _components() -> dict[str, Any]:
    _, schemas = msgspec.json.schema_components(_TYPES, ref_template=_REF)
    # The error body wraps the error object: {"error": {...}}.
    schemas["Error"] = {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"$ref": _REF.format(name="ErrorObject")}},
    }
    return schemas


def _ref(cls: Any) -> dict[str, str]:
    return {"$ref": _REF.format(name=cls.__name__)}


def _errors(*codes: int, schema: dict[str, str] = _ERROR) -> dict[str, Any]:
    return {
        str(c): {
            "description": _STATUS[c],
            "content": {"application/json": {"schema": schema}},
        }
        for c in codes
    }


def _post(
    summary: str,
    request: Any,
    response: Any,
    codes: tuple[int, ...],
    *,
    stream: bool = False,
    error: dict[str, str] = _ERROR,
) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": _ref(response)}}
    if stream:
        # One server-sent event (as schemathesis and OpenAPI 3.2's itemSchema read a
        # stream): `data` holds a JSON chunk, an error object, or `[DONE]`.
        content["text/event-stream"] = {
            "schema": {
                "type": "object",
                "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
                "required": ["data"],
            }
        }
    return {
        "post": {
            "summary": summary,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(request)}},
            },
            "responses": {"200": {"description": "OK", "content": content}}
            | _errors(*codes, schema=error),
        }
    }


def _get(
    summary: str,
    schema: dict[str, Any],
    *codes: int,
    content_type: str = "application/json",
    secured: bool = True,
    parameters: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {"200": {"description": "OK", "content": {content_type: {"schema": schema}}}}
        | _errors(*codes),
    }
    if parameters:
        op["parameters"] = parameters
    if not secured:
        op["security"] = []
    return {"get": op}


def _input_item_parameters() -> list[dict[str, Any]]:
    def query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": False, "schema": schema}

    return [
        query("after", {"type": "string"}),
        query("limit", {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}),
        query("order", {"type": "string", "enum": ["asc", "desc"], "default": "desc"}),
        # As the openai SDK writes a list: `include[]=a&include[]=b`.
        query(
            "include[]",
            {"type": "array", "items": {"type": "string", "enum": sorted(INCLUDABLE)}},
        ),
    ]


def _paths() -> dict[str, Any]:
    model_parameter = {
        "name": "model",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
    }
    response_parameter, file_parameter, batch_parameter = (
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in ("response_id", "file_id", "batch_id")
    )
    return {
        "/v1/chat/completions": _post(
            "Chat completion (single or batch of conversations)",
            protocol.ChatCompletionRequest,
            protocol.ChatCompletion,
            _GENERATION_ERRORS,
            stream=True,
        ),
        "/v1/completions": _post(
            "Text completion (one or many prompts)",
            protocol.CompletionRequest,
            protocol.Completion,
            _GENERATION_ERRORS,
            stream=True,
        ),
        "/v1/responses": _post(
            "A model response (Responses API); streamed as named events",
            protocol.ResponseCreateRequest,
            protocol.Response,
            _GENERATION_ERRORS,
            stream=True,
        ),
        "/v1/responses/{response_id}": _get(
            "A stored response", _ref(protocol.Response), 401, 404, parameters=[response_parameter]
        )
        | {
            "delete": _get(
                "Delete a stored response",
                _ref(protocol.ResponseDeleted),
                401,
                404,
                parameters=[response_parameter],
            )["get"]
        },
        "/v1/responses/{response_id}/input_items": _get(
            "A page of a stored response's own input items",
            _ref(protocol.ResponseItemList),
            400,
            401,
            404,
            parameters=[response_parameter, *_input_item_parameters()],
        ),
        "/v1/responses/{response_id}/cancel": {
            "post": _get(
                "Cancel a background response",
                _ref(protocol.Response),
                400,
                401,
                404,
                parameters=[response_parameter],
            )["get"]
        },
        "/v1/messages": _post(
            "A message (Anthropic's Messages API); streamed as Anthropic's named events",
            anthropic.MessageCreateRequest,
            anthropic.Message,
            _GENERATION_ERRORS,
            stream=True,
            error=_ref(anthropic.ErrorResponse),
        ),
        "/v1/messages/count_tokens": _post(
            "The prompt tokens of a Messages API request",
            anthropic.CountTokensRequest,
            anthropic.TokenCount,
            _TOKENIZER_ERRORS,
            error=_ref(anthropic.ErrorResponse),
        ),
        "/v1/embeddings": _post(
            "Embeddings of one or many inputs",
            protocol.EmbeddingRequest,
            protocol.EmbeddingList,
            _GENERATION_ERRORS,
        ),
        "/v1/files": {
            "post": {
                "summary": "Upload a JSONL file of requests for a batch (purpose 'batch')",
                "requestBody": {
                    "required": True,
                    "content": {
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "required": ["file", "purpose"],
                                "properties": {
                                    "file": {"type": "string", "format": "binary"},
                                    "purpose": {"type": "string", "enum": ["batch"]},
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"application/json": {"schema": _ref(protocol.FileObject)}},
                    }
                }
                | _errors(400, 401, 413),
            }
        }
        | _get("The stored files", _ref(protocol.FileList), 401),
        "/v1/files/{file_id}": _get(
            "A stored file", _ref(protocol.FileObject), 401, 404, parameters=[file_parameter]
        )
        | {
            "delete": _get(
                "Delete a stored file",
                _ref(protocol.FileDeleted),
                401,
                404,
                parameters=[file_parameter],
            )["get"]
        },
        "/v1/files/{file_id}/content": _get(
            "A stored file's bytes (a batch's output: JSONL)",
            {"type": "string", "format": "binary"},
            401,
            404,
            content_type="application/octet-stream",
            parameters=[file_parameter],
        ),
        "/v1/batches": _post(
            "Run every line of an uploaded file, at background priority",
            protocol.BatchCreateRequest,
            protocol.Batch,
            (400, 401, 404, 413, 503),
        )
        | _get("Batches, newest first", _ref(protocol.BatchList), 400, 401),
        "/v1/batches/{batch_id}": _get(
            "A batch and its progress", _ref(protocol.Batch), 401, 404, parameters=[batch_parameter]
        ),
        "/v1/batches/{batch_id}/cancel": {
            "post": _get(
                "Cancel a running batch",
                _ref(protocol.Batch),
                401,
                404,
                409,
                parameters=[batch_parameter],
            )["get"]
        },
        "/v1/models": _get("List the served model", _ref(protocol.ModelList), 401),
        "/v1/models/{model}": _get(
            "The served model's card", _ref(protocol.Model), 401, 404, parameters=[model_parameter]
        ),
        "/tokenize": _post(
            "Tokenize a prompt or a conversation",
            protocol.TokenizeRequest,
            protocol.TokenizeResponse,
            _TOKENIZER_ERRORS,
        ),
        "/detokenize": _post(
            "Token ids to text",
            protocol.DetokenizeRequest,
            protocol.DetokenizeResponse,
            _TOKENIZER_ERRORS,
        ),
        "/health": _get(
            "200 when serving, 503 when draining or unhealthy",
            {"type": "object"},
            503,
            secured=False,
        ),
        "/metrics": _get(
            "Prometheus metrics", {"type": "string"}, content_type="text/plain", secured=False
        ),
        "/openapi.json": _get("This document", {"type": "object"}, secured=False),
    }


def openapi_document(model_name: str) -> dict[str, Any]:
    """The whole document; `model_name` is named in its description."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sluiceway",
            "version": "0.1.0",
            "description": f"OpenAI-compatible inference server serving `{model_name}`.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": _components(),
        },
        "security": [{"bearer": []}],
        "paths": _paths(),
    }
