"""The reasoning splitter: thinking and answer apart for every parser, the same
split whether the text comes whole or cut at any point, tags cut across deltas
included, and the thinking's tokens counted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.reasoning import (
    FORMATS,
    Phase,
    ReasoningFormat,
    ReasoningSplitter,
    UnknownReasoningParser,
    auto_format,
    reasoning_format,
    split_text,
)

QWEN3 = FORMATS["qwen3"]
R1 = FORMATS["deepseek_r1"]


def stream(
    fmt: ReasoningFormat, state: str, deltas: list[str]
) -> tuple[str, str, ReasoningSplitter]:
    splitter = ReasoningSplitter.for_prompt(fmt, state)  # type: ignore[arg-type]
    parts = [splitter.feed(d) for d in deltas] + [splitter.finish()]
    return "".join(p.reasoning for p in parts), "".join(p.content for p in parts), splitter


@pytest.mark.parametrize(
    ("fmt", "state", "text", "expected"),
    [
        (QWEN3, "fresh", "<think>\nLet me see.\n</think>\n\nParis.", ("Let me see.", "Paris.")),
        (QWEN3, "fresh", "Paris.", (None, "Paris.")),
        (QWEN3, "closed", "Paris. <think>x</think>", (None, "Paris. <think>x</think>")),
        (QWEN3, "open", "Hmm.\n</think>\n\nParis.", ("Hmm.", "Paris.")),
        (QWEN3, "fresh", "<think>\ncut short", ("cut short", "")),
        (QWEN3, "fresh", "<think></think>Paris.", ("", "Paris.")),
        (R1, "fresh", "Hmm, 2+2.\n</think>\n\n4", ("Hmm, 2+2.", "4")),
        (R1, "fresh", "<think>Hmm.</think>4", ("Hmm.", "4")),
        (R1, "open", "<think>\nHmm.</think>4", ("Hmm.", "4")),
        (R1, "fresh", "never closed", ("never closed", "")),
        (QWEN3, "fresh", "<thi", (None, "<thi")),
        (QWEN3, "fresh", "<think>a < b, and </th", ("a < b, and </th", "")),
    ],
)
def test_whole_text_split(fmt: ReasoningFormat, state: str, text: str, expected: tuple) -> None:
    assert split_text(fmt, state, text) == expected  # type: ignore[arg-type]


def test_tags_cut_across_deltas_are_held_until_they_resolve() -> None:
    splitter = ReasoningSplitter.for_prompt(QWEN3, "fresh")
    assert splitter.feed("<th").reasoning == "" and splitter.phase is Phase.OPENING
    assert splitter.feed("ink>\nI am ").reasoning == "I am"
    assert splitter.feed("sure <").reasoning == " sure"  # "<" may open "</think>"
    assert splitter.feed("3 is less").reasoning == " <3 is less"  # it did not
    assert splitter.feed("</thi").reasoning == ""
    cut = splitter.feed("nk>\n\nYes")
    assert (cut.reasoning, cut.content) == ("", "Yes")
    assert splitter.phase is Phase.ANSWER
    assert splitter.finish().content == ""
    assert splitter.reasoning_tokens == 6  # every delta up to and with the closing tag


def test_an_answer_without_thinking_counts_no_reasoning_tokens() -> None:
    reasoning, content, splitter = stream(QWEN3, "fresh", ["<", "b>bold</b>"])
    assert (reasoning, content) == ("", "<b>bold</b>")
    assert splitter.reasoning_tokens == 0 and not splitter.thought


def test_opening_tokens_count_once_the_block_opens() -> None:
    _, _, splitter = stream(QWEN3, "fresh", ["<", "think", ">", "x", "</think>", "y"])
    assert splitter.reasoning_tokens == 5


def test_generic_tags_are_configurable() -> None:
    fmt = reasoning_format("think:<reasoning>,</reasoning>")
    assert (fmt.start, fmt.end) == ("<reasoning>", "</reasoning>")
    assert split_text(fmt, "fresh", "<reasoning>why</reasoning>because") == ("why", "because")
    assert split_text(fmt, "fresh", "<think>x</think>y") == (None, "<think>x</think>y")


@pytest.mark.parametrize("name", ["nope", "think:", "think:<a>", "think:<a>,<a>"])
def test_unknown_or_malformed_parser_names_are_refused(name: str) -> None:
    with pytest.raises(UnknownReasoningParser, match=r"think:START,END|unknown"):
        reasoning_format(name)


def test_prompt_state_reads_what_the_template_wrote() -> None:
    assert QWEN3.prompt_state("<|im_start|>assistant\n<think>\n\n</think>\n\n") == "closed"
    assert R1.prompt_state("<｜Assistant｜><think>\n") == "open"
    assert QWEN3.prompt_state("<|im_start|>assistant\n") == "fresh"
    # A past turn's closed block leaves a new turn fresh.
    assert QWEN3.prompt_state("<think>a</think>b<|im_start|>assistant\n") == "fresh"


def test_auto_selection_by_family_then_by_template() -> None:
    assert auto_format("qwen3", None) is QWEN3
    assert auto_format("smollm3", None) is QWEN3
    assert auto_format("llama", "{{ '<｜Assistant｜><think>\\n' }}</think>") is R1
    assert auto_format("qwen2", "{{ '<think>' }}{{ '</think>' }}") is FORMATS["think"]
    assert auto_format("llama", "{{ messages }}") is None


texts = st.text(alphabet="<>/thinkab \n", max_size=40)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    fmt=st.sampled_from([QWEN3, R1, reasoning_format("think:<r>,</r>")]),
    state=st.sampled_from(["open", "closed", "fresh"]),
    body=st.one_of(
        texts, st.builds(lambda a, b, c: f"{a}<think>{b}</think>{c}", texts, texts, texts)
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=8),
)
def test_any_cut_of_the_text_splits_as_the_whole(
    fmt: ReasoningFormat, state: str, body: str, cuts: list[int]
) -> None:
    bounds = sorted({min(c, len(body)) for c in cuts})
    deltas = [body[a:b] for a, b in zip([0, *bounds], [*bounds, len(body)], strict=True)]
    reasoning, content, splitter = stream(fmt, state, deltas)
    whole_reasoning, whole_content = split_text(fmt, state, body)  # type: ignore[arg-type]
    assert (reasoning, content) == (whole_reasoning or "", whole_content)
    assert splitter.thought == (whole_reasoning is not None)


def test_a_budget_given_in_tokens_wins_over_an_effort() -> None:
    from sluiceway.reasoning import thinking_budget

    assert thinking_budget(None, None) is None
    assert thinking_budget(None, "none") == 0
    assert thinking_budget(None, "low") == 1024
    assert thinking_budget(None, "high") is None
    assert thinking_budget(32, "high") == 32


def test_passes_through_once_the_answer_flows() -> None:
    splitter = ReasoningSplitter.for_prompt(QWEN3, "fresh")
    assert not splitter.passes_through
    splitter.feed("<think>x</think>")
    assert not splitter.passes_through  # blanks before the answer are still dropped
    splitter.feed("\n\nA")
    assert splitter.passes_through
    assert ReasoningSplitter.for_prompt(QWEN3, "closed").passes_through


def test_the_servers_choice_and_its_reason() -> None:
    from sluiceway.reasoning import chosen_format

    assert chosen_format("none", "qwen3", "<think></think>") == (
        None,
        "off (--reasoning-parser none)",
    )
    assert chosen_format("deepseek_r1", None, None)[0] is R1
    assert chosen_format("auto", "smollm3", None) == (QWEN3, "the smollm3 family's")
    assert chosen_format("auto", None, "<think>x</think>")[0] is FORMATS["think"]
    assert chosen_format("auto", "llama", "{{ messages }}")[0] is None
    with pytest.raises(UnknownReasoningParser):
        chosen_format("qwen4", None, None)
