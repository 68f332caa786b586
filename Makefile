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

# Two pytest-xdist workers: most multi-process tests wait on heartbeats, timeouts and Slurm more than they
# compute, so a second test runs meanwhile. The Slurm tests stay on one worker (tests/conftest.py). WORKERS=0
# runs in one process (pytest -n 0), e.g. to read one test's output as it happens.
WORKERS ?= 2
PYTEST = $(PYTHON) -m pytest -q -n $(WORKERS) --dist loadgroup

unit:
	$(PYTEST)

# The fast tier alone: no multi-process, Slurm or end-to-end training tests (those are marked slow).
fast:
	$(PYTEST) -m "not slow"

# The slow tier (every multi-process, fault, Slurm and timing test) beside a CPU hog, two spinning processes a
# core: a test that holds only on a quiet machine fails here, on the developer's machine, not in a later CI run.
LOADED_TESTS ?= -m slow
test-loaded:
	$(PYTHON) tools/cpu_hog.py --per-core 2 -- $(PYTEST) $(LOADED_TESTS)

demo:
	gpucert accept
