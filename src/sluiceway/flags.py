"""The model and engine flags, and the configurations they give, shared by every
command that builds an engine: `sluiceway serve`, `sluiceway bench engine` and a
remote tensor-parallel rank (`runner/tensor_parallel/remote.py`).

Only argparse and the configuration types: a command that needs these flags
imports this module, never the `sluiceway` command line itself.
"""

from __future__ import annotations

import argparse
import re
from typing import get_args

from sluiceway.config import EngineConfig, KVCacheDType, ModelConfig

DEFAULT_STEP_TIMEOUT = 300.0
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'512MiB', '2GB', '1.5G' or a plain byte count -> bytes (binary multiples)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 512MiB or 2GiB)")
    number, unit = float(match.group(1)), match.group(2).upper()
    return int(number * 1024 ** "BKMGT".index(unit or "B")) if unit else int(number)


def positive_float(text: str) -> float:
    """An argparse type: a float above zero."""
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an int above zero."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite float, zero or more."""
    value = float(text)
    if not 0 <= value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError("must be zero or more, and finite")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an int, zero or more."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """Add the flags `model_config` reads, as a "model" group."""
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model",
        default=None,
        # Spelled out rather than read from the registry, which imports torch:
        # `--help` stays quick. A test keeps the two lists equal.
        help="HF model directory, .gguf file or hub id (ORG/NAME, or ORG/NAME-GGUF:QUANT for a "
        "GGUF repository's quant) of a supported family (gemma2, "
        "gemma3_text, llama, mistral, mixtral, phi3, qwen2, qwen3, qwen3_moe, smollm3; "
        "default: the embedded SmolLM2-135M-Instruct)",
    )
    group.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    group.add_argument(
        "--attention-backend",
        default="auto",
        choices=["auto", "torch", "triton"],
        help="auto: triton kernels on CUDA, torch elsewhere",
    )
    group.add_argument(
        "--quantization",
        default="auto",
        choices=["auto", "none", "int8", "int4"],
        help="CPU only: weight-only quantized linears, much faster for a few streams; changes "
        "outputs. auto (default): int4 or int8 for a GGUF stored 4-8-bit where the native "
        "kernels run (bfloat16 on AVX512-BF16, float32 on AVX2), else none; the start-up log "
        "says which and why",
    )
    group.add_argument(
        "--dense-weight-copies",
        action="store_true",
        help="with --quantization: also keep every quantized weight's values densely, which "
        "steps of more than a few rows (long prompts, many streams) multiply faster, at 4-8x "
        "the weight memory",
    )
    group.add_argument(
        "--enforce-eager",
        action="store_true",
        help="CUDA: run every step eagerly instead of replaying captured decode graphs",
    )
    group.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="threads for the model's work: torch's operators and the native kernels share "
        "them (default: the cores this process may run on, its CPU affinity mask)",
    )
    group.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=positive_int,
        default=1,
        metavar="N",
        help="split the model over N rank processes (one GPU each on CUDA; see "
        "docs/tensor-parallel.md for ranks on other machines)",
    )


def lora_module(text: str) -> tuple[str, str]:
    """An argparse type: `NAME=PATH` -> (name, path)."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"not NAME=PATH: {text!r}")
    return name.strip(), path.strip()


