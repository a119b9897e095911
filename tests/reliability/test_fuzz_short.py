"""The short fuzz run: the fuzz/ targets driven by hypothesis (structured inputs and
raw bytes), plus schemathesis against a fake-runner server's /openapi.json."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from load_server import ServerProcess

REPO = Path(__file__).resolve().parents[2]

_spec = importlib.util.spec_from_file_location(
    "sluiceway_fuzz_targets", REPO / "fuzz" / "targets.py"
)
assert _spec is not None and _spec.loader is not None
targets: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(targets)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "model",
    "messages",
    "prompt",
    "n",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "logprobs",
    "top_logprobs",
    "echo",
    "logit_bias",
    "ignore_eos",
    "min_tokens",
    "repetition_penalty",
    "presence_penalty",
    "response_format",
    "tools",
]
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "wizard"]) | json_values},
        optional={
            "content": st.text(max_size=40) | json_values,
            "name": st.text(max_size=5) | json_values,
        },
    ),
    max_size=4,
)
request_bodies = st.dictionaries(
    st.sampled_from(FIELDS), json_values | messages | st.lists(messages, max_size=3), max_size=10
)


@pytest.fixture(autouse=True)
def _tokenizer(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(targets, "tokenizer", lambda: tokenizer)


@FAST
@given(request_bodies)
def test_request_validation(body: dict[str, Any]) -> None:
    targets.check_request_body(body)


@FAST
@given(st.binary(max_size=200))
def test_request_json_bytes(data: bytes) -> None:
    targets.fuzz_request_json(data)


@FAST
@given(messages | st.lists(messages, max_size=3) | json_values, st.booleans())
def test_chat_render(value: Any, add_generation_prompt: bool) -> None:
    targets.check_chat_render(value, add_generation_prompt)


@FAST
@given(st.text(max_size=200))
def test_completion_text(text: str) -> None:
    targets.check_completion_text(text)


@FAST
@given(json_values)
def test_sse_framing(value: Any) -> None:
    targets.check_sse_event(value)


@FAST
@given(st.binary(max_size=80))
def test_detokenizer_bytes(data: bytes) -> None:
    targets.fuzz_detokenizer(data)


@FAST
@given(
    st.lists(st.sampled_from(targets._TOKEN_POOL), max_size=40),
    st.lists(st.text(min_size=1, max_size=3), max_size=3),
    st.booleans(),
)
def test_detokenizer_streams(ids: list[int], stops: list[str], include: bool) -> None:
    targets.check_detokenizer(ids, tuple(stops), include)


# ---- a known bug: lone surrogates ---------------------------------------------------


def test_lone_surrogate_is_a_400(tokenizer_dir: Path, tmp_path: Path) -> None:
    with ServerProcess.fake(tokenizer_dir, [], tmp_path / "server.log", start_limit_s=60) as server:
        bodies = [
            ("/v1/completions", '{"prompt": "\\ud800", "max_tokens": 2}'),
            ("/v1/completions", '{"model": "\\ud800", "prompt": "x"}'),
            ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\udc00"}]}'),
            ("/tokenize", '{"prompt": "\\ud800"}'),
        ]
        statuses = [
            httpx.post(
                server.url + path,
                content=body,
                headers={"content-type": "application/json"},
                timeout=10,
            ).status_code
            for path, body in bodies
        ]
    assert statuses == [400, 400, 400, 400]  # an invalid body, before any lookup


# ---- schemathesis ------------------------------------------------------------------------

CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"


def test_schemathesis_short(tokenizer_dir: Path, tmp_path: Path) -> None:
    flags = ["--request-timeout", "5"]
    with ServerProcess.fake(
        tokenizer_dir, flags, tmp_path / "server.log", start_limit_s=60
    ) as server:
        cmd = [
            str(Path(sys.executable).parent / "schemathesis"),
            "run",
            server.url + "/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            "15",
            "--phases",
            "examples,fuzzing",
            "--max-time",
            "12",
            "-w",
            "1",
            "--seed",
            "1",
            "--request-timeout",
            "20",
        ]
        done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-6000:]
