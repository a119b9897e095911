"""Chat-template settings from the command line: `--chat-template FILE_OR_STRING`
(vLLM's flag: a Jinja file, or the template itself) and
`--default-chat-template-kwargs JSON` (an object every template render is given)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_chat_template(value: str) -> str:
    """The template `value` names: a file's text, or `value` itself when it reads
    as a template (it has a Jinja delimiter or a newline), as vLLM decides. Raises
    `ValueError` for a path that does not exist and an empty template."""
    path = Path(value).expanduser()
    if path.is_file():
        text = path.read_text(encoding="utf-8")
    elif any(mark in value for mark in ("{{", "{%", "\n")):
        text = value
    else:
        raise ValueError(f"--chat-template: {value!r} is neither a file nor a Jinja template")
    if not text.strip():
        raise ValueError(f"--chat-template: {value!r} is empty")
    return text


def parse_template_kwargs(text: str) -> dict[str, Any]:
    """`text` as a JSON object (`{"enable_thinking": false}`); `ValueError` saying
    what it is instead."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--default-chat-template-kwargs is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(
            f"--default-chat-template-kwargs must be a JSON object, not {type(value).__name__}"
        )
    return value
