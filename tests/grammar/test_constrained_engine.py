"""Constrained choices in the engine core: every finished output matches its
grammar, n > 1 choices are independent, and aborts and preemptions keep the
matchers right (the runner samples with the real sampler over fixed logits)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from grammar_runner import MaskFollowingRunner
from sluiceway.engine.core import EngineCore
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.grammar import spec
from sluiceway.grammar.compiler import GrammarCompiler

RECORDS = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "minimum": 0, "maximum": 999},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
        "nested": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "ratio": {"type": "number"}},
            "required": ["ok"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "count", "tags", "nested"],
    "additionalProperties": False,
}


def make_core(tokenizer: Any, **kw: Any) -> EngineCore:
    runner = MaskFollowingRunner(tokenizer, **{k: kw.pop(k) for k in ("num_blocks", "block_size") if k in kw})
    return EngineCore(
        runner,
        lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
        max_num_seqs=kw.pop("max_num_seqs", 16),
        max_num_batched_tokens=kw.pop("max_num_batched_tokens", 256),
        eos_token_ids=[tokenizer.eos_token_id],
        max_model_len=kw.pop("max_model_len", 2048),
    )


def run(core: EngineCore) -> dict[int, tuple[str, str | None]]:
    texts: dict[int, list[str]] = {}
    ends: dict[int, str | None] = {}
    while core.has_work():
        for seq_id, delta in core.step():
            texts.setdefault(seq_id, []).append(delta.text)
            if delta.finish_reason is not None:
                ends[seq_id] = delta.finish_reason
    return {s: ("".join(t), ends.get(s)) for s, t in texts.items()}


def test_n4_choices_each_match_the_schema_and_differ(tokenizer: Any, compiler: GrammarCompiler) -> None:
    core = make_core(tokenizer)
    grammar = compiler.compile(spec.json_schema(RECORDS))
    params = SamplingParams(max_tokens=400, temperature=1.0, seed=7, grammar=grammar)
    prompt = tokenizer.encode("Give me a record:")
    seq_ids = core.add_request(0, prompt, params, n=4)
    outputs = run(core)
    texts = []
    for seq_id in seq_ids:
        text, finish = outputs[seq_id]
        assert finish == "stop", (text, finish)
        jsonschema.validate(json.loads(text), RECORDS)
        texts.append(text)
    assert len(set(texts)) > 1  # four draws, not one copied
    assert core.stats().num_constrained_seqs == 0


def test_json_object_regex_and_choice(tokenizer: Any, compiler: GrammarCompiler) -> None:
    core = make_core(tokenizer)
    cases = {
        0: (spec.json_object(), lambda t: isinstance(json.loads(t), dict)),
        1: (spec.regex(r"[0-9]{3}-[a-z]{2}"), lambda t: len(t) == 6 and t[3] == "-"),
        2: (spec.choice(["yes", "no", "maybe"]), lambda t: t in ("yes", "no", "maybe")),
    }
    ids = {}
    for request_id, (constraint, _) in cases.items():
        params = SamplingParams(max_tokens=200, seed=request_id, grammar=compiler.compile(constraint))
        ids[request_id] = core.add_request(request_id, tokenizer.encode("Answer:"), params)[0]
    outputs = run(core)
    for request_id, (_, check) in cases.items():
        text, finish = outputs[ids[request_id]]
        assert finish == "stop" and check(text), (request_id, text)


def test_abort_mid_way_frees_matchers_and_blocks(tokenizer: Any, compiler: GrammarCompiler) -> None:
    core = make_core(tokenizer)
    grammar = compiler.compile(spec.json_schema(RECORDS))
    params = SamplingParams(max_tokens=400, seed=1, grammar=grammar)
    core.add_request(0, tokenizer.encode("Give me a record:"), params, n=4)
    for _ in range(3):
        core.step()
    stats = core.stats()
    assert stats.num_constrained_seqs == 4 and stats.num_running_seqs == 4
    assert stats.kv_blocks_used > 0
    core.abort_request(0)
    stats = core.stats()
    assert stats.num_constrained_seqs == 0 and stats.num_running_seqs == 0
    assert stats.kv_blocks_used == 0
    assert not core.has_work()


def test_preempted_choices_keep_their_place_in_the_grammar(
    tokenizer: Any, compiler: GrammarCompiler
) -> None:
    # Eight choices, few KV blocks: sequences are preempted (recomputed later) while
    # their matchers stay where their outputs left them.
    core = make_core(tokenizer, num_blocks=24, block_size=4, max_num_seqs=8)
    grammar = compiler.compile(spec.json_schema(RECORDS))
    params = SamplingParams(max_tokens=60, seed=3, grammar=grammar)
    seq_ids = core.add_request(0, tokenizer.encode("Give me a record:"), params, n=8)
    outputs = run(core)
    assert core.scheduler.num_preemptions > 0
    finished = 0
    for seq_id in seq_ids:
        text, finish = outputs[seq_id]
        if finish == "stop":
            jsonschema.validate(json.loads(text), RECORDS)
            finished += 1
        else:
            assert finish == "length"
    assert finished > 0
