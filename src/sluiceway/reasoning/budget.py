"""How many tokens a request lets a reasoning model think: `max_reasoning_tokens`
when given, else what its `reasoning_effort` stands for, else no limit.

OpenAI names efforts, not counts; these counts are what thinking of that depth
takes a small open model (a Qwen3 answer to a school maths question thinks for
several hundred tokens, a competition problem for thousands). `none` closes the
thinking at once: the answer follows an empty block.
"""

from __future__ import annotations

from collections.abc import Mapping

EFFORT_BUDGETS: Mapping[str, int | None] = {
    "none": 0,
    "minimal": 256,
    "low": 1024,
    "medium": 4096,
    "high": None,
}


def thinking_budget(max_reasoning_tokens: int | None, effort: str | None) -> int | None:
    """The thinking's budget in tokens (None: no limit)."""
    if max_reasoning_tokens is not None:
        return max_reasoning_tokens
    if effort is None:
        return None
    return EFFORT_BUDGETS[effort]
