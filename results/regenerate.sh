#!/usr/bin/env bash
# Regenerates the measured reports under results/ (and the run directories they cite) on this
# machine, from a fresh cache, as a user's fresh clone would: the default training run, the
# evaluation sweep, the motivation figure, the benchmark's gates, the ablation and the profiling
# tables. docs/results.md quotes these files.
#
#   bash results/regenerate.sh [STAGE ...]      stages: train sweep second-benchmark motivation
#                                               gates ablation
#                                               profiling (default: all, in that order)
#
# RUNS (default runs/regen) holds the run directories; AVEX_CACHE (default RUNS/cache) the
# benchmark and captioner, built on first use. Each stage logs to RUNS/<stage>.log with its wall
# time and the load average, and copies its reports into results/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs/regen}
export AVEX_CACHE=${AVEX_CACHE:-$RUNS/cache}
mkdir -p "$RUNS" results
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(train sweep second-benchmark motivation gates ablation profiling)

run_stage() {  # name, command...
    local name=$1; shift
    local log="$RUNS/$name.log"
    echo "== $name: $* (commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ))" | tee "$log"
    local start; start=$(date +%s)
    "$@" >>"$log" 2>&1
    echo "== $name: $(( $(date +%s) - start )) s wall; load average $(cut -d' ' -f1-3 /proc/loadavg)" \
        | tee -a "$log"
}

for stage in "${stages[@]}"; do
    case $stage in
        train)      # the default recipe, as `make train` runs it (fresh cache: builds data and captioner)
            run_stage train "$PY" -m avex.train --run-dir "$RUNS/default" --no-progress
            cp "$RUNS/default/results.md" results/training-default.md ;;
        sweep)      # 3 training seeds of AVEX-Prune and CaCoVID-AV, every method, test + transfer
            run_stage sweep "$PY" -m avex.evaluate sweep --seeds 0,1,2 \
                --out "$RUNS/sweep" --no-progress
            for ext in md json png; do cp "$RUNS/sweep/sweep.$ext" "results/evaluation-sweep.$ext"; done ;;
        second-benchmark)   # the sweep on the embedded benchmark of seed 1, with its own captioner
            run_stage build-seed1 "$PY" -m avex.data build --seed 1 --no-progress
            run_stage captioner-seed1 "$PY" -m avex.captioner train --seed 1 --no-progress
            cache=${AVEX_CACHE:-$HOME/.cache/avex}
            run_stage sweep-seed1 "$PY" -m avex.evaluate sweep --seeds 0,1,2 \
                --data "$cache/benchmarks/embedded-default-seed1" \
                --captioner "$cache/captioners/embedded-default-seed1-default" \
                --out "$RUNS/sweep-seed1" --no-progress
            for ext in md json png; do
                cp "$RUNS/sweep-seed1/sweep.$ext" "results/evaluation-sweep-benchmark-seed1.$ext"; done ;;
        motivation)
            run_stage motivation "$PY" -m avex.evaluate motivation --out "$RUNS/motivation" --no-progress
            for ext in md json png; do
                cp "$RUNS/motivation/motivation.$ext" "results/evaluation-motivation.$ext"; done ;;
        gates)
            run_stage gates "$PY" -m avex.evaluate gates --out results/embedded-benchmark-gates.md \
                --no-progress ;;
        ablation)
            run_stage ablation "$PY" -m avex.evaluate ablation --seeds 0,1,2 \
                --out "$RUNS/ablation" --no-progress
            for ext in md json; do cp "$RUNS/ablation/ablation.$ext" "results/evaluation-ablation.$ext"; done ;;
        profiling)
            for backbone in qwen2-7b llama3-8b; do
                run_stage "profiling-$backbone" "$PY" -m avex.profiling --backbone "$backbone" \
                    --retention 0.4 --out-dir results --no-progress
            done ;;
        *) echo "unknown stage: $stage (stages: train sweep second-benchmark motivation gates ablation profiling)" >&2
           exit 2 ;;
    esac
done
