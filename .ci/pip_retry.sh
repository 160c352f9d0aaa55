#!/usr/bin/env bash
# `pip install` that survives a registry download cut off mid-file: PYTHON -m pip install ARGS,
# up to 4 attempts, 30/60/90 s apart. pip's own resumes are not enough: in one CI run torch
# 2.11's 530 MB wheel stopped at the same byte through all six of them, and the run failed.
# A new attempt downloads that file from its start; finished files come from pip's cache.
# Usage: .ci/pip_retry.sh PYTHON ARGS...
set -uo pipefail
if (( $# < 2 )); then
    echo "usage: $0 PYTHON PIP-INSTALL-ARGS..." >&2
    exit 2
fi
py=$1
shift
attempts=4
delay=${PIP_RETRY_DELAY_S:-30}  # seconds, times the attempt number
for ((attempt = 1; attempt <= attempts; attempt++)); do
    "$py" -m pip install "$@" && exit 0
    status=$?
    if (( attempt < attempts )); then
        echo "pip install failed (exit $status, attempt $attempt of $attempts):" \
             "retrying in $((delay * attempt)) s" >&2
        sleep $((delay * attempt))
    fi
done
echo "pip install failed $attempts times: pip install $*" >&2
exit "$status"
