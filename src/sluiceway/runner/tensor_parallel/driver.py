"""`TensorParallelRunner`: the engine's `ModelRunner` in the API process, driving N
rank processes that each hold a slice of the model.

The engine loop does not change: it hands each `StepBatch` to `step` on its model
thread as for one device. `step` sends the batch to rank 0 over a pipe (rank 0
relays it to every rank, see `rank.py`) and waits for rank 0's sampled tokens,
while watching every rank it spawned: a rank that exits, a closed pipe, or (with
`step_timeout`) a step without a reply ends every rank and raises, so the engine
fails its open streams and turns unhealthy at once rather than waiting forever.
"""

from __future__ import annotations

import logging
import multiprocessing
import socket
import threading
import time
from multiprocessing.connection import wait
from typing import Any

import attrs

from sluiceway.engine.batch import SampledToken, StepBatch
from sluiceway.engine.pooling import PooledHidden, PoolingSpec
from sluiceway.runner.tensor_parallel.messages import (
    Masks,
    RankFailed,
    RankSpec,
    Ready,
    Reply,
    Shutdown,
    StepCommand,
    StepDone,
)
from sluiceway.runner.tensor_parallel.rank import spawned_rank_main
from sluiceway.runner.tensor_parallel.sharding import TensorParallelError

log = logging.getLogger(__name__)

# What the fork server imports once for every rank: the heavy libraries a rank and
# the loading of a Llama-family checkpoint use (a module that is missing is
# skipped). Not sluiceway itself: Python 3.11's fork server imports these before
# it takes this process's sys.path, so it could find another copy of sluiceway
# than this process runs; a rank imports sluiceway once it has that path.
_PRELOAD = [
    "torch",
    "torch.distributed",
    "transformers.modeling_rope_utils",
    "transformers.models.llama.modeling_llama",
]
# How long ranks get to exit after a shutdown before they are killed.
_EXIT_GRACE_SECONDS = 10.0


@attrs.frozen
class StepTiming:
    """Where one step's time went, in seconds: `total` as `step` saw it; `rank0` on
    rank 0 from the command's arrival to its reply (so `total - rank0` is the
    pipe and the relay to the other ranks); `collectives` within `rank0`, in
    all-reduces and the logits' gather, waiting for slower ranks included."""

    total: float
    rank0: float
    collectives: float


