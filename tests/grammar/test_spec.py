"""Grammar specs: schemas closed to their named properties, and the compiler's
refusals."""

from __future__ import annotations

import json

import pytest

from sluiceway.grammar import spec
from sluiceway.grammar.compiler import GrammarCompiler, GrammarError


def test_objects_are_closed_where_the_schema_is_silent() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
            "c": {"type": "array", "items": {"properties": {"d": {}}}},
            "e": {"anyOf": [{"properties": {}}, {"type": "string"}]},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
        },
        "$defs": {"X": {"properties": {"y": {}}}},
    }
    got = json.loads(spec.json_schema(schema).source)
    assert got["additionalProperties"] is False
    assert got["properties"]["a"]["additionalProperties"] is False
    assert got["properties"]["c"]["items"]["additionalProperties"] is False
    assert got["properties"]["e"]["anyOf"][0]["additionalProperties"] is False
    assert got["properties"]["open"]["additionalProperties"] is True
    assert got["$defs"]["X"]["additionalProperties"] is False
    assert list(got["properties"]) == ["a", "c", "e", "open"]  # order kept: output order


def test_equal_requests_share_one_compiled_grammar(compiler: GrammarCompiler) -> None:
    first = compiler.compile(spec.json_schema({"type": "object", "properties": {"x": {}}}))
    again = compiler.compile(spec.json_schema({"type": "object", "properties": {"x": {}}}))
    assert first is again


@pytest.mark.parametrize(
    "bad",
    [
        spec.json_schema({"type": "frobnicate"}),
        spec.json_schema({"type": "string", "pattern": "(?=x)"}),
        spec.regex("[a-"),
        spec.lark("start: missing_rule"),
    ],
)
def test_invalid_grammars_are_refused_with_a_reason(compiler: GrammarCompiler, bad: spec.GrammarSpec) -> None:
    with pytest.raises(GrammarError) as info:
        compiler.compile(bad)
    assert str(info.value) and "<state>" not in str(info.value)
