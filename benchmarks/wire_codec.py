"""Microbenchmark of the wire codecs: decoding a typical chat request into the
protocol types, and encoding a typical streamed chunk.

    PYTHONPATH=src .venv/bin/python benchmarks/wire_codec.py [--rounds 7] [--number 20000]

Compares msgspec (what the server uses) with cattrs on the same attrs types, and
with the hand-written validator it replaced (`--old-ref`, read with `git show`).
cattrs has no strict unions of its own: the converter here gets one generic
union hook, about the least a server would need. Prints the median µs per call.
cattrs is optional: without it those rows are skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import timeit
import typing
from pathlib import Path
from typing import Any

import msgspec

from sluiceway import protocol
from sluiceway.api.http import sse, wire

CHAT = json.dumps(
    {
        "model": "SmolLM2-135M-Instruct",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write a haiku about a river at night."},
        ],
        "max_tokens": 128,
        "temperature": 0.7,
        "top_p": 0.95,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
).encode()
CHUNK = protocol.ChatCompletionChunk(
    id="chatcmpl-0123456789abcdef0123456789abcdef",
    model="SmolLM2-135M-Instruct",
    created=1700000000,
    choices=[protocol.ChatCompletionChunkChoice(0, protocol.DeltaMessage(content=" river"))],
)


def _cattrs_converter() -> Any:
    import cattrs

    converter = cattrs.Converter(forbid_extra_keys=False)

    def is_union(t: Any) -> bool:
        return typing.get_origin(t) in (typing.Union, __import__("types").UnionType)

    def structure_union(value: Any, t: Any) -> Any:
        errors = []
        for arm in typing.get_args(t):
            base = typing.get_args(arm)[0] if typing.get_origin(arm) is typing.Annotated else arm
            if base is type(None):
                if value is None:
                    return None
                continue
            if base in (int, float, str, bool):
                if type(value) is base or (base is float and type(value) is int):
                    return value
                continue
            try:
                return converter.structure(value, base)
            except Exception as exc:  # try the next arm
                errors.append(exc)
        raise ValueError(f"{value!r} is none of {t}")

    converter.register_structure_hook_func(is_union, structure_union)
    return converter


def _old_validator(ref: str) -> Any:
    """`api/validation.py` as of `ref`, loaded as its own module."""
    source = subprocess.run(
        ["git", "show", f"{ref}:src/sluiceway/api/validation.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_validation.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_validation", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--old-ref", default="5aba36d", help="commit of the old validator")
    args = parser.parse_args()

    cases: dict[str, Any] = {
        "decode chat request: msgspec (bytes -> types)": lambda: wire.decode(
            CHAT, protocol.ChatCompletionRequest
        ),
        "decode chat request: msgspec.convert (json.loads, then types)": lambda: wire.decode(
            json.loads(CHAT), protocol.ChatCompletionRequest
        ),
    }
    chunk_dict = CHUNK.to_dict()
    try:
        converter = _cattrs_converter()
    except ImportError:
        print("cattrs is not installed: its rows are skipped", file=sys.stderr)
    else:
        cases["decode chat request: cattrs (json.loads, then types)"] = lambda: converter.structure(
            json.loads(CHAT), protocol.ChatCompletionRequest
        )
        cases["encode chunk: cattrs unstructure + json"] = lambda: sse.event(
            converter.unstructure(CHUNK)
        )
    try:
        old = _old_validator(args.old_ref)
    except subprocess.CalledProcessError:
        print(f"no validator at {args.old_ref}: its row is skipped", file=sys.stderr)
    else:
        cases[f"decode chat request: hand-written validator at {args.old_ref}"] = lambda: (
            old.parse_chat_request(old.parse_json(CHAT), 49152)
        )
    encoder = msgspec.json.Encoder()
    template = sse.EventTemplate.around(
        lambda text: CHUNK.to_dict() | {"choices": [{"index": 0, "delta": {"content": text}}]}
    )
    assert template is not None
    cases |= {
        "encode chunk: dict + sse.event (the dict path)": lambda: sse.event(chunk_dict),
        "encode chunk: to_dict + sse.event": lambda: sse.event(CHUNK.to_dict()),
        "encode chunk: msgspec.json.encode(attrs)": lambda: encoder.encode(CHUNK),
        "encode chunk: EventTemplate.render (streaming path)": lambda: template.render(" river"),
    }
    for name, fn in cases.items():
        fn()  # warm, and fail early
        times = timeit.repeat(fn, number=args.number, repeat=args.rounds)
        print(f"{statistics.median(times) / args.number * 1e6:8.2f} µs  {name}")


if __name__ == "__main__":
    main()
