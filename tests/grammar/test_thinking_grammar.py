"""A grammar after the thinking: the thinking is free text (here, text no JSON
grammar would allow), the answer after the closing tag matches the grammar, a
thinking budget forces the closing tag, and free and constrained rows share steps.

The runner writes a scripted text where the step's mask allows it and otherwise
takes the best token the mask allows (greedy over fixed logits that favour
closing JSON), sampled by the real sampler: every token a choice generates went
through the masks the engine filled."""

from __future__ import annotations

import json
from typing import Any

import attrs
import jsonschema
import pytest
import torch

from sluiceway.engine.batch import SampledToken, StepBatch
from sluiceway.engine.core import EngineCore
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.grammar import spec
from sluiceway.grammar.compiler import GrammarCompiler
from sluiceway.grammar.masks import start_fill
from sluiceway.grammar.thinking import Stage, ThinkingGrammar, ThinkingTokens
from sluiceway.reasoning import FORMATS, split_text
from sluiceway.runner.sampler import sample

ANSWER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["city", "n"],
}
THINKING = "\nThe user wants {not: json]] -- so I answer in JSON.\n</think>\n\n"


@attrs.define
class ScriptedMaskRunner:
    """Writes `scripts[prompt_len]` (token ids) where the mask allows it; otherwise
    the greedy choice among allowed tokens over `logits`."""

    logits: torch.Tensor
    scripts: dict[int, list[int]]
    num_blocks: int = 256
    block_size: int = 16
    written: dict[int, int] = attrs.field(factory=dict)
    prompt_lens: dict[int, int] = attrs.field(factory=dict)

    def step(self, batch: StepBatch) -> list[SampledToken]:
        rows = [c for c in batch.chunks if c.sample]
        if not rows:
            return []
        logits = self.logits.expand(len(rows), -1).clone()
        for r, chunk in enumerate(rows):
            if chunk.seq_id not in self.prompt_lens:
                self.prompt_lens[chunk.seq_id] = chunk.start_pos + len(chunk.token_ids)
            script = self.scripts.get(self.prompt_lens[chunk.seq_id], [])
            k = self.written.get(chunk.seq_id, 0)
            if k < len(script):
                logits[r, script[k]] += 100.0
            self.written[chunk.seq_id] = k + 1
        return sample(logits, rows, batch.token_masks)


def closer_logits(tokenizer: Any) -> torch.Tensor:
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    logits = torch.tensor([5.0 if p[:1] in '"}],' else 0.0 for p in pieces])
    logits[tokenizer.eos_token_id] = 5.0
    return logits


def make_core(tokenizer: Any, scripts: dict[int, list[int]]) -> EngineCore:
    runner = ScriptedMaskRunner(closer_logits(tokenizer), scripts)
    return EngineCore(
        runner,
        lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
        max_num_seqs=8,
        max_num_batched_tokens=256,
        eos_token_ids=[tokenizer.eos_token_id],
        max_model_len=2048,
        mask_filler=start_fill,
    )


def run(core: EngineCore) -> dict[int, tuple[str, str | None, str | None]]:
    texts: dict[int, list[str]] = {}
    ends: dict[int, tuple[str | None, str | None]] = {}
    while core.has_work():
        for seq_id, delta in core.step():
            texts.setdefault(seq_id, []).append(delta.text)
            if delta.finish_reason is not None:
                ends[seq_id] = (delta.finish_reason, delta.error)
    return {s: ("".join(t), *ends[s]) for s, t in texts.items()}


@pytest.fixture(scope="module")
def tokens(tokenizer: Any) -> ThinkingTokens:
    return ThinkingTokens.from_tokenizer(tokenizer, FORMATS["qwen3"], len(tokenizer))


def prompt_of(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text)


def test_free_thinking_then_an_answer_that_matches_the_schema(
    tokenizer: Any, compiler: GrammarCompiler, tokens: ThinkingTokens
) -> None:
    prompt = prompt_of(tokenizer, "Where? Answer in JSON.")
    script = tokenizer.encode("<think>" + THINKING, add_special_tokens=False)
    core = make_core(tokenizer, {len(prompt): script})
    grammar = ThinkingGrammar(tokens, "fresh", compiler.compile(spec.json_schema(ANSWER)))
    [seq] = core.add_request(
        0, prompt, SamplingParams(max_tokens=200, temperature=0.0, grammar=grammar)
    )
    text, finish, error = run(core)[seq]
    assert (finish, error) == ("stop", None), text
    reasoning, content = split_text(FORMATS["qwen3"], "fresh", text)
    assert reasoning == "The user wants {not: json]] -- so I answer in JSON."
    jsonschema.validate(json.loads(content), ANSWER)


