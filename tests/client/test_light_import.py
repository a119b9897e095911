"""Importing the client must not pull in the server or its heavy dependencies."""

from __future__ import annotations

import subprocess
import sys

HEAVY = [
    "torch",
    "transformers",
    "quart",
    "quart_trio",
    "hypercorn",
    "gguf",
    "accelerate",
    "sluiceway.api",
    "sluiceway.engine",
    "sluiceway.runner",
    "sluiceway.cli",
]


def test_import_sluiceway_client_stays_light() -> None:
    code = (
        "import sys, sluiceway.client, sluiceway.client.chat_cli, sluiceway.protocol\n"
        f"heavy = [m for m in sys.modules if m in {HEAVY!r} or m.split('.')[0] in {HEAVY!r}]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_protocol_imports_only_attrs_msgspec_and_stdlib() -> None:
    code = (
        "import sys; before = set(sys.modules); import sluiceway.protocol\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "assert new <= {'sluiceway', 'attr', 'attrs', 'msgspec', 'typing_extensions'} | set(sys.stdlib_module_names), new\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
