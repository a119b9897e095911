"""A GGUF file's config and tokenizer, as transformers builds them from its
metadata, kept small in the cache.

transformers re-parses the whole header for each of config and tokenizer,
seconds each for a large vocabulary. The first load saves both (config.json and
the tokenizer's files, a few MB) under the SHA-256 of the file's header
(`GGUFFile.header_digest`, which covers the metadata and the tokenizer); later
loads of the same header read those back. Nothing of the weights is cached.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sluiceway.cache_paths import cache_root
from sluiceway.runner.checkpoint.errors import CheckpointError
from sluiceway.runner.checkpoint.gguf_file import GGUFFile

log = logging.getLogger("sluiceway.runner.loading")

_DIRECTORY = "gguf-metadata"
# Architectures transformers calls tied whatever the file holds.
_ALWAYS_TIED = ("falcon", "bloom")
# What the float32 converted-model cache of earlier versions was called.
OLD_CONVERTED = "gguf"


def metadata_dir(path: Path, header_digest: str) -> Path | None:
    """The cache entry for a GGUF header (None: caching is off)."""
    root = cache_root()
    if root is None:
        return None
    return root / _DIRECTORY / f"{path.stem}-{header_digest[:20]}"


def remove_old_converted_models() -> None:
    """Delete the float32 copies of GGUF models that earlier versions cached (each
    four bytes a parameter): nothing reads them any more."""
    root = cache_root()
    old = None if root is None else root / OLD_CONVERTED
    if old is not None and old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
        log.info("removed the float32 converted-model cache %s (no longer used)", old)


def config_and_tokenizer(file: GGUFFile) -> tuple[Any, Any]:
    """`(config, tokenizer)` of the GGUF `file`, from the cache where an entry for
    its header exists, else from the file (then cached). `CheckpointError` when
    transformers cannot build one of them, naming which."""
    from transformers import AutoConfig, AutoTokenizer

    path = file.path
    entry = metadata_dir(path, file.header_digest)
    if entry is not None and (entry / "config.json").is_file():
        try:
            config = AutoConfig.from_pretrained(entry, local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(entry, local_files_only=True)
            return config, tokenizer
        except Exception as exc:  # a damaged entry: build it again
            log.warning("cached metadata %s does not load (%s); reading the GGUF", entry, exc)
            shutil.rmtree(entry, ignore_errors=True)
    kwargs: dict[str, Any] = {"gguf_file": path.name, "local_files_only": True}
    try:
        with _header_reader():
            config = AutoConfig.from_pretrained(path.parent, **kwargs)
    except Exception as exc:
        raise CheckpointError(f"{path}: metadata general.architecture: {_first_line(exc)}") from None
    if file.parts > 1:
        # transformers reads the tensor table of the file it is given, the first
        # part, and calls the head tied when no output.weight is there.
        config.tie_word_embeddings = "output.weight" not in file.tensors or file.architecture in _ALWAYS_TIED
    try:
        tokenizer = _tokenizer(path, config)
    except Exception as exc:
        raise CheckpointError(
            f"{path}: metadata tokenizer.ggml.model: cannot build the tokenizer: {_first_line(exc)}"
        ) from None
    if entry is not None:
        _save(entry, config, tokenizer)
    return config, tokenizer


class _Field:
    """One metadata value in the shape gguf-py's `ReaderField` gives it to
    transformers' legacy GGUF reader: `parts[i]` for each `i` of `data`, decoded
    by the value type(s) `types`."""

    def __init__(self, value: Any) -> None:
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            self.types, self.parts = [9, 8], [list(v.encode()) for v in value]
            self.data = list(range(len(value)))
        elif isinstance(value, list):
            element = 6 if any(isinstance(v, float) for v in value) else 5
            self.types, self.parts = [9, element], [[v] for v in value]
            self.data = list(range(len(value)))
        else:
            if isinstance(value, str):
                self.types, self.parts = [8], [list(value.encode())]
            else:  # bool before int: a bool is an int
                kind = 7 if isinstance(value, bool) else 6 if isinstance(value, float) else 5
                self.types, self.parts = [kind], [[value]]
            self.data = [0]


class _Tensor:
    def __init__(self, name: str) -> None:
        self.name = name


# The tokenizer keys the config takes (token ids); the others hold the
# vocabulary, merges and scores, of which it reads only the vocabulary's length
# (its vocab_size where the architecture's keys give none).
_CONFIG_TOKENIZER_KEYS = tuple(
    f"tokenizer.ggml.{k}_token_id" for k in ("bos", "eos", "unknown", "padding")
)
_TOKENS = "tokenizer.ggml.tokens"


class _HeaderReader:
    """What transformers' legacy GGUF reader asks of gguf-py's `GGUFReader`
    (`fields` and the tensors' names) for a config, from transformers' own fast
    header reader: gguf-py builds a numpy view of every vocabulary and merge
    entry, 7 s of a 128k-token file's first load, none of which a config reads."""

    def __init__(self, path: Any, *args: Any, **kwargs: Any) -> None:
        from transformers.integrations.gguf.reader import read_gguf_metadata

        metadata, names = read_gguf_metadata(str(path))
        self.fields = {
            key: _Field(value)
            for key, value in metadata.items()
            if not key.startswith("tokenizer.") or key in _CONFIG_TOKENIZER_KEYS
        }
        if _TOKENS in metadata:  # the fast reader gives a string array's length
            self.fields[_TOKENS] = _Field([""] * int(metadata[_TOKENS]))
        self.tensors = [_Tensor(name) for name in names]


@contextmanager
def _header_reader() -> Iterator[None]:
    """transformers' legacy GGUF config path reading the header through
    `_HeaderReader` while inside (where this transformers has the fast reader;
    as it is otherwise). Not for use by two threads at once: it swaps
    `gguf.GGUFReader`, which that path imports when called."""
    import gguf

    try:
        from transformers.integrations.gguf.reader import read_gguf_metadata  # noqa: F401
    except ImportError:
        yield
        return
    original = gguf.GGUFReader
    gguf.GGUFReader = _HeaderReader  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]


