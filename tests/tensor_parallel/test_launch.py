"""Starting ranks for a served model: the flag, the rendezvous variables, and the
one-line refusal of a model that does not split (before any rank starts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tp_helpers import tiny_llama

from sluiceway.cli import build_parser, model_config
from sluiceway.config import EngineConfig, ModelConfig
from sluiceway.model_engine import load_bundle
from sluiceway.runner.loading import ModelLoadError
from sluiceway.runner.tensor_parallel.launch import rendezvous
from sluiceway.runner.tensor_parallel.sharding import TensorParallelError


@pytest.mark.parametrize("command", [["serve"], ["generate", "hi"], ["bench", "engine"]])
def test_the_flag_reaches_the_model_config(command):
    args = build_parser().parse_args([*command, "--tensor-parallel-size", "3"])
    assert model_config(args).tensor_parallel_size == 3
    assert model_config(build_parser().parse_args([*command, "-tp", "2"])).tensor_parallel_size == 2
    assert model_config(build_parser().parse_args(command)).tensor_parallel_size == 1


def test_one_machine_spawns_every_rank_on_a_loopback_port():
    init_method, local = rendezvous(4, {})
    assert init_method.startswith("tcp://127.0.0.1:") and local == 4


def test_torchrun_style_variables_place_the_ranks():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29501", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    assert rendezvous(4, env) == ("tcp://10.0.0.1:29501", 2)
    assert rendezvous(4, {"MASTER_ADDR": "10.0.0.1"}) == ("tcp://10.0.0.1:29500", 4)
    with pytest.raises(TensorParallelError, match="WORLD_SIZE=2 but the tensor-parallel size is 4"):
        rendezvous(4, {"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "2"})


def test_a_model_that_does_not_split_fails_to_load_in_one_line(tokenizer, tokenizer_dir: Path, tmp_path: Path):
    tiny_llama(kv_heads=2, vocab=len(tokenizer)).save_pretrained(tmp_path)
    for item in tokenizer_dir.iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    model = ModelConfig(model=str(tmp_path), tensor_parallel_size=3)
    with pytest.raises(ModelLoadError, match="does not divide the model's 4 attention heads") as caught:
        load_bundle(model, EngineConfig(num_kv_blocks=16), progress=False)
    assert "\n" not in str(caught.value)
    quantized = ModelConfig(model=str(tmp_path), tensor_parallel_size=2, quantization="int8")
    with pytest.raises(ModelLoadError, match="quantization runs with a tensor-parallel size of 1"):
        load_bundle(quantized, EngineConfig(num_kv_blocks=16), progress=False)
