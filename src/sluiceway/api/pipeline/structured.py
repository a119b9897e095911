"""What a request's output must match: `response_format`, vLLM's
`structured_outputs` and `tools` with `tool_choice`, turned into one grammar spec,
then compiled off the event loop under a time bound.

Everything a client can get wrong here (two constraints at once, a named function
that does not exist, a schema the grammar library refuses) is a 400 naming the
parameter; compiling never runs on the event loop and never hangs a request.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from sluiceway import protocol
from sluiceway.api.http.errors import invalid_request
from sluiceway.grammar import spec as grammar_spec
from sluiceway.grammar.compiler import CompiledGrammar, GrammarCompiler, GrammarError
from sluiceway.grammar.spec import GrammarSpec

# A grammar that takes longer than this to compile is refused; ordinary ones take
# well under a millisecond (`benchmarks/grammar_backends.py`).
COMPILE_TIMEOUT = 5.0


@attrs.frozen
class ToolUse:
    """How a chat request uses its tools: `tools` as templates read them (OpenAI
    form), and whether the output is parsed for calls."""

    tools: tuple[dict[str, Any], ...]
    parse_calls: bool


def _json_source(value: dict[str, Any] | str, param: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise invalid_request(f"'{param}' is not valid JSON: {exc}.", param) from None
    if not isinstance(value, dict):
        raise invalid_request(f"'{param}' must be a JSON Schema object.", param)
    return value


def _grammar_source(text: str) -> GrammarSpec:
    """vLLM's `grammar`: Lark, or GBNF (llama.cpp's), which llguidance converts."""
    if "::=" in text:
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            text = any_to_lark(text)
        except Exception as exc:  # the converter's own error types
            raise invalid_request(
                f"'structured_outputs.grammar' is not a valid GBNF grammar: {exc}.",
                "structured_outputs.grammar",
            ) from None
    return grammar_spec.lark(text)


def _structured_outputs(value: protocol.StructuredOutputs) -> tuple[GrammarSpec, str]:
    param = "structured_outputs"
    chosen = [
        name
        for name in ("json", "regex", "choice", "grammar")
        if getattr(value, name) is not None
    ] + (["json_object"] if value.json_object else [])
    if len(chosen) != 1:
        raise invalid_request(
            "'structured_outputs' must set exactly one of 'json', 'regex', 'choice', "
            f"'grammar' or 'json_object'; it sets {len(chosen)}.",
            param,
        )
    name = chosen[0]
    where = f"{param}.{name}"
    if value.json is not None:
        return grammar_spec.json_schema(_json_source(value.json, where)), where
    if value.regex is not None:
        return grammar_spec.regex(value.regex), where
    if value.choice is not None:
        return grammar_spec.choice(value.choice), where
    if value.grammar is not None:
        return _grammar_source(value.grammar), where
    return grammar_spec.json_object(), where


def _response_format(value: protocol.ResponseFormat) -> tuple[dict[str, Any] | None, str] | None:
    """The JSON Schema `response_format` asks for (None: plain text), with its param."""
    if value.type == "text":
        return None
    if value.type == "json_object":
        return {"type": "object"}, "response_format"
    if value.json_schema is None:
        raise invalid_request(
            "'response_format.json_schema' is required when the type is 'json_schema'.",
            "response_format.json_schema",
        )
    schema = value.json_schema.schema
    return (schema if schema is not None else {}), "response_format.json_schema.schema"


def output_constraint(
    wire: protocol.SamplingFields,
) -> tuple[GrammarSpec | None, str | None]:
    """The spec of `response_format` or `structured_outputs` (at most one of them)
    and the parameter it came from; (None, None) for free text."""
    formatted = None if wire.response_format is None else _response_format(wire.response_format)
    if wire.structured_outputs is not None:
        if formatted is not None:
            raise invalid_request(
                "Set 'response_format' or 'structured_outputs', not both.", "structured_outputs"
            )
        return _structured_outputs(wire.structured_outputs)
    if formatted is None:
        return None, None
    schema, param = formatted
    return grammar_spec.json_schema(schema or {}), param


def _functions(tools: Sequence[protocol.Tool]) -> dict[str, dict[str, Any] | None]:
    functions: dict[str, dict[str, Any] | None] = {}
    for i, tool in enumerate(tools):
        name = tool.function.name
        if name in functions:
            raise invalid_request(
                f"Tool names must be unique; '{name}' appears more than once.",
                f"tools[{i}].function.name",
            )
        functions[name] = tool.function.parameters
    return functions


def chat_constraint(
    wire: protocol.ChatCompletionRequest,
) -> tuple[GrammarSpec | None, str | None, ToolUse | None]:
    """A chat request's grammar spec, the parameter it came from, and its tool use.

    With tools, `tool_choice` (default `auto`) decides: `none` leaves the output
    free and unparsed (and the tools out of the prompt); `required` or a named
    function constrain it to calls; `auto` allows text or calls, where the text
    alternative is what `response_format` asks for, if anything."""
    spec, param = output_constraint(wire)
    tools = wire.tools or []
    choice = wire.tool_choice
    if not tools:
        if choice is not None and choice != "none":
            raise invalid_request("'tool_choice' requires 'tools'.", "tool_choice")
        return spec, param, None
    functions = _functions(tools)
    if choice == "none":
        return spec, param, ToolUse((), parse_calls=False)
    if spec is not None and spec.kind != "json_schema":
        raise invalid_request(
            "With 'tools', 'structured_outputs' may only ask for JSON.", param
        )
    use = ToolUse(tuple(_tool_dict(t) for t in tools), parse_calls=True)
    parallel = wire.parallel_tool_calls is not False
    if isinstance(choice, protocol.NamedToolChoice):
        name = choice.function.name
        if name not in functions:
            raise invalid_request(
                f"'tool_choice' names the function '{name}', which is not in 'tools'.",
                "tool_choice.function.name",
            )
        return (
            grammar_spec.tool_calls({name: functions[name]}, required=True, parallel=False),
            "tool_choice",
            use,
        )
    answer = None if spec is None else json.loads(spec.source)
    return (
        grammar_spec.tool_calls(
            functions, required=choice == "required", parallel=parallel, answer_schema=answer
        ),
        "tools" if param is None else param,
        use,
    )


def _tool_dict(tool: protocol.Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.function.name}
    if tool.function.description is not None:
        function["description"] = tool.function.description
    function["parameters"] = tool.function.parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


async def compile_grammar(
    compiler: GrammarCompiler, spec: GrammarSpec, param: str
) -> CompiledGrammar:
    """`spec` compiled on a worker thread (cached by spec). A 400 naming `param` if
    the grammar library refuses it or it takes longer than `COMPILE_TIMEOUT`; on
    cancellation (the client left) the thread is abandoned and finishes alone."""
    with trio.move_on_after(COMPILE_TIMEOUT):
        try:
            return await trio.to_thread.run_sync(compiler.compile, spec, abandon_on_cancel=True)
        except GrammarError as exc:
            raise invalid_request(f"Unsupported or invalid '{param}': {exc}", param) from None
    raise invalid_request(
        f"'{param}' did not compile within {COMPILE_TIMEOUT:g} s; simplify it.", param
    )
