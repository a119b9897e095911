"""Per-key budgets: requests and tokens a minute, refilled continuously, over
budget a 429 with Retry-After and OpenAI's rate-limit headers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from sluiceway.api.http.errors import APIError
from sluiceway.api.keys.rate_limits import RateLimits, load_key_budgets
from sluiceway.config import KeyBudget

from .conftest import MODEL


async def test_a_budget_refills_a_sixtieth_a_second(autojump_clock: Any) -> None:
    limits = RateLimits({"k": KeyBudget(requests_per_minute=2, tokens_per_minute=600)})
    limits.take("k", requests=1, tokens=500)
    with pytest.raises(APIError) as over:
        limits.take("k", requests=1, tokens=200)  # 100 tokens left
    assert over.value.status == 429 and over.value.code == "rate_limit_exceeded"
    headers = dict(over.value.headers)
    assert headers["Retry-After"] == "10"  # 100 more tokens at 10 a second
    assert headers["x-ratelimit-remaining-tokens"] == "100"
    assert headers["x-ratelimit-remaining-requests"] == "1"  # a refused request takes nothing
    await trio.sleep(10)
    limits.take("k", requests=1, tokens=200)
    assert dict(limits.headers("k"))["x-ratelimit-remaining-requests"] == "0"
    limits.take(None, requests=100, tokens=10**9)  # a key without a budget is never limited
    limits.take("other", requests=100)


def test_the_budget_file_is_checked(tmp_path: Any) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": {"a": {"requests_per_minute": 5}, "b": {}}}))
    assert load_key_budgets(path) == {"a": KeyBudget(5, None), "b": KeyBudget()}
    path.write_text(json.dumps({"keys": {"a": {"requests_per_minute": 0}}}))
    with pytest.raises(ValueError, match="requests_per_minute must be a positive integer"):
        load_key_budgets(path)
    path.write_text(json.dumps({"keys": {"a": {"rpm": 5}}}))
    with pytest.raises(ValueError, match="rpm"):
        load_key_budgets(path)


async def test_over_budget_is_a_429_with_openais_headers(start_server: Any) -> None:
    budgets = {"limited": KeyBudget(requests_per_minute=2, tokens_per_minute=100_000)}
    async with start_server(api_keys=("free",), api_key_budgets=budgets) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:

            async def post(key: str) -> httpx.Response:
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                }
                return await client.post(
                    "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                )

            first = await post("limited")
            assert first.status_code == 200
            assert first.headers["x-ratelimit-limit-requests"] == "2"
            assert first.headers["x-ratelimit-remaining-requests"] == "1"
            assert (await post("limited")).status_code == 200
            refused = await post("limited")
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            assert int(refused.headers["Retry-After"]) >= 1
            assert refused.headers["x-ratelimit-remaining-requests"] == "0"
            # Another key has its own budget (here none); a budgeted key is accepted.
            assert (await post("free")).status_code == 200
            assert "x-ratelimit-limit-requests" not in (await post("free")).headers
            assert (await post("wrong")).status_code == 401
