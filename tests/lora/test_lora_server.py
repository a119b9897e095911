"""LoRA adapters through the OpenAI API: a request's `model` picks an adapter on
completions, chat and Responses, /v1/models lists each with the base model as its
parent, and each adapter's greedy tokens are peft's. An unknown name is a 404."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import openai
import pytest
import trio
from lora_models import BASE, MAX_NEW, PROMPT, peft_greedy, serving_adapters

T = TypeVar("T")


async def in_thread(fn: Callable[[], T]) -> T:
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(fn)


@pytest.fixture
async def server(models: dict[str, Any], tokenizer: Any):
    async with serving_adapters(
        models["base"], tokenizer, models["dirs"], max_loras=2, model_name=BASE
    ) as running:
        yield running


@pytest.fixture
def client(server: Any) -> Iterator[openai.OpenAI]:
    """The openai SDK's client of `server`, closed when the test ends (left open, its
    pooled sockets would reach the garbage collector during a later test)."""
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as made:
        yield made


async def test_models_lists_each_adapter_with_the_base_as_parent(server, models, client):
    listed = await in_thread(lambda: client.models.list().data)
    assert [m.id for m in listed] == [BASE, "a", "b"]
    parents = [getattr(m, "parent", None) for m in listed]
    assert parents == [None, BASE, BASE]
    assert getattr(listed[1], "root", None) == models["dirs"]["a"]
    one = await in_thread(lambda: client.models.retrieve("b"))
    assert (one.id, getattr(one, "parent", None)) == ("b", BASE)


async def test_each_adapter_answers_with_its_own_tokens(server, models, tokenizer, client):
    def complete(model: str) -> Any:
        return client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=MAX_NEW,
            temperature=0.0,
            extra_body={"ignore_eos": True},
        )

    results: dict[str, Any] = {}

    async def one(model: str) -> None:
        results[model] = await in_thread(lambda: complete(model))

    # All three at once, so the engine may batch them into shared steps.
    async with trio.open_nursery() as nursery:
        for model in (BASE, "a", "b"):
            nursery.start_soon(one, model)
    texts = {m: r.choices[0].text for m, r in results.items()}
    want = {
        BASE: tokenizer.decode(peft_greedy(models["base"], PROMPT, MAX_NEW)),
        "a": tokenizer.decode(peft_greedy(models["a"], PROMPT, MAX_NEW)),
        "b": tokenizer.decode(peft_greedy(models["b"], PROMPT, MAX_NEW)),
    }
    assert len(set(want.values())) == 3
    assert texts == want
    assert {m: r.model for m, r in results.items()} == {BASE: BASE, "a": "a", "b": "b"}


async def test_chat_and_responses_pick_the_adapter(server, client):
    chat = await in_thread(
        lambda: client.chat.completions.create(
            model="a", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0.0
        )
    )
    assert chat.model == "a"
    response = await in_thread(
        lambda: client.responses.create(model="b", input="hi", max_output_tokens=4)
    )
    assert response.model == "b"


async def test_an_unknown_model_is_a_404(server, client):
    with pytest.raises(openai.NotFoundError) as info:
        await in_thread(
            lambda: client.completions.create(model="c", prompt=PROMPT, max_tokens=2)
        )
    assert "c" in str(info.value.body)


async def test_metrics_name_the_adapters_served(server):
    import httpx

    async with httpx.AsyncClient(base_url=server.url) as http:
        text = (await http.get("/metrics")).text
    [line] = [x for x in text.splitlines() if x.startswith("vllm:lora_requests_info{")]
    assert 'max_lora="2"' in line and 'running_lora_adapters=""' in line
