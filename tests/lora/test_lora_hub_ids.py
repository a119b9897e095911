"""LoRA adapters by hub id (`--lora-modules NAME=ORG/NAME`, and `lora_path` of
`/v1/load_lora_adapter`), as vLLM takes them: fetched from a stand-in hub into
the Hugging Face cache, only `adapter_config.json` and
`adapter_model.safetensors`, and served as the same adapter given by path."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from hub_stand_in import StandInHub
from lora_models import BASE, MAX_NEW, PROMPT, peft_greedy, serving_adapters

from sluiceway.config import ModelConfig
from sluiceway.hub import HubError, HubOptions, resolve_adapter
from sluiceway.model_engine import _enable_lora, adapter_check
from sluiceway.runner.loading import ModelLoadError
from sluiceway.runner.lora import AdapterError
from sluiceway.runner.model_runner import TorchModelRunner

NOT_FETCHED = {
    "adapter_model.bin": b"pickle",
    "tokenizer.json": b"{}",
    "checkpoint-100/adapter_model.safetensors": b"an earlier step",
}


def _adapter_repo(hub: StandInHub, repo_id: str, directory: str) -> dict[str, bytes]:
    """`directory` (as peft saves it, with its README.md) as `repo_id` on the
    hub, beside files of other formats; the files an adapter is served from."""
    saved = {p.name: p.read_bytes() for p in Path(directory).iterdir() if p.is_file()}
    assert set(saved) == {"adapter_config.json", "adapter_model.safetensors", "README.md"}
    hub.add_repo(repo_id, {**saved, **NOT_FETCHED})
    return {name: saved[name] for name in ("adapter_config.json", "adapter_model.safetensors")}


def test_an_adapter_id_fetches_its_config_and_safetensors_only(hub, hf_home, models):
    files = _adapter_repo(hub, "org/sql-lora", models["dirs"]["a"])
    local = Path(resolve_adapter("org/sql-lora"))
    assert local.parent.parent == hf_home / "hub" / "models--org--sql-lora"
    assert {p.name: p.read_bytes() for p in local.iterdir()} == files
    assert sorted(r.path.rpartition("/")[2] for r in hub.gets()) == sorted(files)
    hub.stop()
    assert resolve_adapter("org/sql-lora", HubOptions(offline=True)) == str(local)
    assert resolve_adapter(models["dirs"]["a"]) == models["dirs"]["a"]  # a path is a path


def test_what_is_not_an_adapter_is_one_line(hub, hf_home):
    hub.add_repo("org/model", {"config.json": b"{}", "model.safetensors": b"w"})
    hub.add_repo("org/old-lora", {"adapter_config.json": b"{}", "adapter_model.bin": b"pickle"})
    cases = {
        "org/model": "org/model has no adapter_config.json, so it is not a PEFT LoRA adapter "
        "(it is a model, with a config.json: serve it as --model)",
        "org/old-lora": "org/old-lora has no adapter_model.safetensors; it holds: PyTorch .bin",
        "org/lora:Q4_0": "org/lora:Q4_0: a LoRA adapter is named ORG/NAME, with no :QUANT",
        "nobody/missing": "model nobody/missing not found on",
    }
    for path, message in cases.items():
        with pytest.raises(HubError) as caught:
            resolve_adapter(path)
        assert str(caught.value).startswith(message), caught.value


def test_start_up_adapters_by_hub_id_are_served_and_bad_ones_stop_the_start(hub, models):
    _adapter_repo(hub, "org/sql-lora", models["dirs"]["a"])
    base = models["base"]
    runner = TorchModelRunner(base.config, base.state_dict(), block_size=4, num_blocks=8)
    modules, _ = _enable_lora(runner, ModelConfig(lora_modules=(("sql", "org/sql-lora"),)))
    [module] = modules
    assert (module.name, Path(module.path).name) == ("sql", hub.repos["org/sql-lora"].commit)
    with pytest.raises(ModelLoadError, match=r"^model nobody/missing not found on "):
        _enable_lora(runner, ModelConfig(lora_modules=(("sql", "nobody/missing"),)))


async def test_a_runtime_load_by_hub_id_answers_as_its_peft_model(hub, models, tokenizer):
    _adapter_repo(hub, "org/b-lora", models["dirs"]["b"])
    async with (
        serving_adapters(
            models["base"], tokenizer, {}, max_loras=2, model_name=BASE, runtime_updates=True
        ) as server,
        httpx.AsyncClient(base_url=server.url, timeout=60) as http,
    ):
        body = {"lora_name": "fresh", "lora_path": "org/b-lora"}
        loaded = await http.post("/v1/load_lora_adapter", json=body)
        assert loaded.status_code == 200, loaded.text
        request = {"model": "fresh", "prompt": PROMPT, "max_tokens": MAX_NEW, "temperature": 0.0,
                   "ignore_eos": True}  # fmt: skip
        answer = (await http.post("/v1/completions", json=request)).json()
        assert answer["choices"][0]["text"] == tokenizer.decode(peft_greedy(models["b"], PROMPT, MAX_NEW))
        missing = await http.post(
            "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "nobody/missing"}
        )
    assert missing.status_code == 400
    assert missing.json()["error"]["message"].startswith("LoRA adapter 'x': model nobody/missing not found")


def test_the_runtime_check_gives_the_local_directory(hub, models):
    _adapter_repo(hub, "org/b-lora", models["dirs"]["b"])
    base = models["base"]
    runner = TorchModelRunner(base.config, base.state_dict(), block_size=4, num_blocks=8)
    from sluiceway.engine.lora_modules import LoraModules

    table = runner.enable_lora(LoraModules(), max_loras=1, max_rank=16)
    check = adapter_check(table, HubOptions())
    assert Path(check("fresh", "org/b-lora")).name == hub.repos["org/b-lora"].commit
    assert check("local", models["dirs"]["b"]) == models["dirs"]["b"]
    with pytest.raises(AdapterError, match=r"^LoRA adapter 'x': org/b-lora:Q8_0: a LoRA adapter"):
        check("x", "org/b-lora:Q8_0")