def test_without_the_thinking_wrapper_the_same_script_is_held_to_json(
    tokenizer: Any, compiler: GrammarCompiler
) -> None:
    # The control: the grammar alone refuses the thinking text from the first token.
    prompt = prompt_of(tokenizer, "Where? Answer in JSON.")
    script = tokenizer.encode("<think>" + THINKING, add_special_tokens=False)
    core = make_core(tokenizer, {len(prompt): script})
    grammar = compiler.compile(spec.json_schema(ANSWER))
    [seq] = core.add_request(
        0, prompt, SamplingParams(max_tokens=200, temperature=0.0, grammar=grammar)
    )
    text, finish, _ = run(core)[seq]
    assert "<think>" not in text and finish == "stop"
    jsonschema.validate(json.loads(text), ANSWER)


def test_a_spent_budget_forces_the_closing_tag_then_the_grammar(
    tokenizer: Any, compiler: GrammarCompiler, tokens: ThinkingTokens
) -> None:
    prompt = prompt_of(tokenizer, "Think forever.")
    endless = tokenizer.encode("<think>" + " and then" * 50, add_special_tokens=False)
    core = make_core(tokenizer, {len(prompt): endless})
    grammar = ThinkingGrammar(tokens, "fresh", compiler.compile(spec.json_schema(ANSWER)), budget=6)
    [seq] = core.add_request(
        0, prompt, SamplingParams(max_tokens=200, temperature=0.0, grammar=grammar)
    )
    text, finish, error = run(core)[seq]
    assert (finish, error) == ("stop", None), text
    thinking = tokenizer.encode(" and then" * 50, add_special_tokens=False)[:6]
    assert text.startswith("<think>" + tokenizer.decode(thinking) + "\n</think>\n\n"), text
    _, content = split_text(FORMATS["qwen3"], "fresh", text)
    jsonschema.validate(json.loads(content), ANSWER)


def test_a_prompt_that_opened_the_block_is_not_forced_to_open_it_again(
    tokenizer: Any, compiler: GrammarCompiler
) -> None:
    r1 = ThinkingTokens.from_tokenizer(tokenizer, FORMATS["deepseek_r1"], len(tokenizer))
    prompt = prompt_of(tokenizer, "Assistant: <think>\n")
    core = make_core(tokenizer, {len(prompt): tokenizer.encode(THINKING, add_special_tokens=False)})
    grammar = ThinkingGrammar(r1, "open", compiler.compile(spec.regex(r"[0-9]{3}")))
    [seq] = core.add_request(
        0, prompt, SamplingParams(max_tokens=200, temperature=0.0, grammar=grammar)
    )
    text, finish, _ = run(core)[seq]
    assert finish == "stop"
    reasoning, content = split_text(FORMATS["deepseek_r1"], "open", text)
    assert reasoning and reasoning.startswith("The user wants") and len(content) == 3
    assert content.isdigit()


def test_thinking_and_constrained_rows_share_steps(
    tokenizer: Any, compiler: GrammarCompiler, tokens: ThinkingTokens
) -> None:
    # One choice thinks (its row has no mask) while another is held to a regex
    # from its first token: the masks land on the right rows.
    prompt_a = prompt_of(tokenizer, "First question here.")
    prompt_b = prompt_of(tokenizer, "Second.")
    assert len(prompt_a) != len(prompt_b)
    script = tokenizer.encode("<think>" + THINKING, add_special_tokens=False)
    core = make_core(tokenizer, {len(prompt_a): script, len(prompt_b): script})
    regex = compiler.compile(spec.regex(r"[a-z]{4}"))
    [a] = core.add_request(
        0,
        prompt_a,
        SamplingParams(
            max_tokens=200, temperature=0.0, grammar=ThinkingGrammar(tokens, "fresh", regex)
        ),
    )
    [b] = core.add_request(
        1, prompt_b, SamplingParams(max_tokens=200, temperature=0.0, grammar=regex)
    )
    outputs = run(core)
    text_a, finish_a, _ = outputs[a]
    text_b, finish_b, _ = outputs[b]
    assert finish_a == finish_b == "stop"
    _, content_a = split_text(FORMATS["qwen3"], "fresh", text_a)
    assert len(content_a) == 4 and content_a.isalpha() and "think" in text_a
    assert len(text_b) == 4 and text_b.isalpha()


def test_matcher_stages(tokens: ThinkingTokens, compiler: GrammarCompiler, tokenizer: Any) -> None:
    matcher = ThinkingGrammar(tokens, "fresh", None, budget=0).new_matcher()
    assert matcher.stage is Stage.OPENING
    for token in tokens.start_ids:
        assert matcher.mask_source() == token
        assert matcher.accept_token(token)
    assert matcher.stage is Stage.CLOSING  # a budget of 0: no thinking at all
    wrong = tokens.closer_ids[0] + 1
    assert not matcher.accept_token(wrong)
    assert matcher.error() is not None and "thinking tag" in (matcher.error() or "")
    closed = ThinkingGrammar(tokens, "closed", compiler.compile(spec.regex("a"))).new_matcher()
    assert closed.stage is Stage.ANSWER and closed.mask_source() is closed.inner
    with pytest.raises(ValueError, match="at least 0"):
        ThinkingGrammar(tokens, "fresh", None, budget=-1)
