#!/usr/bin/env bash
# Download (here, where PyPI is reachable) the wheels that the GPU image lacks, into .whl/,
# for the device tool to carry. The image has torch, triton, transformers, pytest-benchmark,
# hypothesis, matplotlib and pyyaml already.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info; grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
# pycocoevalcap (104 MB) is over the device tool's 64 MiB carry limit: the GPU run skips the
# metric tests, which need no GPU. fvcore is an sdist: build pure-Python wheels here.
python3 -m pip wheel -q --no-deps -w .whl fvcore iopath yacs termcolor
ls -la .whl
