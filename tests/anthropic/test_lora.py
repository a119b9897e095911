"""A Messages request's `model` picks a LoRA adapter as a chat request's does:
the same tokens as the chat endpoint for that adapter, and the message names it."""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import openai
import pytest
from lora_models import serving_adapters

from tiny_models import TINY_LLAMA

from .conftest import in_thread, sdk

peft = pytest.importorskip("peft")
torch = pytest.importorskip("torch")
ASK = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
async def server(tokenizer: Any, tmp_path: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**TINY_LLAMA, vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2)
    base = LlamaForCausalLM(config).eval()
    lora = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    adapted = peft.get_peft_model(copy.deepcopy(base), lora).eval()
    adapted.save_pretrained(str(tmp_path / "a"))
    async with serving_adapters(
        base, tokenizer, {"a": str(tmp_path / "a")}, max_loras=1, model_name="base"
    ) as running:
        yield running


async def test_the_adapter_a_message_names_is_the_one_it_runs(
    server: Any, request: pytest.FixtureRequest
) -> None:
    client = sdk(server)
    chat = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    request.addfinalizer(chat.close)  # its sockets never reach a later test
    greedy = {"temperature": 0, "ignore_eos": True}
    texts = {}
    for model in ("base", "a"):
        message = await in_thread(
            partial(
                client.messages.create, model=model, max_tokens=6, messages=ASK, extra_body=greedy
            )
        )
        completion = await in_thread(
            partial(
                chat.chat.completions.create,
                model=model,
                max_tokens=6,
                messages=ASK,
                extra_body=greedy,
            )
        )
        assert message.model == model
        texts[model] = message.content[0].text  # type: ignore[union-attr]
        assert texts[model] == completion.choices[0].message.content
    chat.close()
    client.close()
    assert texts["a"] != texts["base"]
