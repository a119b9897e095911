"""Starting ranks for a served model: the flag, the rendezvous variables, and the
one-line refusal of a model that does not split (before any rank starts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tp_helpers import alive

from sluiceway.cli import build_parser, model_config
from sluiceway.config import EngineConfig, ModelConfig
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.model_engine import load_bundle
from sluiceway.offline import LLM
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


def test_a_model_that_does_not_split_fails_to_load_in_one_line(model_dir: Path):
    model = ModelConfig(model=str(model_dir), tensor_parallel_size=3)
    with pytest.raises(ModelLoadError, match="does not divide the model's 4 attention heads") as caught:
        load_bundle(model, EngineConfig(num_kv_blocks=16), progress=False)
    assert "\n" not in str(caught.value)


def test_offline_llm_splits_the_model_and_ends_its_ranks(model_dir: Path):
    prompts = [[5, 17, 99, 3, 42], [200, 201, 7]]
    params = SamplingParams(max_tokens=8, temperature=0.0)
    with LLM(model=str(model_dir), num_kv_blocks=64) as one:
        want = [r.outputs[0].token_ids for r in one.generate(prompts, params)]
    with LLM(model=str(model_dir), tensor_parallel_size=2, num_kv_blocks=64) as split:
        got = [r.outputs[0].token_ids for r in split.generate(prompts, params)]
        pids = split.bundle.runner.rank_pids
    assert got == want
    assert not any(alive(pid) for pid in pids)
