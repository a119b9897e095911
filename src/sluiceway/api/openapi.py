"""A hand-written OpenAPI 3.1 document for the server's endpoints.

Request schemas list the fields the server reads, with the ranges validation
enforces (so a schema-driven fuzzer such as schemathesis can tell valid from
invalid); `additionalProperties` stays open because unknown fields are ignored.
"""

from __future__ import annotations

from typing import Any

_ERROR = {"$ref": "#/components/schemas/Error"}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}


def _errors(*codes: int) -> dict[str, Any]:
    descriptions = {
        400: "Invalid request",
        401: "Missing or wrong API key",
        404: "Unknown model",
        413: "Request body too large",
        429: "Waiting queue full (see Retry-After)",
        503: "Draining or engine unhealthy",
        504: "Request timeout",
    }
    return {
        str(c): {
            "description": descriptions[c],
            "content": {"application/json": {"schema": _ERROR}},
        }
        for c in codes
    }


_SAMPLING: dict[str, Any] = {
    "model": {"type": "string"},
    "n": {"type": "integer", "minimum": 1, "maximum": 128, "default": 1},
    "stream": {"type": "boolean", "default": False},
    "stream_options": {
        "type": ["object", "null"],
        "properties": {
            "include_usage": {"type": "boolean"},
            "continuous_usage_stats": {"type": "boolean"},
        },
        "description": "Only with stream: true.",
    },
    "temperature": {"type": "number", "minimum": 0, "maximum": 2, "default": 1},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1},
    "top_k": {"type": "integer", "minimum": -1, "default": 0},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1, "default": 0},
    "seed": {"type": ["integer", "null"]},
    "stop": {
        "oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 64},
        ]
    },
    "stop_token_ids": _TOKEN_IDS,
    "ignore_eos": {"type": "boolean"},
    "include_stop_str_in_output": {"type": "boolean"},
    "min_tokens": {"type": "integer", "minimum": 0},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
    "logit_bias": {
        "type": "object",
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
    },
}

_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {
            "oneOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                    },
                },
                {"type": "null"},
            ]
        },
        "name": {"type": "string"},
    },
}

_CONVERSATION = {"type": "array", "items": {"$ref": "#/components/schemas/Message"}, "minItems": 1}

_CHAT_REQUEST = {
    "type": "object",
    "required": ["messages"],
    "properties": _SAMPLING
    | {
        "messages": {
            "description": "One conversation, or a list of conversations (batch chat: "
            "choice index = conversation_index * n + j).",
            "oneOf": [_CONVERSATION, {"type": "array", "items": _CONVERSATION, "minItems": 1}],
        },
        "max_tokens": {"type": ["integer", "null"], "minimum": 1},
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {
            "type": "integer",
            "minimum": 0,
            "maximum": 20,
            "description": "Requires logprobs: true.",
        },
        "add_generation_prompt": {"type": "boolean", "default": True},
    },
}

_COMPLETION_REQUEST = {
    "type": "object",
    "required": ["prompt"],
    "properties": _SAMPLING
    | {
        "prompt": {
            "description": "choice index = prompt_index * n + j",
            "oneOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
                _TOKEN_IDS | {"minItems": 1},
                {"type": "array", "items": _TOKEN_IDS | {"minItems": 1}, "minItems": 1},
            ],
        },
        "max_tokens": {"type": ["integer", "null"], "minimum": 1, "default": 16},
        "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
        "echo": {"type": "boolean", "description": "Not together with logprobs."},
    },
}

_USAGE = {
    "type": "object",
    "properties": {
        k: {"type": "integer"} for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    },
}

_COMPLETION_RESPONSE = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {"type": "array", "items": {"type": "object"}},
        "usage": _USAGE,
    },
}


def _post(
    summary: str,
    schema: dict[str, Any],
    response: dict[str, Any],
    *codes: int,
    stream: bool = False,
) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": response}}
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
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {"200": {"description": "OK", "content": content}} | _errors(*codes),
        }
    }


def _get(
    summary: str,
    schema: dict[str, Any],
    *codes: int,
    content_type: str = "application/json",
    secured: bool = True,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {"200": {"description": "OK", "content": {content_type: {"schema": schema}}}}
        | _errors(*codes),
    }
    if not secured:
        op["security"] = []
    return {"get": op}


def openapi_document(model_name: str) -> dict[str, Any]:
    gen_codes = (400, 401, 404, 413, 429, 503, 504)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sluiceway",
            "version": "0.1.0",
            "description": f"OpenAI-compatible inference server serving `{model_name}`.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["message", "type", "param", "code"],
                            "properties": {
                                "message": {"type": "string"},
                                "type": {"type": "string"},
                                "param": {"type": ["string", "null"]},
                                "code": {"type": ["string", "null"]},
                            },
                        }
                    },
                },
                "Message": _MESSAGE,
                "ChatCompletionRequest": _CHAT_REQUEST,
                "CompletionRequest": _COMPLETION_REQUEST,
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/chat/completions": _post(
                "Chat completion (single or batch of conversations)",
                {"$ref": "#/components/schemas/ChatCompletionRequest"},
                _COMPLETION_RESPONSE,
                *gen_codes,
                stream=True,
            ),
            "/v1/completions": _post(
                "Text completion (one or many prompts)",
                {"$ref": "#/components/schemas/CompletionRequest"},
                _COMPLETION_RESPONSE,
                *gen_codes,
                stream=True,
            ),
            "/v1/models": _get("List the served model", {"type": "object"}, 401),
            "/v1/models/{model}": {
                "get": {
                    "summary": "The served model's card",
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": "OK",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        }
                    }
                    | _errors(401, 404),
                }
            },
            "/tokenize": _post(
                "Tokenize a prompt or a conversation",
                {
                    "type": "object",
                    "properties": {
                        "model": {"type": "string"},
                        "prompt": {"type": "string"},
                        "add_special_tokens": {"type": "boolean"},
                        "messages": _CONVERSATION,
                        "add_generation_prompt": {"type": "boolean"},
                    },
                },
                {
                    "type": "object",
                    "properties": {
                        "count": {"type": "integer"},
                        "max_model_len": {"type": "integer"},
                        "tokens": _TOKEN_IDS,
                    },
                },
                400,
                401,
                404,
                413,
            ),
            "/detokenize": _post(
                "Token ids to text",
                {
                    "type": "object",
                    "required": ["tokens"],
                    "properties": {"model": {"type": "string"}, "tokens": _TOKEN_IDS},
                },
                {"type": "object", "properties": {"prompt": {"type": "string"}}},
                400,
                401,
                404,
                413,
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
        },
    }
