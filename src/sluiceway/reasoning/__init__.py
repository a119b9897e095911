"""Reasoning models: telling a choice's thinking from its answer.

`formats` says how a model marks its thinking, `registry` names the parsers
(`--reasoning-parser`) and picks one by model family, `splitter` splits a choice's
text, streamed or whole, and counts the thinking's tokens, `budget` says how long
a request lets the model think. Pure Python: no torch, trio or tokenizer here.
"""

from sluiceway.reasoning.budget import EFFORT_BUDGETS, thinking_budget
from sluiceway.reasoning.formats import PromptState, ReasoningFormat
from sluiceway.reasoning.registry import (
    FAMILY_PARSERS,
    FORMATS,
    UnknownReasoningParser,
    auto_format,
    chosen_format,
    reasoning_format,
)
from sluiceway.reasoning.splitter import Phase, ReasoningSplitter, Split, split_text

__all__ = [
    "EFFORT_BUDGETS",
    "FAMILY_PARSERS",
    "FORMATS",
    "Phase",
    "PromptState",
    "ReasoningFormat",
    "ReasoningSplitter",
    "Split",
    "UnknownReasoningParser",
    "auto_format",
    "chosen_format",
    "reasoning_format",
    "split_text",
    "thinking_budget",
]
