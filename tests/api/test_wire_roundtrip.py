"""Every response shape the server sends decodes into the shared protocol types and
re-encodes to the same JSON (the autouse `wire_roundtrip` fixture checks each
test's responses; this test makes sure every shape is among them)."""

from __future__ import annotations

import httpx

from server_helpers import CHAT, COMPLETIONS, chat, completion, stream
from wire_roundtrip import Recorder

from .conftest import MODEL


async def test_every_response_shape_round_trips(
    client: httpx.AsyncClient, wire_roundtrip: Recorder
) -> None:
    bodies = [
        (CHAT, chat("hi", max_tokens=3)),
        (CHAT, chat("hi", max_tokens=3, n=2, logprobs=True, top_logprobs=2, stop=["zz"])),
        (CHAT, {"messages": [[{"role": "user", "content": "a"}]] * 2, "max_tokens": 2}),
        (COMPLETIONS, completion("hi", max_tokens=3, logprobs=2)),
        (COMPLETIONS, completion(["a", [5, 6]], max_tokens=2, echo=True)),
    ]
    for path, body in bodies:
        r = await client.post(path, json=body)
        assert r.status_code == 200, r.text
        options = {"include_usage": True}
        for extra in (
            {},
            {"stream_options": options},
            {"stream_options": options | {"continuous_usage_stats": True}},
        ):
            result = await stream(client, path, body | extra)
            result.check_well_formed()
    r = await client.post("/tokenize", json={"model": MODEL, "prompt": "Hello"})
    await client.post("/detokenize", json={"tokens": r.json()["tokens"]})
    await client.get("/v1/models")
    await client.get(f"/v1/models/{MODEL}")
    await client.post(CHAT, json={"messages": [{"role": "user"}]})  # an error body
    await client.get("/v1/nothing")
    # 5 bodies x (1 whole + 3 streams of at least 3 events), 4 tokenizer/model bodies, 2 errors
    assert len(wire_roundtrip.bodies) == 11
    assert wire_roundtrip.check() >= 11 + 5 * 3 * 3
