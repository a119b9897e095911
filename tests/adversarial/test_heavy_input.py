"""Heavy request bodies never hold the event loop: parsing, validating, rendering the
chat template and tokenizing a large body happen on a worker thread, so other
clients' requests and streams go on meanwhile, and a client that leaves during
that work costs at most the stage in progress.

The tokenizer is the real one behind a proxy that records the thread of every
template render and encode, and can hold a render until the test's own trio
task releases it: if that render ran on the event loop's thread, the test's task
could not run, so the hold would only end at its time limit and the test fails.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import trio

from polling import eventually
from server_helpers import CHAT, RawStream, chat, engine_empty, stream
from sluiceway.api.pipeline import prompts

MODEL = "test-model"
HOLD_LIMIT_S = 10  # a hold that outlives this means the test's task never ran


class WatchedTokenizer:
    """The real tokenizer, recording the thread of each render and encode.

    A render of at least `hold_messages` messages waits for `release` (polling the
    request's cancellation meanwhile, which it records in `cancel_seen`)."""

    def __init__(self, inner: Any, hold_messages: int | None = None) -> None:
        self._inner = inner
        self.hold_messages = hold_messages
        self.holding = threading.Event()
        self.release = threading.Event()
        self.cancel_seen = threading.Event()
        self.released_in_time: bool | None = None
        self.renders: list[tuple[int, int]] = []  # (messages, thread id)
        self.encodes: list[tuple[int, int]] = []  # (characters, thread id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)

    def apply_chat_template(self, messages: list[Any], **kw: Any) -> Any:
        self.renders.append((len(messages), threading.get_ident()))
        if self.hold_messages is not None and len(messages) >= self.hold_messages:
            self.holding.set()
            self.released_in_time = self._hold()
        return self._inner.apply_chat_template(messages, **kw)

    def _hold(self) -> bool:
        for _ in range(HOLD_LIMIT_S * 200):
            if self.release.wait(0.005):
                return True
            try:
                trio.from_thread.check_cancelled()
            except trio.Cancelled:
                self.cancel_seen.set()
            except RuntimeError:
                pass  # not a trio worker thread: the render runs on the event loop
        return False

    def encode(self, text: str, **kw: Any) -> Any:
        self.encodes.append((len(text), threading.get_ident()))
        return self._inner.encode(text, **kw)


@pytest.fixture
def watched(tokenizer: Any) -> WatchedTokenizer:
    return WatchedTokenizer(tokenizer, hold_messages=500)


@pytest.fixture
def serve_watched(
    serve_runner: Callable[..., Any], runner: Any, watched: WatchedTokenizer
) -> Callable[..., Any]:
    def start(**kw: Any) -> Any:
        return serve_runner(runner, tokenizer=watched, **kw)

    return start


def empty_messages(count: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": ""}] * count


def heavy_chat(count: int = 1000) -> dict[str, Any]:
    """Far over the test model's 2048-token context once rendered: a 400 in the end,
    after the template and the tokenizer have run."""
    return {"model": MODEL, "messages": empty_messages(count), "max_tokens": 1}


async def test_a_held_heavy_render_leaves_other_clients_served(
    serve_watched: Callable[..., Any], watched: WatchedTokenizer
) -> None:
    """While a heavy chat request's template render is held, /health answers and
    another client's stream runs start to finish; then the heavy one gets its 400."""
    loop_thread = threading.get_ident()
    heavy: dict[str, Any] = {}
    async with (
        serve_watched() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):

        async def post_heavy() -> None:
            response = await client.post(CHAT, json=heavy_chat())
            heavy.update(response.json(), status=response.status_code)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(post_heavy)
                await eventually(watched.holding.is_set, HOLD_LIMIT_S * 2)
                assert (await client.get("/health")).status_code == 200
                result = await stream(client, CHAT, chat("hello", max_tokens=4))
                result.check_well_formed()
                assert result.finish_reasons() == {0: "length"}
                watched.release.set()
        finally:
            watched.release.set()
    assert watched.released_in_time, "the held render blocked the event loop"
    assert heavy["status"] == 400 and heavy["error"]["code"] == "context_length_exceeded"
    held = [thread for count, thread in watched.renders if count >= 500]
    assert held and loop_thread not in held


async def test_large_bodies_are_parsed_rendered_and_tokenized_off_the_loop(
    serve_watched: Callable[..., Any],
    watched: WatchedTokenizer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chat (message-heavy and text-heavy), completions and /tokenize bodies above
    the inline size: JSON decoding and validation, the template and the tokenizer
    all run on worker threads; a small chat request stays on the event loop's
    thread."""
    watched.hold_messages = None
    loop_thread = threading.get_ident()
    decodes: list[int] = []
    decode = prompts.decode

    def recording_decode(data: bytes | str, type: Any) -> Any:
        decodes.append(threading.get_ident())
        return decode(data, type)

    monkeypatch.setattr(prompts, "decode", recording_decode)
    long_text = "the river flows under a quiet bridge " * 3000  # 111 kB
    async with (
        serve_watched() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        small = await client.post(CHAT, json=chat("hi", max_tokens=2))
        assert small.status_code == 200
        assert watched.renders[-1][1] == loop_thread and watched.encodes[-1][1] == loop_thread
        assert decodes[-1:] == [loop_thread]
        watched.renders.clear()
        watched.encodes.clear()
        decodes.clear()
        bodies = [
            (CHAT, heavy_chat()),
            (CHAT, chat(long_text, max_tokens=1)),
            ("/v1/completions", {"model": MODEL, "prompt": long_text, "max_tokens": 1}),
            ("/tokenize", {"model": MODEL, "messages": empty_messages(1000)}),
            ("/tokenize", {"model": MODEL, "prompt": long_text}),
        ]
        for path, body in bodies:
            response = await client.post(path, json=body)
            assert response.status_code in (200, 400), response.text
    assert len(watched.renders) == 3 and loop_thread not in {t for _, t in watched.renders}
    assert len(watched.encodes) == 5 and loop_thread not in {t for _, t in watched.encodes}
    assert len(decodes) == len(bodies) and loop_thread not in decodes


async def test_tokenize_of_a_large_prompt_returns_every_token(
    serve_watched: Callable[..., Any], watched: WatchedTokenizer, tokenizer: Any
) -> None:
    """The /tokenize answer built off the loop, a slice at a time, is the same JSON."""
    text = "the river flows under a quiet bridge " * 3000
    async with (
        serve_watched() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        response = await client.post("/tokenize", json={"model": MODEL, "prompt": text})
        small = await client.post("/tokenize", json={"model": MODEL, "prompt": "the river"})
    expected = tokenizer.encode(text)
    assert response.json() == {"count": len(expected), "max_model_len": 2048, "tokens": expected}
    assert small.json()["tokens"] == tokenizer.encode("the river")


async def test_a_conversation_longer_than_the_context_is_a_400_before_rendering(
    serve_watched: Callable[..., Any], watched: WatchedTokenizer
) -> None:
    """More messages than the context has tokens can never fit: refused with a 400
    that names the limit and `messages`, and no template is rendered for it."""
    async with (
        serve_watched() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        for path in (CHAT, "/tokenize"):
            response = await client.post(path, json=heavy_chat(2049))
            assert response.status_code == 400
            error = response.json()["error"]
            assert error["param"] == "messages" and "2048" in error["message"], error
            assert "2049" in error["message"]
    assert watched.renders == []


async def test_a_client_gone_during_a_heavy_render_stops_it_at_the_next_stage(
    serve_watched: Callable[..., Any], watched: WatchedTokenizer
) -> None:
    """The client hangs up while its template is being rendered: the request is
    cancelled at once (the event loop is free), the thread's work stops after the
    render (its text is never tokenized), and the server is left clean."""
    async with (
        serve_watched() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        try:
            raw = await RawStream.post(server.url, CHAT, heavy_chat())
            await eventually(watched.holding.is_set, HOLD_LIMIT_S * 2)
            await raw.aclose()
            await eventually(watched.cancel_seen.is_set, HOLD_LIMIT_S * 2)
        finally:
            watched.release.set()
        result = await stream(client, CHAT, chat("after", max_tokens=3))
        result.check_well_formed()
        await eventually(lambda: engine_empty(server) and server.state.active == 0)
    assert watched.released_in_time
    heavy_renders = [count for count, _ in watched.renders if count >= 500]
    assert heavy_renders == [1000]
    # The small request's prompt is the only text tokenized.
    assert len(watched.encodes) == 1 and watched.encodes[0][0] < 200
