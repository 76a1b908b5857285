# parsim — quick start: `make demo` then `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
OUT     ?= out/demo

.PHONY: demo test venv clean fuzz gpu-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# exactly torch==2.13.0: the CPU build pip finds on this machine's disk (an unpinned torch pulls CUDA)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[torch,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m parsim demo --out $(OUT)

test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests

# >= 10,000 generated command lines through the CLI, 30 s cap each, counts printed (issue 23)
fuzz: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python tests/fuzz/run.py --cases 10000 --workers 2 --timeout 30

# calibrate --device cuda + validate NCCL plans and print one report; says so and exits 0 without a GPU.
# Runs with the venv's python, or (on a GPU machine with parsim installed) GPU_PY=python3.
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY))
gpu-check:
	$(GPU_PY) studies/gpu_check/check.py --out out/gpu_check

clean:
	rm -rf $(VENV) out .pytest_cache
