# One-command set-up: `make test` builds its own virtual environment and runs the suite.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.avex-installed
PYTEST_ARGS ?=
TRAIN_ARGS ?=

.PHONY: test test-fast train bench install cuda-lib clean wheel-check test-gpu-image

$(STAMP): setup.py pyproject.toml kernels/gumbel_topk_host.c
	@# A machine that already has torch (a GPU image with its CUDA build) keeps it: the venv
	@# sees the system packages. Elsewhere torch==2.13.0 goes in first, so that no range
	@# pulls gigabytes of CUDA wheels.
	@if python3 -c "import torch" 2>/dev/null; then \
	    echo "torch found on the system: reusing it"; \
	    python3 -m venv --system-site-packages $(VENV); \
	else \
	    python3 -m venv $(VENV) && $(PY) -m pip install -q --upgrade pip && \
	    $(PY) -m pip install -q torch==2.13.0; \
	fi
	$(PY) -m pip install -q -e ".[dev]"
	@touch $@

install: $(STAMP)

# The CUDA C++ library (kernels/csrc) needs only nvcc and CMake; without nvcc its tests skip.
cuda-lib:
	@if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then \
	    cmake -S . -B build && cmake --build build -j 2; \
	else \
	    echo "nvcc not found: not building the CUDA C++ library (its tests will skip)"; \
	fi

test: $(STAMP) cuda-lib
	$(PY) -m pytest tests $(PYTEST_ARGS)

# The contributor's lane: every test but those marked slow (end-to-end training and evaluation).
test-fast: $(STAMP) cuda-lib
	$(PY) -m pytest tests -m "not slow" $(PYTEST_ARGS)

# The wheel installed without -e in a fresh venv: every module, `avex.train --help`, README snippet.
wheel-check: $(STAMP)
	.ci/wheel_check.sh $(PY)

# The GPU image's stack (Python 3.12, torch 2.11, triton 3.6, transformers 5.17; no fvcore,
# pycocoevalcap, flash-attn or Java) in .venv-gpu-image (~5 GB), and the whole suite on it.
test-gpu-image: cuda-lib
	.ci/test_gpu_image.sh $(PYTEST_ARGS)

train: $(STAMP)
	$(PY) -m avex.train $(TRAIN_ARGS)

bench: $(STAMP)
	$(PY) -m pytest bench --benchmark-only $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv-gpu-image build *.egg-info
