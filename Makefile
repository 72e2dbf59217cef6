# Two commands for a newcomer: `make demo` (the CPU lab) and `make test` (the test suite).
# Both create .venv on first use and install pinned dependencies (constraints.txt pins torch==2.13.0, CPU build).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
OUT ?= runs/lab
# One thread per process: the suite and the lab are faster and steadier that way on a loaded 2-core machine.
export OMP_NUM_THREADS ?= 1

.PHONY: help venv test demo bench lint clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -e 's/:.*## /\t/' -e 's|$$(OUT)|$(OUT)|' -e 's|$$(VENV)|$(VENV)|'

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[lab,recipe,test]'
	touch $(STAMP)

venv: $(STAMP)  ## create .venv with pinned dependencies

test: $(STAMP)  ## run the test suite
	$(PY) -m pytest -q

demo: $(STAMP)  ## run the CPU lab comparison on the tiny MoE policy (one seed); report and plots in $(OUT)
	$(PY) -m mismatch_ctrl lab --out $(OUT)

bench: $(STAMP)  ## core time vs a Python loop and one elementwise pass; hook ops, collectives and time vs targets
	$(PY) benchmarks/bench_core.py
	PYTHONWARNINGS=ignore $(PY) benchmarks/bench_hooks.py

lint: $(STAMP)  ## ruff (installed on first use)
	$(PY) -m pip install --quiet ruff
	$(PY) -m ruff check mismatch_ctrl tests benchmarks recipes

clean:  ## remove the virtual environment and run outputs
	rm -rf $(VENV) runs
