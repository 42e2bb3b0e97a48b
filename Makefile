# coursekit: `make lab` starts the course (`make update` brings course updates into your copies),
# `make test` runs every test,
# `make test-fast` the unit tests alone (no cluster, MPI, browser, notebook or slow test),
# `make test-gpu` the GPU tests and benches on a machine with an NVIDIA GPU (README "On GPUs").
# They create the virtual environment .venv (Python 3.11+) on first use.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
EXTRAS ?= test,mpi,torch
comma  := ,
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)-$(subst $(comma),-,$(EXTRAS))
PORT   ?= 8888
CLASS_PYTHON ?= /usr/bin/python3
CLASS_VENV   := .venv-class
CLASS_STAMP  := $(CLASS_VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
NBGRADER_VENV  := .venv-nbgrader
NBGRADER_STAMP := $(NBGRADER_VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
LAB_ARGS ?=
WORKSPACE ?= workspace
AS_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: install class-env nbgrader-env lab update test test-fast test-gpu gpu-check test-clusters notebooks exercises bench lock clean

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "coursekit needs Python 3.11 or newer; run: make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]" -c constraints.txt
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

# Students run and edit their own copies in $(WORKSPACE) (ignored by git), never the course's
# tracked notebooks, so `make update` (git pull, then a cell-by-cell merge) never conflicts.
# The links JupyterLab prints (with their token) open the first notebook, not the Launcher:
# its default URL is /lab/tree/<path>, the same page the browser it starts opens. The file
# to run is the working copy's, by its absolute path: jupyter resolves it from the current
# folder and refuses one outside root_dir.
FIRST_NOTEBOOK := notebooks/00_setup.ipynb
lab: $(STAMP)
	$(BIN)/python -m coursekit workspace init --course $(CURDIR) --workspace $(WORKSPACE)
	@echo "Starting JupyterLab on http://127.0.0.1:$(PORT)/lab/tree/$(FIRST_NOTEBOOK) (open the link with the token printed below)"
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(PORT) --ServerApp.root_dir=$(abspath $(WORKSPACE)) --LabApp.default_url=/lab/tree/$(FIRST_NOTEBOOK) $(AS_ROOT) $(LAB_ARGS) $(abspath $(WORKSPACE))/$(FIRST_NOTEBOOK)

update:
	@if git -C $(CURDIR) rev-parse --is-inside-work-tree >/dev/null 2>&1; then git -C $(CURDIR) pull --ff-only; fi
	$(MAKE) install
	$(BIN)/python -m coursekit workspace update --course $(CURDIR) --workspace $(WORKSPACE)

# The notebooks run with NumPy's SIMD dispatch and Numba's target forced off this CPU's
# (--numerics=off-host, conftest.py): their stored outputs must read the same on any machine.
# tests/test_nbgrader.py grades every exercise with the real nbgrader, from $(NBGRADER_VENV).
test: $(STAMP) $(NBGRADER_STAMP)
	COURSEKIT_TEST_NBGRADER_VENV=$(CURDIR)/$(NBGRADER_VENV) \
	$(BIN)/python -m pytest tests notebooks solutions --ignore=tests/clusters --nbval --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=300 --numerics=off-host \
		$(PYTEST_ARGS)

# The markers are kept honest by tests/conftest.py (a test that starts a cluster, mpiexec or
# JupyterLab without its marker fails). Under a minute on a 2-vCPU machine.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests --ignore=tests/clusters -m "not cluster and not mpi and not ui and not slow" \
		$(PYTEST_ARGS)

# On a machine with an NVIDIA GPU and driver: the CUDA tests on the hardware (the simulator's
# equality tests, COURSEKIT_CUDA_TESTS=device), bench/bench_gpu_kernels.py and
# bench/bench_gpu_training.py; every figure into $(GPU_REPORT)/gpu.json and gpu.md
# (bench/gpu_report.py). It installs .venv with the test and $(GPU_EXTRA) extras (gpu: CUDA
# 12 wheels, for any CUDA 12 or 13 driver; gpu-cu13: CUDA 13 wheels, driver 580+), or with
# GPU_PYTHON=python3 uses that Python, adding only what it lacks (bench/gpu_env.py; offline:
# PIP_NO_INDEX=1 PIP_FIND_LINKS=$$PWD/.whl, bench/GPU_RUN.md). Without a GPU it stops at once.
GPU_PYTHON ?=
GPU_EXTRA  ?= gpu
GPU_REPORT ?= artifacts/gpu
GPU_TESTS  ?= tests/nn/test_nn_cuda_sim.py tests/parallel/data_parallel/test_data_parallel_cuda_sim.py tests/parallel/test_model_parallel_cuda_sim.py
GPU_ARGS   ?=
NO_GPU_MESSAGE := no NVIDIA GPU visible: make test-gpu measures on a GPU; make test checks the GPU code in numba's simulator

gpu-check:
	@nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || { echo "$(NO_GPU_MESSAGE)" >&2; exit 1; }

test-gpu: gpu-check
ifeq ($(strip $(GPU_PYTHON)),)
	$(MAKE) install EXTRAS=test,$(GPU_EXTRA)
	$(BIN)/python bench/gpu_report.py --report $(GPU_REPORT) --tests $(GPU_TESTS) $(GPU_ARGS)
else
	$(GPU_PYTHON) bench/gpu_env.py --extra $(GPU_EXTRA)
	$(GPU_PYTHON) bench/gpu_report.py --report $(GPU_REPORT) --tests $(GPU_TESTS) $(GPU_ARGS)
endif

class-env: $(CLASS_STAMP)

# Every notebook on every cluster kind the README offers (MPI profile, real Slurm, two
# hosts, JupyterHub on Slurm). Needs root and Debian's slurm-wlm and munge (see .ci/run).
test-clusters: $(STAMP) $(CLASS_STAMP)
	COURSEKIT_TEST_CLASS_VENV=$(CURDIR)/$(CLASS_VENV) $(BIN)/python -m pytest tests/clusters $(PYTEST_ARGS)

# The class's environment (JupyterHub, batchspawner, the proxy from npm): the students' Slurm
# jobs run it as the students, so it is built from the system Python, which they can read
# (a pyenv or conda Python under /root is not). On a real cluster: a shared file system.
$(CLASS_STAMP): pyproject.toml constraints.txt
	$(CLASS_PYTHON) -m venv $(CLASS_VENV)
	$(CLASS_VENV)/bin/python -m pip install --quiet --upgrade pip
	# the pins, less soupsieve's (its release needs Python >= 3.11.5; Debian 12 has 3.11.2)
	grep -v '^soupsieve==' constraints.txt > $(CLASS_VENV)/constraints.txt
	$(CLASS_VENV)/bin/python -m pip install --quiet -e ".[class]" -c $(CLASS_VENV)/constraints.txt
	npm install --prefix $(CLASS_VENV)/proxy --no-audit --no-fund --silent configurable-http-proxy@5
	touch $@

nbgrader-env: $(NBGRADER_STAMP)

# The instructor's nbgrader with the course (its kernels run the exercises, chapter 09's
# with PyTorch), apart from .venv: nbgrader installs a JupyterLab extension, which must not
# enter the students' lab.
$(NBGRADER_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(NBGRADER_VENV)
	$(NBGRADER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(NBGRADER_VENV)/bin/python -m pip install --quiet -e ".[nbgrader,torch]" -c constraints.txt
	rm -f $(NBGRADER_VENV)/.installed-* && touch $@

notebooks: $(STAMP)
	$(BIN)/python -m coursekit notebooks execute

exercises: $(STAMP)
	$(BIN)/python -m coursekit notebooks exercises

bench:
	$(MAKE) install EXTRAS=test,mpi,bench
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

# Pin every package to the versions installed now (after changing pyproject.toml and
# `make install EXTRAS=test,mpi,bench,class`), then rebuild the notebooks with them.
lock:
	{ echo "# Versions the stored notebook outputs were computed with (make lock rewrites this)."; \
	  $(BIN)/python -m pip freeze --exclude-editable | grep -v -e '^torch==' -e '^coursekit'; } > constraints.txt

clean:
	rm -rf $(VENV) $(NBGRADER_VENV) .pytest_cache .hypothesis build *.egg-info
