"""A grammar after the thinking on the real torch runner: a tiny random-weight
Llama over the SmolLM2 vocabulary, whose thinking is whatever its weights say,
capped by a budget; the answer after the forced closing tag is held to a JSON
Schema by the engine's masks and the real sampler."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from tiny_models import TINY_LLAMA

from .conftest import MODEL, TEMPLATE, in_thread, oai

torch = pytest.importorskip("torch")

ANSWER = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
}


async def test_a_random_model_thinks_freely_then_answers_in_json(
    tokenizer: Any, serve_runner: Any
) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from sluiceway.runner.model_runner import TorchModelRunner

    torch.manual_seed(0)
    config = LlamaConfig(
        **TINY_LLAMA,
        vocab_size=len(tokenizer),
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    runner = TorchModelRunner(
        config, model.state_dict(), dtype=torch.float32, block_size=16, num_blocks=128
    )
    async with serve_runner(
        runner, max_model_len=512, chat_template=TEMPLATE, reasoning_parser="qwen3"
    ) as server:
        with oai(server) as client:
            completion = await in_thread(
                lambda: client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Is the sky blue?"}],
                    max_tokens=80,
                    temperature=0,
                    response_format={
                        "type": "json_schema",
                        "json_schema": {"name": "a", "schema": ANSWER},
                    },
                    extra_body={"max_reasoning_tokens": 5},
                )
            )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    reasoning = (choice.message.model_extra or {}).get("reasoning_content")
    assert reasoning is not None  # the block was opened for it and closed by the budget
    jsonschema.validate(json.loads(choice.message.content or ""), ANSWER)
    usage = completion.usage
    assert usage is not None and usage.completion_tokens_details is not None
    opening = len(tokenizer.encode("<think>", add_special_tokens=False))
    assert usage.completion_tokens_details.reasoning_tokens > opening + 5
