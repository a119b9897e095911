"""Which family serves a transformers config (`family_for`), and the list of
what is served."""

from __future__ import annotations

from sluiceway.runner.models import (
    gemma2,
    gemma3,
    llama,
    mistral,
    mixtral,
    phi3,
    qwen2,
    qwen3,
    qwen3_moe,
    smollm3,
)
from sluiceway.runner.models.architecture import UnsupportedModel
from sluiceway.runner.models.family import DecoderFamily

FAMILIES: tuple[DecoderFamily, ...] = (
    llama.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    mistral.FAMILY,
    phi3.FAMILY,
    smollm3.FAMILY,
    gemma2.FAMILY,
    gemma3.FAMILY,
    qwen3_moe.FAMILY,
    mixtral.FAMILY,
)

_BY_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}

SUPPORTED_MODEL_TYPES = frozenset(_BY_TYPE)


def family_for(config) -> DecoderFamily:
    """The family of `config.model_type`; `UnsupportedModel` naming the field and
    what is supported for any other."""
    model_type = getattr(config, "model_type", None)
    family = _BY_TYPE.get(model_type)  # type: ignore[arg-type]
    if family is None:
        raise UnsupportedModel(
            f"unsupported architecture {model_type!r} (config field model_type); supported: "
            + ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        )
    return family


def check_supported(config) -> None:
    """Raise `UnsupportedModel` naming the config field this server cannot serve."""
    family_for(config).architecture(config)
