#!/usr/bin/env bash
# Everything that needs a GPU, one stage per call (a lent GPU takes at most 10 minutes a call, and
# a task gets 15 minutes of GPU time in all, start-up included: first-light comes first):
#
#   bash bench/gpu.sh first-light  # the one call that matters most (<= 480 s): the CUDA paths of
#                               # the kernel suites, P1 (Gumbel-Top-K + PL) and P2 (compaction)
#                               # timed against their baselines, P9 (one AVEX training step and
#                               # its generation share); one Markdown table, first-light.md
#   bash bench/gpu.sh tests     # CUDA C++ library build + example; the CUDA test suites (xdist)
#   bash bench/gpu.sh bench     # every bench/bench_*.py (pytest-benchmark) -> bench-gpu.md
#   bash bench/gpu.sh train     # short python -m avex.train + evaluation on the embedded benchmark
#   bash bench/gpu.sh profile   # python -m avex.profiling at real size (qwen2-7b, bf16): the
#                               # timed table, FLOPs by hand, rounds bounded by the budget
#   bash bench/gpu.sh flops     # the same backbone's FLOPs counted by fvcore (carry .whl)
#   bash bench/gpu.sh session   # several stages in one call (AVEX_SESSION_STAGES, each with its
#                               # share of the budget), packed into gpu-session.tgz
#   bash bench/gpu.sh STAGE --dry-run   # the same logic on a CPU, small sizes; skips only what
#                                       # needs CUDA (tests/test_gpu_script.py runs it)
#
# Each stage writes its logs and Markdown tables to $OUT (default bench/results/gpu-run), at
# most 8 files, flat, and stops itself after AVEX_STAGE_SECONDS (default 480 s) so that the call
# ends inside its limit with the tables written. Wheels in .whl/ (bench/fetch_gpu_wheels.sh
# fetches them here; carry .whl) are installed first. docs/gpu.md says how to run it.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

STAGE=${1:-${AVEX_GPU_STAGE:-}}
DRY_RUN=${AVEX_GPU_DRY_RUN:-0}
[[ ${2:-} == "--dry-run" || ${1:-} == "--dry-run" ]] && DRY_RUN=1
[[ ${1:-} == "--dry-run" ]] && STAGE=${2:-${AVEX_GPU_STAGE:-}}
# the stages one call can run; "session" runs several of them in one call
STAGES=(first-light tests bench train profile flops)
is_stage() { local s; for s in "${STAGES[@]}"; do [[ $1 == "$s" ]] && return 0; done; return 1; }
if ! is_stage "$STAGE" && [[ $STAGE != session ]]; then
    usage=$(IFS='|'; echo "${STAGES[*]}|session")
    echo "usage: bash bench/gpu.sh {$usage} [--dry-run]; got '$STAGE'" >&2
    exit 2
fi

PY=${PYTHON:-python3}
OUT=${OUT:-bench/results/gpu-run}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUDGET=${AVEX_STAGE_SECONDS:-480}
WHEELS=${AVEX_WHEEL_DIR:-.whl}
SITE=${AVEX_SITE:-/tmp/avex-site}
SCRATCH=${AVEX_SCRATCH:-/tmp/avex-gpu-$STAGE}
export PYTHONUNBUFFERED=1
started=$(date +%s)
status=0

note() { echo "[gpu.sh $STAGE$([[ $DRY_RUN == 1 ]] && echo ' dry-run')] $*"; }
skip_cuda() { note "skipped (needs CUDA): $*"; echo "skipped (needs CUDA): $*" >> "$OUT/machine.txt"; }

# --- set-up shared by every stage -------------------------------------------------------------
# Carried wheels (packages the GPU image lacks), installed beside the image's own packages.
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$WHEELS"/*.whl || { note "wheel install from $WHEELS failed"; exit 1; }
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    wheels=$(cd "$WHEELS" && ls *.whl | tr '\n' ' ')
else
    wheels="none"
