"""The synchronous engine core: requests in, one model step at a time, deltas out.

No trio and no torch here. The trio `Engine` owns one `EngineCore` and is the only
caller of its methods; `step` runs in a worker thread while the event loop keeps
serving, so scheduling, detokenization and stop checks never stall other streams.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Sequence
from typing import cast

import attrs

from sluiceway.engine.batch import (
    ModelRunner,
    PoolingModelRunner,
    SampledToken,
    ScheduledChunk,
    StepBatch,
)
from sluiceway.engine.block_manager import BlockManager
from sluiceway.engine.constraint import MaskFiller, TokenMasks, TokenMatcher, default_mask_filler
from sluiceway.engine.detokenizer import Decode, IncrementalDetokenizer
from sluiceway.engine.errors import PromptTooLongError
from sluiceway.engine.outputs import ChoiceDelta, FinishReason, TokenLogprob
from sluiceway.engine.pooling import PooledHidden, Pooling, PoolingSpec
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.engine.scheduler import ScheduledWork, Scheduler
from sluiceway.engine.sequence import Sequence as Seq


@attrs.frozen
class EngineStats:
    """A snapshot of the engine's load and lifetime counters."""

    num_running_seqs: int
    num_waiting_seqs: int
    kv_blocks_used: int
    kv_blocks_total: int
    num_preemptions_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    prefix_cache_queries_total: int = 0
    prefix_cache_hits_total: int = 0
    num_constrained_seqs: int = 0
    grammar_mask_rows_total: int = 0
    grammar_mask_fill_seconds_total: float = 0.0
    grammar_mask_wait_seconds_total: float = 0.0
    # The LoRA adapters (ids, then names where the engine knows them) of the
    # sequences running and waiting, and how many the runner keeps loaded (0: it
    # serves no adapters).
    running_lora_ids: tuple[int, ...] = ()
    waiting_lora_ids: tuple[int, ...] = ()
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()
    max_lora: int = 0


