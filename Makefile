# The README's commands. Everything runs from a venv this Makefile creates.
#   make test      - create .venv, install albert_dist[dev], run the whole test suite (prints the 25 slowest tests)
#   make test-fast - the inner loop: tests/unit (single process, no subprocess, no trainer; ~1 min on 2 cores)
#   make pretrain  - create .venv, pretrain albert-tiny on the bundled corpus (deepspeed launcher, 2 ranks)
#   make bench     - run every benchmark in bench/ and write bench/results/results.json
#   make gpu-kit   - .whl (wheels for the GPU image's CPython $(PYVER)) and .gpu_data (SST-2) for bench/gpu_check.sh;
#                    SST2=DIR: GLUE SST-2's train.tsv and dev.tsv (default ../shared/corpora/glue-sst2)
# GPU users: install the torch build for your CUDA first, e.g.
#   make install TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# pytest-xdist workers: two on CI's 2 cores; a whole test file is one unit of work (its module fixtures start once),
# in collection order (the long distributed files first, tests/unit last to fill the gaps). Not loadgroup: it does not
# group on pytest 9.2 (pytest-xdist issue 1386)
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
NUM_RANKS ?= 2
# Every command runs with the venv's bin first on PATH (the deepspeed/mlflow commands tests start are the
# venv's, and DeepSpeed's JIT builds use the venv's ninja: a system ninja of another version rebuilds every
# time) and with a per-venv torch-extension cache (two venvs sharing ~/.cache/torch_extensions rebuild each
# other's ops, and a build killed by another checkout's job can leave a stale lock there).
RUN_ENV := PATH=$(abspath $(VENV))/bin:$$PATH TORCH_EXTENSIONS_DIR=$(abspath $(VENV))/torch_extensions

PYVER ?= 3.12
.PHONY: install test test-fast pretrain bench gpu-kit clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[dev]'
	# DeepSpeed JIT-compiles its shared-memory comm op on the first CPU process group (~1-2 min); build it
	# once here so concurrent test ranks do not all wait on the compile lock. A no-op on GPU builds.
	$(RUN_ENV) $(PY) -c "from deepspeed.accelerator import get_accelerator as g; b = g().create_op_builder('ShareMemCommBuilder'); b is not None and b.load()" || true
	# matplotlib builds its font cache on its first import by running fc-list: once here, not inside a unit test
	# (tests/unit refuses subprocesses; the first plotting test on a new machine failed on it)
	$(PY) -c "import matplotlib.font_manager"
	touch $@

install: $(VENV)/.installed

# junit.xml (per-test times) feeds `python tools/slowest_tests.py junit.xml --write docs/layout.md`
test: install
	$(RUN_ENV) OMP_NUM_THREADS=1 $(PY) -m pytest -q $(XDIST) --durations=25 --junitxml=junit.xml $(PYTEST_ARGS)

# tests/unit: one process per test run, no subprocess, worker or server (tests/unit/conftest.py fails a test that
# starts one): what to run after every change
test-fast: install
	$(RUN_ENV) OMP_NUM_THREADS=1 $(PY) -m pytest -q $(XDIST) --durations=10 tests/unit $(PYTEST_ARGS)

pretrain: install
	$(RUN_ENV) bash launch/pretrain_local.sh $(NUM_RANKS)

bench: install
	$(RUN_ENV) OMP_NUM_THREADS=1 $(PY) bench/run_all.py

# PYVER="3.12 3.11": wheels for both (3.11: this machine's CPython, for the bare-venv rehearsal of gpu_check --cpu)
gpu-kit: install
	PYTHON=$(PY) PYVER="$(PYVER)" SST2="$(SST2)" bash bench/gpu_wheels.sh

clean:
	rm -rf $(VENV) runs mlruns.db
