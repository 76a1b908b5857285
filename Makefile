# parsim — quick start: `make demo` then `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
OUT     ?= out/demo

.PHONY: demo test venv clean

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

clean:
	rm -rf $(VENV) out .pytest_cache
