"""Property: for JSON Schemas drawn from a strategy (objects, arrays, enums, nesting,
required and optional fields, numeric bounds, string patterns), every output the
engine finishes validates against its schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.grammar import spec
from sluiceway.grammar.compiler import GrammarCompiler

from .test_constrained_engine import make_core, run

NAMES = st.sampled_from(["id", "name", "kind", "size", "when", "tags", "a", "b_c"])


def _bounded_integer() -> st.SearchStrategy[dict[str, Any]]:
    return st.tuples(st.integers(-1000, 1000), st.integers(0, 500)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}
    )


LEAVES: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.just({"type": "integer"}),
    _bounded_integer(),
    st.just({"type": "number", "minimum": 0, "maximum": 100}),
    st.integers(1, 16).map(lambda n: {"type": "string", "maxLength": n}),
    st.sampled_from(["^[a-z]{1,6}$", "^[0-9]{2}-[0-9]{2}$", "^(yes|no)$"]).map(
        lambda p: {"type": "string", "pattern": p}
    ),
    st.lists(st.text("abcxyz ", min_size=1, max_size=5), min_size=1, max_size=4, unique=True).map(
        lambda values: {"enum": values}
    ),
)


def _object(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def build(props: dict[str, dict[str, Any]], data: st.DataObject) -> dict[str, Any]:
        required = data.draw(st.lists(st.sampled_from(sorted(props)), unique=True))
        return {
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": False,
        }

    return st.builds(build, st.dictionaries(NAMES, children, min_size=1, max_size=4), st.data())


def _array(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.tuples(children, st.integers(0, 2), st.integers(0, 3)).map(
        lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]}
    )


SCHEMAS = st.recursive(LEAVES, lambda children: st.one_of(_object(children), _array(children)), max_leaves=8)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(schema=SCHEMAS, seed=st.integers(0, 2**31))
def test_every_finished_output_validates(
    tokenizer: Any, compiler: GrammarCompiler, schema: dict[str, Any], seed: int
) -> None:
    core = make_core(tokenizer)
    grammar = compiler.compile(spec.json_schema(schema))
    params = SamplingParams(max_tokens=300, seed=seed, grammar=grammar)
    core.add_request(0, tokenizer.encode("JSON:"), params, n=2)
    for text, finish in run(core).values():
        assert finish in ("stop", "length")
        if finish == "stop":
            jsonschema.validate(json.loads(text), schema)
