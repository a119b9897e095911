"""`--reasoning-parser`, `--chat-template` and `--default-chat-template-kwargs` on
the command line, and the parser a server picks by model family."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from script_runner import ScriptRunner
from sluiceway import cli
from sluiceway.api import create_app
from sluiceway.api.app import app_state
from sluiceway.config import EngineConfig, ServerConfig
from sluiceway.engine.engine import Engine
from sluiceway.reasoning import FORMATS


def test_the_flags_parse_into_what_the_server_reads(tmp_path: Path) -> None:
    template = tmp_path / "reasoning.jinja"
    template.write_text("{{ messages[0].content }}")
    args = cli.build_parser().parse_args(
        [
            "serve",
            "--reasoning-parser",
            "think:<r>,</r>",
            "--chat-template",
            str(template),
            "--default-chat-template-kwargs",
            '{"enable_thinking": false}',
        ]
    )
    assert args.reasoning_parser == "think:<r>,</r>"
    assert args.chat_template == "{{ messages[0].content }}"
    assert args.default_chat_template_kwargs == {"enable_thinking": False}
    defaults = cli.build_parser().parse_args(["serve"])
    assert (defaults.reasoning_parser, defaults.chat_template) == ("auto", None)
    assert defaults.default_chat_template_kwargs == {}


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--reasoning-parser", "qwen9"], "unknown reasoning parser 'qwen9'"),
        (["--chat-template", "missing.jinja"], "neither a file nor a Jinja template"),
        (["--default-chat-template-kwargs", "[true]"], "must be a JSON object"),
    ],
)
def test_bad_values_are_refused_at_start(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", *argv])
    assert complaint in capsys.readouterr().err


@pytest.mark.parametrize(
    ("model_type", "setting", "expected", "logged"),
    [
        ("qwen3", "auto", "qwen3", "reasoning parser qwen3 (the qwen3 family's)"),
        ("smollm3", "auto", "qwen3", "reasoning parser qwen3 (the smollm3 family's)"),
        ("llama", "auto", None, "reasoning parser: off"),
        ("qwen3", "none", None, "reasoning parser: off (--reasoning-parser none)"),
        ("llama", "deepseek_r1", "deepseek_r1", "reasoning parser deepseek_r1 (named by"),
    ],
)
async def test_the_server_picks_by_family_and_says_so(
    tokenizer: Any,
    caplog: pytest.LogCaptureFixture,
    model_type: str,
    setting: str,
    expected: str | None,
    logged: str,
) -> None:
    runner = ScriptRunner.of(tokenizer, ["x"])
    engine = Engine(
        runner,
        tokenizer,
        EngineConfig(),
        eos_token_ids=frozenset({tokenizer.eos_token_id}),
        max_model_len=256,
    )
    with caplog.at_level(logging.INFO):
        app = create_app(
            engine,
            server_config=ServerConfig(reasoning_parser=setting),
            model_name="m",
            model_type=model_type,
        )
    chosen = app_state(app).reasoning
    assert chosen is (None if expected is None else FORMATS[expected])
    assert any(logged in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]
