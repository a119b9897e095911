"""Which files of a hub repository serving needs, from the list of its files.

A Hugging Face model repository is served from its top-level JSON files (config,
generation config, tokenizer and its config, chat template, index), its
tokenizer files and its safetensors weights; never pickles (`*.bin`, `*.pth`),
never the folders other formats keep (`onnx/`, `original/`, ...). A GGUF
repository is served from one quant's file, or all the parts of a split one.

A PEFT LoRA adapter repository is served from its `adapter_config.json` and
`adapter_model.safetensors`.

Pure functions of file names, as `vllm serve` and `llama-server -hf` choose
them; `hub.fetch` does the downloading.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Iterable

import attrs

log = logging.getLogger(__name__)


class HubError(Exception):
    """A hub model that cannot be served: the message is one line, for the user,
    and never holds the token."""


# Top-level files besides the weights: every JSON (config.json,
# generation_config.json, tokenizer_config.json, special_tokens_map.json, the
# safetensors index, chat_template.json, ...) and these.
_TOKENIZER_FILES = re.compile(
    r"^(?:[^/]+\.(?:json|jinja|tiktoken|model)|merges\.txt|vocab\.txt)$", re.IGNORECASE
)
# Indexes of formats not served; their shards are never fetched.
_OTHER_INDEX = re.compile(r"\.(?:bin|pt|pth|h5|msgpack)\.index\.json$", re.IGNORECASE)
# A sentence-transformers Pooling module's config, read for `/v1/embeddings`.
_POOLING_CONFIG = re.compile(r"^\d+_Pooling/config\.json$")
_SAFETENSORS = re.compile(r"^[^/]+\.safetensors$", re.IGNORECASE)
_SAFETENSORS_INDEX = re.compile(r"^[^/]+\.safetensors\.index\.json$", re.IGNORECASE)

# The weights of formats not served, by how a file or folder is named: for
# saying what a repository holds instead.
_OTHER_FORMATS = (
    (re.compile(r"\.bin$", re.IGNORECASE), "PyTorch .bin"),
    (re.compile(r"\.(?:pth|pt)$", re.IGNORECASE), "PyTorch .pth/.pt"),
    (re.compile(r"(?:^|/)consolidated[^/]*\.safetensors$", re.IGNORECASE), "Mistral consolidated safetensors"),
    (re.compile(r"\.onnx(?:_data)?$", re.IGNORECASE), "ONNX"),
    (re.compile(r"\.h5$", re.IGNORECASE), "TensorFlow .h5"),
    (re.compile(r"\.msgpack$", re.IGNORECASE), "Flax .msgpack"),
    (re.compile(r"(?:^|/)openvino[^/]*\.xml$", re.IGNORECASE), "OpenVINO"),
    (re.compile(r"\.npz$", re.IGNORECASE), "MLX/NumPy .npz"),
    (re.compile(r"\.ckpt$", re.IGNORECASE), "checkpoint .ckpt"),
    (re.compile(r"\.gguf$", re.IGNORECASE), "GGUF"),
    (re.compile(r"\.safetensors$", re.IGNORECASE), "safetensors in subfolders"),
)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})$", re.IGNORECASE)
# The quant a GGUF's name ends with: Q4_K_M, Q8_0, IQ4_XS, UD-Q4_K_XL, F16, BF16, ...
_QUANT = re.compile(
    r"(?:^|[-_.])((?:UD-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32|FP16|FP32|MXFP4(?:_MOE)?))$",
    re.IGNORECASE,
)
# Without a quant asked for: the one llama.cpp's hub manifest defaults to, then
# the next most common CPU quants.
_PREFERRED = ("Q4_K_M", "Q4_0", "Q8_0")


@attrs.frozen
class DirectoryPlan:
    """A Hugging Face model directory: `files` to fetch first; the shards the
    safetensors `index` (if any) lists are fetched after it."""

    files: tuple[str, ...]
    index: str | None


@attrs.frozen
class GgufPlan:
    """One GGUF quant: `files` are its parts in order (one for an unsplit file);
    the loader is given the first."""

    quant: str
    files: tuple[str, ...]


def is_gguf_repo(names: Collection[str]) -> bool:
    """A repository served as GGUF: it holds GGUF files and no Hugging Face
    model (a config.json beside safetensors weights)."""
    has_gguf = any(n.lower().endswith(".gguf") for n in names)
    has_model = "config.json" in names and any(_SAFETENSORS.match(n) for n in names)
    return has_gguf and not has_model


def directory_plan(repo_id: str, names: Collection[str]) -> DirectoryPlan:
    """The files serving `repo_id` as a Hugging Face directory needs. HubError
    when it has no config.json, or no weights in safetensors (naming the formats
    it holds instead)."""
    if "config.json" not in names:
        raise HubError(
            f"{repo_id} has no config.json, so it is not a Hugging Face model "
            f"(it holds: {_formats(names) or 'no model files'})"
        )
    indexes = sorted(n for n in names if _SAFETENSORS_INDEX.match(n))
    weights = sorted(
        n for n in names if _SAFETENSORS.match(n) and not n.lower().startswith("consolidated")
    )
    if not indexes and not weights:
        raise HubError(
            f"{repo_id} has no weights in a format sluiceway serves (safetensors or GGUF); "
            f"it holds: {_formats(names) or 'no weights'}"
        )
    index = "model.safetensors.index.json" if "model.safetensors.index.json" in indexes else None
    index = index or (indexes[0] if indexes else None)
    others = sorted(
        n
        for n in names
        if (_TOKENIZER_FILES.match(n) or _POOLING_CONFIG.match(n))
        and not _OTHER_INDEX.search(n)
        and n not in indexes
    )
    # With an index, its shards are what the loader reads; a lone file beside it
    # (a consolidated copy, say) is not fetched.
    files = [*others, index] if index is not None else [*others, *weights]
    return DirectoryPlan(tuple(files), index)


def adapter_plan(repo_id: str, names: Collection[str]) -> tuple[str, ...]:
    """The files serving `repo_id` as a LoRA adapter needs. HubError when it is
    not a PEFT adapter, or holds its weights in a format not served (naming it)."""
    if ADAPTER_CONFIG not in names:
        held = (
            "it is a model, with a config.json: serve it as --model"
            if "config.json" in names
            else f"it holds: {_formats(names) or 'no model files'}"
        )
        raise HubError(f"{repo_id} has no {ADAPTER_CONFIG}, so it is not a PEFT LoRA adapter ({held})")
    if ADAPTER_WEIGHTS not in names:
        raise HubError(
            f"{repo_id} has no {ADAPTER_WEIGHTS}; it holds: {_formats(names) or 'no weights'}"
        )
    return (ADAPTER_CONFIG, ADAPTER_WEIGHTS)


def listed_shards(index: str, weight_map: Iterable[str]) -> tuple[str, ...]:
    """The shard files (paths in the repository) a safetensors `index` lists, in order."""
    folder = index.rpartition("/")[0]
    return tuple(sorted({f"{folder}/{s}" if folder else s for s in weight_map}))


def shards_of(repo_id: str, index: str, weight_map: Iterable[str], names: Collection[str]) -> tuple[str, ...]:
    """The shard files the safetensors `index` lists, in order; HubError for one
    the repository lacks."""
    shards = listed_shards(index, weight_map)
    missing = [s for s in shards if s not in names]
    if missing:
        raise HubError(f"{repo_id}: {index} lists shards the repository lacks: {', '.join(missing)}")
    return shards


def quant_of(name: str) -> str:
    """The quant a GGUF file name carries (Q4_K_M for `Qwen3-8B-Q4_K_M.gguf` or its
    split parts), upper-cased; the file's stem when it names none."""
    stem = _SPLIT.sub("", name.rpartition("/")[2][: -len(".gguf")])
    match = _QUANT.search(stem)
    return (match[1] if match else stem).upper()


