# One task runner for developers and CI (.ci/run calls `make test`).
PYTHON ?= python3
# The CPU wheel on our machines; on a GPU node keep the torch you have (make install TORCH=).
TORCH ?= torch==2.13.0

.PHONY: install test lint typecheck unit fast test-loaded demo

install:
	$(PYTHON) -m pip install $(TORCH) -e '.[all,dev]'

test: lint typecheck unit

lint:
	$(PYTHON) -m ruff check src tests
	$(PYTHON) -m ruff format --check src tests

typecheck:
	$(PYTHON) -m mypy

unit:
	$(PYTHON) -m pytest -q

# The fast tier alone: no multi-process, Slurm or end-to-end training tests (those are marked slow).
fast:
	$(PYTHON) -m pytest -q -m "not slow"

# The multi-process and fault tests beside a CPU hog (two spinning processes a core): a test that holds only on a
# quiet machine fails here, on the developer's machine, not in a later CI run.
LOADED_TESTS ?= tests/runtime tests/finetune/test_job_failures.py tests/bench/test_worker_failure.py
test-loaded:
	$(PYTHON) tools/cpu_hog.py --per-core 2 -- $(PYTHON) -m pytest -q $(LOADED_TESTS)

demo:
	gpucert accept
