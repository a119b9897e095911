"""A bad PEFT adapter is refused with an error naming its problem, before it
serves a token: a missing file, a rank over `--max-lora-rank`, a module the
runner has no linear for, a shape that does not fit the base model."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from family_models import tiny
from sluiceway.engine.lora_modules import LoraModules
from sluiceway.runner.lora import AdapterError
from sluiceway.runner.model_runner import TorchModelRunner

PREFIX = "base_model.model.model.layers.0."


def write_adapter(directory, *, rank=4, targets=("q_proj",), tensors=None, config=None):
    directory.mkdir()
    body = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": list(targets)}
    (directory / "adapter_config.json").write_text(json.dumps(body | (config or {})))
    if tensors is None:
        tensors = {
            PREFIX + "self_attn.q_proj.lora_A.weight": torch.randn(rank, 64),
            PREFIX + "self_attn.q_proj.lora_B.weight": torch.randn(64, rank),
        }
    if tensors:
        save_file(tensors, str(directory / "adapter_model.safetensors"))
    return directory


def enable(directory, max_rank=8):
    base = tiny("llama")
    runner = TorchModelRunner(base.config, base.state_dict(), block_size=4, num_blocks=8)
    return runner.enable_lora(LoraModules.of({"sql": str(directory)}), max_loras=1, max_rank=max_rank)


def test_a_good_adapter_loads(tmp_path):
    table = enable(write_adapter(tmp_path / "ok"))
    assert table.resident_ids == [1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(rank=16), "has rank 16, above --max-lora-rank 8"),
        (dict(targets=("lm_head",)), "unsupported module(s) lm_head"),
        (dict(tensors={}), "has no adapter_model.safetensors"),
        (dict(config={"modules_to_save": ["lm_head"]}), "modules_to_save is not supported"),
        (
            dict(
                tensors={
                    PREFIX + "self_attn.q_proj.lora_A.weight": torch.randn(4, 32),
                    PREFIX + "self_attn.q_proj.lora_B.weight": torch.randn(64, 4),
                }
            ),
            "does not fit the base model: layer 0 q_proj maps 32 -> 64 features, "
            "the base model's 64 -> 64",
        ),
        (
            dict(
                tensors={
                    "base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight": torch.randn(4, 64),
                    "base_model.model.model.layers.7.self_attn.q_proj.lora_B.weight": torch.randn(64, 4),
                }
            ),
            "has layer 7; the base model has 2",
        ),
        (
            dict(tensors={PREFIX + "self_attn.q_proj.lora_A.weight": torch.randn(4, 64)}),
            "layer 0 q_proj lacks lora_A or lora_B",
        ),
    ],
)
def test_a_bad_adapter_is_refused_naming_the_problem(tmp_path, kwargs, message):
    with pytest.raises(AdapterError, match="sql") as info:
        enable(write_adapter(tmp_path / "bad", **kwargs))
    assert message in str(info.value)


def test_a_directory_without_a_config_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match=r"has no adapter_config\.json"):
        enable(tmp_path / "empty")
