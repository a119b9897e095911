"""Where sluiceway keeps what it builds once and reuses: a GGUF model's config
and tokenizer (`runner/checkpoint/gguf_metadata.py`; never its weights) and
compiled C kernels (`runner/native/library.py`).

Standard library only, so that any layer can ask for the directory without
importing the one that fills it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path | None:
    """The cache directory: `$SLUICEWAY_CACHE_DIR`, else `$XDG_CACHE_HOME/sluiceway`
    (default `~/.cache/sluiceway`); None when `SLUICEWAY_CACHE_DIR` is set to "off".
    Read from the environment on every call; nothing is created."""
    configured = os.environ.get("SLUICEWAY_CACHE_DIR")
    if configured == "off":
        return None
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "sluiceway"
