"""How `sluiceway serve` starts on models of real shapes: time to ready, time to
the first token, peak RSS and bytes written to disk, and then one stream's
decode rate; with `--llama-server`, llama.cpp's server on the same files too.

    .venv/bin/python benchmarks/load_real.py --shapes llama-3.2-1b --types Q4_0 [--cold] \
        [--llama-server ~/.cache/sluiceway-peers/llama-build/bin/llama-server]
    make bench-load LOAD_SHAPES=llama-3.2-1b,llama-3.1-8b LOAD_TYPES=Q4_0,Q8_0

Each model is a random-weight GGUF of the real shape (Llama-3.2-1B, Llama-3.2-3B,
Llama-3.1-8B, Qwen2.5-0.5B), written once with gguf-py's writer into
`--dir` (default ~/.cache/sluiceway-bench, outside the repository): Q4_0 and
Q8_0 blocks of random codes and fp16 scales (random weights need no
quantizer), F32 norms and biases, and the default model's tokenizer with its
vocabulary padded to the shape's size by reserved tokens. Q4_K_M needs
llama.cpp's `llama-quantize`: pass `--llama-quantize PATH` (built as
`benchmarks/peers.sh` builds llama.cpp) and the type Q4_K_M, and the F16 file
of the shape (random normal weights) is written, quantized with it, and
deleted.

For each file two servers are started in turn (`sluiceway serve`, its own
process, with `--dir`/cache as its cache: the native kernels compiled once, by
the first run of all): a first load, which builds the GGUF's config and
tokenizer from its metadata and caches them, and a load again, which reads them
back. Each is polled until /v1/models answers (ready), then sent one streamed
chat request for 8 tokens (first token), then one of 48 tokens with EOS ignored,
whose tokens a second from its second token to its last are the decode rate.
llama.cpp's server (`--llama-server`, built as `benchmarks/peers.sh` builds it)
is started once per file after sluiceway's two starts, with as many threads as
the machine has cores, one slot, and a KV cache of as many tokens as
`--kv-cache-memory` holds in 16 bits; it is ready when /health answers. Peak
RSS is the server's
VmHWM from /proc, bytes written its `write_bytes` from /proc/PID/io (what it
sent to storage, the cache included). `--cold` drops the page cache before each
start (root only: `echo 3 > /proc/sys/vm/drop_caches`); otherwise the file is
read once first, so the page cache is warm. The KV cache is the server's
default (1 GiB) unless `--kv-cache-memory` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
# name -> (architecture, hidden, intermediate, layers, heads, kv heads, vocab, tied, rope theta)
SHAPES = {
    "llama-3.2-1b": ("llama", 2048, 8192, 16, 32, 8, 128256, True, 500000.0),
    "llama-3.2-3b": ("llama", 3072, 8192, 28, 24, 8, 128256, True, 500000.0),
    "llama-3.1-8b": ("llama", 4096, 14336, 32, 32, 8, 128256, False, 500000.0),
    "qwen2.5-0.5b": ("qwen2", 896, 4864, 24, 14, 2, 151936, True, 1000000.0),
}
BLOCK_BYTES = {"Q4_0": 18, "Q8_0": 34}
# Types llama.cpp's `llama-quantize` makes from the shape's F16 file.
QUANTIZED_BY_LLAMA_CPP = ("Q4_K_M",)


def _random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """`rows x cols` weights of GGML type `kind` as random blocks: fp16 scales
    around 0.02 / the code range, random codes."""
    blocks = cols // 32
    size = BLOCK_BYTES[kind]
    out = np.empty((rows, blocks, size), dtype=np.uint8)
    top = 8.0 if kind == "Q4_0" else 127.0
    d = (rng.uniform(0.5, 1.5, (rows, blocks)) * 0.05 / top).astype(np.float16)
    out[..., :2] = d.view(np.uint8).reshape(rows, blocks, 2)
    if kind == "Q4_0":
        out[..., 2:] = rng.integers(0, 256, (rows, blocks, 16), dtype=np.uint8)
    else:
        out[..., 2:] = rng.integers(-127, 128, (rows, blocks, 32), dtype=np.int8).view(np.uint8)
    return out.reshape(rows, blocks * size)


def _tokenizer_fields(vocab: int):
    """The default model's tokenizer metadata, its vocabulary padded to `vocab`."""
    import gguf

    from sluiceway.runner.loading import default_model_path

    reader = gguf.GGUFReader(default_model_path())
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        value = field.contents()
        if field.name == "tokenizer.ggml.tokens":
            value = value + [f"<|reserved_{i}|>" for i in range(vocab - len(value))]
        elif field.name == "tokenizer.ggml.token_type":
            # Plain vocabulary entries, as a real vocabulary's are (added tokens,
            # which a tokenizer matches one by one, would slow its start-up).
            value = value + [1] * (vocab - len(value))
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        yield field.name, value, vtype, sub


