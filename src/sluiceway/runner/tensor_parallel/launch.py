"""Starting the ranks for a served model: where they rendezvous, how many run on
this machine, on which device, with how many threads each.

On one machine (no MASTER_ADDR in the environment) sluiceway spawns every rank
and picks a free loopback port. Across machines the API process reads the
torchrun-style variables MASTER_ADDR, MASTER_PORT, WORLD_SIZE and
LOCAL_WORLD_SIZE (how many ranks it spawns here: ranks 0 .. LOCAL_WORLD_SIZE-1);
the other ranks are started on their machines with `python -m
sluiceway.runner.tensor_parallel.remote` (see docs/tensor-parallel.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from sluiceway.config import EngineConfig, ModelConfig
from sluiceway.engine.pooling import PoolingSpec
from sluiceway.runner.tensor_parallel.driver import TensorParallelRunner, free_loopback_port
from sluiceway.runner.tensor_parallel.messages import CheckpointSource, RankSpec
from sluiceway.runner.tensor_parallel.sharding import ShardPlan, TensorParallelError
from sluiceway.runner.threads import available_cores

DEFAULT_MASTER_PORT = 29500


def rendezvous(world_size: int, environ: Mapping[str, str] = os.environ) -> tuple[str, int]:
    """`(init_method, ranks to spawn on this machine)` for `world_size` ranks."""
    if "MASTER_ADDR" not in environ:
        return free_loopback_port(), world_size
    declared = environ.get("WORLD_SIZE")
    if declared is not None and int(declared) != world_size:
        raise TensorParallelError(
            f"WORLD_SIZE={declared} but the tensor-parallel size is {world_size}"
        )
    port = int(environ.get("MASTER_PORT", DEFAULT_MASTER_PORT))
    local = int(environ.get("LOCAL_WORLD_SIZE", world_size))
    return f"tcp://{environ['MASTER_ADDR']}:{port}", local


def rank_spec(
    model: ModelConfig,
    engine: EngineConfig,
    *,
    init_method: str,
    device: str,
    local_ranks: int,
    quantization: str | None = None,
    dtype: str | None = None,
) -> RankSpec:
    """The spec every rank of `model` starts from (the same on every machine), with
    the weight path and dtype decided for it (`quantization`: None, "int8" or
    "int4"; `dtype` None: `model.dtype`). Ranks take rank 0's decisions of both."""
    threads = None
    if device == "cpu":
        # Ranks on one machine share its cores; more threads than cores would
        # leave ranks waiting at each collective for a descheduled peer.
        threads = max(1, (model.threads or available_cores()) // local_ranks)
    return RankSpec(
        world_size=model.tensor_parallel_size,
        init_method=init_method,
        source=CheckpointSource(model.model, dtype or model.dtype),
        device=device,
        attention_backend=model.attention_backend,
        block_size=engine.block_size,
        num_blocks=engine.num_kv_blocks,
        kv_cache_bytes=None if engine.num_kv_blocks else engine.kv_cache_memory_bytes,
        kv_cache_dtype=engine.kv_cache_dtype,
        torch_threads=threads,
        quantization=quantization,
    )


def start_ranks(
    model: ModelConfig,
    engine: EngineConfig,
    hf_config,
    device: str,
    pooling: PoolingSpec | None = None,
    *,
    quantization: str | None = None,
    dtype: str | None = None,
) -> TensorParallelRunner:
    """Check that `hf_config` splits over `model.tensor_parallel_size` ranks (a
    one-line `TensorParallelError` if not, before anything starts), then start
    the ranks and return their runner once every one has loaded its slice in
    `dtype` (None: `model.dtype`) on weight path `quantization` (decided by
    `quantization.sharded_quantization`); it serves embeddings pooled as
    `pooling` says (None: none)."""
    size = model.tensor_parallel_size
    ShardPlan.for_config(hf_config, size)
    init_method, local = rendezvous(size)
    if device == "cuda":
        import torch

        if torch.cuda.device_count() < local:
            raise TensorParallelError(
                f"{local} tensor-parallel ranks on this machine need {local} GPUs; it has "
                f"{torch.cuda.device_count()}"
            )
    spec = rank_spec(
        model,
        engine,
        init_method=init_method,
        device=device,
        local_ranks=local,
        quantization=quantization,
        dtype=dtype,
    )
    return TensorParallelRunner(
        spec, local_ranks=local, step_timeout=engine.step_timeout, pooling=pooling
    )
