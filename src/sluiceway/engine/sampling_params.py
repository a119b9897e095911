"""Per-request sampling parameters, validated once at the edge."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from sluiceway.engine.constraint import Grammar


class InvalidParameterError(ValueError):
    """A sampling parameter is out of range; `param` names the offending field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _as_str_tuple(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _as_int_tuple(value: Iterable[int] | None) -> tuple[int, ...]:
    return () if value is None else tuple(value)


def _as_bias(value: Mapping[int, float] | Iterable[tuple[int, float]] | None) -> tuple[tuple[int, float], ...]:
    if value is None:
        return ()
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((int(k), float(v)) for k, v in items))


@attrs.frozen(kw_only=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    `temperature == 0` means greedy. `top_k <= 0` disables top-k. `logprobs=None`
    returns no log-probabilities; `logprobs=k` returns the sampled token's and the
    top k alternatives'. `max_tokens=None` generates until the model's context is full.
    Construction raises `InvalidParameterError` for out-of-range values.
    """

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = attrs.field(default=(), converter=_as_str_tuple)
    stop_token_ids: tuple[int, ...] = attrs.field(default=(), converter=_as_int_tuple)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = attrs.field(default=(), converter=_as_bias)
    logprobs: int | None = None
    grammar: Grammar | None = None
    # The LoRA adapter the tokens come from (`engine/lora_modules.py`; 0: the base
    # model). It travels with the parameters to every chunk of the sequence, and it
    # salts the sequence's prefix-cache keys (`Scheduler`).
    lora_id: int = 0

    def __attrs_post_init__(self) -> None:
        checks: list[tuple[bool, str, str]] = [
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be at least 1"),
            (self.temperature >= 0.0, "temperature", "must be non-negative"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (self.min_tokens >= 0, "min_tokens", "must be non-negative"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                "min_tokens",
                "must not exceed max_tokens",
            ),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
            (self.repetition_penalty > 0.0, "repetition_penalty", "must be positive"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", "must be in [0, 20]"),
            (all(s for s in self.stop), "stop", "stop strings must be non-empty"),
            (all(-100.0 <= b <= 100.0 for _, b in self.logit_bias), "logit_bias", "biases must be in [-100, 100]"),
        ]
        for ok, param, message in checks:
            if not ok:
                raise InvalidParameterError(param, f"{param} {message}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )
