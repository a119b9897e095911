"""What the user typed as `--model`: a local path, or a Hugging Face hub id.

`ORG/NAME` is a model repository; `ORG/NAME:QUANT` also names the quant of a
GGUF repository, as llama.cpp's `-hf` takes it (`unsloth/Qwen3-8B-GGUF:Q4_K_M`,
case-insensitive). A path that exists always wins: `models/llama` is that
directory when there is one, and a hub id only when there is none.

Standard library and attrs only: the command line reads this before it knows
whether anything is to be fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

# The hub's own rule for repository names: letters, digits, '-', '_' and '.',
# at most 96 characters, not starting or ending with '-' or '.', and no '--'
# or '..' (huggingface_hub's validate_repo_id); one namespace before the slash.
_PART = r"[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?::(?P<quant>[A-Za-z0-9_.-]+))?$")


@attrs.frozen
class HubModelId:
    """A model on the hub: `repo_id` (ORG/NAME), the quant asked for (None: any)
    and `text`, the id as the user typed it (the name the model is served under)."""

    repo_id: str
    quant: str | None
    text: str


def parse_model_id(text: str) -> HubModelId | None:
    """The hub id `text` names, or None when it is a local path (one that exists,
    or that only a path can be: absolute, `~`, `./`, a `.gguf` file, more than
    one slash). None is for the local loader to open or to say it is missing."""
    if Path(text).expanduser().exists():
        return None
    if text.startswith(("/", "~", ".")) or text.lower().endswith(".gguf"):
        return None
    match = _HUB_ID.match(text)
    if match is None or "--" in text or ".." in text:
        return None
    return HubModelId(match["repo"], match["quant"], text)
