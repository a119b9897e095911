"""Frozen, validated configuration for the engine and the server."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

import attrs

if TYPE_CHECKING:
    from sluiceway.fleet.kv_events_config import KVEventsConfig

DType = Literal["auto", "float32", "bfloat16", "float16"]
# How the KV cache stores keys and values (`runner/kv_cache.py`): "auto" in the
# model's dtype, a float dtype, or int8 / fp8 (e4m3) codes with a scale per row.
KVCacheDType = Literal["auto", "bfloat16", "float16", "float32", "fp8", "int8"]
AttentionBackendName = Literal["auto", "torch", "triton"]
Quantization = Literal["int8", "int4"]
# What a user asks for: a path, "none", or "auto" (the path the stored weights fit).
QuantizationMode = Literal["auto", "none", "int8", "int4"]
AccessLogStyle = Literal["logfmt", "json"]


def _positive(instance: object, attribute: attrs.Attribute, value: int | float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen(kw_only=True)
class EngineConfig:
    """Scheduling and KV-cache limits of one engine.

    `max_model_len=None` takes the model's own context length. The KV cache is
    `num_kv_blocks` blocks of `block_size` tokens when given, else as many as fit in
    `kv_cache_memory_bytes`, each key and value stored as `kv_cache_dtype` says
    ("int8" and "fp8" hold about twice the tokens of bfloat16 in the same
    memory, at a small loss: docs/kv-cache.md). `max_waiting` bounds the choices waiting for a
    sequence slot (those beyond the free ones of `max_num_seqs`); past it
    `Engine.generate` raises `QueueFullError`. `step_timeout` is the watchdog:
    a model step running longer than that many seconds marks the engine failed
    (None: no watchdog). `stream_interval` is how many tokens a
    choice's channel receives per delta: 1 delivers every token as it is made;
    larger values hold tokens back and deliver them together (the first token and
    the last delta go out at once), so a streaming consumer formats and writes
    fewer, larger events. `steps_on_event_loop` runs every model step (and the
    loading) on the event loop's own thread instead of a model thread: less work
    per token, but nothing else is served while a step runs, so it excludes the
    `step_timeout` watchdog. Without it, a step that only decodes
    `event_loop_decode_max_seqs` sequences or fewer still runs on the event loop's
    thread (0, the default: never): for one stream that saves two wake-ups across
    threads and the loop's contention with the step for the cores, but the loop
    answers nothing (`/health` included) while such a step runs, and on a busy
    host one stream can keep `/health` waiting for seconds. The watchdog does not
    cover those steps.
    `burst_window` is how many seconds an idle engine, woken by a request, may
    hold its first step while other requests are still being prepared (the rest
    of a burst of parallel requests, see `engine.arrivals`), so that the burst is
    prefilled in one step rather than the first request alone and the rest after
    it; the step starts as soon as none is being prepared and none has begun or
    arrived for half a millisecond (0: at once).
    `background_step_tokens` is the most tokens background work (Batch API lines)
    may take of a step while a foreground sequence is held; it never runs in a
    step that holds a foreground prompt, so what a request waits for before its
    first token is at most one step of that size. With no foreground sequence
    held, background work takes whole steps.
    """

    max_model_len: int | None = attrs.field(default=None, validator=_positive)
    max_num_seqs: int = attrs.field(default=64, validator=_positive)
    max_num_batched_tokens: int = attrs.field(default=1024, validator=_positive)
    block_size: int = attrs.field(default=16, validator=_positive)
    num_kv_blocks: int | None = attrs.field(default=None, validator=_positive)
    kv_cache_memory_bytes: int = attrs.field(default=1 << 30, validator=_positive)
    kv_cache_dtype: KVCacheDType = attrs.field(
        default="auto", validator=attrs.validators.in_(get_args(KVCacheDType))
    )
    max_waiting: int = attrs.field(default=256, validator=_positive)
    enable_prefix_caching: bool = True
    step_timeout: float | None = attrs.field(default=None, validator=_positive)
    stream_interval: int = attrs.field(default=1, validator=_positive)
    steps_on_event_loop: bool = False
    event_loop_decode_max_seqs: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    burst_window: float = attrs.field(default=0.05, validator=attrs.validators.ge(0))
    background_step_tokens: int = attrs.field(default=1, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.steps_on_event_loop and self.step_timeout is not None:
            raise ValueError(
                "a step timeout needs steps on the model thread: a step on the event loop "
                "cannot be abandoned"
            )


@attrs.frozen(kw_only=True)
class ModelConfig:
    """Which model to load and how to run it. `model=None` is the embedded default
    (SmolLM2-135M-Instruct). `attention_backend="auto"` is triton on CUDA, torch elsewhere.
    `quantization` ("int8" or "int4", CPU only) serves the linear weights
    weight-only quantized: every step reads a quarter or a half of bfloat16's
    weight bytes and the model holds only those bytes; outputs are those of the
    quantized model, not the original (see `runner/linear.py`). With
    `dense_weight_copies` each quantized weight also keeps its dequantized values
    densely, which steps of more than a few rows (long prompts, many sequences)
    multiply faster, at four to eight times the weight memory. "auto" (the default) picks the path the
    stored weights fit: int4 or int8 on CPU for a GGUF whose linear weights are
    stored quantized, where the native kernels serve them (bfloat16 on
    AVX512-BF16, float32 on AVX2); none for float weights, on other CPUs and on CUDA
    (see `runner/quantization_choice.py`). With tensor parallelism each rank
    quantizes its slices to the same weights, where the slices' shapes allow
    (`runner/tensor_parallel/quantization.py`). "none" (or None) never
    quantizes. On CUDA, decode steps replay CUDA graphs unless `enforce_eager`.
    `tensor_parallel_size` > 1 splits the model over that many rank processes
    (docs/tensor-parallel.md). `lora_modules` are LoRA adapters served beside the
    base model, (name, PEFT directory) each, at most `max_loras` loaded at once and
    none of rank above `max_lora_rank` (docs/lora.md); with
    `enable_lora_runtime_updates` more are loaded and unloaded while serving. An
    adapter given by hub id is fetched with `hf_token` (None: `HF_TOKEN` or the
    saved login; never in `repr`), or found in the hub cache alone when
    `offline`. `threads` sizes the one OpenMP team that torch's operators and the
    native kernels share (None: the cores of the process's affinity mask; see
    `runner/threads.py`); tensor-parallel ranks on one machine split it."""

    model: str | None = None
    dtype: DType = "auto"
    served_model_name: str | None = None
    attention_backend: AttentionBackendName = "auto"
    quantization: QuantizationMode | None = "auto"
    dense_weight_copies: bool = False
    enforce_eager: bool = False
    tensor_parallel_size: int = attrs.field(default=1, validator=_positive)
    lora_modules: tuple[tuple[str, str], ...] = ()
    max_loras: int = attrs.field(default=1, validator=_positive)
    max_lora_rank: int = attrs.field(default=16, validator=_positive)
    enable_lora_runtime_updates: bool = False
    hf_token: str | None = attrs.field(default=None, repr=False)
    offline: bool = False
    threads: int | None = attrs.field(default=None, validator=_positive)


@attrs.frozen
class KeyBudget:
    """One API key's budget a minute (None: unlimited); see `api/rate_limits.py`.
    Keys of one `project` share their stored objects (`api/owners.py`), not their
    budgets."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    project: str | None = None


