"""Token counts of a response."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from sluiceway.protocol._codec import JSON, opt


@attrs.frozen
class PromptTokensDetails:
    cached_tokens: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PromptTokensDetails:
        return cls(cached_tokens=int(d.get("cached_tokens") or 0))

    def to_dict(self) -> JSON:
        return {"cached_tokens": self.cached_tokens}


@attrs.frozen
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Usage:
        return cls(
            prompt_tokens=int(d.get("prompt_tokens") or 0),
            completion_tokens=int(d.get("completion_tokens") or 0),
            total_tokens=int(d.get("total_tokens") or 0),
            prompt_tokens_details=opt(PromptTokensDetails, d.get("prompt_tokens_details")),
        )

    def to_dict(self) -> JSON:
        d: JSON = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }
        if self.prompt_tokens_details is not None:
            d["prompt_tokens_details"] = self.prompt_tokens_details.to_dict()
        return d