def gguf_plan(repo_id: str, names: Collection[str], quant: str | None) -> GgufPlan:
    """The GGUF of `quant` (case-insensitive; `Q4_K_XL` also finds `UD-Q4_K_XL`,
    `Q4_K_M` also `model-Q4_K_M-imat.gguf`),
    or without one the only quant there, else the first of Q4_K_M, Q4_0, Q8_0,
    else the first by name; the choice is logged. HubError when no file matches
    (naming the quants there) or a split file lacks parts."""
    groups = _gguf_groups(names)
    if not groups:
        raise HubError(
            f"{repo_id} has no GGUF files; it holds: {_formats(names) or 'no model files'}"
        )
    quants = sorted({q for q, _ in groups})
    if quant is not None:
        wanted = quant.upper()
        # The quant a name ends with, then one it ends with after a prefix
        # (UD-Q4_K_XL), then one anywhere in it between separators (Q4_K_M-imat).
        token = re.compile(rf"(?:^|[-_./]){re.escape(wanted)}(?:[-.]|$)", re.IGNORECASE)
        chosen = (
            [g for g in groups if g[0] == wanted]
            or [g for g in groups if g[0].endswith("-" + wanted)]
            or [g for g in groups if token.search(g[1][0][: -len(".gguf")])]
        )
        if not chosen:
            raise HubError(f"{repo_id} has no {quant} GGUF; quants there: {', '.join(quants)}")
        label, files = chosen[0]
        return GgufPlan(label, _complete(repo_id, files, names))
    by_quant = {q: files for q, files in reversed(groups)}  # the first of each quant wins
    if len(by_quant) == 1:
        label = quants[0]
    else:
        label = next((q for q in _PREFERRED if q in by_quant), quants[0])
        log.info(
            "%s holds %d quants (%s): serving %s; name another as %s:QUANT",
            repo_id,
            len(quants),
            ", ".join(quants),
            label,
            repo_id,
        )
    return GgufPlan(label, _complete(repo_id, by_quant[label], names))


def _gguf_groups(names: Collection[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(quant, files) of each GGUF model in the repository, by file name: a split
    file's parts grouped, vision projectors (`mmproj`) left out."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        base = name.rpartition("/")[2]
        if not base.lower().endswith(".gguf") or "mmproj" in base.lower():
            continue
        key = _SPLIT.sub("", name[: -len(".gguf")])
        groups.setdefault(key, []).append(name)
    return [(quant_of(files[0]), tuple(files)) for _, files in sorted(groups.items())]


def _complete(repo_id: str, files: tuple[str, ...], names: Collection[str]) -> tuple[str, ...]:
    """The parts of a split GGUF, all of them (HubError naming those missing)."""
    match = _SPLIT.search(files[0][: -len(".gguf")])
    if match is None:
        return files[:1]
    count = int(match[2])
    stem = files[0][: match.start()]
    suffix = files[0][-len(".gguf") :]
    parts = tuple(f"{stem}-{i:05d}-of-{match[2]}{suffix}" for i in range(1, count + 1))
    missing = [p for p in parts if p not in names]
    if missing:
        raise HubError(f"{repo_id}: the split GGUF {files[0]} lacks parts: {', '.join(missing)}")
    return parts


def _formats(names: Iterable[str]) -> str:
    found: list[str] = []
    for name in sorted(names):
        for pattern, label in _OTHER_FORMATS:
            if pattern.search(name):
                if label not in found:
                    found.append(label)
                break
    return ", ".join(found)
