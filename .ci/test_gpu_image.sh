#!/usr/bin/env bash
# The GPU image's Python stack on a CPU (`make test-gpu-image`; CI runs it too): Python 3.12,
# torch 2.11 (its CUDA build, which runs on a CPU), triton 3.6, transformers 5.17, and no fvcore,
# pycocoevalcap, flash-attn or Java. Builds that stack once in its own virtual environment
# ($GPU_VENV, default .venv-gpu-image, about 5 GB) and runs the whole suite there with `java`
# hidden from PATH, so the paths the image takes (metrics without Java, FLOPs by hand) are the
# ones tested, and what needs the missing tools skips, saying so. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GPU_VENV:-.venv-gpu-image}
STACK="torch==2.11.0 triton==3.6.0 transformers==5.17.0"
# the rest of avex's requirements and the test tools (the image has them); not fvcore or
# pycocoevalcap, which avex's requirements name but the image lacks
OTHERS="safetensors tqdm numpy pyyaml matplotlib pytest pytest-benchmark hypothesis"
ABSENT="fvcore pycocoevalcap flash_attn"

python312() {  # the interpreter to build the environment from: $GPU_IMAGE_PYTHON, or a 3.12
    local candidates=("${GPU_IMAGE_PYTHON:-}" python3.12
                      "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12)
    for py in "${candidates[@]}"; do
        [[ -n $py ]] && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' \
            2>/dev/null && { echo "$py"; return; }
    done
    echo "test-gpu-image: no Python 3.12 found (the GPU image's); set GPU_IMAGE_PYTHON, or" \
         "install one (e.g. pyenv install 3.12)" >&2
    return 1
}

PY=$VENV/bin/python
STAMP=$VENV/.avex-gpu-image-stack
if [[ ! -x $PY || "$(cat "$STAMP" 2>/dev/null)" != "$STACK $OTHERS" ]]; then
    base=$(python312)
    rm -rf "$VENV"
    "$base" -m venv "$VENV"
    .ci/pip_retry.sh "$PY" -q --upgrade pip
    # about 5 GB of wheels: a download cut off mid-file is retried (.ci/pip_retry.sh)
    .ci/pip_retry.sh "$PY" -q $STACK $OTHERS
    echo "$STACK $OTHERS" > "$STAMP"
fi
# avex itself, without its requirements (fvcore and pycocoevalcap would come with them)
"$PY" -m pip install -q --no-deps --no-build-isolation -e .
"$PY" - "$ABSENT" <<'EOF'
import importlib.util, sys
from importlib.metadata import requires, version
from packaging.requirements import Requirement
absent = sys.argv[1].split()
present = [m for m in absent if importlib.util.find_spec(m) is not None]
if present:
    sys.exit(f"test-gpu-image: {present} installed in this environment, the GPU image has none")
# avex's own requirements admit this stack (the ones the image lacks aside)
for req in map(Requirement, requires("avex-prune")):
    if req.name in absent or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    if not req.specifier.contains(version(req.name), prereleases=True):
        sys.exit(f"test-gpu-image: avex requires {req}, the stack has {version(req.name)}")
import torch, triton, transformers
print(f"GPU image's stack: Python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"triton {triton.__version__}, transformers {transformers.__version__}; no "
      f"{', '.join(sys.argv[1].split())}")
EOF

# PATH without java: every other program of each PATH folder, linked into one folder
nojava=$VENV/path-without-java
rm -rf "$nojava"
mkdir -p "$nojava"
IFS=: read -ra folders <<< "$PATH"
for folder in "${folders[@]}"; do
    [[ -d $folder ]] || continue
    for program in "$folder"/*; do
        name=${program##*/}
        [[ $name == java || -e $nojava/$name || -d $program || ! -x $program ]] && continue
        ln -s "$program" "$nojava/$name"
    done
done
export PATH="$PWD/$VENV/bin:$PWD/$nojava"
unset JAVA_HOME
if command -v java >/dev/null; then
    echo "test-gpu-image: java is still on PATH ($(command -v java))" >&2
    exit 1
fi
echo "java hidden: not on PATH for this run"
"$PY" -m pytest tests -p no:cacheprovider "$@"
