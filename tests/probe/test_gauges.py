"""The running and waiting gauges of the servers the probe knows, read from their
/metrics text (an httpx mock transport: no socket)."""

from __future__ import annotations

import httpx
import pytest

from sluiceway.client import AsyncClient
from sluiceway.probe.gauges import Gauges, read_gauges

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 2.0
vllm:num_requests_running{model_name="b"} 1.0
vllm:num_requests_waiting{model_name="a"} 4.0
"""
SGLANG = 'sglang:num_running_reqs{model_name="m"} 3\nsglang:num_queue_reqs{model_name="m"} 5\n'
LLAMA_CPP = "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n"


def client_for(status: int, text: str) -> AsyncClient:
    def reply(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        return httpx.Response(status, text=text)

    return AsyncClient("http://probe.invalid", transport=httpx.MockTransport(reply), max_retries=0)


@pytest.mark.parametrize(
    ("status", "text", "expected"),
    [
        (200, VLLM, Gauges(3.0, 4.0, "vllm")),  # summed over label sets
        (200, SGLANG, Gauges(3.0, 5.0, "sglang")),
        (200, LLAMA_CPP, Gauges(1.0, 0.0, "llamacpp")),
        (200, "process_cpu_seconds_total 12.5\n", None),  # /metrics without the gauges
        (404, '{"error": {"message": "not found"}}', None),  # no /metrics
    ],
)
async def test_gauges_by_server(status: int, text: str, expected: Gauges | None) -> None:
    async with client_for(status, text) as client:
        assert await read_gauges(client) == expected
