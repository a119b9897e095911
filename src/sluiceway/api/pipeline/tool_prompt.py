"""Tools and tool calls in a prompt: through the model's chat template when it knows
tools, else through one fallback format.

A template knows tools when it reads a `tools` variable (transformers'
`apply_chat_template(tools=...)`, as Qwen2.5, Llama 3.1, Mistral and Hermes
templates do). For one that does not (the default model's), the conversation is
rewritten before rendering, in the Hermes/Qwen2.5 convention that the tool grammar
also uses:

- the tool list and the call format go into the system message (a system message
  is added at the front when there is none);
- an assistant message's `tool_calls` become its text, one
  `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` block per call;
- a `tool` message becomes a `user` message whose text is the result inside
  `<tool_response>` tags.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sluiceway.grammar.spec import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

_INSTRUCTIONS = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within {open}{close} XML tags:
{open}
{{"name": <function-name>, "arguments": <args-json-object>}}
{close}"""


def template_knows_tools(tokenizer: Any, template: str | None = None) -> bool:
    """Whether the chat template (`template`, else the tokenizer's) renders `tools`."""
    if template is None:
        template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the one used by default
        template = template.get("tool_use") or template.get("default")
    return isinstance(template, str) and "tools" in template


def _call_text(call: dict[str, Any]) -> str:
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        arguments = function["arguments"]  # shown as the client sent it
    body = json.dumps({"name": function["name"], "arguments": arguments})
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def _rewritten(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] == "tool":
        text = f"<tool_response>\n{message['content']}\n</tool_response>"
        return {"role": "user", "content": text}
    calls = message.get("tool_calls")
    if not calls:
        return message
    parts = [message["content"]] if message["content"] else []
    parts.extend(_call_text(call) for call in calls)
    return {"role": message["role"], "content": "\n".join(parts)}


def fallback_messages(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`messages` in the fallback format, with `tools` described in the system message."""
    out = [_rewritten(m) for m in messages]
    if not tools:
        return out
    listing = "\n".join(json.dumps(tool) for tool in tools)
    instructions = _INSTRUCTIONS.format(tools=listing, open=TOOL_CALL_OPEN, close=TOOL_CALL_CLOSE)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{instructions}"}
    else:
        out.insert(0, {"role": "system", "content": instructions})
    return out
