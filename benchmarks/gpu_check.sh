#!/usr/bin/env bash
# GPU check for the triton paged KV-cache kernels; run from anywhere on a machine
# with an NVIDIA GPU, torch, triton and transformers (no sluiceway install, no trio):
#   bash benchmarks/gpu_check.sh [gpu_check.py args, e.g. --batches 1 8 --iters 5]
# (a) tests/kernels compiled for the GPU (pytest) or an inline check without pytest;
# (b) Llama-3-8B-shaped bf16 decode throughput table; (c) the same shape's decode step
# with sampling on one GPU (tp=1) and, where the machine has 2 or more GPUs, split
# over them (tensor parallelism, NCCL). Sized to end within ~10 minutes.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
PY=${PYTHON:-python3}
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

echo "== (a) kernel correctness on the device"
if $PY -c "import pytest" 2>/dev/null; then
    # The project's pytest config needs pytest-trio (trio_mode); use a bare one.
    ini=$(mktemp --suffix=.ini)
    printf '[pytest]\nfilterwarnings =\n    error\n' >"$ini"
    timeout 200 $PY -m pytest -c "$ini" --rootdir "$PWD" -p no:cacheprovider \
        --import-mode=importlib -q tests/kernels || status=1
    rm -f "$ini"
else
    timeout 200 $PY benchmarks/gpu_check.py --kernels-only || status=1
fi

echo "== (b) decode throughput"
timeout 270 $PY benchmarks/gpu_check.py "$@" || status=1

echo "== (c) tensor parallel: tp=1 beside tp=N (N GPUs; one GPU: the tp=1 row only)"
timeout 150 $PY benchmarks/tp_check.py || status=1
exit $status
