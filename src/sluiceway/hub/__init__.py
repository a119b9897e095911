"""Serving a model by its hub id: `--model ORG/NAME` or `ORG/NAME-GGUF:QUANT`.

`resolve_model` turns what the user typed into a local path (a Hugging Face
model directory or a GGUF file) in the standard Hugging Face cache, fetching
through `huggingface_hub` only the files serving needs (`hub.files`); the
loader never sees a hub id. A local path that exists always wins.
"""

from sluiceway.hub.files import HubError
from sluiceway.hub.flags import add_hub_flags, hub_options
from sluiceway.hub.resolve import HubOptions, ResolvedModel, resolve_adapter, resolve_model

__all__ = ["HubError", "HubOptions", "ResolvedModel", "add_hub_flags", "hub_options", "resolve_adapter", "resolve_model"]
