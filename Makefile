# Two commands set everything up: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup demo test test-slow bench bench-testbed report-check clean

setup: $(STAMP)

# The pinned CPU torch goes in first: a bare `torch` requirement would pull a multi-GB CUDA build.
# On a GPU machine: make TORCH=torch==2.13.0 (or any CUDA build's requirement) setup
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/scaletrain train --config configs/demo.toml --out runs/demo-$$(date +%Y%m%d-%H%M%S)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

bench-testbed: $(STAMP)  # root only: builds network namespaces (docs/testbed.md)
	$(PY) benchmarks/testbed_bytes.py
	$(PY) benchmarks/testbed_strategies.py

# Renders a report in headless Chromium: tables in the DOM, plots decoded (skips without Chromium).
report-check: $(STAMP)
	$(PY) -m pytest -q tests/test_report_html_chromium.py

clean:
	rm -rf $(VENV) runs .pytest_cache
