"""A GGUF file's header and tensors, memory-mapped.

The header (metadata and tensor table) is parsed here with `struct` over a
memory map: `gguf.GGUFReader` builds a numpy view for every vocabulary and
merge entry, several seconds for a 128k-token vocabulary, where this walks the
string arrays without decoding them. Tensor data is never read here; a
`StoredTensor` is a view of its bytes, which `gguf.quants` dequantizes.

A split GGUF (llama.cpp's `gguf-split`, `NAME-00001-of-0000N.gguf`) is opened
by its first part: that part holds the metadata, each part a share of the
tensors, all of which one `GGUFFile` holds.
"""

from __future__ import annotations

import hashlib
import mmap
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from sluiceway.runner.checkpoint.errors import CheckpointError

_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
# Metadata value types of a fixed width (gguf.GGUFValueType): struct format by id.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# A split GGUF's part, named as llama.cpp's gguf-split names it (`llama_split_path`).
_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_SPLIT_NO, _SPLIT_COUNT, _SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"


@attrs.frozen
class StringArray:
    """A metadata array of strings left unread (a vocabulary, a merge table):
    only its length is known."""

    length: int


@attrs.frozen(eq=False)
class StoredTensor:
    """One tensor as the file stores it: `shape` in torch order (rows first),
    `data` its raw bytes (a read-only view of the mapping)."""

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray  # uint8 [nbytes]

    @property
    def type_name(self) -> str:
        return self.ggml_type.name

    @property
    def nbytes(self) -> int:
        return int(self.data.shape[0])

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    def blocks(self) -> np.ndarray:
        """The raw bytes as `[rows, bytes per row]` (rows of the last dimension)."""
        return self.data.reshape(-1, _row_bytes(self.ggml_type, self.shape[-1]))


@attrs.frozen(eq=False)
class GGUFFile:
    """A parsed GGUF file: `metadata` (string arrays as `StringArray`), `tensors`
    by GGUF name in file order (of every part, for a split file), and
    `header_digest`, the SHA-256 of every byte before the tensor data
    (metadata, tokenizer and tensor table) of the first part."""

    path: Path
    metadata: Mapping[str, Any]
    tensors: Mapping[str, StoredTensor]
    header_digest: str
    _maps: tuple[mmap.mmap, ...]

    @property
    def architecture(self) -> str:
        return str(self.metadata["general.architecture"])

    @property
    def parts(self) -> int:
        """How many files the model is stored in (1 unless split)."""
        return len(self._maps)

    def release(self, tensor: StoredTensor) -> None:
        """Let the kernel drop `tensor`'s pages from this process's memory (they stay
        in the page cache): once its values are in the runner's layout, the mapped
        copy would only add to the resident set."""
        address = tensor.data.__array_interface__["data"][0]
        for mapped in self._maps:
            start = address - _address(mapped)
            if 0 <= start < len(mapped):
                break
        else:
            return
        page = mmap.PAGESIZE
        begin = start // page * page
        try:
            mapped.madvise(mmap.MADV_DONTNEED, begin, start + tensor.nbytes - begin)
        except (OSError, ValueError, AttributeError):
            pass  # only an optimisation

    @classmethod
    def open(cls, path: Path) -> GGUFFile:
        """Parse `path`'s header, and for the first part of a split GGUF every
        part's; `CheckpointError` naming the file and the field for a file that
        is not a GGUF, is truncated, or holds a tensor type not known, and for
        a split GGUF given by a later part or lacking a part."""
        first = _parse(path, first_part=True)
        count = int(first.metadata.get(_SPLIT_COUNT, 1))
        if count <= 1:
            return first
        paths = _split_paths(path, first.metadata)
        tensors = dict(first.tensors)
        maps = list(first._maps)
        for part in paths[1:]:
            if not part.is_file():
                raise CheckpointError(
                    f"{path}: part {part.name} of this {count}-part split GGUF is missing"
                )
            parsed = _parse(part, first_part=False)
            if int(parsed.metadata.get(_SPLIT_COUNT, 0)) != count:
                raise CheckpointError(f"{part}: not a part of the {count}-part split GGUF {path.name}")
            tensors.update(parsed.tensors)
            maps += parsed._maps
        expected = int(first.metadata.get(_SPLIT_TENSORS, len(tensors)))
        if len(tensors) != expected:
            raise CheckpointError(
                f"{path}: the {count} parts hold {len(tensors)} tensors, the metadata says {expected}"
            )
        return GGUFFile(path, first.metadata, tensors, first.header_digest, tuple(maps))


