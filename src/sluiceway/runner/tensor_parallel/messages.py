"""What crosses between the API process and the ranks: how a rank starts (`RankSpec`),
the commands rank 0 relays to every rank, and rank 0's replies. All frozen and
picklable: they travel through a pipe and `broadcast_object_list`."""

from __future__ import annotations

from typing import Any

import attrs

from sluiceway.engine.batch import SampledToken, StepBatch
from sluiceway.engine.pooling import PooledHidden


@attrs.frozen
class CheckpointSource:
    """Load the weights from a checkpoint (`load_model(model, dtype)`; None: the
    default model), on each rank."""

    model: str | None
    dtype: str = "auto"


@attrs.frozen(eq=False)
class WeightsSource:
    """Weights already in memory (a whole, unsplit state dict and its transformers
    config), pickled to each rank: for tests and tiny models."""

    hf_config: Any
    state_dict: dict[str, Any]
    dtype: Any  # a torch.dtype; Any keeps this module free of torch


@attrs.frozen(eq=False)
class RankSpec:
    """Everything a rank needs to start; every rank of one model gets the same.

    `init_method` is torch.distributed's rendezvous (`tcp://host:port`), where
    rank 0 hosts the store. `device` is "cpu" (gloo) or "cuda" (nccl, a GPU per
    rank by its local rank). The KV cache is `num_blocks` blocks when given, else
    what fits `kv_cache_bytes` on each rank (all ranks then take the smallest
    count), stored as `kv_cache_dtype` says. `torch_threads` caps each rank's intra-op threads (None: torch's
    default). `quantization` is the linear slices' weight path (None, "int8" or
    "int4"), decided once for the split model (`quantization.py`).

    Rank 0's `quantization` and checkpoint dtype are the ones every rank uses (see
    `rank.py`): a rank started on another machine from the server's flags would
    otherwise decide "auto" by its own CPU."""

    world_size: int
    init_method: str
    source: CheckpointSource | WeightsSource
    device: str = "cpu"
    attention_backend: str = "auto"
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_dtype: str = "auto"
    torch_threads: int | None = None
    quantization: str | None = None


@attrs.frozen
class StepCommand:
    """Run `batch` (which carries no token masks). With `masks_follow`, the API
    process sends the step's `Masks` next, once filled: rank 0 reads them after
    its forward pass, so the fill still runs beside the model."""

    batch: StepBatch
    masks_follow: bool = False


@attrs.define(eq=False)  # not frozen: `TokenMasks` declares its timings writable
class Masks:
    """A step's filled next-token masks, as the sampler reads a `TokenMasks`:
    `bitmask` (numpy int32 `[len(rows), ceil(vocab / 32)]`) for the sampled `rows`.
    Never changed once sent."""

    rows: tuple[int, ...]
    bitmask: Any
    fill_seconds: float = 0.0
    wait_seconds: float = 0.0

    def wait(self) -> Any:
        return self.bitmask


@attrs.frozen
class Heartbeat:
    """Sent by rank 0 when the engine has been idle for a while, so that the other
    ranks' wait for the next command never runs into the process group's timeout."""


@attrs.frozen
class Shutdown:
    pass


Command = StepCommand | Heartbeat | Shutdown


@attrs.frozen
class Ready:
    """Rank 0, once every rank holds its weights and KV cache."""

    num_blocks: int
    block_size: int


@attrs.frozen
class StepDone:
    """Rank 0's samples and pooled hidden states (`ScheduledChunk.pooling`), and
    where its time went: the whole step on rank 0 (from the command's arrival to
    the reply), and the part spent in collectives."""

    tokens: list[SampledToken]
    pooled: list[PooledHidden] = attrs.field(factory=list)
    rank0_seconds: float = 0.0
    collective_seconds: float = 0.0


@attrs.frozen
class RankFailed:
    """Rank 0 could not start or finish a step; it exits after sending this."""

    reason: str  # one line


Reply = Ready | StepDone | RankFailed