# Files beside a GGUF that AutoTokenizer reads to choose the tokenizer's class.
_TOKENIZER_HINTS = ("tokenizer_config.json", "tokenizer.json", "config.json")


def _tokenizer(path: Path, config: Any) -> Any:
    """The tokenizer AutoTokenizer builds from the GGUF at `path`, of `config`.
    AutoTokenizer first builds the config again from the file (transformers'
    legacy GGUF reader: 6 s of a 128k-token vocabulary's 12 s first load) only to
    pick the tokenizer class by its type; with nothing beside the file to say
    otherwise, that pick is `TOKENIZER_MAPPING` of the config's type (or
    `TokenizersBackend`), whose own GGUF reader takes half a second."""
    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    kwargs: dict[str, Any] = {"gguf_file": path.name, "local_files_only": True}
    chosen: Any = TOKENIZER_MAPPING.get(type(config), TokenizersBackend)
    if (
        not hasattr(chosen, "from_pretrained")  # a (slow, fast) pair: let AutoTokenizer pick
        or chosen.__name__ == "MistralCommonBackend"  # AutoTokenizer decides that one by the files
        or any((path.parent / hint).exists() for hint in _TOKENIZER_HINTS)
    ):
        return AutoTokenizer.from_pretrained(path.parent, **kwargs)
    return chosen.from_pretrained(path.parent, **kwargs)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _save(entry: Path, config: Any, tokenizer: Any) -> None:
    """Write the entry atomically (built beside it, then renamed); a failure only
    costs the cache, and says so in the log."""
    tmp: Path | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(entry)
        except OSError:
            if not (entry / "config.json").is_file():
                raise
    except Exception as exc:
        log.warning("could not cache the GGUF's config and tokenizer in %s: %s", entry, exc)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
