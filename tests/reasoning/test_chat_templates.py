"""`--chat-template` and `--default-chat-template-kwargs` values."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluiceway.chat_templates import load_chat_template, parse_template_kwargs


def test_a_file_or_an_inline_template(tmp_path: Path) -> None:
    file = tmp_path / "t.jinja"
    file.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert load_chat_template(str(file)) == file.read_text()
    assert load_chat_template("{{ messages[0].content }}") == "{{ messages[0].content }}"
    with pytest.raises(ValueError, match="neither a file nor"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        load_chat_template(str(tmp_path / "empty.jinja"))


def test_template_kwargs_are_a_json_object() -> None:
    assert parse_template_kwargs('{"enable_thinking": false}') == {"enable_thinking": False}
    with pytest.raises(ValueError, match="JSON object, not list"):
        parse_template_kwargs("[1]")
    with pytest.raises(ValueError, match="not JSON"):
        parse_template_kwargs("{enable_thinking: false}")
