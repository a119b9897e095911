"""Tokens held back per choice until `--stream-interval` of them are ready, so a
stream sends fewer, larger deltas. Owned by the engine loop."""

from __future__ import annotations

from sluiceway.engine.outputs import ChoiceDelta


class HoldBack:
    """Joins each sequence's deltas until `interval` tokens are ready. The first
    token and the last delta of a sequence are never held."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self._held: dict[int, ChoiceDelta] = {}

    def ready(self, seq_id: int, delta: ChoiceDelta) -> ChoiceDelta | None:
        """The delta to send now for `seq_id` (joined with the tokens held back
        before it), or None to hold it for now."""
        if self.interval == 1:
            return delta
        held = self._held.pop(seq_id, None)
        if held is not None:
            delta = held.then(delta)
        if (
            delta.finish_reason is not None
            or delta.num_output_tokens == 1
            or len(delta.token_ids) >= self.interval
        ):
            return delta
        self._held[seq_id] = delta
        return None

    def __len__(self) -> int:
        """How many sequences have tokens held."""
        return len(self._held)

    def take(self, seq_id: int) -> ChoiceDelta | None:
        """What is held for `seq_id`, which is held no longer (None: nothing)."""
        return self._held.pop(seq_id, None)
