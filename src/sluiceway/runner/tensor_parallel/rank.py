"""A tensor-parallel rank: a process holding one slice of the model and of the KV
cache, stepping in lockstep with the other ranks.

Rank 0 takes commands from the API process over a pipe and relays each one to
every rank with `broadcast_object_list` (on a gloo group, also under NCCL); all
ranks run the step; rank 0 samples from the gathered logits and replies. A
command is a step, a heartbeat (so an idle server never runs into the process
group's timeout) or a shutdown. Any failure ends the rank's process: the API
process notices it (an exited rank, a closed pipe, a step without a reply) and
fails the engine; a rank left waiting on a dead peer's collective is ended by
its lifeline or by the peer's closed connection.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

import attrs
import torch
import torch.distributed as dist

from sluiceway.engine.batch import StepBatch
from sluiceway.runner.tensor_parallel.lifeline import die_with_parent
from sluiceway.runner.tensor_parallel.messages import (
    CheckpointSource,
    Command,
    Heartbeat,
    Masks,
    RankFailed,
    RankSpec,
    Ready,
    Shutdown,
    StepCommand,
    StepDone,
)
from sluiceway.runner.tensor_parallel.sharded_model import ShardRunner
from sluiceway.runner.tensor_parallel.sharding import ShardPlan

log = logging.getLogger(__name__)

# How long a collective may wait (the process group's timeout): long enough for the
# slowest rank to load its weights at start-up. A hung step is caught sooner, by
# the API process's step watchdog.
GROUP_TIMEOUT = datetime.timedelta(minutes=10)
# Rank 0 relays a heartbeat after this long without a command.
HEARTBEAT_SECONDS = 60.0


def spawned_rank_main(
    spec: RankSpec, rank: int, commands: Connection | None, lifeline: Connection
) -> None:
    """Entry point of a rank that sluiceway started on this machine."""
    die_with_parent(lifeline)
    run_rank(spec, rank, local_rank=rank, commands=commands)
    # Shut down cleanly: skip the interpreter's teardown of torch (seconds on a
    # busy machine), which the API process would wait for.
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)


def run_rank(spec: RankSpec, rank: int, *, local_rank: int, commands: Connection | None) -> None:
    """Join the process group, build this rank's shard, then serve commands until a
    shutdown. Rank 0 must have `commands` (its pipe to the API process). Exits the
    process with status 1 on any failure, after telling the API process why where
    this is rank 0."""
    if spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    try:
        device = torch.device(f"cuda:{local_rank}" if spec.device == "cuda" else "cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=spec.init_method,
            rank=rank,
            world_size=spec.world_size,
            timeout=GROUP_TIMEOUT,
        )
        # Commands are Python objects: they travel on the CPU whatever the device.
        cpu_group = (
            dist.new_group(backend="gloo", timeout=GROUP_TIMEOUT) if device.type == "cuda" else None
        )
        spec = _with_rank0_decisions(spec, cpu_group)
        shard = _build_shard(spec, rank, device, cpu_group)
        if commands is not None:
            commands.send(Ready(num_blocks=shard.num_blocks, block_size=spec.block_size))
        _serve(shard, rank, commands, cpu_group)
    except BaseException as exc:
        reason = _first_line(exc)
        log.exception("tensor-parallel rank %d failed", rank)
        if commands is not None:
            try:
                commands.send(RankFailed(f"rank {rank}: {type(exc).__name__}: {reason}"))
            except OSError:
                pass  # the API process is gone
        sys.stderr.flush()
        os._exit(1)  # a collective of another thread may still hold this process
    if dist.is_initialized():
        dist.destroy_process_group()


def _with_rank0_decisions(spec: RankSpec, cpu_group) -> RankSpec:
    """`spec` with rank 0's weight path and checkpoint dtype. A rank started on
    another machine built its spec from the server's flags ("auto" for both) and
    would decide them by its own CPU; ranks whose slices differ in either would
    sum partial products of two different models, without an error."""
    source = spec.source
    decided: list[Any] = [
        spec.quantization,
        source.dtype if isinstance(source, CheckpointSource) else None,
    ]
    dist.broadcast_object_list(decided, src=0, group=cpu_group)
    quantization, dtype = decided
    if isinstance(source, CheckpointSource) and dtype is not None:
        source = attrs.evolve(source, dtype=dtype)
    return attrs.evolve(spec, quantization=quantization, source=source)


def _build_shard(spec: RankSpec, rank: int, device: torch.device, cpu_group) -> ShardRunner:
    from sluiceway.runner.kernels.backend import select_attention_backend

    source = spec.source
    state_dict: Mapping[str, Any]
    if isinstance(source, CheckpointSource):
        from sluiceway.runner.loading import load_model, resolve_dtype
        from sluiceway.runner.tensor_parallel.checkpoint import lazy_checkpoint

        lazy = lazy_checkpoint(source.model)
        if lazy is not None:  # read just this rank's slices
            hf_config, state_dict = lazy
            dtype = resolve_dtype(source.dtype)  # as the API process resolved it
        else:
            loaded = load_model(source.model, source.dtype, progress=False)
            hf_config, state_dict, dtype = loaded.hf_config, loaded.state_dict(), loaded.dtype
            loaded.module = None
    else:
        hf_config, state_dict, dtype = source.hf_config, source.state_dict, source.dtype
    plan = ShardPlan.for_config(hf_config, spec.world_size, rank)
    shard = ShardRunner(
        hf_config,
        state_dict,
        plan,
        dtype=dtype,
        device=device,
        block_size=spec.block_size,
        num_blocks=spec.num_blocks,
        kv_cache_bytes=spec.kv_cache_bytes,
        kv_cache_dtype=spec.kv_cache_dtype,
        attention=select_attention_backend(
            spec.attention_backend, device.type, kv_cache_dtype=spec.kv_cache_dtype
        ),
        cpu_group=cpu_group,
        quantization=spec.quantization,
    )
    del state_dict  # this rank keeps only its slices
    return shard


def _serve(shard: ShardRunner, rank: int, commands: Connection | None, cpu_group) -> None:
    from sluiceway.runner.sampler import sample

    while True:
        local: Command | None = _next_command(commands) if rank == 0 else None
        relayed: list[Command | None] = [_for_other_ranks(local)]
        try:
            dist.broadcast_object_list(relayed, src=0, group=cpu_group)
        except RuntimeError as exc:
            if rank == 0:
                raise
            # Waiting for the next command, not inside a step: rank 0 is gone,
            # which is how a rank on another machine learns that the server stopped.
            log.warning("rank %d: rank 0 went away (%s); exiting", rank, _first_line(exc))
            sys.stderr.flush()
            os._exit(1)
        command = local if rank == 0 else relayed[0]
        if isinstance(command, Shutdown):
            return
        if not isinstance(command, StepCommand):
            continue  # a heartbeat
        started = time.perf_counter()
        shard.model.collective_seconds = 0.0
        with torch.inference_mode():
            logits, pooled = shard.run(command.batch.chunks)
            if commands is not None:
                sampling = [c for c in command.batch.chunks if c.sample]
                masks = _masks(commands) if command.masks_follow else None
                tokens = sample(logits, sampling, masks) if sampling else []
                commands.send(
                    StepDone(
                        tokens,
                        pooled,
                        rank0_seconds=time.perf_counter() - started,
                        collective_seconds=shard.model.collective_seconds,
                    )
                )


def _masks(commands: Connection) -> Masks:
    """Rank 0: the token masks the API process sends after a step's command."""
    masks = commands.recv()
    if not isinstance(masks, Masks):
        raise TypeError(f"expected the step's token masks, got {type(masks).__name__}")
    return masks


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def _next_command(commands: Connection | None) -> Command:
    """Rank 0: the API process's next command, or a heartbeat after a quiet spell;
    a closed pipe (the API process is gone) is a shutdown."""
    assert commands is not None
    try:
        if not commands.poll(HEARTBEAT_SECONDS):
            return Heartbeat()
        command = commands.recv()
    except (EOFError, OSError):
        return Shutdown()
    if not isinstance(command, StepCommand | Heartbeat | Shutdown):
        raise TypeError(f"unexpected command {type(command).__name__}")
    return command


def _for_other_ranks(command: Command | None) -> Command | None:
    """What the other ranks need of `command`: a step's chunks without the token
    histories that only sampling (rank 0) reads, which grow with every token."""
    if not isinstance(command, StepCommand):
        return command
    chunks = tuple(
        attrs.evolve(c, prompt_token_ids=(), output_token_ids=(), suppressed_token_ids=())
        for c in command.batch.chunks
    )
    return StepCommand(StepBatch(chunks))