fi
# avex from this checkout (kernels/ maps to avex.kernels): an offline editable install, unless
# the interpreter already imports this checkout (a developer's venv).
# Asked from outside the checkout: here the source folder avex/ (no kernels/ inside) would answer.
if ! (cd / && "$PY" -c "import avex.kernels, sys; sys.exit(not avex.__file__.startswith('$ROOT/'))") \
        2>/dev/null; then
    if ! "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .; then
        # Never lose a lent GPU's call to packaging: the same layout as setup.py's mapping
        # (kernels/ -> avex.kernels, profiling/ -> avex.profiling) in a copy on PYTHONPATH,
        # without the optional C extension (gumbel_topk's check runs in NumPy then).
        note "pip install -e . failed: importing a copy of the tree from $SCRATCH/src instead"
        rm -rf "$SCRATCH/src" && mkdir -p "$SCRATCH/src"
        cp -r avex "$SCRATCH/src/avex" && cp -r kernels "$SCRATCH/src/avex/kernels" \
            && cp -r profiling "$SCRATCH/src/avex/profiling" || exit 1
        export PYTHONPATH=$SCRATCH/src${PYTHONPATH:+:$PYTHONPATH}
        "$PY" -c "import avex.kernels, avex.profiling" || { note "no importable avex"; exit 1; }
    fi
fi
HAS_CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))")
if [[ $HAS_CUDA != 1 && $DRY_RUN != 1 ]]; then
    note "no CUDA device here; run on a GPU machine, or pass --dry-run"; exit 1
fi
DEVICE=$([[ $HAS_CUDA == 1 ]] && echo cuda || echo cpu)
GPU_NAME=$([[ $HAS_CUDA == 1 ]] && nvidia-smi --query-gpu=name --format=csv,noheader | head -1 \
           || echo "no GPU (dry run)")
commit=${AVEX_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export AVEX_COMMIT=$commit   # what the tables record (profiling's too), not the copy's git state
{
    echo "stage: $STAGE$([[ $DRY_RUN == 1 ]] && echo ' (dry run on a CPU)')"
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "commit: $commit"
    if [[ $HAS_CUDA == 1 ]]; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    else
        echo "device: $GPU_NAME"
    fi
    "$PY" -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0], \
'| torch', torch.__version__, '| triton', triton.__version__, '| transformers', \
transformers.__version__)"
    echo "carried wheels: $wheels"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"
TITLE_TAIL="on $GPU_NAME (commit ${commit:0:12})"

seconds_left() {  # of $BUDGET, after what ran so far (at least 30)
    local left=$(( BUDGET - ($(date +%s) - started) ))
    echo $(( left < 30 ? 30 : left ))
}

run_budgeted() {  # run "$@" for at most $BUDGET seconds, minus what set-up took, output to a log
    local log=$1; shift
    local left
    left=$(seconds_left)
    timeout --signal=INT --kill-after=20 "$left" "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    (( rc == 124 )) && note "stopped after its time budget ($left s); the tables show what ran"
    return "$rc"
}

# The kernel suites with CUDA paths (first-light and tests). On a CPU they take minutes under the
# interpreter (CI runs them); a dry run runs their argument-check tests, enough to exercise the
# stage, its table and every file's imports.
KERNEL_SUITES="tests/test_gumbel_topk.py tests/test_exchange.py tests/test_compact.py
               tests/test_set_aware_kernel.py tests/test_pruning.py"
DRY_RUN_TESTS="bad_input or dispatch"
pytest_args() {  # $1: the JUnit file; xdist where the image has it
    local args=(-q -p no:cacheprovider --junitxml="$1")
    if "$PY" -c "import xdist" 2>/dev/null; then
        args+=(-n "${AVEX_TEST_WORKERS:-8}" --dist loadfile)
    else
        note "pytest-xdist is not installed: one process" >&2
    fi
    echo "${args[@]}"
}

