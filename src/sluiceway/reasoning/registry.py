"""Reasoning parsers by name (`--reasoning-parser`), and the one a model family
uses when none is named.

Names as vLLM spells them: `qwen3` (Qwen3, Qwen3-MoE and SmolLM3 write
`<think>...</think>` and open it themselves, or get an empty block from the
template when thinking is off), `deepseek_r1` (its thinking may start without the
opening tag, which the template often writes), and `think`, the generic pair,
written `think:START,END` for other tags (`think:<reasoning>,</reasoning>`).
"""

from __future__ import annotations

from collections.abc import Mapping

from sluiceway.reasoning.formats import ReasoningFormat

FORMATS: Mapping[str, ReasoningFormat] = {
    "qwen3": ReasoningFormat("qwen3"),
    "deepseek_r1": ReasoningFormat("deepseek_r1", implicit_start=True),
    "think": ReasoningFormat("think"),
}

# transformers `model_type` -> parser, for the families that think in tags. Other
# families are not reasoning models as a family (a DeepSeek-R1 distill is a Llama
# or a Qwen2): their chat template decides (`auto_format`).
FAMILY_PARSERS: Mapping[str, str] = {
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3",
    "smollm3": "qwen3",
}


class UnknownReasoningParser(ValueError):
    """A parser name that is not one of `FORMATS` (nor `think:START,END`)."""


def reasoning_format(name: str) -> ReasoningFormat:
    """The format `name` stands for; `UnknownReasoningParser` saying what exists."""
    if name in FORMATS:
        return FORMATS[name]
    base, sep, tags = name.partition(":")
    if base == "think" and sep:
        start, comma, end = tags.partition(",")
        if comma and start and end and start != end:
            return ReasoningFormat(name, start=start, end=end)
        raise UnknownReasoningParser(
            f"reasoning parser {name!r}: write the generic pair as think:START,END"
        )
    raise UnknownReasoningParser(
        f"unknown reasoning parser {name!r}; known: {', '.join(sorted(FORMATS))}, think:START,END"
    )


def auto_format(model_type: str | None, chat_template: str | None) -> ReasoningFormat | None:
    """The parser for a model that names none: its family's, else the generic
    `<think>` pair when its chat template writes that tag (DeepSeek-R1 distills
    and other fine-tunes), else none."""
    name = FAMILY_PARSERS.get(model_type or "")
    if name is not None:
        return FORMATS[name]
    if chat_template and "<think>" in chat_template and "</think>" in chat_template:
        return FORMATS["deepseek_r1"] if "<｜Assistant｜>" in chat_template else FORMATS["think"]
    return None


def chosen_format(
    setting: str, model_type: str | None, chat_template: str | None
) -> tuple[ReasoningFormat | None, str]:
    """The format a server uses for `--reasoning-parser setting` ("auto", "none"
    or a name), and why, for its log. Raises `UnknownReasoningParser`."""
    if setting == "none":
        return None, "off (--reasoning-parser none)"
    if setting != "auto":
        return reasoning_format(setting), "named by --reasoning-parser"
    fmt = auto_format(model_type, chat_template)
    if fmt is None:
        return None, "off: neither the model family nor its chat template marks thinking"
    if (model_type or "") in FAMILY_PARSERS:
        return fmt, f"the {model_type} family's"
    return fmt, "its chat template writes <think>"