def add_lora_flags(parser: argparse.ArgumentParser) -> None:
    """Add the LoRA flags `model_config` reads, as a "LoRA adapters" group."""
    group = parser.add_argument_group("LoRA adapters")
    group.add_argument(
        "--lora-modules",
        type=lora_module,
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters served beside the base model, each a PEFT directory "
        "(adapter_config.json + adapter_model.safetensors) or its hub id ORG/NAME; a request's `model` picks one "
        "by NAME, and /v1/models lists each with the base model as its parent",
    )
    group.add_argument(
        "--max-loras",
        type=positive_int,
        default=1,
        metavar="N",
        help="distinct LoRA adapters one step serves and kept loaded, least recently used "
        "dropped first; a request of one more waits (default 1)",
    )
    group.add_argument(
        "--max-lora-rank",
        type=positive_int,
        default=16,
        metavar="R",
        help="refuse adapters of a higher rank (default 16)",
    )
    group.add_argument(
        "--enable-lora-runtime-updates",
        action="store_true",
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's bodies)",
    )


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """Add the flags `engine_config` reads, as an "engine" group."""
    group = parser.add_argument_group("engine")
    group.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    group.add_argument("--max-num-seqs", type=int, default=64, help="sequences decoded together")
    group.add_argument("--max-num-batched-tokens", type=int, default=1024, help="tokens per model step")
    group.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    group.add_argument("--kv-cache-memory", type=parse_size, default=1 << 30, help="KV cache size, e.g. 1GiB")
    group.add_argument(
        "--kv-cache-dtype",
        choices=get_args(KVCacheDType),
        default="auto",
        help="how the KV cache stores keys and values: auto (the model's dtype), a float "
        "dtype, or int8 / fp8 with a scale per row (about twice the tokens in the same memory)",
    )
    group.add_argument("--num-kv-blocks", type=int, default=None, help="KV cache size in blocks (overrides --kv-cache-memory)")
    group.add_argument("--max-waiting", type=int, default=256, help="choices allowed to wait for a free sequence slot; beyond it requests get 429")
    group.add_argument("--no-prefix-caching", action="store_true", help="do not reuse KV blocks of identical prefixes")
    group.add_argument(
        "--step-timeout",
        type=positive_float,
        default=None,
        help="watchdog: a model step longer than this many seconds fails the engine (503 on "
        f"/health; default {DEFAULT_STEP_TIMEOUT:g}, none with --steps-on-event-loop)",
    )
    group.add_argument(
        "--steps-on-event-loop",
        action="store_true",
        help="run the model on the event loop's own thread, not a model thread: less server "
        "work per token, but nothing is answered while a step runs and there is no step "
        "watchdog",
    )
    group.add_argument(
        "--event-loop-decode-max-seqs",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="decode steps of at most N sequences run on the event loop's own thread, "
        "without the watchdog: a little faster for a lone stream, but nothing, /health "
        "included, is answered while such a step runs; 0: every step on the model thread "
        "(default 0)",
    )
    group.add_argument(
        "--burst-window",
        type=non_negative_float,
        default=0.05,
        metavar="SECONDS",
        help="an idle engine woken by a request waits up to this long, while other requests "
        "are still being read and tokenized, so that the rest of a burst of parallel requests "
        "joins the first step (0: step at once; default 0.05)",
    )
    group.add_argument(
        "--background-step-tokens",
        type=positive_int,
        default=1,
        metavar="N",
        help="most tokens background work (Batch API lines) takes of one step while "
        "interactive requests are held; it never shares a step with an interactive prompt, so "
        "an interactive request waits at most one such step for its first token. On a CPU a "
        "step's time grows with its rows, and 1 keeps interactive decoding at its speed while "
        "a batch runs (docs/benchmarks.md). With no interactive request held, background work "
        "takes whole steps (default 1)",
    )
    group.add_argument(
        "--stream-interval",
        type=positive_int,
        default=1,
        help="tokens per streamed event (the first token is sent at once); more means fewer, "
        "larger events and less per-token server work, at the cost of a burstier stream",
    )


def model_config(args: argparse.Namespace) -> ModelConfig:
    """The model configuration of parsed `add_model_flags` flags (and
    `--served-model-name`, where the command has it)."""
    return ModelConfig(
        model=args.model,
        dtype=args.dtype,
        served_model_name=getattr(args, "served_model_name", None),
        attention_backend=args.attention_backend,
        quantization=args.quantization,
        dense_weight_copies=args.dense_weight_copies,
        enforce_eager=args.enforce_eager,
        tensor_parallel_size=args.tensor_parallel_size,
        lora_modules=tuple(getattr(args, "lora_modules", None) or ()),
        max_loras=getattr(args, "max_loras", 1),
        max_lora_rank=getattr(args, "max_lora_rank", 16),
        enable_lora_runtime_updates=getattr(args, "enable_lora_runtime_updates", False),
        hf_token=getattr(args, "hf_token", None),
        offline=getattr(args, "offline", False),
        threads=args.threads,
    )


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine configuration of parsed `add_engine_flags` flags. Raises
    `ValueError` for flags that cannot go together."""
    return EngineConfig(
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_bytes=args.kv_cache_memory,
        kv_cache_dtype=args.kv_cache_dtype,
        max_waiting=args.max_waiting,
        enable_prefix_caching=not args.no_prefix_caching,
        step_timeout=_step_timeout(args),
        stream_interval=args.stream_interval,
        steps_on_event_loop=args.steps_on_event_loop,
        event_loop_decode_max_seqs=args.event_loop_decode_max_seqs,
        burst_window=args.burst_window,
        background_step_tokens=args.background_step_tokens,
    )


def _step_timeout(args: argparse.Namespace) -> float | None:
    """The watchdog's limit: as given, else the default where a step can be abandoned."""
    if args.step_timeout is None and not args.steps_on_event_loop:
        return DEFAULT_STEP_TIMEOUT
    return args.step_timeout
