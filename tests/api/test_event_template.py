"""Chunks that carry only text are encoded from a template, byte for byte as the
dicts would be."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluiceway import protocol
from sluiceway.api.http import sse
from sluiceway.api.http.stream_output import StreamOutput
from sluiceway.api.pipeline.formatting import TokenText
from sluiceway.api.pipeline.generation import _Stream
from sluiceway.api.pipeline.prompts import Prompt
from sluiceway.api.pipeline.request_run import ChoiceState, RequestRun
from sluiceway.api.pipeline.shapes import ChatShape, CompletionShape
from sluiceway.api.pipeline.validation import parse_chat_request, parse_completion_request
from sluiceway.engine.outputs import ChoiceDelta, TokenLogprob

# Text a detokenizer can give: any characters, with JSON's special ones often.
_TEXT = st.text(
    alphabet=st.one_of(st.characters(codec="utf-8"), st.sampled_from('"\\/\n\t\x00\u2028é😀'))
)


def _chunk(text: str) -> dict[str, Any]:
    return {"id": "chatcmpl-x", "choices": [{"index": 1, "delta": {"content": text}}], "n": None}


@given(_TEXT)
def test_render_is_the_event_of_the_object(text: str) -> None:
    template = sse.EventTemplate.around(_chunk)
    assert template is not None
    assert template.render(text) == sse.event(_chunk(text))


def test_no_template_unless_the_text_appears_once() -> None:
    assert sse.EventTemplate.around(lambda text: {"a": 1}) is None
    assert sse.EventTemplate.around(lambda text: {"a": text, "b": text}) is None
    assert sse.EventTemplate.around(lambda text: {"a": text + "!"}) is None


class _Tokenizer:
    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


class _State:
    """What a stream reads of the server's state to build a chunk."""

    model_name = "SmolLM2-135M-Instruct"
    token_text = TokenText(_Tokenizer())


def _stream(api: str, **fields: Any) -> tuple[_Stream, ChoiceState]:
    if api == "chat":
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, **fields}
        req: Any = parse_chat_request(body, vocab_size=100)
        shape: Any = ChatShape(req, _State.token_text)
    else:
        req = parse_completion_request({"prompt": "hi", "stream": True, **fields}, vocab_size=100)
        shape = CompletionShape(req, _State.token_text)
    prompt = Prompt((1, 2), "hi")
    run = RequestRun(state=_State(), prompts=[prompt], n=req.n, started_at=0.0)  # type: ignore[arg-type]
    choice = ChoiceState(index=req.n - 1, prompt=prompt)
    run.choices.append(choice)
    return _Stream(run, req, shape, "messages", "chatcmpl-1", 1700000000), choice


REQUESTS = [
    ("chat", {}),
    ("chat", {"n": 3, "stream_options": {"include_usage": True}}),
    ("chat", {"logprobs": True}),
    ("completions", {}),
    ("completions", {"n": 2, "stream_options": {"include_usage": True}}),
    ("completions", {"logprobs": 2}),
]
_LOGPROBS = (TokenLogprob(5, -0.5, ((5, -0.5),)),)
DELTAS = [
    ChoiceDelta((5,), 'Hello "world"\n', num_output_tokens=3),
    ChoiceDelta((5,), "é😀", logprobs=_LOGPROBS, num_output_tokens=4),
    ChoiceDelta((5,), "end", finish_reason="length", num_output_tokens=5),
    ChoiceDelta((5,), "", num_output_tokens=6),
]


@pytest.mark.parametrize(("api", "fields"), REQUESTS)
@pytest.mark.parametrize("delta", DELTAS)
def test_text_only_chunks_match_the_dict_path(api: str, fields: Any, delta: ChoiceDelta) -> None:
    fast, fast_choice = _stream(api, **fields)
    slow, slow_choice = _stream(api, **fields)
    text = fast.shape.text_only_delta(fast_choice, delta)
    body = slow.shape.delta_choice(slow_choice, delta)
    if text is None:
        # Anything more than text (an end, logprobs to send) or nothing: the dicts.
        requested_logprobs = fields.get("logprobs") and delta.logprobs
        assert not delta.text or delta.finish_reason is not None or requested_logprobs
        assert fast.shape.delta_choice(fast_choice, delta) == body
    # The same bookkeeping either way (completions' text offset).
    assert attrs.asdict(fast_choice) == attrs.asdict(slow_choice)
    if text is None:
        return
    assert body is not None
    assert fast._text_event(fast_choice, text) == sse.event(slow._chunk_object(slow_choice, body))
    # A second chunk from the same (now cached) template.
    assert fast._text_event(fast_choice, "again") == sse.event(
        slow._chunk_object(slow_choice, slow.shape.text_choice(slow_choice.index, "again"))
    )


async def test_continuous_usage_stats_reach_every_text_chunk() -> None:
    # Each chunk's usage differs, so these chunks cannot come from one template.
    stream, choice = _stream(
        "chat", stream_options={"include_usage": True, "continuous_usage_stats": True}
    )
    output = stream.output = StreamOutput()
    for count in (1, 2, 3):
        choice.num_output_tokens = count
        await stream.sink(choice, ChoiceDelta((5,), "a", num_output_tokens=count))
    output.close()
    written = b"".join([part async for part in output.body()])
    events = [json.loads(e.removeprefix(b"data: ")) for e in written.split(b"\n\n") if e]
    assert [e["usage"]["completion_tokens"] for e in events] == [1, 2, 3]
    assert [e["choices"][0]["delta"] for e in events] == [{"content": "a"}] * 3


def _reencoded(event: bytes) -> bytes:
    """`event` decoded into its protocol chunk type and encoded again."""
    obj = json.loads(event.removeprefix(b"data: "))
    chunk_type = (
        protocol.ChatCompletionChunk
        if obj["object"] == "chat.completion.chunk"
        else protocol.CompletionChunk
    )
    return sse.event(chunk_type.from_dict(obj).to_dict())


@pytest.mark.parametrize(("api", "fields"), REQUESTS)
@given(text=_TEXT)
def test_template_events_are_protocol_chunks(api: str, fields: Any, text: str) -> None:
    """What the byte templates write decodes into the shared chunk type and encodes
    back to the same bytes: the fast path sends exactly what the types describe."""
    stream, choice = _stream(api, **fields)
    event = stream._text_event(choice, text)
    assert _reencoded(event) == event


@pytest.mark.parametrize(("api", "fields"), REQUESTS)
@pytest.mark.parametrize("delta", DELTAS)
def test_dict_path_events_are_protocol_chunks(api: str, fields: Any, delta: ChoiceDelta) -> None:
    """Likewise for the chunks built as dicts (the first, the last, logprobs)."""
    stream, choice = _stream(api, **fields)
    for body in (stream.shape.open_choice(choice), stream.shape.delta_choice(choice, delta)):
        if body is not None:
            event = sse.event(stream._chunk_object(choice, body))
            assert _reencoded(event) == event