# --- stages -----------------------------------------------------------------------------------
case "$STAGE" in
first-light)
    # Four parts, each bounded so that the later ones still run when an earlier one hangs: the
    # CUDA tests, then P1, P2 and P9 (bench/first_light.py; each part appends its rows to
    # first-light.jsonl as it goes), then P1 under torch.compile (its compile time is the least
    # predictable), then one table. A part's cap and the seconds kept back for the parts after it:
    rows=$OUT/first-light.jsonl
    log=$OUT/first-light.log
    rm -f "$rows" "$log"
    rounds=${AVEX_ROUNDS:-20}
    part() {  # part NAME CAP KEEP CMD...: run CMD for min(CAP, left - KEEP) s, log its exit
        local name=$1 cap=$2 keep=$3; shift 3
        local left=$(( $(seconds_left) - keep ))
        local limit=$(( left < cap ? left : cap ))
        (( limit < 10 )) && limit=10
        note "$name: at most $limit s"
        local t0
        t0=$(date +%s)
        timeout --signal=INT --kill-after=15 "$limit" "$@" 2>&1 | tee -a "$log"
        local rc=${PIPESTATUS[0]}
        echo "{\"part\": \"$name\", \"exit\": $rc, \"seconds\": $(( $(date +%s) - t0 ))}" \
            >> "$rows"
        (( rc != 0 )) && status=1
        return 0
    }
    args=($(pytest_args "$OUT/tests.xml") --maxfail="${AVEX_MAXFAIL:-5}")
    "$PY" -c "import pytest_timeout" 2>/dev/null && args+=(--timeout=120)
    [[ $DRY_RUN == 1 ]] && args+=(-k "$DRY_RUN_TESTS")
    part tests 220 200 "$PY" -m pytest $KERNEL_SUITES "${args[@]}"
    cp "$log" "$OUT/tests.log"
    bench=("$PY" bench/first_light.py)
    [[ $DRY_RUN == 1 ]] && rounds=${AVEX_ROUNDS:-3}
    part P1 60 140 "${bench[@]}" p1 "$rows" --rounds "$rounds"
    part P2 45 100 "${bench[@]}" p2 "$rows" --rounds "$rounds"
    if [[ $DRY_RUN == 1 ]]; then  # the tiny presets (AVEX_CACHE may hold them already)
        p9=(--preset tiny --batch-size 8 --micro-batch-size 4 --steps 2
            --cache-dir "${AVEX_CACHE:-$SCRATCH/cache}")
    else
        p9=(--cache-dir "$SCRATCH/cache")
    fi
    part P9 120 40 "${bench[@]}" p9 "$rows" "${p9[@]}"
    part P1-compile 120 10 "${bench[@]}" p1-compile "$rows" --rounds "$rounds"
    "$PY" bench/first_light.py table "$rows" --machine "$OUT/machine.txt" \
        --tests "$OUT/tests.xml" --title "First light $TITLE_TAIL" > "$OUT/first-light.md" \
        || status=1
    cat "$OUT/first-light.md"
    ;;
tests)
    if [[ $HAS_CUDA == 1 ]]; then
        export AVEX_REQUIRE_CUDA_BUILD=1  # a missing library build fails its tests, no skip
        cmake -S . -B build -DAVEX_CUDA_ARCHITECTURES=90 > "$OUT/cmake.log" 2>&1 \
            && cmake --build build -j 16 >> "$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; status=1; }
        ./build/avex_prune_example > "$OUT/example.log" 2>&1 || status=1
    else
        skip_cuda "CUDA C++ library build (cmake, nvcc) and its example"
    fi
    # The suites that have CUDA paths; the rest of the suite is CPU work, which CI runs. The
    # metric tests need Java, which the image lacks; test_triton_compile needs no GPU.
    files="$KERNEL_SUITES tests/test_cuda_library.py tests/test_profiling.py
           tests/test_methods_on_device.py"
    args=($(pytest_args "$OUT/tests.xml"))
    # The dry run: the argument checks, and the profiling and on-device-baseline suites whole
    # (seconds on a CPU).
    [[ $DRY_RUN == 1 ]] && args+=(-k "$DRY_RUN_TESTS or test_profiling.py or test_methods_on_device.py")
    run_budgeted "$OUT/tests.log" "$PY" -m pytest $files "${args[@]}" || status=1
    "$PY" bench/gpu_tables.py tests "$OUT/tests.xml" --title "CUDA tests $TITLE_TAIL" \
        > "$OUT/tests-gpu.md" || status=1
    cat "$OUT/tests-gpu.md"
    ;;
