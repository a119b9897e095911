"""A Messages API request in the terms the chat pipeline runs: the conversation as
chat templates read it, tools as functions, `tool_choice`, thinking and the
sampling fields mapped onto a chat completions request, which the chat
validation then checks and turns into sampling parameters and a grammar.

What Anthropic's API has and this server cannot serve is a 400 naming the
field: image and document blocks (the model reads text), server tools
(`web_search_...`), a named `tool_choice` without its name.
"""

from __future__ import annotations

import json
from typing import Any

from sluiceway import protocol
from sluiceway.api.http.errors import invalid_request
from sluiceway.protocol import anthropic as wire
from sluiceway.protocol.tools import ToolChoiceFunction


def chat_body(req: wire.MessageCreateRequest) -> protocol.ChatCompletionRequest:
    """`req` as the chat completions request it means. Raises `APIError` (400)."""
    tool_choice, parallel = _tool_choice(req.tool_choice)
    kwargs, budget = _thinking(req.thinking)
    messages: list[Any] = conversation(req.system, req.messages)
    return protocol.ChatCompletionRequest(
        model=req.model,
        messages=messages,
        max_tokens=req.max_tokens,
        stop=list(req.stop_sequences) if req.stop_sequences else None,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k if req.top_k else None,
        stream=bool(req.stream),
        tools=_tools(req.tools) if req.tools else None,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        chat_template_kwargs=kwargs,
        max_reasoning_tokens=budget,
        # A last assistant turn is a prefill: the answer continues it.
        continue_final_message=req.messages[-1].role == "assistant" or None,
    )


def count_body(req: wire.CountTokensRequest) -> protocol.ChatCompletionRequest:
    """What `count_tokens` renders: the request's prompt, as `chat_body` would."""
    tool_choice, _ = _tool_choice(req.tool_choice)
    kwargs, _ = _thinking(req.thinking)
    messages: list[Any] = conversation(req.system, req.messages)
    return protocol.ChatCompletionRequest(
        model=req.model,
        messages=messages,
        tools=_tools(req.tools) if req.tools else None,
        tool_choice=tool_choice,
        chat_template_kwargs=kwargs,
        continue_final_message=req.messages[-1].role == "assistant" or None,
    )


def conversation(
    system: wire.System | None, messages: list[wire.MessageParam]
) -> list[protocol.ChatMessageParam]:
    """The system prompt and turns as chat messages: a user turn's tool results
    become `tool` messages (before its text), an assistant turn's tool uses its
    `tool_calls`; earlier thinking is left out, as chat templates leave it."""
    out: list[protocol.ChatMessageParam] = []
    text = wire.system_text(system)
    if text:
        out.append(protocol.ChatMessageParam(role="system", content=text))
    for i, message in enumerate(messages):
        blocks = message.blocks()
        for j, block in enumerate(blocks):
            _check_block(block, message.role, f"messages[{i}].content[{j}]")
        if message.role == "user":
            out.extend(_user_turn(blocks))
        else:
            out.append(_assistant_turn(blocks))
    return out


def _check_block(block: wire.ContentBlockParam, role: str, param: str) -> None:
    problem = block.problem()
    if problem is not None:
        raise invalid_request(f"{param}: {problem}.", param)
    if block.type in ("image", "document"):
        raise invalid_request(
            f"{param}: {block.type} blocks are not supported; this model reads text.", param
        )
    allowed = (
        ("text", "tool_result")
        if role == "user"
        else ("text", "tool_use", "thinking", "redacted_thinking")
    )
    if block.type not in allowed:
        raise invalid_request(f"{param}: a {role} turn cannot hold a {block.type} block.", param)


def _user_turn(blocks: list[wire.ContentBlockParam]) -> list[protocol.ChatMessageParam]:
    results = [
        protocol.ChatMessageParam(
            role="tool", content=block.result_text(), tool_call_id=block.tool_use_id
        )
        for block in blocks
        if block.type == "tool_result"
    ]
    texts = [block.text or "" for block in blocks if block.type == "text"]
    if texts or not results:
        results.append(protocol.ChatMessageParam(role="user", content="\n".join(texts)))
    return results


def _assistant_turn(blocks: list[wire.ContentBlockParam]) -> protocol.ChatMessageParam:
    text = "".join(block.text or "" for block in blocks if block.type == "text")
    calls = [
        protocol.ToolCall(
            block.id or "", protocol.FunctionCall(block.name or "", json.dumps(block.input))
        )
        for block in blocks
        if block.type == "tool_use"
    ]
    return protocol.ChatMessageParam(
        role="assistant", content=text if text or not calls else None, tool_calls=calls or None
    )


def _tools(tools: list[wire.ToolParam]) -> list[protocol.Tool]:
    out = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise invalid_request(
                f"The server tool '{tool.type}' is not available here; "
                "only client tools (name, description, input_schema) are.",
                f"tools[{i}].type",
            )
        if tool.input_schema is None:
            raise invalid_request(f"tools[{i}]: a tool needs `input_schema`.", f"tools[{i}]")
        out.append(
            protocol.Tool(
                "function",
                protocol.FunctionDefinition(
                    name=tool.name, description=tool.description, parameters=tool.input_schema
                ),
            )
        )
    return out


def _tool_choice(
    choice: wire.ToolChoiceParam | None,
) -> tuple[protocol.ToolChoice | None, bool | None]:
    if choice is None:
        return None, None
    parallel = (
        None if choice.disable_parallel_tool_use is None else not choice.disable_parallel_tool_use
    )
    if choice.type == "tool":
        if not choice.name:
            raise invalid_request("tool_choice: type 'tool' needs `name`.", "tool_choice.name")
        return protocol.NamedToolChoice("function", ToolChoiceFunction(choice.name)), parallel
    mapped = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    return mapped, parallel  # type: ignore[return-value]


def _thinking(thinking: wire.ThinkingParam | None) -> tuple[dict[str, bool] | None, int | None]:
    """`thinking` as template kwargs (Qwen3's and SmolLM3's switch) and a budget."""
    if thinking is None:
        return None, None
    if thinking.type == "disabled":
        return {"enable_thinking": False}, None
    return {"enable_thinking": True}, thinking.budget_tokens