def free_loopback_port() -> str:
    """`tcp://127.0.0.1:PORT` with a port free now, for ranks on this machine only."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def _picklable(batch: StepBatch) -> StepBatch:
    """`batch` without what lives only in this process: the token masks' fill (sent
    on its own once done) and the choices' compiled grammars (the masks carry what
    the sampler needs of them)."""
    if batch.token_masks is None and all(c.params.grammar is None for c in batch.chunks):
        return batch
    chunks = tuple(
        c if c.params.grammar is None else attrs.evolve(c, params=attrs.evolve(c.params, grammar=None))
        for c in batch.chunks
    )
    return StepBatch(chunks)


class TensorParallelRunner:
    """Implements `sluiceway.engine.batch.ModelRunner` over `spec.world_size` ranks.

    Spawns ranks 0 .. `local_ranks` - 1 on this machine (default: all of them);
    the others join from elsewhere through `spec.init_method` (see
    docs/tensor-parallel.md). The constructor returns once every rank holds its
    weights and KV cache, and raises `TensorParallelError` (after ending the ranks
    it spawned) if one fails first. Construct it on a thread that lives as long
    as the runner: spawned ranks die with that thread (`lifeline.py`).

    `step` must be called from one thread at a time. `close` may be called from
    any thread, at any time, more than once.

    Ending the ranks happens once, on whichever path gets there first (a failed
    step, `close`, a failed start); a second caller waits for the first to finish.
    The pipes are closed only by `close`, and only once no step is using them:
    ending the ranks readies their sentinels, so a step waiting on them returns
    at once and `close` then takes the step lock. So no descriptor is closed
    twice, or closed under a thread still polling or reading it."""

    def __init__(
        self,
        spec: RankSpec,
        *,
        local_ranks: int | None = None,
        step_timeout: float | None = None,
        pooling: PoolingSpec | None = None,
    ) -> None:
        local = spec.world_size if local_ranks is None else local_ranks
        # How the model's embeddings are pooled (None: the runner serves none).
        self.pooling = pooling
        if not 1 <= local <= spec.world_size:
            raise TensorParallelError(f"{local} local ranks of {spec.world_size}")
        self.world_size = spec.world_size
        self.device = spec.device  # the ranks' device type, "cpu" or "cuda"
        self._step_timeout = step_timeout
        # Guards `_failure`, `_closed`, `_ending` and writes to the command pipe.
        self._lock = threading.Lock()
        # Held by `step` throughout, and by `close` while it closes the pipes.
        self._step_lock = threading.Lock()
        self._failure: str | None = None
        self._closed = False
        self._ending = False
        self._ranks_ended = threading.Event()
        # A forkserver child's exit status is read from its sentinel once; two
        # threads joining it at the same time could read it as 255.
        self._join_lock = threading.Lock()
        # Ranks fork from multiprocessing's fork server, a fresh single-threaded
        # process that has imported torch and the model code once: spawning each
        # rank anew paid that import once per rank, at the same time, on the same
        # cores, which on a busy small machine took tens of seconds. Never fork this
        # process itself: it runs threads.
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        lifeline_reader, self._lifeline = context.Pipe(duplex=False)
        self._commands, rank0_end = context.Pipe()
        self._ranks: list[Any] = []
        try:
            for rank in range(local):
                process = context.Process(
                    target=spawned_rank_main,
                    args=(spec, rank, rank0_end if rank == 0 else None, lifeline_reader),
                    name=f"sluiceway-tp-rank{rank}",
                    daemon=True,  # multiprocessing ends it at a normal interpreter exit too
                )
                process.start()
                self._ranks.append(process)
        except BaseException:
            self._abandon_start()
            raise
        finally:
            rank0_end.close()
            lifeline_reader.close()
        try:
            reply = self._reply(timeout=None)
            if not isinstance(reply, Ready):
                raise self._failed(f"unexpected first reply {type(reply).__name__}")
        except BaseException:
            self._abandon_start()
            raise
        self._block_size = reply.block_size
        self._num_blocks = reply.num_blocks
        self.last_step: StepTiming | None = None  # the latest step's (benchmarks)
        log.info(
            "tensor parallel: %d ranks (%d on this machine), KV cache %d blocks of %d tokens each",
            spec.world_size,
            local,
            self._num_blocks,
            self._block_size,
        )

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def rank_pids(self) -> tuple[int, ...]:
        """Process ids of the ranks spawned on this machine, rank 0 first."""
        return tuple(p.pid for p in self._ranks)

    def step(self, batch: StepBatch) -> list[SampledToken]:
        """Run one step on every rank; rank 0's samples, one per chunk with
        `sample=True`, in order. Raises `TensorParallelError` if a rank fails,
        exits, or (with `step_timeout`) does not answer in time; every rank has
        then been ended and every later call raises too. Not interruptible: a
        caller that gives up on it (the engine's watchdog) leaves it to end by
        itself, which the timeout or a rank's exit bounds."""
        if not batch.chunks:
            return []
        with self._step_lock:
            return self._step(batch).tokens

    def step_pooled(self, batch: StepBatch) -> tuple[list[SampledToken], list[PooledHidden]]:
        """`step`, plus rank 0's pooled hidden states of the chunks with `pooling`."""
        with self._step_lock:
            reply = self._step(batch)
        return reply.tokens, reply.pooled

    def _step(self, batch: StepBatch) -> StepDone:
        started = time.perf_counter()
        masks = batch.token_masks
        self._send(StepCommand(_picklable(batch), masks_follow=masks is not None))
        if masks is not None:
            # Filled on a thread of this process while the ranks run the forward pass.
            try:
                bitmask = masks.wait()
            except Exception as exc:
                raise self._failed(f"filling the token masks failed: {exc}") from exc
            self._send(Masks(tuple(masks.rows), bitmask))
        reply = self._reply(timeout=self._step_timeout)
        if not isinstance(reply, StepDone):
            raise self._failed(f"unexpected reply {type(reply).__name__}")
        self.last_step = StepTiming(
            time.perf_counter() - started, reply.rank0_seconds, reply.collective_seconds
        )
        return reply

    def _send(self, message: StepCommand | Masks) -> None:
        with self._lock:
            if self._failure is not None or self._closed:
                raise TensorParallelError(self._failure or "the tensor-parallel runner is closed")
            try:
                self._commands.send(message)
            except OSError:
                raise self._failed("rank 0 is gone (its pipe is closed)") from None

    def close(self) -> None:
        """Ask the ranks to exit, wait up to `_EXIT_GRACE_SECONDS` for them, then
        kill any left, and close the pipes once no step uses them; returns once
        every spawned rank has ended. A later call returns at once; a concurrent
        one returns once the first has ended the ranks. A step in flight on
        another thread raises `TensorParallelError` (its ranks are gone)."""
        with self._lock:
            if self._closed:
                closing_elsewhere = True
            else:
                closing_elsewhere = False
                self._closed = True
                if self._failure is None and not self._ending:
                    try:
                        self._commands.send(Shutdown())
                    except OSError:
                        pass
        self._end_ranks(grace=_EXIT_GRACE_SECONDS)
        if not closing_elsewhere:
            self._close_pipes()

    def _abandon_start(self) -> None:
        """End a start that failed at once: nobody holds this runner to close it."""
        with self._lock:
            self._closed = True
        self._end_ranks()
        self._close_pipes()

    def _close_pipes(self) -> None:
        """Close the pipes, once the ranks have ended and no step uses them."""
        with self._step_lock:
            self._lifeline.close()
            self._commands.close()

    def _reply(self, timeout: float | None) -> Reply:
        """Rank 0's next reply; raises (after ending every rank) when a rank exits,
        rank 0 reports a failure, or `timeout` seconds pass first."""
        sentinels = {p.sentinel: p for p in self._ranks}
        ready = wait([self._commands, *sentinels], timeout=timeout)
        if self._commands in ready:
            try:
                reply: Reply = self._commands.recv()
            except (EOFError, OSError):
                reply = RankFailed(self._exit_reason() or "rank 0 closed its pipe")
            if isinstance(reply, RankFailed):
                raise self._failed(reply.reason)
            return reply
        if ready:
            for sentinel in ready:
                # Its pipe closes as it exits, a moment before its status is ready.
                self._join(sentinels[sentinel], timeout=1.0)
            raise self._failed(self._exit_reason() or "a rank exited")
        raise self._failed(f"no reply from the ranks within {timeout} s")

    def _exit_reason(self) -> str | None:
        for rank, process in enumerate(self._ranks):
            self._join(process, timeout=0)
            if process.exitcode is not None:
                how = (
                    f"was killed by signal {-process.exitcode}"
                    if process.exitcode < 0
                    else f"exited with status {process.exitcode}"
                )
                return f"tensor-parallel rank {rank} (pid {process.pid}) {how}"
        return None

    def _failed(self, reason: str) -> TensorParallelError:
        """Record `reason`, end every rank, and return the error to raise."""
        with self._lock:
            self._failure = self._failure or reason
        log.error("tensor parallel failed: %s; ending every rank", reason)
        self._end_ranks()
        return TensorParallelError(reason)

    def _end_ranks(self, grace: float = 0.0) -> None:
        """End every spawned rank: wait up to `grace` seconds for it to exit, then
        kill it. Runs once; a call while another is under way waits for that one,
        a later call returns at once. Closes no descriptor (see the class doc)."""
        with self._lock:
            first = not self._ending
            self._ending = True
        if not first:
            self._ranks_ended.wait()
            return
        try:
            deadline = time.monotonic() + grace
            for process in self._ranks:
                self._join(process, timeout=max(0.0, deadline - time.monotonic()))
            for process in self._ranks:
                if process.exitcode is None:
                    process.kill()
            for process in self._ranks:
                self._join(process, timeout=None)
        finally:
            self._ranks_ended.set()

    def _join(self, process: Any, timeout: float | None) -> None:
        with self._join_lock:
            process.join(timeout=timeout)