bench)
    # Every bench/bench_*.py, #15's end-to-end benchmark included once merged. The dry run
    # times the CPU-only reward benchmark with one round, to exercise the JSON and the table.
    targets=${AVEX_BENCH_FILES:-bench}
    args=(--benchmark-only -q -p no:cacheprovider --benchmark-json="$OUT/bench.json"
          --benchmark-max-time="${AVEX_BENCH_MAX_TIME:-0.5}")
    # AVEX_BENCH_K: a pytest -k selection, e.g. "not compile" (torch.compile of the reference
    # had not compiled in 120 s on an H100)
    [[ -n ${AVEX_BENCH_K:-} ]] && args+=(-k "$AVEX_BENCH_K")
    if [[ $DRY_RUN == 1 ]]; then
        targets=${AVEX_BENCH_FILES:-bench/bench_reward.py}
        args+=(--benchmark-min-rounds=1 --benchmark-max-time=0.000001 --benchmark-warmup=off)
    fi
    run_budgeted "$OUT/bench.log" "$PY" -m pytest $targets "${args[@]}" || status=1
    if [[ -s $OUT/bench.json ]]; then
        "$PY" bench/summarize.py "$OUT/bench.json" --title "Kernel benchmarks $TITLE_TAIL" \
            --commit "$commit" \
            > "$OUT/bench-gpu.md" || status=1
        cat "$OUT/bench-gpu.md"
    else
        note "no benchmark JSON was written"; status=1
    fi
    ;;
train)
    # The embedded benchmark and captioner: carried in .avex-cache (docs/gpu.md), else built.
    export AVEX_CACHE=${AVEX_CACHE:-$ROOT/.avex-cache}
    run_dir=$SCRATCH/run
    rm -rf "$run_dir"
    if [[ $DRY_RUN == 1 ]]; then
        sizes=(--benchmark-preset tiny --captioner-preset tiny --batch-size 8
               --micro-batch-size 4 --epochs 0.5 --warmup-epochs 0.5 --max-eval-clips 8)
    else
        sizes=(--epochs "${AVEX_TRAIN_EPOCHS:-0.25}" --warmup-epochs 0.1 --max-eval-clips 100)
    fi
    # AVEX_TRAIN_EXCHANGES=1: the paper's exchange term too (build_exchanges in the CUDA loop)
    [[ ${AVEX_TRAIN_EXCHANGES:-0} == 1 ]] && sizes+=(--exchanges)
    run_budgeted "$OUT/train.log" "$PY" -m avex.train "${sizes[@]}" --eval-retentions 0.4 \
        --run-dir "$run_dir" --no-progress || status=1
    if [[ -s $run_dir/metrics.jsonl ]]; then
        "$PY" bench/gpu_tables.py train "$run_dir" \
            --title "Short training run on the embedded benchmark $TITLE_TAIL" \
            > "$OUT/train-gpu.md" || status=1
        cat "$OUT/train-gpu.md"
    else
        note "the run logged no step"; status=1
    fi
    ;;
