"""`POST /v1/embeddings` through the official `openai` client: the vectors equal
transformers' last hidden state of the served model, normalized, in float and
base64 alike; `dimensions`, bad inputs, the timeout and a runner without
embeddings each get their OpenAI-style answer."""

from __future__ import annotations

import math
from typing import Any

import httpx
import openai
import pytest
import trio

from sluiceway.engine.pooling import PoolingSpec

from .conftest import MODEL, in_thread
from .fakes import PoolingRunner

torch = pytest.importorskip("torch")

E = "/v1/embeddings"
TEXTS = ["The quick brown fox", "jumps over", "the lazy dog, again and again and again."]


def tiny_runner(parts: Any, pooling: PoolingSpec | None = None) -> Any:
    from sluiceway.runner.model_runner import TorchModelRunner

    config, state_dict = parts
    return TorchModelRunner(config, state_dict, block_size=16, num_blocks=64, pooling=pooling)


def transformers_vector(parts: Any, token_ids: list[int], width: int | None = None) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    config, state_dict = parts
    model = LlamaForCausalLM(config).eval()
    model.load_state_dict(state_dict)
    with torch.no_grad():
        last = model.model(torch.tensor([token_ids])).last_hidden_state[0, -1]
    last = last[:width] if width else last
    return last / last.norm()


