"""The command-line flags of hub ids: `--revision`, `--hf-token`, `--offline`.

argparse only, so that `--help` stays quick."""

from __future__ import annotations

import argparse

from sluiceway.hub.resolve import HubOptions


def add_hub_flags(parser: argparse.ArgumentParser) -> None:
    """Add the flags `hub_options` reads, as a "model hub" group."""
    group = parser.add_argument_group("model hub (for --model ORG/NAME)")
    group.add_argument(
        "--revision",
        default=None,
        metavar="REV",
        help="branch, tag or commit of the hub repository (default: main)",
    )
    group.add_argument(
        "--hf-token",
        default=None,
        metavar="TOKEN",
        help="Hugging Face token for gated and private repositories (default: HF_TOKEN, or "
        "the token `hf auth login` saved)",
    )
    group.add_argument(
        "--offline",
        action="store_true",
        help="serve from the hub cache only, never asking the hub (as HF_HUB_OFFLINE=1 does)",
    )


def hub_options(args: argparse.Namespace) -> HubOptions:
    """The hub options of parsed `add_hub_flags` flags."""
    return HubOptions(revision=args.revision, token=args.hf_token, offline=args.offline)
