#!/usr/bin/env bash
# Regenerates the measured reports under results/ (and the run directories they cite) on this
# machine, from a fresh cache, as a user's fresh clone would: the default training run, the
# evaluation sweep, the motivation figure, the benchmark's gates, the ablation and the profiling
# tables. docs/results.md quotes these files.
#
#   bash results/regenerate.sh [STAGE ...]      stages: train sweep motivation gates ablation
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
[ ${#stages[@]} -gt 0 ] || stages=(train sweep motivation gates ablation profiling)

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
        sweep)
            run_stage sweep "$PY" -m avex.evaluate sweep --avex-run "$RUNS/default" \
                --out "$RUNS/sweep" --no-progress
            for ext in md json png; do cp "$RUNS/sweep/sweep.$ext" "results/evaluation-sweep.$ext"; done ;;
        motivation)
            run_stage motivation "$PY" -m avex.evaluate motivation --out "$RUNS/motivation" --no-progress
            for ext in md json png; do
                cp "$RUNS/motivation/motivation.$ext" "results/evaluation-motivation.$ext"; done ;;
        gates)
            run_stage gates "$PY" -m avex.evaluate gates --out results/embedded-benchmark-gates.md \
                --no-progress ;;
        ablation)
            run_stage ablation "$PY" -m avex.evaluate ablation --run "full=$RUNS/default" \
                --out "$RUNS/ablation" --no-progress
            for ext in md json; do cp "$RUNS/ablation/ablation.$ext" "results/evaluation-ablation.$ext"; done ;;
        profiling)
            for backbone in qwen2-7b llama3-8b; do
                run_stage "profiling-$backbone" "$PY" -m avex.profiling --backbone "$backbone" \
                    --retention 0.4 --out-dir results --no-progress
            done ;;
        *) echo "unknown stage: $stage (stages: train sweep motivation gates ablation profiling)" >&2
           exit 2 ;;
    esac
done
