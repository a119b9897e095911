"""What a choice's output must match, as plain data: the key of the grammar cache.

Every kind of constraint a request can ask for becomes one of three sources that
llguidance compiles: a JSON Schema, a regular expression, or a Lark grammar. The
request-facing variants (OpenAI's `json_object`, vLLM's `choice` and GBNF
`grammar`, tool calls) are written in these terms here, once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

GrammarKind = Literal["json_schema", "regex", "lark"]

# Tool calls are written as Hermes-style tags (Qwen2.5, Hermes, many fine-tunes):
# `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


@attrs.frozen
class GrammarSpec:
    """A constraint on a choice's output text. `source` is the JSON Schema (as
    canonical JSON text), the regex, or the Lark grammar; equal specs compile to
    the same grammar."""

    kind: GrammarKind
    source: str


# JSON is written as `json.dumps` writes it: `", "` and `": "`, no other whitespace.
# Models have seen that form most; free whitespace lets a small model emit newlines
# or spaces without end inside an object (vLLM's `disable_any_whitespace`).
# llguidance reads these options from the schema's "x-guidance" key.
JSON_OPTIONS: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _canonical(value: Any) -> str:
    # Key order is kept: it is the order the output's properties take.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")


def closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object schema that lists
    its `properties` and says nothing about others: output has only the properties
    a schema names (xgrammar's strict mode, vLLM's default). A small model left free
    to add properties adds them until its tokens run out."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(sub) for sub in out[key]]
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def json_schema(schema: Mapping[str, Any] | bool) -> GrammarSpec:
    """Output valid against `schema` (a JSON Schema object, or `true`), objects
    `closed` to the properties they name."""
    return GrammarSpec("json_schema", _canonical(closed(schema) if schema is not True else {}))


def json_object() -> GrammarSpec:
    """Any JSON object (OpenAI's `response_format: {"type": "json_object"}`)."""
    return json_schema({"type": "object"})


def regex(pattern: str) -> GrammarSpec:
    return GrammarSpec("regex", pattern)


def lark(grammar: str) -> GrammarSpec:
    """A Lark grammar (llguidance's dialect, with `start` as its start rule)."""
    return GrammarSpec("lark", grammar)


def choice(options: Sequence[str]) -> GrammarSpec:
    """Exactly one of `options` (vLLM's `structured_outputs.choice`)."""
    alternatives = " | ".join(json.dumps(option) for option in options)
    return lark(f"start: {alternatives}\n")


def _call_schema(name: str, parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """One call of the function `name` whose arguments match `parameters`; `name`
    comes first, so a streamed call says which function before its arguments."""
    return {
        "type": "object",
        "properties": {
            "name": {"const": name},
            "arguments": closed(dict(parameters)) if parameters is not None else {"type": "object"},
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_call_schema(functions: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
    """The JSON of one call to any of `functions` (name -> parameters schema)."""
    calls = [_call_schema(name, params) for name, params in functions.items()]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {**schema, "x-guidance": JSON_OPTIONS}


def tool_calls(
    functions: Mapping[str, Mapping[str, Any] | None],
    *,
    required: bool,
    parallel: bool,
    answer_schema: Mapping[str, Any] | None = None,
) -> GrammarSpec:
    """Tool calls to `functions` (name -> parameters schema), as tagged JSON.

    `required`: the output is one call (`parallel`: one or more, a newline apart)
    and nothing else. Otherwise it is an answer or calls: the answer is JSON valid
    against `answer_schema` when one is given, else free text, and free text may
    lead into calls: `<tool_call>` is a lazy trigger (llguidance's structural
    tags), so the text before it is unconstrained, and once it appears the call
    must be complete and valid, and only calls may follow."""
    call = f'call: %json {json.dumps(tool_call_schema(functions))} "\\n{TOOL_CALL_CLOSE}"\n'
    more = f' ("\\n{TOOL_CALL_OPEN}\\n" call)*' if parallel else ""
    if required:
        return lark(f'%llguidance {{}}\nstart: "{TOOL_CALL_OPEN}\\n" call{more}\n{call}')
    if answer_schema is not None:
        answer = {**closed(dict(answer_schema)), "x-guidance": JSON_OPTIONS}
        return lark(
            "%llguidance {}\n"
            f'start: answer | "{TOOL_CALL_OPEN}\\n" call{more}\n'
            f"answer: %json {json.dumps(answer)}\n"
            f"{call}"
        )
    return lark(
        "%llguidance {}\n"
        f'start: TEXT | call_open "\\n" call{more}\n'
        f'call_open[lazy]: TEXT "{TOOL_CALL_OPEN}"\n'
        f"{call}"
        "TEXT: /(.|\\n)*/\n"
    )
