# parsim — quick start: `make demo` then `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
OUT     ?= out/demo
# the shared training data: ../shared from the repository (../../shared from a worktree)
RUNS    ?= $(firstword $(wildcard ../shared/validation/public_runs_train.csv ../../shared/validation/public_runs_train.csv) ../shared/validation/public_runs_train.csv)

.PHONY: demo test studies equivalence profiles heldout heldout-smoke venv clean fuzz gpu-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# exactly torch==2.13.0: the CPU build pip finds on this machine's disk (an unpinned torch pulls CUDA)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[torch,dev,cluster]'
	# numba compiles the fast path's kernels once, here, not in the first sweep (parsim/study/warm.py)
	$(BIN)/python -m parsim.study.warm
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m parsim demo --out $(OUT)

# the shipped GPU profiles, fitted to the public training runs (parsim/study/runs/profiles.py)
profiles: $(STAMP)
	$(BIN)/python -m parsim.study.runs.profiles $(RUNS)

# Three pytest workers on CI's two cores, a test file each at a time (module fixtures start their
# gloo processes once): a third of two workers' time went to waiting on gloo process start-up and
# on timeouts the reliability tests provoke (2-core Zen 4 VM, 2026-12-02, parallel part: 3:41-3:47
# with two workers, 2:58-3:20 over four runs with three, all passing); then the tests marked
# `alone`, which time this machine, with nothing running beside them (only their files are
# collected again: collecting all of tests/ imports torch and every module).
TEST_WORKERS ?= 3
ALONE_FILES := $(shell grep -l 'pytest.mark.alone' tests/test_*.py)
# Bytecode is written even where the environment says not to (PYTHONDONTWRITEBYTECODE=1): every
# worker, rank and CLI call of the suite would otherwise compile parsim and the tests again
# (pytest's assertion rewriting alone: 13 s of each worker's 20 s collection).
test: $(STAMP)
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests -n $(TEST_WORKERS) --dist loadfile -m "not alone"
	$(if $(ALONE_FILES),PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(ALONE_FILES) -m alone)

# >= 10,000 generated command lines through the CLI, 30 s cap each, counts printed (issue 23)
fuzz: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python tests/fuzz/run.py --cases 10000 --workers 2 --timeout 30

# calibrate --device cuda + validate NCCL plans and print one report; says so and exits 0 without a GPU.
# Runs with the venv's python, or (on a GPU machine with parsim installed) GPU_PY=python3.
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY))
gpu-check:
	$(GPU_PY) studies/gpu_check/check.py --out out/gpu_check

# The studies that run in under 10 minutes and measure nothing about this machine (each README
# gives its time; about 5 minutes in all). The timing studies (sim_speed,
# executor_overhead, validation_cpu, merak's CPU checks, gpt3_175b_1024/bench_fast.py,
# at_scale/straggler_cpu.py and bench_montecarlo.py) are left
# out: they need an idle machine. Scripts that only print get their results.txt through tee.
# Narayanan et al. 2021 Table 1 lives outside the repo (studies/megatron2021/README.md)
MEGATRON_TABLE ?= ../shared/validation/megatron2021_table1.csv
studies: SHELL := /bin/bash
studies: .SHELLFLAGS := -o pipefail -c
studies: $(STAMP)
	$(BIN)/python studies/bubble_vs_microbatches/run.py | tee studies/bubble_vs_microbatches/results.txt
	$(BIN)/python studies/dp_ps_vs_allreduce/run.py | tee studies/dp_ps_vs_allreduce/results.txt
	$(BIN)/python studies/zero_memory_7b/run.py | tee studies/zero_memory_7b/results.txt
	$(BIN)/python studies/llama3_70b_64h100/run.py | tee studies/llama3_70b_64h100/results.txt
	$(BIN)/python studies/rules_of_thumb/run.py | tee studies/rules_of_thumb/results.txt
	$(BIN)/python studies/gpt3_175b_1024/run.py | tee studies/gpt3_175b_1024/results.txt
	$(BIN)/python studies/megatron2021/run.py --table $(MEGATRON_TABLE)
	$(BIN)/python studies/public_runs/run.py
	$(BIN)/python studies/merak/run.py
	$(BIN)/python studies/plots_demo/make_demo_plots.py
	$(BIN)/python studies/at_scale/run.py
	$(BIN)/python studies/memory_moments/run.py | tee studies/memory_moments/results.txt

# Issue 20's held-out validation: calibrate this machine (no --model), run six models it never
# saw (30 plans, 2 and 4 ranks) on the executor and the simulator, check the targets. Needs an
# idle machine: ~35 (AMD EPYC VM) to ~60 (Intel VM) minutes; results in studies/validation_cpu/heldout/ (its README). The smoke
# run (one round, 12 plans, quick calibration) only proves the pipeline works: its numbers are not results.
heldout: $(STAMP)
	bash studies/validation_cpu/heldout/run.sh

heldout-smoke: $(STAMP)
	QUICK=1 bash studies/validation_cpu/heldout/run.sh

# Did a refactor change any number? The corpus in both the reference commit and this tree.
equivalence: $(STAMP)
	$(BIN)/python studies/equivalence/compare.py

clean:
	rm -rf $(VENV) out .pytest_cache
