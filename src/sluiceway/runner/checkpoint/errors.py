"""The one error a checkpoint reader raises."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read: the message is one line naming the
    file and the field (or tensor) at fault."""
