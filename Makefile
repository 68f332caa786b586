# One task runner for developers and CI (.ci/run calls `make test`).
PYTHON ?= python3
# The CPU wheel on our machines; on a GPU node keep the torch you have (make install TORCH=).
TORCH ?= torch==2.13.0

.PHONY: install test lint typecheck unit demo

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

demo:
	gpucert accept
