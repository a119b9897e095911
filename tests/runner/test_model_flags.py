"""The model flags shared by `serve`, `generate` and `bench engine` reach ModelConfig."""

from __future__ import annotations

import pytest

from sluiceway.cli import build_parser, model_config


@pytest.mark.parametrize("command", [["serve"], ["generate", "hi"], ["bench", "engine"]])
def test_quantization_and_enforce_eager_reach_the_model_config(command):
    args = build_parser().parse_args([*command, "--quantization", "int4", "--enforce-eager"])
    config = model_config(args)
    assert config.quantization == "int4"
    assert config.enforce_eager is True


def test_defaults_pick_the_quantization_from_the_weights_and_are_graph_capable():
    config = model_config(build_parser().parse_args(["serve"]))
    assert config.quantization == "auto"
    assert config.enforce_eager is False


def test_quantization_none_keeps_the_weights_unquantized():
    args = build_parser().parse_args(["serve", "--quantization", "none"])
    assert model_config(args).quantization == "none"


def test_an_unknown_quantization_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--quantization", "int3"])
    assert exit_info.value.code == 2
    assert "int3" in capsys.readouterr().err