def write_model(path: Path, shape: str, kind: str, seed: int = 0) -> None:
    """A random-weight GGUF of `shape` with its linear weights and embedding in
    `kind` (Q4_0, Q8_0, or F16 for `llama-quantize` to start from), written
    tensor by tensor."""
    import gguf

    arch, hidden, inter, layers, heads, kv_heads, vocab, tied, theta = SHAPES[shape]
    head_dim = hidden // heads
    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[kind] if kind in BLOCK_BYTES else None
    tensors: list[tuple[str, tuple[int, int] | tuple[int], str]] = [("token_embd.weight", (vocab, hidden), kind)]
    for i in range(layers):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", (hidden,), "F32"),
            (p + "attn_q.weight", (heads * head_dim, hidden), kind),
            (p + "attn_k.weight", (kv_heads * head_dim, hidden), kind),
            (p + "attn_v.weight", (kv_heads * head_dim, hidden), kind),
            (p + "attn_output.weight", (hidden, heads * head_dim), kind),
            (p + "ffn_norm.weight", (hidden,), "F32"),
            (p + "ffn_gate.weight", (inter, hidden), kind),
            (p + "ffn_up.weight", (inter, hidden), kind),
            (p + "ffn_down.weight", (hidden, inter), kind),
        ]
        if arch == "qwen2":
            tensors += [
                (p + "attn_q.bias", (heads * head_dim,), "F32"),
                (p + "attn_k.bias", (kv_heads * head_dim,), "F32"),
                (p + "attn_v.bias", (kv_heads * head_dim,), "F32"),
            ]
    tensors.append(("output_norm.weight", (hidden,), "F32"))
    if not tied:
        tensors.append(("output.weight", (vocab, hidden), kind))

    tmp = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(tmp, arch)
    writer.add_name(f"random {shape}")
    writer.add_context_length(8192 if arch == "llama" else 32768)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(theta)
    writer.add_layer_norm_rms_eps(1e-5 if arch == "llama" else 1e-6)
    writer.add_vocab_size(vocab)
    for name, value, vtype, sub in _tokenizer_fields(vocab):
        writer.add_key_value(name, value, vtype, sub)
    for name, dims, stored in tensors:
        if stored == "F32":
            writer.add_tensor_info(name, dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
        elif stored == "F16":
            writer.add_tensor_info(name, dims, np.dtype(np.float16), int(np.prod(dims)) * 2)
        else:
            rows, cols = dims
            writer.add_tensor_info(
                name, (rows, cols // 32 * BLOCK_BYTES[kind]), np.dtype(np.uint8),
                rows * cols // 32 * BLOCK_BYTES[kind], raw_dtype=qtype,
            )  # fmt: skip
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims, stored in tensors:
        if stored == "F32":
            base = 0.02 * rng.standard_normal(dims).astype(np.float32)
            writer.write_tensor_data(base + 1.0 if name.endswith("norm.weight") else base)
        elif stored == "F16":
            writer.write_tensor_data((0.02 * rng.standard_normal(dims, dtype=np.float32)).astype(np.float16))
        else:
            writer.write_tensor_data(_random_blocks(kind, dims[0], dims[1], rng))
    writer.close()
    tmp.rename(path)


def _quantize_with_llama_cpp(llama_quantize: Path, directory: Path, shape: str, kind: str) -> None:
    """`directory/shape.kind.gguf` made by llama.cpp's `llama-quantize` from the
    shape's F16 file (written first, and deleted after: 2 bytes a weight)."""
    f16 = directory / f"{shape}.F16.gguf"
    began = time.monotonic()
    print(f"writing {f16} ...", flush=True)
    write_model(f16, shape, "F16")
    target = directory / f"{shape}.{kind}.gguf"
    partial = target.with_suffix(".partial")
    command = [str(llama_quantize), str(f16), str(partial), kind, str(os.cpu_count() or 1)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    partial.rename(target)
    f16.unlink()
    print(f"  {target.stat().st_size / 1e6:.0f} MB in {time.monotonic() - began:.0f} s", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc(pid: int) -> tuple[int, int]:
    """(peak RSS bytes, bytes written to storage) of process `pid`."""
    hwm = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    written = 0
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            written = int(line.split()[1])
    return hwm, written


def _drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def _first_token(port: int) -> float:
    body = json.dumps({
        "model": "m", "stream": True, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "Say something."}],
    }).encode()  # fmt: skip
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: ") and b'"content"' in line:
                return time.monotonic()
            if line.startswith(b"data: [DONE]"):
                break
    return time.monotonic()


def _decode_rate(port: int, tokens: int = 48) -> float:
    """Tokens a second of one streamed completion of `tokens` tokens (EOS ignored),
    from its second token to its last: one stream's decode rate."""
    body = json.dumps({
        "model": "m", "stream": True, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Count."}],
    }).encode()  # fmt: skip
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    times = []
    with urllib.request.urlopen(request, timeout=900) as response:
        for line in response:
            if line.startswith(b"data: ") and b'"content"' in line:
                times.append(time.monotonic())
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 2 else float("nan")


def _kv_tokens(shape: str, kv_bytes: int) -> int:
    """Tokens a bfloat16/f16 KV cache of `kv_bytes` holds for `shape`."""
    _, hidden, _, layers, heads, kv_heads, *_ = SHAPES[shape]
    return kv_bytes // (2 * layers * kv_heads * (hidden // heads) * 2)


def _bytes(size: str) -> int:
    """"1GiB", "512MiB", "2GB" as bytes."""
    units = {"GiB": 1 << 30, "MiB": 1 << 20, "GB": 10**9, "MB": 10**6}
    for unit, factor in units.items():
        if size.endswith(unit):
            return int(float(size[: -len(unit)]) * factor)
    return int(size)


def _tree_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def measure(
    path: Path,
    *,
    cache: Path,
    first_load: bool,
    cold: bool,
    kv_cache: str,
    timeout: float,
    llama_server: Path | None = None,
    context: int = 0,
    llama_args: tuple[str, ...] = (),
    sluiceway_args: tuple[str, ...] = (),
) -> dict:
    """Start a server on `path` (`sluiceway serve` with `sluiceway_args` more, or
    llama.cpp's `llama_server` with a KV cache of `context` tokens); its start-up
    numbers and one stream's decode rate (see the module docstring)."""
    if cold:
        cold = _drop_caches()
    else:
        with open(path, "rb") as f:  # warm the page cache
            while f.read(1 << 24):
                pass
    port = _free_port()
    metadata = cache / "gguf-metadata"
    if first_load and metadata.is_dir():
        shutil.rmtree(metadata)  # the GGUF's config and tokenizer built again, and cached
    before = _tree_bytes(cache)
    env = dict(os.environ, SLUICEWAY_CACHE_DIR=str(cache))
    command = [
        sys.executable, "-m", "sluiceway.cli", "serve", "--model", str(path), "--port", str(port),
        "--kv-cache-memory", kv_cache, "--served-model-name", "m", *sluiceway_args,
    ]  # fmt: skip
    ready_path = "/v1/models"
    if llama_server is not None:
        command = [
            str(llama_server), "-m", str(path), "--host", "127.0.0.1", "--port", str(port),
            "-c", str(context), "-t", str(os.cpu_count() or 1), "-np", "1", "--alias", "m",
            *llama_args,
        ]  # fmt: skip
        ready_path = "/health"
    log = tempfile.NamedTemporaryFile(prefix="sluiceway-load-", suffix=".log", delete=False)
    started = time.monotonic()
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    row: dict = {
        "server": "llama.cpp" if llama_server is not None else "sluiceway",
        "file": path.name, "file_bytes": path.stat().st_size, "cold": cold, "log": log.name,
    }  # fmt: skip
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"server exited with {server.returncode}; see {log.name}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"not ready in {timeout:.0f} s; see {log.name}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{ready_path}", timeout=2).read()
                break
            except OSError:
                time.sleep(0.2)
        row["ready_s"] = time.monotonic() - started
        row["first_token_s"] = _first_token(port) - started
        row["peak_rss"], row["written"] = _proc(server.pid)
        row["decode_tok_s"] = _decode_rate(port)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        row["cache_bytes_added"] = _tree_bytes(cache) - before
    row["first_load"] = first_load
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="llama-3.2-1b", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--types", default="Q4_0", help="comma-separated: Q4_0, Q8_0 (Q4_K_M with --llama-quantize)")
    parser.add_argument("--dir", type=Path, default=Path("~/.cache/sluiceway-bench").expanduser())
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each start (root)")
    parser.add_argument("--kv-cache-memory", default="1GiB")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--llama-quantize", type=Path, default=None, help="llama.cpp's llama-quantize, for Q4_K_M")
    parser.add_argument("--llama-server", type=Path, default=None,
                        help="llama.cpp's llama-server: also start it on each file, with a KV cache "
                        "of as many tokens as --kv-cache-memory holds")  # fmt: skip
    parser.add_argument("--sluiceway-args", default="",
                        help="more arguments for sluiceway serve, e.g. --kv-cache-dtype int8")  # fmt: skip
    parser.add_argument("--llama-server-args", default="",
                        help="more arguments for llama-server, e.g. --no-repack")  # fmt: skip
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    cache = args.dir / "cache"
    cache.mkdir(exist_ok=True)
    rows = []
    for shape in args.shapes.split(","):
        for kind in args.types.split(","):
            path = args.dir / f"{shape}.{kind}.gguf"
            if kind in QUANTIZED_BY_LLAMA_CPP:
                if args.llama_quantize is None:
                    print(f"{shape} {kind}: needs --llama-quantize", flush=True)
                    continue
                if not path.is_file():
                    _quantize_with_llama_cpp(args.llama_quantize, args.dir, shape, kind)
            elif kind not in BLOCK_BYTES:
                print(f"{shape} {kind}: gguf-py writes Q4_0 and Q8_0 here; llama-quantize makes "
                      f"{', '.join(QUANTIZED_BY_LLAMA_CPP)}", flush=True)  # fmt: skip
                continue
            if not path.is_file():
                began = time.monotonic()
                print(f"writing {path} ...", flush=True)
                write_model(path, shape, kind)
                print(f"  {path.stat().st_size / 1e6:.0f} MB in {time.monotonic() - began:.0f} s", flush=True)
            if not (cache / "native").is_dir():
                print("warm-up run (compiles the native kernels into the cache):", flush=True)
                warm_up = measure(path, cache=cache, first_load=True, cold=False,
                                  kv_cache=args.kv_cache_memory, timeout=args.timeout)  # fmt: skip
                print(json.dumps(warm_up), flush=True)
            for first_load in (True, False):
                row = measure(
                    path,
                    cache=cache,
                    first_load=first_load,
                    cold=args.cold,
                    kv_cache=args.kv_cache_memory,
                    timeout=args.timeout,
                    sluiceway_args=tuple(args.sluiceway_args.split()),
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
            if args.llama_server is not None:
                row = measure(
                    path, cache=cache, first_load=False, cold=args.cold,
                    kv_cache=args.kv_cache_memory, timeout=args.timeout,
                    llama_server=args.llama_server,
                    context=_kv_tokens(shape, _bytes(args.kv_cache_memory)),
                    llama_args=tuple(args.llama_server_args.split()),
                )  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    print()
    kv = _bytes(args.kv_cache_memory)
    print(
        "| server | file | MB | load | page cache | ready s | first token s | peak RSS GB "
        "| (RSS - KV) / file | written MB | decode tok/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['server']} | {r['file']} | {r['file_bytes'] / 1e6:.0f} "
            f"| {'first' if r['first_load'] else 'again'} | {'cold' if r['cold'] else 'warm'} "
            f"| {r['ready_s']:.1f} | {r['first_token_s']:.1f} | {r['peak_rss'] / 1e9:.2f} "
            f"| {(r['peak_rss'] - kv) / r['file_bytes']:.2f}x | {r['written'] / 1e6:.1f} "
            f"| {r['decode_tok_s']:.1f} |"
        )
    print(f"\nload average: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
