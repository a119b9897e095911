"""Assembling an engine from a model source: load, build the runner, wrap the core.

This is the one place that joins the torch runner to the torch-free engine, so
the engine package itself never imports torch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from sluiceway.config import EngineConfig, ModelConfig
from sluiceway.engine.core import EngineCore
from sluiceway.engine.lora_modules import LoraModules
from sluiceway.engine.step_threads import CallingThread, ModelThread, StepThread

if TYPE_CHECKING:
    from sluiceway.engine.engine import Engine
    from sluiceway.hub import HubOptions
    from sluiceway.runner.loading import LoadedModel
    from sluiceway.runner.lora.table import LoraTable
    from sluiceway.runner.model_runner import TorchModelRunner
    from sluiceway.runner.quantization_choice import QuantizationChoice
    from sluiceway.runner.tensor_parallel import TensorParallelRunner

logger = logging.getLogger(__name__)


@attrs.frozen
class ModelBundle:
    """A loaded model, the runner built over it, and the thread that did the torch
    work (None: the caller's thread). Steps should run on that same thread. The
    runner is a `TorchModelRunner`, or a `TensorParallelRunner` with a
    tensor-parallel size above 1 (then `loaded` holds no weights: the ranks do).
    `quantization` is the weight path the runner took (None: unquantized);
    `lora_modules` the LoRA adapters it serves by name."""

    loaded: LoadedModel
    runner: TorchModelRunner | TensorParallelRunner
    thread: StepThread | None = None
    quantization: str | None = None
    lora_modules: LoraModules = attrs.field(factory=LoraModules)
    # Reads and checks an adapter to be added while serving (None: they are fixed).
    lora_check: Callable[[str, str], str] | None = None

    @property
    def name(self) -> str:
        return self.loaded.name


def load_bundle_on_thread(model: ModelConfig, engine: EngineConfig, *, progress: bool = True) -> ModelBundle:
    """`load_bundle` run on the thread the engine will step on: a new `ModelThread`,
    or, with `engine.steps_on_event_loop`, the calling thread (`CallingThread`),
    which must then be the one that runs the event loop."""
    if engine.steps_on_event_loop:
        return attrs.evolve(load_bundle(model, engine, progress=progress), thread=CallingThread())
    thread = ModelThread()
    try:
        bundle = thread.call(lambda: load_bundle(model, engine, progress=progress))
    except BaseException:
        thread.stop()
        raise
    return attrs.evolve(bundle, thread=thread)


def load_bundle(
    model: ModelConfig, engine: EngineConfig, *, progress: bool = True, keep_module: bool = False
) -> ModelBundle:
    """Load weights and tokenizer and allocate the KV cache on the calling thread.
    The runner reads the checkpoint's tensors one at a time into its own layout;
    `keep_module` also builds a transformers model (on the CPU) from the same
    weights in `loaded.module`, for comparisons.

    Raises `sluiceway.runner.loading.ModelLoadError` for a missing or unreadable model.
    """
    from sluiceway.runner.checkpoint.stored_int4 import servable_from_blocks
    from sluiceway.runner.checkpoint.type_report import stored_types_report
    from sluiceway.runner.kernels.backend import select_attention_backend
    from sluiceway.runner.loading import ModelLoadError, load_model
    from sluiceway.runner.quantization_choice import (
        choose_quantization,
        linear_weight_types,
        native_quantized_kernels,
    )
    from sluiceway.runner.threads import use_threads

    device = _device()
    if model.tensor_parallel_size == 1:
        use_threads(model.threads)  # the ranks size their own (`tensor_parallel.launch`)
    try:
        attention = select_attention_backend(
            model.attention_backend, device, kv_cache_dtype=engine.kv_cache_dtype
        )
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    loaded = load_model(model.model, model.dtype, progress=progress)
    try:
        choice = choose_quantization(
            model.quantization,
            device=device,
            gguf_path=loaded.gguf_path,
            native_kernels=native_quantized_kernels(loaded.dtype, device),
            linear_types=None if loaded.gguf is None else linear_weight_types(loaded.gguf),
        )
    except ValueError as exc:  # an unknown --quantization
        raise ModelLoadError(str(exc)) from None
    if model.tensor_parallel_size > 1:
        # The ranks serve the one-process decision where their slices can hold it.
        choice = _sharded_choice(choice, loaded, model, device)
    logger.info(
        "serving %s on %s in %s, %s (%s)",
        loaded.name,
        device,
        _dtype_name(loaded),
        f"{choice.quantization} weight-only" if choice.quantization else "unquantized",
        choice.reason,
    )
    if model.tensor_parallel_size > 1:
        if model.lora_modules:
            raise ModelLoadError("LoRA adapters are not served with tensor parallelism")
        ranks = _start_ranks(loaded, model, engine, device, choice.quantization)
        return ModelBundle(loaded, ranks, quantization=choice.quantization)
    from_blocks = (
        choice.quantization in ("int4", "int8")
        and loaded.read_options is not None
        and servable_from_blocks(
            loaded.hf_config, loaded.state_dict(), choice.quantization, loaded.dtype
        )
    )
    logger.info("%s: %s", loaded.name, stored_types_report(loaded, choice.quantization, from_blocks))
    runner = _build_runner(loaded, model, engine, device, attention, choice.quantization, from_blocks)
    lora_modules, lora_check = _enable_lora(runner, model)
    if keep_module:
        from sluiceway.runner.checkpoint.reference import transformers_module

        loaded.module = transformers_module(loaded.hf_config, loaded.state_dict(), torch_dtype=loaded.dtype)
    loaded.weights_in_place()
    return ModelBundle(
        loaded,
        runner,
        quantization=choice.quantization,
        lora_modules=lora_modules,
        lora_check=lora_check,
    )


def _enable_lora(
    runner: TorchModelRunner, model: ModelConfig
) -> tuple[LoraModules, Callable[[str, str], str] | None]:
    """The adapters of `model.lora_modules` (a hub id fetched into the hub
    cache), each read and checked on `runner` (ModelLoadError naming the first
    bad one), and, with runtime updates, what fetches and checks one more:
    `check(name, path)` gives its local directory (AdapterError naming what is
    wrong)."""
    from sluiceway.hub import HubError, HubOptions, resolve_adapter
    from sluiceway.runner.loading import ModelLoadError
    from sluiceway.runner.lora import AdapterError

    options = HubOptions(token=model.hf_token, offline=model.offline)
    try:
        local = {name: resolve_adapter(path, options) for name, path in model.lora_modules}
        modules = LoraModules.of(local)
        if len(modules) != len(model.lora_modules):
            raise ValueError("two LoRA adapters have the same name")
        if modules or model.enable_lora_runtime_updates:
            table = runner.enable_lora(
                modules, max_loras=model.max_loras, max_rank=model.max_lora_rank
            )
            logger.info("LoRA adapters: %s", ", ".join(m.name for m in modules) or "none yet")
    except (AdapterError, ValueError, HubError) as exc:
        raise ModelLoadError(str(exc)) from None
    if not model.enable_lora_runtime_updates:
        return modules, None
    return modules, adapter_check(table, options)


def adapter_check(table: LoraTable, options: HubOptions) -> Callable[[str, str], str]:
    """`check(name, path)` for adapters loaded while serving: the local directory
    of `path` (a hub id fetched with `options`), read and checked against the
    base model on `table`; AdapterError naming what is wrong. Blocking (it may
    download): the server runs it on a worker thread."""
    from sluiceway.hub import HubError, resolve_adapter
    from sluiceway.runner.lora import AdapterError

    def check(name: str, path: str) -> str:
        try:
            directory = resolve_adapter(path, options)
        except HubError as exc:
            raise AdapterError(f"LoRA adapter {name!r}: {exc}") from None
        table.check(name, directory)
        return directory

    return check


def _build_runner(
    loaded: LoadedModel,
    model: ModelConfig,
    engine: EngineConfig,
    device: str,
    attention,
    quantization: str | None,
    from_blocks: bool,
) -> TorchModelRunner:
    """The runner over `loaded`'s weights, read one at a time. `from_blocks`: the
    layer linears stored in blocks their path takes as they are (4-bit blocks on
    int4, Q8_0 on int8) are packed from the GGUF's blocks
    (`checkpoint.stored_int4`) rather than read as values and quantized again."""
    from sluiceway.runner.checkpoint.heap import loading_heap
    from sluiceway.runner.checkpoint.stored_int4 import StoredBlocks
    from sluiceway.runner.decode_graphs import default_batch_sizes
    from sluiceway.runner.loading import ModelLoadError
    from sluiceway.runner.model_runner import TorchModelRunner

    try:
        with loading_heap():
            return TorchModelRunner.from_loaded(
                loaded,
                device=device,
                attention=attention,
                quantization=quantization,
                block_size=engine.block_size,
                num_blocks=engine.num_kv_blocks,
                kv_cache_bytes=None if engine.num_kv_blocks else engine.kv_cache_memory_bytes,
                cuda_graphs=False if model.enforce_eager else None,
                graph_batch_sizes=default_batch_sizes(engine.max_num_seqs),
                stored=StoredBlocks(loaded.hf_config, loaded.state_dict(), loaded.dtype)
                if from_blocks
                else None,
                dense_copies=model.dense_weight_copies,
                kv_cache_dtype=engine.kv_cache_dtype,
            )
    except ValueError as exc:  # an architecture or shape this runner cannot serve
        raise ModelLoadError(f"cannot run {loaded.name}: {exc}") from None


def _dtype_name(loaded: LoadedModel) -> str:
    return str(loaded.dtype).removeprefix("torch.")


def _sharded_choice(
    choice: QuantizationChoice, loaded: LoadedModel, model: ModelConfig, device: str
) -> QuantizationChoice:
    from sluiceway.runner.loading import ModelLoadError
    from sluiceway.runner.tensor_parallel.quantization import sharded_quantization
    from sluiceway.runner.tensor_parallel.sharding import TensorParallelError

    try:
        return sharded_quantization(
            choice,
            loaded.hf_config,
            model.tensor_parallel_size,
            requested=model.quantization,
            device=device,
        )
    except TensorParallelError as exc:
        raise ModelLoadError(f"cannot run {loaded.name}: {exc}") from None


def _start_ranks(
    loaded: LoadedModel,
    model: ModelConfig,
    engine: EngineConfig,
    device: str,
    quantization: str | None,
) -> TensorParallelRunner:
    """The ranks' runner, in this process's dtype on weight path `quantization`;
    this process keeps the tokenizer and config, not the weights."""
    from sluiceway.runner.loading import ModelLoadError
    from sluiceway.runner.tensor_parallel.launch import start_ranks
    from sluiceway.runner.tensor_parallel.sharding import TensorParallelError

    loaded.release_weights()  # each rank loads its own slice
    try:
        return start_ranks(
            model,
            engine,
            loaded.hf_config,
            device,
            loaded.pooling,
            quantization=quantization,
            # Resolved here once, so that "auto" cannot resolve otherwise in a rank.
            dtype=_dtype_name(loaded),
        )
    except TensorParallelError as exc:
        raise ModelLoadError(f"cannot run {loaded.name}: {exc}") from None


def build_engine(bundle: ModelBundle, config: EngineConfig) -> Engine:
    """The trio engine around `bundle`'s runner, stepping on the thread that loaded
    it; small decodes may move to the event loop's thread where this process's
    OpenMP team can be freed (`runner.openmp_teams`)."""
    from sluiceway.engine.engine import Engine
    from sluiceway.runner.openmp_teams import find_openmp_pool_release

    moves = config.event_loop_decode_max_seqs and not config.steps_on_event_loop
    return Engine(
        bundle.runner,
        bundle.loaded.tokenizer,
        config,
        eos_token_ids=bundle.loaded.eos_token_ids,
        max_model_len=bundle.loaded.max_model_len,
        model_thread=bundle.thread,
        openmp_pool_release=find_openmp_pool_release() if moves else None,
        lora_modules=bundle.lora_modules,
        lora_check=bundle.lora_check,
    )


def build_core(bundle: ModelBundle, config: EngineConfig) -> EngineCore:
    """A synchronous core for scripts and benchmarks (no event loop)."""
    tokenizer = bundle.loaded.tokenizer
    model_len = bundle.loaded.max_model_len
    return EngineCore(
        bundle.runner,
        lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        eos_token_ids=bundle.loaded.eos_token_ids,
        max_model_len=min(model_len, config.max_model_len or model_len),
        enable_prefix_caching=config.enable_prefix_caching,
        max_loras=bundle.lora_modules.max_loras,
    )


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
