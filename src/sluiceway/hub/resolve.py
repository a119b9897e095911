"""From what the user typed as the model to what the loader opens."""

from __future__ import annotations

import attrs

from sluiceway.hub.fetch import fetch, offline_from_environment
from sluiceway.hub.files import HubError
from sluiceway.hub.model_id import parse_model_id


@attrs.frozen
class HubOptions:
    """How hub ids are fetched: the `revision` (branch, tag or commit; None:
    main), the `token` (None: `HF_TOKEN` or the saved login) and `offline`
    (from the cache only; `HF_HUB_OFFLINE=1` means the same). The token is
    kept out of `repr`, so that no log or error shows it."""

    revision: str | None = None
    token: str | None = attrs.field(default=None, repr=False)
    offline: bool = False


@attrs.frozen
class ResolvedModel:
    """`path` is what the loader opens (None: the embedded default model);
    `served_name` the name clients use when none is configured: the hub id as
    typed, or None for a local path (the loader names it)."""

    path: str | None
    served_name: str | None = None


def resolve_model(model: str | None, options: HubOptions | None = None) -> ResolvedModel:
    """`model` as a local path: itself when it is one (or the default, None), else
    the hub id it names fetched into the hub cache (see `hub.fetch`). Raises
    `HubError` with a one-line message when a hub model cannot be had."""
    options = options or HubOptions()
    hub_id = None if model is None else parse_model_id(model)
    if hub_id is None:
        return ResolvedModel(model)
    path = fetch(
        hub_id,
        revision=options.revision,
        token=options.token,
        offline=options.offline or offline_from_environment(),
    )
    return ResolvedModel(str(path), hub_id.text)


def resolve_adapter(path: str, options: HubOptions | None = None) -> str:
    """A LoRA adapter's local directory: `path` itself when it is one, else the
    hub id it names (`ORG/NAME`, the latest revision, as vLLM takes one)
    fetched into the hub cache: only `adapter_config.json` and
    `adapter_model.safetensors`. `HubError` with a one-line message when it
    cannot be had."""
    options = options or HubOptions()
    hub_id = parse_model_id(path)
    if hub_id is None:
        return path
    if hub_id.quant is not None:
        raise HubError(f"{path}: a LoRA adapter is named ORG/NAME, with no :QUANT")
    offline = options.offline or offline_from_environment()
    return str(fetch(hub_id, revision=None, token=options.token, offline=offline, adapter=True))