def client_for(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


async def test_openai_embeddings_equal_the_models_last_hidden_state(
    serve_runner: Any, tiny_runner_parts: Any, tokenizer: Any
) -> None:
    async with serve_runner(tiny_runner(tiny_runner_parts)) as server:
        with client_for(server) as oai:
            # The client asks for base64 unless told otherwise, and decodes it.
            encoded = await in_thread(lambda: oai.embeddings.create(model=MODEL, input=TEXTS))
            floats = await in_thread(
                lambda: oai.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
            )
            alone = await in_thread(lambda: oai.embeddings.create(model=MODEL, input=TEXTS[1]))
            by_ids = await in_thread(
                lambda: oai.embeddings.create(model=MODEL, input=tokenizer.encode(TEXTS[1]))
            )
    ids = [tokenizer.encode(t) for t in TEXTS]
    assert [d.index for d in encoded.data] == [0, 1, 2]
    assert encoded.usage.prompt_tokens == encoded.usage.total_tokens == sum(map(len, ids))
    for got, want_ids, as_float in zip(encoded.data, ids, floats.data, strict=True):
        want = transformers_vector(tiny_runner_parts, want_ids)
        torch.testing.assert_close(torch.tensor(got.embedding), want, rtol=1e-4, atol=1e-5)
        assert as_float.embedding == pytest.approx(got.embedding, abs=1e-6)
        assert math.isclose(math.fsum(v * v for v in as_float.embedding), 1.0, rel_tol=1e-5)
    # Batched with the others or alone, by text or by token ids: one vector.
    assert alone.data[0].embedding == encoded.data[1].embedding
    assert by_ids.data[0].embedding == pytest.approx(alone.data[0].embedding, abs=1e-6)


async def test_dimensions_cut_a_matryoshka_model_and_are_refused_elsewhere(
    serve_runner: Any, tiny_runner_parts: Any, tokenizer: Any
) -> None:
    matryoshka = PoolingSpec("last", 64, (16, 32))
    async with serve_runner(tiny_runner(tiny_runner_parts, matryoshka)) as server:
        with client_for(server) as oai:
            cut = await in_thread(
                lambda: oai.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=16)
            )
            with pytest.raises(openai.BadRequestError) as refused:
                await in_thread(
                    lambda: oai.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=20)
                )
    assert len(cut.data[0].embedding) == 16
    want = transformers_vector(tiny_runner_parts, tokenizer.encode(TEXTS[0]), width=16)
    torch.testing.assert_close(torch.tensor(cut.data[0].embedding), want, rtol=1e-4, atol=1e-5)
    error = refused.value.body
    assert error["param"] == "dimensions" and "16, 32 and 64" in error["message"]

    async with serve_runner(tiny_runner(tiny_runner_parts)) as server:
        with client_for(server) as oai:
            with pytest.raises(openai.BadRequestError) as refused:
                await in_thread(
                    lambda: oai.embeddings.create(model=MODEL, input="hi", dimensions=16)
                )
            full = await in_thread(
                lambda: oai.embeddings.create(model=MODEL, input="hi", dimensions=64)
            )
    assert refused.value.body["param"] == "dimensions"
    assert len(full.data[0].embedding) == 64


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"input": ""}, 400, "input", None),
        ({"input": [""]}, 400, "input", None),
        ({"input": []}, 400, None, None),
        ({"input": [1, "two"]}, 400, None, None),
        ({"input": [[1, 2], 3]}, 400, "input", None),
        ({"input": [10**9]}, 400, "input", None),
        ({"input": "x " * 40}, 400, "input", "context_length_exceeded"),
        ({"input": "hi", "encoding_format": "int8"}, 400, None, None),
        ({"input": "hi", "dimensions": 0}, 400, None, None),
        ({"input": "hi", "model": "another-model"}, 404, "model", "model_not_found"),
        # Each input is a choice: more than --max-choices-per-request (128) is a 400.
        ({"input": ["hi"] * 129}, 400, "input", None),
    ],
)
async def test_bad_requests_get_openai_errors(
    serve_runner: Any,
    tokenizer: Any,
    body: dict[str, Any],
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    runner = PoolingRunner(vocab=(5, 6), eos=tokenizer.eos_token_id)
    async with (
        serve_runner(runner, max_model_len=32) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        r = await client.post(E, json=body)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        if param is not None:
            assert error["param"] == param
        if code is not None:
            assert error["code"] == code
        # The server still serves.
        ok = await client.post(E, json={"input": "hi", "encoding_format": "float"})
        assert ok.status_code == 200
        ids = tokenizer.encode("hi")
        raw = (ids[-1], len(ids), 0.0, 0.0)  # the fake's vector, then normalized
        want = [v / math.hypot(*raw) for v in raw]
        assert ok.json()["data"][0]["embedding"] == pytest.approx(want)


async def test_a_runner_without_embeddings_says_so(start_server: Any) -> None:
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        r = await client.post(E, json={"input": "hi"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "model"


async def test_a_timed_out_request_leaves_nothing_in_the_engine(
    serve_runner: Any, tokenizer: Any
) -> None:
    runner = PoolingRunner(vocab=(5, 6), eos=tokenizer.eos_token_id, gated=True)
    async with (
        serve_runner(runner, request_timeout=0.5) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        with trio.fail_after(20):
            r = await client.post(E, json={"input": TEXTS})
            assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
            runner.open()
            await server.state.engine.wait_idle()
            stats = server.state.engine.stats()
            assert stats.num_running_seqs == stats.num_waiting_seqs == stats.kv_blocks_used == 0


async def test_the_trio_client_reads_embeddings_in_both_encodings(
    serve_runner: Any, tokenizer: Any
) -> None:
    import base64
    import struct

    from sluiceway.client import AsyncClient

    runner = PoolingRunner(vocab=(5, 6), eos=tokenizer.eos_token_id)
    async with (
        serve_runner(runner) as server,
        AsyncClient(server.url, timeout=30, max_retries=0) as client,
    ):
        floats = await client.embeddings.create(input=["hi", "hello there"], model=MODEL)
        encoded = await client.embeddings.create(input="hello there", encoding_format="base64")
    assert [d.index for d in floats.data] == [0, 1]
    assert floats.usage.prompt_tokens == len(tokenizer.encode("hi")) + len(
        tokenizer.encode("hello there")
    )
    assert isinstance(encoded.data[0].embedding, str)
    raw = base64.b64decode(encoded.data[0].embedding)
    unpacked = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert unpacked == pytest.approx(floats.data[1].embedding, abs=1e-6)
