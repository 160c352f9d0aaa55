#!/usr/bin/env bash
# Prepare here (where PyPI and the shared cache are) what bench/gpu.sh needs on a bare GPU image,
# in two git-ignored folders for the device tool to carry:
#   .whl/         wheels of packages the image lacks (it has torch, triton, transformers,
#                 pytest-xdist, pytest-benchmark, hypothesis, matplotlib and pyyaml already);
#   .avex-cache/  the embedded benchmark, its captioner and their cached attention (~51 MB), for
#                 the train stage (without it the stage builds them there first).
set -euo pipefail
cd "$(dirname "$0")/.."
# pycocoevalcap (104 MB) is over the device tool's 64 MiB carry limit: the metrics degrade
# without it (avex.metrics.unavailable_metrics). fvcore is an sdist: build pure-Python wheels.
python3 -m pip wheel -q --no-deps -w .whl fvcore iopath yacs termcolor
ls -la .whl
cache=${AVEX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/avex}
mkdir -p .avex-cache
for part in benchmarks/embedded-default-seed0 captioners/embedded-default-seed0-default attention; do
    if [[ -e $cache/$part ]]; then
        mkdir -p ".avex-cache/$(dirname "$part")"
        cp -r "$cache/$part" ".avex-cache/$(dirname "$part")/"
    fi
done
du -sh .whl .avex-cache
