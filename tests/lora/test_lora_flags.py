"""`sluiceway serve --lora-modules NAME=PATH ... --max-loras N --max-lora-rank R`
reach the model configuration, and a bad adapter stops the start with an error
naming it."""

from __future__ import annotations

import pytest

from family_models import tiny
from sluiceway.cli import build_parser
from sluiceway.config import ModelConfig
from sluiceway.flags import model_config
from sluiceway.model_engine import _enable_lora
from sluiceway.runner.loading import ModelLoadError
from sluiceway.runner.model_runner import TorchModelRunner


def test_the_flags_reach_the_model_config():
    args = build_parser().parse_args(
        ["serve", "--lora-modules", "sql=/a/sql", "chat=/b", "--max-loras", "3", "--max-lora-rank", "64"]
    )
    config = model_config(args)
    assert config.lora_modules == (("sql", "/a/sql"), ("chat", "/b"))
    assert (config.max_loras, config.max_lora_rank) == (3, 64)
    plain = model_config(build_parser().parse_args(["serve"]))
    assert (plain.lora_modules, plain.max_loras, plain.max_lora_rank) == ((), 1, 16)


@pytest.mark.parametrize("bad", ["sql", "=/a", "sql="])
def test_a_module_without_name_and_path_is_refused(bad, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--lora-modules", bad])
    assert "NAME=PATH" in capsys.readouterr().err


def test_a_bad_adapter_is_a_start_error_naming_it(tmp_path):
    base = tiny("llama")
    runner = TorchModelRunner(base.config, base.state_dict(), block_size=4, num_blocks=8)
    config = ModelConfig(lora_modules=(("sql", str(tmp_path / "missing")),))
    with pytest.raises(ModelLoadError, match=r"missing.*has no adapter_config"):
        _enable_lora(runner, config)
    twice = ModelConfig(lora_modules=(("sql", "/a"), ("sql", "/b")))
    with pytest.raises(ModelLoadError, match="same name"):
        _enable_lora(runner, twice)
    assert runner.lora is None
