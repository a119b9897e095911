"""LoRA adapters served on a base model, greedy-exact to `peft` + transformers'
`generate`: requests of two adapters and of the base model interleaved in one
engine batch (the LoRA deltas computed row by row in each step), prefilled in
chunks, and recomputed after preemption."""

from __future__ import annotations

import pytest
from lora_models import base_greedy, peft_greedy, peft_model, save_adapter

from family_models import tiny
from greedy_rounds import FewerBlocks, bare_core
from sluiceway.engine.lora_modules import LoraModules
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.model_runner import TorchModelRunner

MAX_NEW = 16
PROMPTS = [[5, 17, 99, 3, 42, 8, 250, 11, 64, 7, 1, 2, 3], [200, 201], [4, 8, 15, 16, 23, 42]]
FAMILIES = ["llama", "phi3", "qwen3"]


def serve(family, tmp_path, *, max_loras=2, num_blocks=96):
    """A runner of `tiny(family)` serving two peft adapters "a" (rank 4) and "b"
    (rank 8, rsLoRA scaling), and the peft models that made them."""
    models = {
        "a": peft_model(family, seed=1),
        "b": peft_model(family, seed=2, rank=8, alpha=4.0, use_rslora=True),
    }
    modules = LoraModules.of(
        {name: str(save_adapter(m, tmp_path / name)) for name, m in models.items()}
    )
    base = tiny(family)
    runner = TorchModelRunner(base.config, base.state_dict(), block_size=4, num_blocks=num_blocks)
    runner.enable_lora(modules, max_loras=max_loras, max_rank=8)
    return runner, modules, models


def interleaved(runner, modules, *, budget, engine_blocks=None):
    """Greedy tokens of every prompt under the base model, "a" and "b", all added
    at once (so every step mixes them), by (adapter name or None, prompt index)."""
    core = bare_core(
        runner if engine_blocks is None else FewerBlocks(runner, engine_blocks), budget=budget, max_seqs=9
    )
    order = {}
    request = 0
    for p, prompt in enumerate(PROMPTS):
        for name in (None, "a", "b"):
            lora_id = 0 if name is None else modules.named(name).lora_id
            params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, lora_id=lora_id)
            [seq] = core.add_request(request, prompt, params)
            order[seq] = (name, p)
            request += 1
    tokens: dict[int, list[int]] = {}
    while core.has_work():
        for seq_id, delta in core.step():
            tokens.setdefault(seq_id, []).extend(delta.token_ids)
    return {order[s]: tuple(t) for s, t in tokens.items()}, core


def expected(models, family):
    want = {}
    for p, prompt in enumerate(PROMPTS):
        want[(None, p)] = base_greedy(family, tuple(prompt), MAX_NEW)
        for name, model in models.items():
            want[(name, p)] = peft_greedy(model, prompt, MAX_NEW)
    return want


@pytest.mark.parametrize("family", FAMILIES)
def test_adapters_and_base_in_one_batch_match_peft(family, tmp_path):
    runner, modules, models = serve(family, tmp_path)
    want = expected(models, family)
    # Each adapter changes what the model says, or the comparison would prove little.
    for p in range(len(PROMPTS)):
        assert len({want[(None, p)], want[("a", p)], want[("b", p)]}) == 3
    got, _ = interleaved(runner, modules, budget=512)
    assert got == want


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_the_triton_kernel_serves_the_same_tokens(family, tmp_path, triton_interpreted):
    """The deltas through `kernels/lora_delta.py` (the CUDA path; triton's
    interpreter here), adapters of ranks 4 and 8 stacked by slot."""
    runner, modules, models = serve(family, tmp_path)
    runner.lora.kernel = "triton"
    got, _ = interleaved(runner, modules, budget=512)
    assert runner.lora._stacked is not None and len(runner.lora._stacked.adapters) == 2
    assert got == expected(models, family)


def test_chunked_prefill_and_preemption_match_peft(tmp_path):
    # 5 tokens a step prefills the long prompt in chunks beside others' decodes;
    # 20 blocks of 4 tokens cannot hold nine sequences, so some are preempted and
    # recompute their tokens under their own adapter. One adapter resident at a
    # time: steps holding both load the other one back.
    runner, modules, models = serve("llama", tmp_path, max_loras=1)
    got, core = interleaved(runner, modules, budget=5, engine_blocks=20)
    assert core.scheduler.num_preemptions > 0
    assert runner.lora is not None and runner.lora.loads > 2
    assert got == expected(models, "llama")
