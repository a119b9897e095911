"""How a checkpoint splits over ranks: which heads, rows and vocabulary slices each
rank holds, and the one-line refusals. Pure tensor slicing: no processes."""

from __future__ import annotations

import pytest
import torch
from tp_helpers import tiny_llama
from transformers import LlamaConfig

from sluiceway.runner.models.registry import family_for
from sluiceway.runner.tensor_parallel.checkpoint import lazy_checkpoint
from sluiceway.runner.tensor_parallel.sharding import ShardPlan, TensorParallelError
from tiny_models import TINY_LLAMA


def config(**overrides) -> LlamaConfig:
    return LlamaConfig(**dict(TINY_LLAMA, vocab_size=250, **overrides))


def shard(plan: ShardPlan, cfg, state_dict) -> dict[str, torch.Tensor]:
    """The rank's canonical weights (`runner/models/weights.py`) of `state_dict`."""
    return plan.shard(family_for(cfg).weight_views(cfg, state_dict), state_dict)


def test_kv_heads_split_when_the_size_divides_them():
    plans = [ShardPlan.for_config(config(num_key_value_heads=4), 2, r) for r in range(2)]
    assert [(p.local_heads, p.local_kv_heads, p.first_kv_head) for p in plans] == [(2, 2, 0), (2, 2, 2)]


def test_kv_heads_are_replicated_when_the_size_exceeds_them():
    # 4 query heads over 2 KV heads on 4 ranks: ranks 0-1 share KV head 0, ranks 2-3 head 1,
    # each rank's one query head being one that reads that KV head on one device.
    plans = [ShardPlan.for_config(config(num_key_value_heads=2), 4, r) for r in range(4)]
    assert [(p.local_heads, p.local_kv_heads, p.first_kv_head) for p in plans] == [
        (1, 1, 0),
        (1, 1, 0),
        (1, 1, 1),
        (1, 1, 1),
    ]


@pytest.mark.parametrize(
    ("overrides", "size", "message"),
    [
        (dict(num_attention_heads=4, num_key_value_heads=2), 3, "does not divide the model's 4 attention heads"),
        (dict(hidden_size=96, num_attention_heads=12, num_key_value_heads=4), 6, "neither divides nor is a multiple of the model's 4 KV heads"),
        (dict(intermediate_size=130), 4, "does not divide the model's MLP width 130"),
    ],
)
def test_a_model_that_does_not_split_is_a_one_line_error(overrides, size, message):
    with pytest.raises(TensorParallelError, match=message) as caught:
        ShardPlan.for_config(config(**overrides), size)
    assert "\n" not in str(caught.value)


def test_the_slices_put_back_together_are_the_whole_weights():
    cfg = config(num_key_value_heads=2)
    torch.manual_seed(0)
    p = "model.layers.0."
    whole = {
        f"{p}self_attn.q_proj.weight": torch.randn(64, 64),
        f"{p}self_attn.k_proj.weight": torch.randn(32, 64),
        f"{p}self_attn.o_proj.weight": torch.randn(64, 64),
        f"{p}self_attn.o_proj.bias": torch.randn(64),
        f"{p}mlp.down_proj.weight": torch.randn(64, 128),
        f"{p}input_layernorm.weight": torch.randn(64),
        "model.embed_tokens.weight": torch.randn(250, 64),
    }
    shards = [shard(ShardPlan.for_config(cfg, 2, r), cfg, whole) for r in range(2)]
    cat = lambda name, dim: torch.cat([s[name] for s in shards], dim=dim)  # noqa: E731
    q = "layers.0."
    assert torch.equal(cat(f"{q}q.weight", 0), whole[f"{p}self_attn.q_proj.weight"])
    assert torch.equal(cat(f"{q}k.weight", 0), whole[f"{p}self_attn.k_proj.weight"])
    assert torch.equal(cat(f"{q}o.weight", 1), whole[f"{p}self_attn.o_proj.weight"])
    assert torch.equal(cat(f"{q}down.weight", 1), whole[f"{p}mlp.down_proj.weight"])
    # A row-parallel bias is added once, by rank 0.
    assert torch.equal(shards[0][f"{q}o.bias"] + shards[1][f"{q}o.bias"], whole[f"{p}self_attn.o_proj.bias"])
    assert all(torch.equal(s[f"{q}input_norm"], whole[f"{p}input_layernorm.weight"]) for s in shards)
    # 250 rows in 2 slices of 125; with 3 ranks, 84 rows each and 2 zero rows of padding.
    assert torch.equal(cat("embed", 0), whole["model.embed_tokens.weight"])
    cfg3 = config(hidden_size=96, intermediate_size=192, num_attention_heads=6, num_key_value_heads=3)
    thirds = [ShardPlan.for_config(cfg3, 3, r) for r in range(3)]
    embed = torch.cat([shard(t, cfg3, whole)["embed"] for t in thirds])
    assert embed.shape == (252, 64)
    assert torch.equal(embed[:250], whole["model.embed_tokens.weight"]) and not embed[250:].any()


def test_the_local_config_describes_the_slice():
    plan = ShardPlan.for_config(config(num_key_value_heads=2), 4, 3)
    local = plan.local_config(config(num_key_value_heads=2))
    assert (local.num_attention_heads, local.num_key_value_heads, local.head_dim) == (1, 1, 16)
    assert (local.intermediate_size, local.vocab_size) == (32, 63)


def test_a_safetensors_checkpoint_is_sliced_without_reading_it_whole(tmp_path):


    model = tiny_llama(kv_heads=2, vocab=254)
    model.save_pretrained(tmp_path)
    loaded = lazy_checkpoint(str(tmp_path))
    assert loaded is not None and lazy_checkpoint(None) is None
    config, lazy = loaded
    whole = model.state_dict()
    for rank in range(4):
        plan = ShardPlan.for_config(config, 4, rank)
        from_file, from_memory = shard(plan, config, lazy), shard(plan, config, whole)
        assert from_file.keys() == from_memory.keys()
        assert all(torch.equal(from_file[k], from_memory[k]) for k in from_file)
