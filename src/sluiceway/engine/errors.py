"""Errors the engine raises to callers of `Engine.generate`."""


class EngineError(Exception):
    """Base class for engine errors reported to callers."""


class EngineUnhealthyError(EngineError):
    """The engine loop failed (or is shutting down) and accepts no more work."""


class QueueFullError(EngineError):
    """More requests are waiting than the engine's `max_waiting` allows."""


class PromptTooLongError(EngineError):
    """The prompt (plus at least one generated token) does not fit the model's context."""


class EngineStepError(EngineError):
    """A model step raised; every request open at that moment receives this."""