profile|flops)
    # One backbone a call, split so that each call ends inside its limit: `profile` times the
    # real size (FLOPs by hand, equal to fvcore's count: tests/test_profiling.py) and starts no
    # timing round once its budget, less 60 s for the memory runs and the files, is spent;
    # `flops` counts with fvcore (CPU work: about 2 minutes for qwen2-7b on 2 busy cores).
    backbone=${AVEX_PROFILE_BACKBONE:-qwen2-7b}
    name=()
    if [[ $STAGE == profile ]]; then
        rounds_until=$(( $(seconds_left) - 60 ))
        sizes=(--runs "${AVEX_PROFILE_RUNS:-20}" --flops hand
               --max-seconds $(( rounds_until < 30 ? 30 : rounds_until )))
    else
        sizes=(--no-latency --flops "${AVEX_PROFILE_FLOPS:-fvcore}")
    fi
    if [[ $DRY_RUN == 1 && -z ${AVEX_PROFILE_BACKBONE:-} ]]; then
        backbone=$SCRATCH/tiny-qwen2  # a 2-layer Qwen2 config: the suite's logic, CPU-sized
        "$PY" -c "from transformers import Qwen2Config; Qwen2Config(vocab_size=256, \
hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, \
num_key_value_heads=2).save_pretrained('$backbone')" || exit 1
        sizes+=(--runs 2 --warmup 0 --visual-tokens 16 --audio-tokens 8 --decode-tokens 4)
        # fvcore where it is installed; the GPU image's stack without the wheels: by hand
        [[ $STAGE == flops ]] && sizes+=(--flops "${AVEX_PROFILE_FLOPS:-auto}")
    fi
    # profiling-<backbone>-r0.4-cuda.* from `profile`, profiling-<backbone>-r0.4-flops.* here
    [[ $STAGE == flops ]] && name=(--name "$(basename "$backbone")-r0.4-flops")
    # AVEX_PROFILE_ARGS: more options, e.g. "--methods full,avex --visual-tokens 4096
    # --audio-tokens 1024 --name qwen2-7b-long-r0.4-cuda" (a long video)
    read -r -a more <<< "${AVEX_PROFILE_ARGS:-}"
    run_budgeted "$OUT/$STAGE.log" "$PY" -m avex.profiling --backbone "$backbone" \
        --retention 0.4 --device "$DEVICE" "${sizes[@]}" "${name[@]}" "${more[@]}" \
        --out-dir "$OUT" --no-progress || status=1
    ;;
session)
    # Several stages in one call: a lent GPU gives 15 minutes in all, start-up included, so
    # one or two calls. Each stage runs in its own folder with its share of the budget (never
    # more than is left), then everything is packed into one archive, since at most 8 files
    # come back. AVEX_SESSION_STAGES: "STAGE:SECONDS ..." in order.
    plan=${AVEX_SESSION_STAGES:-"tests:110 bench:130 profile:90 train:150"}
    # a fresh folder of its own: nothing under an AVEX_SCRATCH the caller chose is removed
    mkdir -p "$SCRATCH" && work=$(mktemp -d "$SCRATCH/stages.XXXXXX") || exit 1
    {
        echo "# GPU session $TITLE_TAIL"; echo
        echo "| stage | exit | seconds | budget |"; echo "|---|---|---|---|"
    } > "$OUT/session.md"
    for item in $plan; do
        name=${item%%:*} want=${item##*:}
        if ! is_stage "$name"; then
            note "AVEX_SESSION_STAGES: unknown stage '$name' in '$plan'"; status=1; continue
        fi
        if ! [[ $want =~ ^[0-9]+$ ]]; then
            note "AVEX_SESSION_STAGES: '$item' needs STAGE:SECONDS"; status=1; continue
        fi
        left=$(( $(seconds_left) - 20 ))   # 20 s kept for the archive
        if (( left < 30 )); then
            echo "| $name | not run: the budget was spent | - | - |" >> "$OUT/session.md"
            status=1; continue
        fi
        budget=$(( want < left ? want : left ))
        t0=$(date +%s)
        OUT=$work/$name AVEX_STAGE_SECONDS=$budget AVEX_GPU_DRY_RUN=$DRY_RUN \
            AVEX_SCRATCH=$SCRATCH/$name bash bench/gpu.sh "$name" > "$work/$name.log" 2>&1
        rc=$?
        (( rc != 0 )) && status=1
        echo "| $name | $rc | $(( $(date +%s) - t0 )) | $budget |" >> "$OUT/session.md"
        tail -3 "$work/$name.log"
    done
    tar czf "$OUT/gpu-session.tgz" -C "$work" . || status=1
    cat "$OUT/session.md"
    ;;
esac

# --- what comes back --------------------------------------------------------------------------
files=$(find "$OUT" -type f | wc -l)
deep=$(find "$OUT" -mindepth 3 -type f | wc -l)
if (( files > 8 || deep > 0 )); then
    note "$OUT holds $files files ($deep more than 2 folders down): at most 8 come back"
    status=1
fi
note "finished in $(( $(date +%s) - started )) s with status $status; files in $OUT:"
ls -1 "$OUT"
exit $status