def _split_paths(path: Path, metadata: Mapping[str, Any]) -> list[Path]:
    """Every part's path of the split GGUF whose part `path` is, named as
    llama.cpp names them; `CheckpointError` unless `path` is the first."""
    count, number = int(metadata[_SPLIT_COUNT]), int(metadata.get(_SPLIT_NO, 0))
    named = _SPLIT_NAME.match(path.name)
    if named is None:
        raise CheckpointError(
            f"{path}: part {number + 1} of a {count}-part split GGUF, but not named "
            "NAME-00001-of-NNNNN.gguf, so its other parts cannot be found"
        )
    prefix = named["prefix"]
    if number != 0:
        raise CheckpointError(
            f"{path}: part {number + 1} of a {count}-part split GGUF: give its first part, "
            f"{prefix}-00001-of-{count:05d}.gguf"
        )
    return [path.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _parse(path: Path, *, first_part: bool) -> GGUFFile:
    try:
        with open(path, "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot map the file: {exc}") from None
    parser = _Parser(mapped, path)
    try:
        return parser.parse(first_part)
    except struct.error:
        raise CheckpointError(f"{path}: truncated GGUF header (ends inside {parser.where})") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: corrupt GGUF header ({parser.where} is not UTF-8)") from None


def _address(mapped: mmap.mmap) -> int:
    return np.frombuffer(mapped, dtype=np.uint8, count=1).__array_interface__["data"][0]


def _row_bytes(ggml_type: GGMLQuantizationType, row_elements: int) -> int:
    block, size = GGML_QUANT_SIZES[ggml_type]
    return row_elements // block * size


class _Parser:
    def __init__(self, mapped: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos = mapped, path, 0
        self.where = "the magic number"

    def _unpack(self, fmt: str) -> Any:
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return values[0] if len(values) == 1 else values

    def _string(self) -> str:
        length = self._unpack("<Q")
        if self.pos + length > len(self.buf):
            raise struct.error("past the end")
        text = self.buf[self.pos : self.pos + length].decode("utf-8")
        self.pos += length
        return text

    def _value(self, kind: int, key: str) -> Any:
        if kind in _SCALARS:
            return self._unpack(_SCALARS[kind])
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            raise CheckpointError(f"{self.path}: metadata {key}: unknown value type {kind}")
        element, count = self._unpack("<IQ")
        if element in _SCALARS:
            fmt = _SCALARS[element]
            size = struct.calcsize(fmt) * count
            if self.pos + size > len(self.buf):
                raise struct.error("past the end")
            values = np.frombuffer(self.buf, dtype=np.dtype(fmt), count=count, offset=self.pos)
            self.pos += size
            return values.tolist() if count <= 4096 else values
        if element == _STRING:
            for _ in range(count):  # walked, not decoded: see the module docstring
                self.pos += 8 + self._unpack("<Q")
            if self.pos > len(self.buf):
                raise struct.error("past the end")
            return StringArray(count)
        raise CheckpointError(f"{self.path}: metadata {key}: unknown array element type {element}")

    def parse(self, first_part: bool) -> GGUFFile:
        """The file's header; a split GGUF's later parts have no architecture,
        only their tensors (`open` says which part to give instead)."""
        if self.buf[:4] != b"GGUF":
            raise CheckpointError(f"{self.path}: not a GGUF file (no GGUF magic number)")
        self.pos = 4
        self.where = "the version"
        version, tensor_count, kv_count = self._unpack("<IQQ")
        if version not in _VERSIONS:
            raise CheckpointError(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
        metadata: dict[str, Any] = {}
        for i in range(kv_count):
            self.where = f"metadata entry {i}"
            key = self._string()
            self.where = f"metadata {key}"
            metadata[key] = self._value(self._unpack("<I"), key)
        later_part = not first_part or int(metadata.get(_SPLIT_NO, 0)) > 0
        if not later_part and "general.architecture" not in metadata:
            raise CheckpointError(f"{self.path}: metadata general.architecture is missing")
        entries = []
        for i in range(tensor_count):
            self.where = f"tensor info {i}"
            name = self._string()
            self.where = f"tensor info {name}"
            dims = self._unpack("<I")
            shape = tuple(reversed(struct.unpack_from(f"<{dims}Q", self.buf, self.pos)))
            self.pos += 8 * dims
            type_id, offset = self._unpack("<IQ")
            entries.append((name, shape, type_id, offset))
        alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        data_start = -(-self.pos // alignment) * alignment
        digest = hashlib.sha256(self.buf[: self.pos]).hexdigest()
        tensors = {}
        whole = np.frombuffer(self.buf, dtype=np.uint8)
        for name, shape, type_id, offset in entries:
            tensors[name] = self._tensor(whole, name, shape, type_id, data_start + offset)
        return GGUFFile(self.path, metadata, tensors, digest, (self.buf,))

    def _tensor(self, whole, name, shape, type_id, start) -> StoredTensor:
        try:
            ggml_type = GGMLQuantizationType(type_id)
        except ValueError:
            raise CheckpointError(
                f"{self.path}: tensor {name}: unknown tensor type {type_id}"
            ) from None
        block, size = GGML_QUANT_SIZES[ggml_type]
        elements = int(np.prod(shape)) if shape else 1
        if not shape or shape[-1] % block:
            raise CheckpointError(
                f"{self.path}: tensor {name}: shape {list(shape)} is not whole {ggml_type.name} blocks"
            )
        nbytes = elements // block * size
        if start + nbytes > len(self.buf):
            raise CheckpointError(
                f"{self.path}: truncated: tensor {name} ends at byte {start + nbytes}, "
                f"the file has {len(self.buf)}"
            )
        return StoredTensor(name, ggml_type, shape, whole[start : start + nbytes])
