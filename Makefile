# Two commands set everything up: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
COMPILED := $(VENV)/.compiled
PYTEST_ARGS ?=

.PHONY: bench-plan bench-plan-search bench-memory bench-largest bench-bigdigits setup demo test test-slow test-slurm bench bench-pipeline bench-spatial bench-recovery bench-testbed validate-predict report-check clean

setup: $(COMPILED)

# The pinned CPU torch goes in first: a bare `torch` requirement would pull a multi-GB CUDA build.
# On a GPU machine: make TORCH=torch==2.13.0 (or any CUDA build's requirement) setup
$(STAMP): pyproject.toml
	@echo "[1/3] creating the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "[2/3] installing $(TORCH) (the CPU build here; about 200 MB)"
	$(PY) -m pip install --progress-bar on $(TORCH) | grep -v "^Requirement already satisfied" || true
	@$(PY) -c "import torch" || { echo "error: torch did not install: see the pip output above"; exit 1; }
	@echo "[3/3] installing scaletrain and its dependencies (numpy, scikit-learn, matplotlib, rich, ...)"
	$(PY) -m pip install --progress-bar on -e '.[dev]' | grep -v "^Requirement already satisfied" || true
	@$(PY) -c "import scaletrain.cli" || { echo "error: scaletrain did not install: see the pip output above"; exit 1; }
	touch $(STAMP)
	@echo "installed: run commands as .venv/bin/scaletrain, or 'source .venv/bin/activate' to put scaletrain on PATH"

# Bytecode written once: where PYTHONDONTWRITEBYTECODE is set (as on these machines) Python would otherwise compile
# torch's sources again in every process it starts, 3 s of each rank's start (docs/testing.md: "Start-up").
$(COMPILED): $(STAMP)
	@echo "compiling the environment's bytecode once (about 30 s)"
	$(PY) -m compileall -q -j 0 -x py312_intrinsics $(VENV)/lib > /dev/null
	touch $(COMPILED)

demo: $(COMPILED)
	$(VENV)/bin/scaletrain train --config configs/demo.toml --out runs/demo-$$(date +%Y%m%d-%H%M%S)

# The fast suite, under 5 minutes on 2 cores (docs/testing.md). A test file per pytest worker, one worker per core:
# launches wait on their ranks' start-up, and the other worker's tests fill that time. Tests write bytecode even
# where PYTHONDONTWRITEBYTECODE is set: pytest would otherwise rewrite every test module's asserts at each run (9 s).
# Every equivalence test (2 ranks = 1 rank, ...) runs again on the kernels of a CPU without AVX2 in test-slow (and
# so in CI), so that a test that holds on one CPU's kernels only cannot land (tests/conftest.py: EXACT).
TESTENV := PYTHONDONTWRITEBYTECODE=
WORKERS ?= auto
PYTEST := $(TESTENV) $(PY) -m pytest -q -n $(WORKERS) --dist loadfile
SERIAL := $(TESTENV) $(PY) -m pytest -q
test: $(COMPILED)
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

# The slow suite, which includes the real-SLURM tests (SLURM and munge are installed first where missing, as
# root), then every equivalence test, fast and slow, again on the kernels of a CPU without AVX2 (49 + 4 min here).
# One test at a time: some compare timings (a diagnosed slowdown, the testbed's links), which another test's load
# would move.
test-slow: $(COMPILED)
	sh tools/slurm/install.sh
	$(SERIAL) -m slow $(PYTEST_ARGS)
	@echo "every equivalence test again, on the kernels of a CPU without AVX2 (ATEN_CPU_CAPABILITY=default):"
	ATEN_CPU_CAPABILITY=default $(SERIAL) -m equivalence $(PYTEST_ARGS)

# `scaletrain slurm` against a real SLURM (root): installs slurmctld, slurmd, slurm-client and munge where
# missing, then the tests start them on this machine and stop them after (docs/slurm.md; about 3 min).
test-slurm: $(COMPILED)
	sh tools/slurm/install.sh
	$(SERIAL) -m slurm $(PYTEST_ARGS)

bench: $(COMPILED)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/allocator.py
	$(PY) benchmarks/tensorboard_cost.py
	$(PY) benchmarks/pipeline_split.py

# The planner's choice against its candidates all measured, interleaved (docs/plan.md; ~75 min at 3 rounds;
# the testbed cases need root). CAL=FILE: a calibration of this machine (default: its cached one).
bench-plan: $(COMPILED)
	$(PY) benchmarks/plan_choice.py --testbed $(if $(CAL),--calibration $(CAL))

# The plan search's time against revision BASE's, alternated, and their plans compared candidate by candidate
# (docs/plan.md; ~3 min): make bench-plan-search BASE=<commit>
bench-plan-search: $(COMPILED)
	$(PY) benchmarks/plan_search.py --base $(or $(BASE),HEAD~1)

# The automatic pipeline split against uniform and the exhaustive best, K=2 (docs/bench-pipeline.md; ~2 min).
bench-pipeline: $(COMPILED)
	$(PY) benchmarks/pipeline_split.py

# Memory per rank of one large image: the whole model against 2 spatial tiles (docs/spatial.md; ~7 min).
bench-spatial: $(COMPILED)
	$(PY) benchmarks/spatial_memory.py

# The one memory model against every strategy's resident peak, under each allocator policy
# (docs/predict-validation.md; ~2 min each).
bench-memory: $(COMPILED)
	$(PY) benchmarks/memory_strategies.py --allocator lean
	$(PY) benchmarks/memory_strategies.py --allocator steady

# The largest image side each layout trains under 2 GiB per rank, measured (docs/spatial.md; ~40 min).
bench-largest: $(COMPILED)
	$(PY) benchmarks/largest_side.py

# Resolution matters: bigdigits at full size (one process, and 2 spatial tiles) against 8x downsampled (docs/datasets.md; ~6 min).
bench-bigdigits: $(COMPILED)
	$(PY) benchmarks/bigdigits_resolution.py

# What recovery costs: --checkpoint-every against none, and kill -9 to training resumed (docs/bench-recovery.md; ~6 min).
bench-recovery: $(COMPILED)
	$(PY) benchmarks/recovery.py

bench-testbed: $(COMPILED)  # root only: builds network namespaces (docs/testbed.md)
	$(PY) benchmarks/testbed_bytes.py
	$(PY) benchmarks/testbed_strategies.py

# The performance model against measurements here (docs/predict.md): calibrates (about 3 min), runs 30+
# configurations (studies, and testbed hosts over shaped links when root), predicts and validates them.
validate-predict: $(COMPILED)
	$(PY) benchmarks/validate_predict.py

# Renders a report in headless Chromium: tables in the DOM, plots decoded (skips without Chromium).
report-check: $(COMPILED)
	$(PY) -m pytest -q tests/test_report_html_chromium.py

clean:
	rm -rf $(VENV) runs .pytest_cache