class EngineCore:
    """Owns sequences, the scheduler and the block manager for one model runner.

    Not thread-safe: exactly one caller at a time (the engine loop, or a script).
    """

    def __init__(
        self,
        runner: ModelRunner,
        decode: Decode,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        eos_token_ids: Iterable[int],
        max_model_len: int,
        enable_prefix_caching: bool = True,
        mask_filler: MaskFiller | None = None,
        background_step_tokens: int = 1,
        max_loras: int = 0,
    ) -> None:
        """`mask_filler` fills the next-token masks of constrained choices (default:
        llguidance's, loaded when a request first has a grammar). `max_loras`: the
        distinct LoRA adapters a step may serve, those the runner keeps loaded
        (0: no limit)."""
        self.runner = runner
        # Embeddings are served when the runner can pool (`PoolingModelRunner`).
        self.pooling: PoolingSpec | None = getattr(runner, "pooling", None)
        self._pooling_runner = cast(PoolingModelRunner, runner) if self.pooling else None
        self._mask_filler = mask_filler
        self._decode = decode
        self.blocks = BlockManager(runner.num_blocks, runner.block_size, enable_prefix_caching)
        self.scheduler = Scheduler(
            self.blocks, max_num_seqs, max_num_batched_tokens, background_step_tokens, max_loras
        )
        self.eos_token_ids = frozenset(eos_token_ids)
        # A sequence must fit in the cache on its own, or preemption could never
        # make room for it.
        self.max_model_len = min(max_model_len, runner.num_blocks * runner.block_size)
        self._seqs: dict[int, Seq] = {}
        self._requests: dict[int, list[Seq]] = {}
        self._next_seq_id = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        # Constrained rows masked, the time their masks took to fill beside the
        # model, and the part of it that steps waited for.
        self.mask_rows_total = 0
        self.mask_fill_seconds_total = 0.0
        self.mask_wait_seconds_total = 0.0

    # ---- requests -------------------------------------------------------------

    def add_request(
        self,
        request_id: int,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        n: int = 1,
        *,
        group: Hashable = None,
        pooling: Pooling | None = None,
        background: bool = False,
    ) -> list[int]:
        """Queue `n` choices of one prompt; returns their sequence ids (choice order).

        Requests of one `group` (say, the prompts of one client request) share one
        fair turn for sequence slots; None gives the request a group of its own.
        With `pooling` the request is an embedding (`n` must be 1): its prompt runs
        and it finishes with one delta carrying the pooled hidden state. A
        `background` request (a Batch API line) yields to every other (`Scheduler`).
        Raises PromptTooLongError if the prompt leaves no room for one new token
        (for an embedding: if it is longer than the context), ValueError for an
        empty prompt, a duplicate request id, or `pooling` on a runner that cannot
        pool.
        """
        self.check_prompt(prompt_token_ids, embedding=pooling is not None)
        if pooling is not None and self.pooling is None:
            raise ValueError("this model runner does not produce embeddings")
        if pooling is not None and n != 1:
            raise ValueError("an embedding has one choice")
        if request_id in self._requests:
            raise ValueError(f"request id {request_id} is already in use")
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        seqs = [self._new_sequence(request_id, j, prompt_token_ids, params, seed) for j in range(n)]
        for seq in seqs:
            seq.pooling = pooling
            seq.background = background
            # Without a group the request is its own, keyed apart from the ints and
            # objects callers pass as groups.
            seq.group = ("request", request_id) if group is None else group
            self._seqs[seq.seq_id] = seq
            self.scheduler.add(seq)
        self._requests[request_id] = seqs
        self.prompt_tokens_total += len(prompt_token_ids)
        return [s.seq_id for s in seqs]

    def check_prompt(self, prompt_token_ids: Sequence[int], *, embedding: bool = False) -> None:
        """Raise ValueError for an empty prompt, PromptTooLongError if it leaves no
        room for one generated token (for an `embedding`: if it outgrows the context)."""
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        if embedding:
            if len(prompt_token_ids) > self.max_model_len:
                raise PromptTooLongError(
                    f"the input has {len(prompt_token_ids)} tokens; this model's context "
                    f"holds {self.max_model_len}"
                )
            return
        if len(prompt_token_ids) + 1 > self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_token_ids)} tokens; this model's context "
                f"holds {self.max_model_len} including at least one generated token"
            )

    def has_request(self, request_id: int) -> bool:
        return request_id in self._requests

    def _new_sequence(
        self, request_id: int, index: int, prompt: Sequence[int], params: SamplingParams, seed: int
    ) -> Seq:
        detokenizer = IncrementalDetokenizer.for_prompt(
            self._decode, prompt, params.stop, params.include_stop_str_in_output
        )
        seq_id = self._next_seq_id
        self._next_seq_id += 1
        seq = Seq(seq_id, request_id, index, params, seed, list(prompt), len(prompt), detokenizer)
        if params.grammar is not None:
            seq.matcher = params.grammar.new_matcher()
        return seq

    def abort_request(self, request_id: int) -> list[int]:
        """Drop every unfinished choice of a request and free its blocks at once.

        Returns the aborted sequence ids; an unknown or finished request is a no-op.
        """
        seqs = self._requests.pop(request_id, [])
        aborted = []
        for seq in seqs:
            if self._seqs.pop(seq.seq_id, None) is not None:
                self.scheduler.remove(seq)
                aborted.append(seq.seq_id)
        return aborted

    def abort_all(self) -> None:
        """Drop every request (the engine failed): all KV blocks become free."""
        for request_id in list(self._requests):
            self.abort_request(request_id)

    def next_step_only_decodes(self, max_seqs: int) -> bool:
        """Whether the next step decodes one to `max_seqs` sequences and nothing
        else: no request waits and every running prompt is fully computed. Looks
        at the sequences only when there are few enough."""
        running = self.scheduler.running
        if self.scheduler.waiting or not 0 < len(running) <= max_seqs:
            return False
        return all(seq.num_uncomputed_tokens == 1 for seq in running)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def foreground_load(self) -> tuple[int, int]:
        """(running, waiting) sequences that are not background ones."""
        scheduler = self.scheduler
        if not scheduler.num_background:
            return len(scheduler.running), len(scheduler.waiting)
        running = sum(1 for seq in scheduler.running if not seq.background)
        waiting = sum(1 for seq in scheduler.waiting if not seq.background)
        return running, waiting

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running_seqs=len(self.scheduler.running),
            num_waiting_seqs=len(self.scheduler.waiting),
            kv_blocks_used=self.blocks.num_used,
            kv_blocks_total=self.blocks.num_blocks,
            num_preemptions_total=self.scheduler.num_preemptions,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            prefix_cache_queries_total=self.scheduler.prefix_cache_queries,
            prefix_cache_hits_total=self.scheduler.prefix_cache_hits,
            num_constrained_seqs=sum(1 for s in self._seqs.values() if s.matcher is not None),
            grammar_mask_rows_total=self.mask_rows_total,
            grammar_mask_fill_seconds_total=self.mask_fill_seconds_total,
            grammar_mask_wait_seconds_total=self.mask_wait_seconds_total,
            running_lora_ids=_adapters(self.scheduler.running),
            waiting_lora_ids=_adapters(self.scheduler.waiting),
        )

    # ---- the step -------------------------------------------------------------

    def step(self) -> list[tuple[int, ChoiceDelta]]:
        """Schedule, run the model (once, plus once for each embedding chunk), and
        turn the samples and pooled states into per-choice deltas.

        Returns (sequence id, delta) pairs; a delta with a finish_reason is that
        choice's last. If the runner raises, the exception propagates and the
        engine's state must be considered lost.
        """
        plan = self.scheduler.schedule()
        if not plan.work:
            if self.has_work():
                raise RuntimeError("the scheduler could not schedule any work")
            return []
        for seq in plan.preempted:
            seq.pooled_sum = None  # its hidden states are recomputed from the start
        sampling = [w.seq for w in plan.work if w.completes_sequence and w.seq.pooling is None]
        token_masks = self._start_masks(sampling)  # filled beside the model
        # Every chunk of an embedding runs on its own, before the rest: its vector
        # then depends on its own tokens alone, not on what shares the step (half
        # precision rounds a row differently in a larger matmul, and quantized
        # layers switch kernels with the row count). First, because a sequence
        # later in the step may reuse the blocks it fills.
        pooling: list[tuple[Seq, bool]] = []
        pooled: list[PooledHidden] = []
        for w in plan.work:
            if w.seq.pooling is not None:
                pooled.extend(self._run_embedding_chunk(w))
                if self._pools(w):
                    pooling.append((w.seq, w.completes_sequence))
        batch = StepBatch(
            tuple(self._chunk(w) for w in plan.work if w.seq.pooling is None), token_masks
        )
        samples = self.runner.step(batch) if batch.chunks else []
        if batch.token_masks is not None:
            masks = batch.token_masks
            self.mask_rows_total += len(masks.rows)
            self.mask_fill_seconds_total += masks.fill_seconds
            self.mask_wait_seconds_total += masks.wait_seconds
        if len(samples) != len(sampling):
            raise RuntimeError(f"runner returned {len(samples)} samples for {len(sampling)} chunks")
        for w in plan.work:
            w.seq.num_computed_tokens += w.num_tokens
        deltas = [(seq.seq_id, self._accept(seq, sample)) for seq, sample in zip(sampling, samples, strict=True)]
        if pooling:
            deltas.extend(self._pool(pooling, pooled))
        return deltas

    def _pool(
        self, pooling: list[tuple[Seq, bool]], pooled: list[PooledHidden]
    ) -> list[tuple[int, ChoiceDelta]]:
        """Add the pooled rows to their sequences; finish those whose prompt is done."""
        if len(pooled) != len(pooling):
            raise RuntimeError(f"runner returned {len(pooled)} pooled rows for {len(pooling)} chunks")
        finished = []
        for (seq, completes), row in zip(pooling, pooled, strict=True):
            if seq.pooling == "mean" and seq.pooled_sum is not None:
                seq.pooled_sum = [a + b for a, b in zip(seq.pooled_sum, row.values, strict=True)]
            else:
                seq.pooled_sum = list(row.values)
            if not completes:
                continue
            total = seq.pooled_sum
            if seq.pooling == "mean":
                total = [v / seq.num_prompt_tokens for v in total]
            self._finish(seq)
            delta = ChoiceDelta(
                token_ids=(),
                text="",
                finish_reason="stop",
                num_prompt_tokens=seq.num_prompt_tokens,
                num_cached_prompt_tokens=seq.num_cached_prompt_tokens,
                embedding=tuple(total),
            )
            finished.append((seq.seq_id, delta))
        return finished

    def _run_embedding_chunk(self, work: ScheduledWork) -> list[PooledHidden]:
        """Run one chunk of an embedding sequence as a batch of its own; its pooled
        row, if it asks for one."""
        assert self._pooling_runner is not None  # add_request refuses embeddings otherwise
        _, pooled = self._pooling_runner.step_pooled(StepBatch((self._chunk(work),)))
        return pooled

    @staticmethod
    def _pools(work: ScheduledWork) -> bool:
        """Whether this chunk of an embedding sequence asks the runner for hidden
        states: every chunk of a mean, the last chunk of a last."""
        return work.seq.pooling == "mean" or work.completes_sequence

    def _start_masks(self, sampling: list[Seq]) -> TokenMasks | None:
        """Start filling the masks of the constrained rows, to run beside the model."""
        rows: list[tuple[int, TokenMatcher]] = [
            (row, seq.matcher) for row, seq in enumerate(sampling) if seq.matcher is not None
        ]
        if not rows:
            return None
        if self._mask_filler is None:
            self._mask_filler = default_mask_filler()
        return self._mask_filler(rows)

    def _chunk(self, work: ScheduledWork) -> ScheduledChunk:
        seq = work.seq
        start = seq.num_computed_tokens
        sample = work.completes_sequence and seq.pooling is None
        params = seq.params
        penalties = sample and params.needs_penalties
        return ScheduledChunk(
            seq_id=seq.seq_id,
            token_ids=seq.token_ids[start : start + work.num_tokens],
            start_pos=start,
            block_table=list(seq.block_ids),
            sample=sample,
            params=params,
            step_seed=seq.next_step_seed() if sample else 0,
            suppressed_token_ids=self._suppressed(seq) if sample else (),
            prompt_token_ids=seq.prompt_token_ids if penalties else (),
            output_token_ids=seq.output_token_ids if penalties else (),
            pooling=seq.pooling if seq.pooling is not None and self._pools(work) else None,
        )

    def _suppressed(self, seq: Seq) -> tuple[int, ...]:
        if seq.num_output_tokens >= seq.params.min_tokens:
            return ()
        eos = () if seq.params.ignore_eos else tuple(self.eos_token_ids)
        return eos + seq.params.stop_token_ids

    def _accept(self, seq: Seq, sample: SampledToken) -> ChoiceDelta:
        token = sample.token_id
        seq.token_ids.append(token)
        self.generation_tokens_total += 1
        params = seq.params
        finish: FinishReason | None = None
        stop_reason: str | int | None = None
        text = ""
        min_met = seq.num_output_tokens >= params.min_tokens
        error: str | None = None
        if min_met and not params.ignore_eos and token in self.eos_token_ids:
            finish = "stop"
        elif min_met and token in params.stop_token_ids:
            finish, stop_reason = "stop", token
        else:
            released = seq.detokenizer.add_token(token)
            text = released.text
            if released.stop is not None:
                finish, stop_reason = "stop", released.stop
            elif seq.matcher is not None:
                finish, error = self._advance_matcher(seq.matcher, token)
        if finish is None and (
            (params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens)
            or seq.num_tokens >= self.max_model_len
        ):
            finish = "length"
        if finish is not None and not isinstance(stop_reason, str):
            # Text held back for a possible stop string or an unfinished
            # character is released; after a stop string the rest is dropped.
            flushed = seq.detokenizer.flush()
            text += flushed.text
            if flushed.stop is not None:
                finish, stop_reason = "stop", flushed.stop
        logprobs: tuple[TokenLogprob, ...] = ()
        if params.logprobs is not None:
            logprobs = (TokenLogprob(token, sample.logprob, sample.top_logprobs),)
        if finish is not None:
            self._finish(seq)
        return ChoiceDelta(
            token_ids=(token,),
            text=text,
            finish_reason=finish,
            stop_reason=stop_reason,
            error=error,
            logprobs=logprobs,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            num_cached_prompt_tokens=seq.num_cached_prompt_tokens,
        )

    @staticmethod
    def _advance_matcher(
        matcher: TokenMatcher, token: int
    ) -> tuple[FinishReason | None, str | None]:
        """Follow `token` in the grammar: a complete grammar finishes the choice now
        (nothing but its end could follow). The mask allowed only tokens the grammar
        accepts, so a refusal means the matcher failed: the choice ends in error
        rather than return output that does not match."""
        if not matcher.accept_token(token):
            return "error", f"the output grammar failed: {matcher.error() or 'token refused'}"
        if matcher.is_stopped():
            return "stop", None
        return None, None

    def _finish(self, seq: Seq) -> None:
        self.scheduler.remove(seq)
        del self._seqs[seq.seq_id]
        siblings = self._requests.get(seq.request_id, [])
        if all(s.seq_id not in self._seqs for s in siblings):
            self._requests.pop(seq.request_id, None)


def _adapters(seqs: Iterable[Seq]) -> tuple[int, ...]:
    """The distinct LoRA adapter ids of `seqs`, in order, the base model's left out."""
    return tuple(sorted({s.params.lora_id for s in seqs} - {0}))
