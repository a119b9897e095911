"""A Responses API request as the chat endpoint's body: its input items as chat
messages (after the stored conversation of `previous_response_id`), its function
tools, `tool_choice` and `text.format` in their chat forms, so that one
validation, chat template, grammar and tool-call parser serve both endpoints.

Every item is checked here; a bad one is a 400 naming it (`input[2].call_id`)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sluiceway import protocol
from sluiceway.api.http.errors import invalid_request
from sluiceway.protocol.responses import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputMessageItem,
    InputText,
    OutputMessage,
    OutputText,
)

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text")


def chat_messages(items: str | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`input` as chat messages; consecutive function calls form one assistant
    message with several tool calls, as chat templates expect them."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, param))
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", param),
                "type": "function",
                "function": {
                    "name": _string(item, "name", param),
                    "arguments": _string(item, "arguments", param),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = _text(output, f"{param}.output")
            messages.append(
                {"role": "tool", "tool_call_id": _string(item, "call_id", param), "content": output}
            )
        elif kind == "reasoning":
            continue  # earlier thinking is not shown to the model again, as templates drop it
        else:
            raise invalid_request(
                f"Input item type {kind!r} is not supported here (supported: message, "
                "function_call, function_call_output).",
                f"{param}.type",
            )
    return messages


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise invalid_request(
            f"Message role {role!r} is not one of user, system, developer, assistant.",
            f"{param}.role",
        )
    return {"role": _ROLES[role], "content": _text(item.get("content"), f"{param}.content")}


def _text(content: Any, param: str) -> str:
    """A message's content: a string, or text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise invalid_request(
                    f"Content part type {kind!r} is not supported (text parts only).",
                    f"{param}[{j}].type",
                )
            texts.append(_string(part, "text", f"{param}[{j}]"))
        return "".join(texts)
    raise invalid_request("Content must be a string or a list of text parts.", param)


def _string(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise invalid_request(f"'{key}' must be a string.", f"{param}.{key}")
    return value


_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
_STATUSES = ("in_progress", "completed", "incomplete")


def input_items(items: str | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`input` as `GET /v1/responses/{id}/input_items` lists it: each item in its
    wire form, text content as parts, with an id, the item's own where it brings
    one (an earlier output sent back) and else a new one as OpenAI assigns them
    (`msg_...`). `items` must be an input `chat_messages` accepted."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    ids: set[str] = set()
    for item in items:
        kind = item.get("type", "message")
        if kind == "reasoning":
            continue  # as `chat_messages` drops it
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id or item_id in ids:
            # A page's `after` names an item by its id, so no two may share one.
            item_id = f"{_ID_PREFIXES[kind]}_{uuid.uuid4().hex}"
        ids.add(item_id)
        status = item.get("status")
        if status not in _STATUSES:
            status = "completed"
        out.append(_input_item(item, kind, item_id, status).to_dict())
    return out


def _input_item(item: dict[str, Any], kind: str, item_id: str, status: str) -> protocol.InputItem:
    if kind == "function_call":
        return FunctionCallItem(item_id, item["call_id"], item["name"], item["arguments"], status)
    if kind == "function_call_output":
        output = item["output"]
        if not isinstance(output, str):
            output = [InputText(text).to_dict() for text in _texts(output)]
        return FunctionCallOutputItem(item_id, item["call_id"], output, status)
    texts = _texts(item["content"])
    if item["role"] == "assistant":
        return OutputMessage(item_id, [OutputText(text) for text in texts], status)
    return InputMessageItem(item_id, item["role"], [InputText(text) for text in texts], status)


def _texts(content: str | list[dict[str, Any]]) -> list[str]:
    return [content] if isinstance(content, str) else [part["text"] for part in content]


def chat_tools(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Function tools (`{"type": "function", "name", "parameters", ...}`) in the
    chat form; any other tool type is a 400 naming it."""
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise invalid_request(
                f"Tool type {tool.get('type')!r} is not supported (function tools only).",
                f"tools[{i}].type",
            )
        function = {"name": _string(tool, "name", f"tools[{i}]")}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": _string(choice, "name", "tool_choice")}}
    raise invalid_request(
        f"tool_choice type {choice.get('type')!r} is not supported.", "tool_choice.type"
    )


def chat_response_format(text: dict[str, Any]) -> dict[str, Any] | None:
    """`text.format` as the chat endpoint's `response_format` (None: plain text)."""
    fmt = text.get("format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {"name": fmt.get("name") or "response", "schema": fmt.get("schema")}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": schema}
    raise invalid_request(
        f"text.format type {fmt.get('type')!r} is not one of text, json_object, json_schema.",
        "text.format.type",
    )


def chat_body(
    req: protocol.ResponseCreateRequest, history: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """The chat completions body that generates `req`'s response after the
    conversation `history` (a previous response's messages; its instructions do
    not carry over, as OpenAI's do not)."""
    messages = list(history) + chat_messages(req.input)
    if req.instructions:
        messages.insert(0, {"role": "system", "content": req.instructions})
    body: dict[str, Any] = {"messages": messages, "model": req.model}
    for key, value in (
        ("max_tokens", req.max_output_tokens),
        ("temperature", req.temperature),
        ("top_p", req.top_p),
        ("seed", req.seed),
        ("parallel_tool_calls", req.parallel_tool_calls),
        ("chat_template_kwargs", req.chat_template_kwargs),
        ("reasoning_effort", req.reasoning.effort if req.reasoning is not None else None),
        ("max_reasoning_tokens", req.max_reasoning_tokens),
    ):
        if value is not None:
            body[key] = value
    if req.tools:
        body["tools"] = chat_tools(req.tools)
    if req.tool_choice is not None:
        body["tool_choice"] = chat_tool_choice(req.tool_choice)
    if req.text is not None:
        response_format = chat_response_format(req.text)
        if response_format is not None:
            body["response_format"] = response_format
    return body
