"""Continuous batching: which sequences run how many tokens in the next step."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable

import attrs

from sluiceway.engine.block_manager import BlockManager, block_key, chain_hash, root_hash
from sluiceway.engine.lora_modules import BASE_LORA_ID
from sluiceway.engine.sequence import Sequence, SequenceStatus


@attrs.frozen
class ScheduledWork:
    """One sequence and how many of its uncomputed tokens run this step."""

    seq: Sequence
    num_tokens: int

    @property
    def completes_sequence(self) -> bool:
        """The chunk reaches the last known token, so the step samples a new one."""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens


@attrs.frozen
class SchedulerOutput:
    work: tuple[ScheduledWork, ...]
    preempted: tuple[Sequence, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(w.num_tokens for w in self.work)


@attrs.define
class _StepBudget:
    """What is left of one step: `tokens` in all, of which a prompt or decode
    chunk may take `prompt_tokens` (all of them, until the background part of the
    step caps them to its share); an embedding chunk takes a whole
    `embedding_chunk` (or its prompt's rest) or nothing, and only while
    `embeddings` holds."""

    tokens: int
    embedding_chunk: int
    prompt_tokens: int = attrs.field()
    embeddings: bool = True

    @prompt_tokens.default
    def _all_tokens(self) -> int:
        return self.tokens

    def enter_background(self, share: int, *, embeddings: bool) -> None:
        self.prompt_tokens = min(self.tokens, share)
        self.embeddings = embeddings

    def chunk(self, seq: Sequence) -> int:
        """How many of `seq`'s tokens run this step; 0: none."""
        if seq.pooling is None:
            return min(seq.num_uncomputed_tokens, self.prompt_tokens)
        count = min(seq.num_uncomputed_tokens, self.embedding_chunk)
        return count if self.embeddings and count <= self.tokens else 0

    def take(self, seq: Sequence, count: int) -> None:
        self.tokens -= count
        if seq.pooling is None:
            self.prompt_tokens -= count
        self.prompt_tokens = min(self.prompt_tokens, self.tokens)


@attrs.define
class Scheduler:
    """Fair continuous-batching scheduler with chunked prefill and preemption.

    Each step: running sequences first (a decode is one token; an unfinished
    prefill continues), then waiting ones, within `max_num_batched_tokens` tokens
    and `max_num_seqs` running sequences. Each free slot goes to the waiting
    sequence whose group (`Sequence.group`, one client request) runs the fewest
    sequences, the earliest in line among equals: a request with dozens of choices
    waiting cannot keep a later one out, which starts at the first free slot. With
    every waiting sequence in its own group this is arrival order. When a running
    sequence needs a block and none is free, the most recently admitted running
    sequence is preempted: its blocks are freed and it is recomputed later from its
    tokens (prompt and outputs so far), first in line within its group.

    Background sequences (`Sequence.background`: Batch API lines) yield to every
    other: they are scheduled after them, take at most `background_step_tokens`
    tokens of a step while a foreground sequence is held (the whole step when
    none is), pause while another sequence waits or is in its prompt (so none of
    a background prefill stands between a request and its first token), are the
    first preempted for blocks, and give up their slot to a waiting foreground
    sequence when every slot is taken.

    Embedding sequences (`Sequence.pooling`) run their prompt in chunks of a fixed
    size, `embedding_chunk_tokens` (the last one shorter), never cut to what a step
    has left: the runner computes each embedding chunk on its own, so equal chunks
    make a text's vector the same bits whatever else the engine is running. The
    size is the largest chunk that fits beside one decode token of every other
    slot, so a running decode never keeps one out. A chunk that does not fit waits
    for the next step, first in line. A background embedding chunk runs only on an
    engine that holds no foreground sequence: beside a foreground decode it would
    stall that stream for a whole chunk.

    LoRA adapters (`SamplingParams.lora_id`; 0 is the base model): with
    `max_loras` (0: no limit) the running sequences use at most that many
    distinct adapters, the runner's resident set, as vLLM's `--max-loras` caps
    a batch. A waiting sequence whose adapter would be one too many waits,
    first in line, and no later sequence of any adapter is admitted past it
    (the base model's are): otherwise a steady stream of requests to the
    adapters running could keep its adapter out for ever. It starts once every
    sequence of one running adapter has finished.
    """

    blocks: BlockManager
    max_num_seqs: int
    max_num_batched_tokens: int
    background_step_tokens: int = 1
    max_loras: int = 0
    waiting: deque[Sequence] = attrs.field(factory=deque)
    running: list[Sequence] = attrs.field(factory=list)
    num_preemptions: int = 0
    # Tokens looked up in the prefix cache when a sequence is (re)admitted, and how
    # many of them were found cached (vLLM's prefix_cache_queries / _hits).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # Background sequences held (waiting or running): none, the usual case, spares
    # every step the two classes' ordering and scans.
    num_background: int = 0

    @property
    def block_size(self) -> int:
        return self.blocks.block_size

    @property
    def embedding_chunk_tokens(self) -> int:
        """The size of every embedding chunk but a prompt's last."""
        return max(1, self.max_num_batched_tokens - self.max_num_seqs + 1)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self.num_background += seq.background

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the schedule (finished or aborted) and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self._release_blocks(seq)
        seq.status = SequenceStatus.FINISHED
        self.num_background -= seq.background

    def schedule(self) -> SchedulerOutput:
        budget = _StepBudget(self.max_num_batched_tokens, self.embedding_chunk_tokens)
        work: list[ScheduledWork] = []
        preempted: list[Sequence] = []
        # Foreground first, each class in admission order; a preemption takes
        # the last of this order (background first), never one already scheduled.
        yielded: list[Sequence] = []
        order = self.running
        if self.num_background:
            yielded = self._free_slots_for_foreground()
            order = sorted(self.running, key=lambda seq: seq.background)
        index = 0
        while index < len(order) and budget.tokens > 0 and not order[index].background:
            self._schedule_running(order, index, budget, work, preempted)
            index += 1
        if not preempted:
            self._admit_waiting(budget, work, background=False, yielded=yielded)
        if self.num_background and not (
            preempted or yielded or self._foreground_waits_or_prefills(work)
        ):
            # The share caps background work only while a foreground sequence is
            # held, whose next token it would delay; on an engine that holds only
            # background work, background lines run as ordinary requests would.
            only_background = len(self.running) + len(self.waiting) == self.num_background
            share = budget.tokens if only_background else self.background_step_tokens
            budget.enter_background(share, embeddings=only_background)
            while index < len(order) and budget.tokens > 0:
                self._schedule_running(order, index, budget, work, preempted)
                index += 1
            if not preempted:
                self._admit_waiting(budget, work, background=True, yielded=yielded)
        return SchedulerOutput(tuple(work), tuple(yielded + preempted))

    def _foreground_waits_or_prefills(self, work: list[ScheduledWork]) -> bool:
        """Whether background work should sit this step out: a foreground sequence
        still waits, or one runs part of its prompt (its first token is due)."""
        return any(not seq.background for seq in self.waiting) or any(
            w.seq.num_computed_tokens < w.seq.num_prompt_tokens for w in work
        )
    def _schedule_running(
        self,
        order: list[Sequence],
        index: int,
        budget: _StepBudget,
        work: list[ScheduledWork],
        preempted: list[Sequence],
    ) -> None:
        """Schedule `order[index]` within `budget` (preempting from the end of
        `order` for blocks). A sequence preempted for itself leaves `order` with
        nothing after it and the budget spent, which ends the caller's loop."""
        seq = order[index]
        count = budget.chunk(seq)
        if not count:
            return  # an embedding chunk that does not fit this step
        if not self._reserve_blocks_for_running(seq, count, order, preempted):
            budget.tokens = 0  # `seq` itself was preempted; everything after it already was
            return
        self._schedule(seq, count, work)
        budget.take(seq, count)

    def _free_slots_for_foreground(self) -> list[Sequence]:
        """With every slot taken, preempt the latest background sequences, one for
        each foreground sequence waiting; returns them."""
        waiting = sum(1 for seq in self.waiting if not seq.background)
        yielded: list[Sequence] = []
        while waiting > len(yielded) and len(self.running) >= self.max_num_seqs:
            victim = self._latest_background()
            if victim is None:
                break
            yielded.append(victim)
        return yielded

    def _latest_background(self) -> Sequence | None:
        """Preempt the most recently admitted background sequence running, if any."""
        victim = next((s for s in reversed(self.running) if s.background), None)
        if victim is not None:
            self.running.remove(victim)
            self._preempt(victim)
        return victim

    def _schedule(self, seq: Sequence, count: int, work: list[ScheduledWork]) -> None:
        # Registering at once lets a later sequence in this same step reuse the
        # blocks: the runner writes every token's keys/values before any attention
        # reads them.
        self._register_full_blocks(seq, seq.num_computed_tokens + count)
        work.append(ScheduledWork(seq, count))

    def _reserve_blocks_for_running(
        self, seq: Sequence, count: int, order: list[Sequence], preempted: list[Sequence]
    ) -> bool:
        needed = self._blocks_needed(seq, count)
        while needed > self.blocks.num_free:
            victim = order.pop()
            if order is not self.running:
                self.running.remove(victim)
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        seq.block_ids.extend(self.blocks.allocate(needed))
        return True

    def _admit_waiting(
        self,
        budget: _StepBudget,
        work: list[ScheduledWork],
        *,
        background: bool,
        yielded: list[Sequence],
    ) -> None:
        """Admit waiting sequences of one class (`background` or not) within `budget`.
        A foreground one short of blocks preempts background sequences for them
        (adding them to `yielded`); otherwise it waits, first in line."""
        if not self.waiting or budget.tokens <= 0 or len(self.running) >= self.max_num_seqs:
            return
        running_by_group = Counter(seq.group for seq in self.running)
        adapters = {seq.params.lora_id for seq in self.running} - {BASE_LORA_ID}
        while budget.tokens > 0 and len(self.running) < self.max_num_seqs:
            seq = self._next_waiting(running_by_group, adapters, background)
            if seq is None:
                break
            if seq.num_computed_tokens == 0 and not seq.block_ids and seq.reuses_cached_prefix:
                self._reuse_cached_prefix(seq)
            count = budget.chunk(seq)
            if not count:
                # Out of the background share, or an embedding chunk that does not
                # fit: next step, first in line, prefix hits given back.
                self._release_blocks(seq)
                break
            needed = self._blocks_needed(seq, count)
            while needed > self.blocks.num_free and not background:
                victim = self._latest_background()
                if victim is None:
                    break
                yielded.append(victim)
            if needed > self.blocks.num_free:
                # Give back prefix hits and retry next step, still first in line:
                # skipping it for smaller ones could starve a long prompt.
                self._release_blocks(seq)
                break
            seq.block_ids.extend(self.blocks.allocate(needed))
            if seq is self.waiting[0]:
                self.waiting.popleft()
            else:
                self.waiting.remove(seq)
            running_by_group[seq.group] += 1
            if seq.params.lora_id != BASE_LORA_ID:
                adapters.add(seq.params.lora_id)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._schedule(seq, count, work)
            budget.take(seq, count)

    def _next_waiting(
        self, running_by_group: Counter[Hashable], adapters: set[int], background: bool
    ) -> Sequence | None:
        """The first waiting sequence of the class (`background` or not) whose group
        runs the fewest sequences; None when none of the class waits. Stops at the
        first group that runs none, so with every waiting sequence in a group of its
        own (the usual case) this looks at the first of the class only. Past a
        sequence held by `max_loras` (the running `adapters` are as many), only
        the base model's are taken."""
        best: Sequence | None = None
        fewest = 0
        held_for_adapters = False
        for seq in self.waiting:
            if seq.background != background:
                continue
            lora_id = seq.params.lora_id
            if lora_id != BASE_LORA_ID and self.max_loras:
                if held_for_adapters:
                    continue
                if lora_id not in adapters and len(adapters) >= self.max_loras:
                    held_for_adapters = True
                    continue
            running = running_by_group[seq.group]
            if best is None or running < fewest:
                best, fewest = seq, running
            if not fewest:
                break
        return best

    def _reuse_cached_prefix(self, seq: Sequence) -> None:
        # At least one token must run through the model to produce logits, so a
        # fully cached sequence still recomputes its last token.
        full_blocks = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, full_blocks)
        hits = self.blocks.lookup_prefix(
            [self._key(seq, i) for i in range(full_blocks)]
        )
        seq.block_ids = hits
        seq.num_registered_blocks = len(hits)
        seq.num_computed_tokens = len(hits) * self.block_size
        if seq.num_output_tokens == 0:
            seq.num_cached_prompt_tokens = seq.num_computed_tokens
        if self.blocks.enable_prefix_caching:
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += seq.num_computed_tokens

    def _register_full_blocks(self, seq: Sequence, num_scheduled_tokens: int) -> None:
        full_blocks = num_scheduled_tokens // self.block_size
        self._extend_hashes(seq, full_blocks)
        for i in range(seq.num_registered_blocks, full_blocks):
            self.blocks.register(seq.block_ids[i], self._key(seq, i), seq.params.lora_id)
        seq.num_registered_blocks = max(seq.num_registered_blocks, full_blocks)

    def _extend_hashes(self, seq: Sequence, full_blocks: int) -> None:
        while len(seq.block_hashes) < full_blocks:
            seq.block_hashes.append(chain_hash(self._key(seq, len(seq.block_hashes))))

    def _key(self, seq: Sequence, block_index: int) -> tuple[int, tuple[int, ...]]:
        # An adapter's chains start from a root of their own: the same tokens under
        # two adapters, or under an adapter and the base model, never share blocks.
        root = root_hash(seq.params.lora_id)
        parent = seq.block_hashes[block_index - 1] if block_index else root
        start = block_index * self.block_size
        return block_key(parent, seq.token_ids[start : start + self.block_size])

    def _blocks_needed(self, seq: Sequence, count: int) -> int:
        positions = seq.num_computed_tokens + count
        return max(0, -(-positions // self.block_size) - len(seq.block_ids))

    def _preempt(self, seq: Sequence) -> None:
        self._release_blocks(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _release_blocks(self, seq: Sequence) -> None:
        self.blocks.free(seq.block_ids)
        seq.block_ids = []
        seq.num_computed_tokens = 0
        seq.num_registered_blocks = 0
