# Two commands for a newcomer: `make demo` (the CPU lab) and `make test` (the test suite).
# Both create .venv on first use and install pinned dependencies (constraints.txt pins torch==2.13.0, CPU build).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
OUT ?= runs/lab
# verl 0.9.1 pins hydra-core (omegaconf 2.3, antlr4 4.9.3), transformers and packaging against ours: its own venv.
VERL_VENV ?= .venv-verl
VERL_PY := $(VERL_VENV)/bin/python
VERL_STAMP := $(VERL_VENV)/.installed
# One thread per process: the suite and the lab are faster and steadier that way on a loaded 2-core machine.
export OMP_NUM_THREADS ?= 1

GPU_OUT ?= runs/gpu-check
# The GPU check needs a python whose torch finds CUDA: the venv's where its torch does (it may be a CPU build), else
# the machine's python3 (a device machine has torch there and no network for a venv); with neither, the venv's, which
# says that there is no GPU. Evaluated only by gpu-check (=, not :=).
GPU_PY = $(firstword $(foreach p,$(wildcard $(PY)) $(PYTHON),$(shell $(p) -c 'import sys, torch;   sys.exit(not torch.cuda.is_available())' >/dev/null 2>&1 && echo $(p))) $(wildcard $(PY)) $(PYTHON))

.PHONY: help venv verl-venv test test-verl demo bench gpu-check lint clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -e 's/:.*## /\t/' -e 's|$$(OUT)|$(OUT)|' -e 's|$$(VENV)|$(VENV)|' -e 's|$$(GPU_OUT)|$(GPU_OUT)|' -e 's|$$(VERL_VENV)|$(VERL_VENV)|'

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[lab,recipe,test]'
	touch $(STAMP)

venv: $(STAMP)  ## create .venv with pinned dependencies

# torch first (the local CPU build), then verl and what its modules import on a CPU, pinned, without resolving verl's
# declared GPU/logging dependencies (vllm, flash-attn, wandb, tensorboard: requirements-verl.txt says why).
$(VERL_STAMP): pyproject.toml constraints.txt requirements-verl.txt
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(VERL_PY) -m pip install --quiet --no-deps -r requirements-verl.txt
	$(VERL_PY) -m pip install --quiet --no-deps -e .
	touch $(VERL_STAMP)

verl-venv: $(VERL_STAMP)  ## create $(VERL_VENV): verl 0.9.1 on the CPU torch, for the verl adapter's tests

test: $(STAMP) $(VERL_STAMP)  ## run the test suite (tests/verl in $(VERL_VENV), against verl 0.9.1)
	$(PY) -m pytest -q
	$(MAKE) --no-print-directory test-verl

test-verl: $(VERL_STAMP)  ## run only the verl adapter's tests, against the real verl 0.9.1
	MISMATCH_CTRL_REQUIRE_VERL=1 $(VERL_PY) -m pytest -q tests/verl

demo: $(STAMP)  ## run the CPU lab comparison on the tiny MoE policy (one seed); report and plots in $(OUT)
	$(PY) -m mismatch_ctrl lab --preset demo --out $(OUT)

bench: $(STAMP)  ## core time vs a Python loop and one elementwise pass; hook ops, collectives and time; GPU syncs and time, and a fused correction's (with CUDA)
	$(PY) benchmarks/bench_core.py
	PYTHONWARNINGS=ignore $(PY) benchmarks/bench_hooks.py
	$(PY) benchmarks/bench_gpu.py
	$(PY) benchmarks/bench_fused.py

gpu-check:  ## on a GPU machine (<= 8 min): CUDA tests, GPU benchmarks, lab device choice and throughput; report in $(GPU_OUT)
	$(GPU_PY) benchmarks/gpu_check.py --out $(GPU_OUT)

lint: $(STAMP)  ## ruff (installed on first use)
	$(PY) -m pip install --quiet ruff
	$(PY) -m ruff check mismatch_ctrl tests benchmarks recipes

clean:  ## remove the virtual environment and run outputs
	rm -rf $(VENV) $(VERL_VENV) runs