@attrs.frozen(kw_only=True)
class ServerConfig:
    """HTTP-side settings. `request_timeout=None` lets a request run as long as it needs;
    `body_timeout` is how long a request body may take to arrive (then 408)."""

    host: str = "127.0.0.1"
    port: int = 8000
    request_timeout: float | None = attrs.field(default=None, validator=_positive)
    api_keys: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    drain_grace_seconds: float = attrs.field(default=30.0, validator=_positive)
    max_body_bytes: int = attrs.field(default=4 << 20, validator=_positive)
    # Prompts x n of one request. 128 is OpenAI's own cap on n, so every n valid
    # there is valid here for one prompt; half the default `max_waiting`, so one
    # request alone never fills the waiting queue (and every other client gets 429).
    max_choices_per_request: int = attrs.field(default=128, validator=_positive)
    body_timeout: float = attrs.field(default=60.0, validator=_positive)
    # An idle keep-alive connection is closed after this long, whatever it served.
    keep_alive_timeout: float = attrs.field(default=5.0, validator=_positive)
    # A client that takes none of the bytes waiting for it for this long is cut
    # off: its request is aborted and its connection reset.
    send_stall_timeout: float = attrs.field(default=30.0, validator=_positive)
    # Open connections at most; None: as many as the descriptor limit leaves room
    # for (`connection_limits.default_max_connections`).
    max_connections: int | None = attrs.field(default=None, validator=_positive)
    # One line per request on the `sluiceway.access` logger, in this style; None: off.
    access_log: AccessLogStyle | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(("logfmt", "json")))
    )
    # Publish the KV cache's block lifecycle for routers (`--kv-events-config`); None: off.
    kv_events: KVEventsConfig | None = None
    # The SQLite file stored responses live in (`--response-store`); None: in memory.
    response_store: str | None = None
    # Keys with a budget (`--api-key-budgets`), accepted beside `api_keys`.
    api_key_budgets: Mapping[str, KeyBudget] = attrs.field(factory=dict)
    # The SQLite file of uploaded files and batches (`--batch-store`); None: in memory.
    batch_store: str | None = None
    # Batch API lines in the engine at once (`--batch-concurrency`).
    batch_concurrency: int = attrs.field(default=8, validator=_positive)
    # Reasoning models (`--reasoning-parser`): the parser's name, "auto" for the
    # model family's (or none), "none" to leave thinking inside `content`.
    reasoning_parser: str = "auto"
    # A chat template (its text) used instead of the model's (`--chat-template`).
    chat_template: str | None = None
    # What every chat template is given unless a request's `chat_template_kwargs`
    # says otherwise (`--default-chat-template-kwargs`).
    default_chat_template_kwargs: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def accepted_keys(self) -> tuple[str, ...]:
        return self.api_keys + tuple(k for k in self.api_key_budgets if k not in self.api_keys)
