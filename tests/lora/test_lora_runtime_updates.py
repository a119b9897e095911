"""Adapters loaded and unloaded while serving (`--enable-lora-runtime-updates`,
vLLM's endpoints and bodies): a loaded one answers as its peft model does and is
listed; a bad one is a 400 naming its problem; an unloaded one is a 404 for new
requests while the requests already running through it finish under it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from lora_models import BASE, MAX_NEW, PROMPT, peft_greedy, serving_adapters

from greedy_rounds import bare_core
from sluiceway.engine.lora_modules import LoraModules
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.model_runner import TorchModelRunner


@pytest.fixture
async def server(models, tokenizer):
    async with serving_adapters(
        models["base"], tokenizer, {}, max_loras=2, model_name=BASE, runtime_updates=True
    ) as running:
        yield running


def completion(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": MAX_NEW,
        "temperature": 0.0,
        "ignore_eos": True,
    }


async def test_load_answer_list_and_unload(server, models, tokenizer):
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        body = {"lora_name": "fresh", "lora_path": models["dirs"]["b"]}
        loaded = await http.post("/v1/load_lora_adapter", json=body)
        assert (loaded.status_code, loaded.text) == (
            200,
            "Success: LoRA adapter 'fresh' added successfully.",
        )
        again = await http.post("/v1/load_lora_adapter", json=body)
        assert again.status_code == 400
        assert "already been loaded" in again.json()["error"]["message"]
        listed = (await http.get("/v1/models")).json()["data"]
        assert [(m["id"], m.get("parent")) for m in listed] == [(BASE, None), ("fresh", BASE)]
        answer = (await http.post("/v1/completions", json=completion("fresh"))).json()
        want = tokenizer.decode(peft_greedy(models["b"], PROMPT, MAX_NEW))
        assert (answer["model"], answer["choices"][0]["text"]) == ("fresh", want)

        gone = await http.post("/v1/unload_lora_adapter", json={"lora_name": "fresh"})
        assert (gone.status_code, gone.text) == (
            200,
            "Success: LoRA adapter 'fresh' removed successfully.",
        )
        after = await http.post("/v1/completions", json=completion("fresh"))
        assert after.status_code == 404 and after.json()["error"]["code"] == "model_not_found"
        twice = await http.post("/v1/unload_lora_adapter", json={"lora_name": "fresh"})
        assert twice.status_code == 404
        assert [m["id"] for m in (await http.get("/v1/models")).json()["data"]] == [BASE]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"lora_name": "x", "lora_path": "/nowhere"}, "has no adapter_config.json"),
        ({"lora_name": "x"}, "'lora_path' (a non-empty string) is required."),
        ({"lora_name": BASE, "lora_path": "/nowhere"}, "already been loaded"),
    ],
)
async def test_a_bad_load_is_a_400_naming_the_problem(server, body, message):
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        got = await http.post("/v1/load_lora_adapter", json=body)
    assert got.status_code == 400
    assert message in got.json()["error"]["message"]


async def test_without_the_flag_the_endpoints_are_404(models, tokenizer):
    async with (
        serving_adapters(models["base"], tokenizer, {}, max_loras=2, model_name=BASE) as running,
        httpx.AsyncClient(base_url=running.url, timeout=60) as http,
    ):
        got = await http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/x"})
    assert got.status_code == 404
    assert "--enable-lora-runtime-updates" in got.json()["error"]["message"]


def test_requests_running_through_an_unloaded_adapter_finish_under_it(models):
    base = models["base"]
    runner = TorchModelRunner(base.config, base.state_dict(), block_size=16, num_blocks=64)
    modules = LoraModules.of({"a": models["dirs"]["a"]})
    # No adapter kept between steps beyond one: the running request's adapter
    # is evicted by another's and must load again, by id, after its unloading.
    modules.add("b", models["dirs"]["b"])
    runner.enable_lora(modules, max_loras=1, max_rank=16)
    core = bare_core(runner, budget=64)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, lora_id=modules.named("a").lora_id)
    [seq] = core.add_request(0, PROMPT, params)
    tokens: list[int] = []
    for _, delta in core.step():
        tokens.extend(delta.token_ids)
    modules.remove("a")
    other = SamplingParams(max_tokens=2, temperature=0.0, lora_id=modules.named("b").lora_id)
    core.add_request(1, PROMPT, other)
    while core.has_work():
        for seq_id, delta in core.step():
            if seq_id == seq:
                tokens.extend(delta.token_ids)
    assert modules.named("a") is None
    assert tuple(tokens) == peft_greedy(models["a"], PROMPT, MAX_NEW)
