#!/usr/bin/env bash
# Everything that needs a GPU, in one call: the CUDA tests (compiled Triton kernels against their
# references; the CUDA C++ library built with CMake and its example run), the kernel benchmarks
# and their Markdown table, and the profiling suite at real size. Meant for a lent H100/H200 whose
# image already has torch + triton and no internet:
#
#   here:      bash bench/fetch_gpu_wheels.sh          # wheels of packages the GPU image lacks
#   there:     AVEX_COMMIT=<sha> bash bench/gpu.sh      # carry .whl; tables go to $OUT
#   then:      copy $OUT/*.md into bench/results/ and commit them
#
# A device call has a 10-minute limit: AVEX_GPU_STAGES="tests" (or "bench", "profile", or any
# of the three) runs a part; the default is all three.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu-run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/avex-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/avex-site${PYTHONPATH:+:$PYTHONPATH}
fi
# The CUDA C++ library (kernels/csrc), built here with the image's nvcc and CMake.
cmake -S . -B build -DAVEX_CUDA_ARCHITECTURES=90 > "$OUT/cmake.log" 2>&1 \
    && cmake --build build -j 8 >> "$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
./build/avex_prune_example | tee "$OUT/example.log" || status_example=1
# Offline editable install: maps kernels/ to avex.kernels and keeps the image's torch/triton.
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1

commit=${AVEX_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "commit: $commit"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, \
'| triton', triton.__version__, '| transformers', transformers.__version__)"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

status=${status_example:-0}
# The kernel suites (on CUDA they compare the compiled kernels with the references); the
# metric tests need pycocoevalcap, which is too big to carry, and no GPU.
kernel_tests=$(ls tests/test_gumbel_topk.py tests/test_exchange.py tests/test_compact.py \
               tests/test_pruning.py tests/test_cuda*.py 2>/dev/null)
stages=" ${AVEX_GPU_STAGES:-tests bench profile} "
if [[ $stages == *" tests "* ]]; then
    python3 -m pytest $kernel_tests tests/test_profiling.py -q -p no:cacheprovider 2>&1 \
        | tee "$OUT/tests.log" || status=1
fi
if [[ $stages == *" bench "* ]]; then
    python3 -m pytest bench --benchmark-only -q -p no:cacheprovider \
        --benchmark-json="$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" || status=1
    python3 bench/summarize.py "$OUT/bench.json" --title "Kernel benchmarks on $(nvidia-smi \
--query-gpu=name --format=csv,noheader | head -1) (commit ${commit:0:12})" > "$OUT/bench-gpu.md"
    cat "$OUT/bench-gpu.md"
fi
if [[ $stages == *" profile "* ]]; then
    # The paper's Table 4 at real size: random bf16 weights; FLOPs need fvcore (carried).
    for backbone in ${AVEX_PROFILE_BACKBONES:-qwen2-7b llama3-8b}; do
        python3 -m avex.profiling --backbone "$backbone" --retention 0.4 --device cuda \
            --runs "${AVEX_PROFILE_RUNS:-20}" --out-dir "$OUT" --no-progress \
            2>&1 | tee "$OUT/profiling-$backbone.log" || status=1
    done
fi
exit $status
