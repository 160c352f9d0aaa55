#!/usr/bin/env bash
# The wheel, installed without -e, works: build it from a copy of the tracked tree, check it
# ships every source module, install it into a fresh virtual environment and, from outside the
# repository, import every module, run `python -m avex.train --help` and the README's pipeline
# snippet. The fresh environment borrows the test environment's dependencies (torch & co.)
# through a .pth file instead of installing them again (minutes); the project itself comes
# only from the wheel, which is checked.
# Usage: .ci/wheel_check.sh [python of the test environment, default .venv/bin/python]
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=$(realpath -s "${1:-.venv/bin/python}")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# A copy of the files git tracks or would track: setuptools' build/ directory keeps files of
# earlier builds (and build/ is the CUDA library's CMake folder), so never build in the tree.
mkdir "$TMP/src"
git ls-files -z --cached --others --exclude-standard | \
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done | \
    tar --null -T - -cf - | tar -xf - -C "$TMP/src"
# The test environment's setuptools if it has one (Python 3.12's venvs don't), else pip's own.
BUILD_ISOLATION=()
"$PY" -c 'import setuptools' 2>/dev/null && BUILD_ISOLATION=(--no-build-isolation)
"$PY" -m pip wheel -q --no-deps "${BUILD_ISOLATION[@]}" "$TMP/src" -w "$TMP/dist"
WHEEL=$(ls "$TMP"/dist/avex_prune-*.whl)

# Every .py file of the mapped folders must be in the wheel, under its import name.
"$PY" - "$WHEEL" "$TMP/src" <<'EOF'
import sys, zipfile
from pathlib import Path

wheel, src = sys.argv[1], Path(sys.argv[2])
roots = {"avex": "avex", "kernels": "avex/kernels", "profiling": "avex/profiling"}
expected = {f"{target}/{p.relative_to(src / folder).as_posix()}"
            for folder, target in roots.items() for p in (src / folder).rglob("*.py")}
shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
missing = sorted(expected - shipped)
if missing:
    sys.exit(f"wheel check FAILED: {Path(wheel).name} lacks {len(missing)} source module(s) "
             "(a folder without __init__.py, or a package setup.py doesn't find):\n  "
             + "\n  ".join(missing))
print(f"wheel check: {Path(wheel).name} ships all {len(expected)} source modules")
EOF

# Fresh environment, no pip of its own: the test environment's pip installs into it.
BASE_PY=$("$PY" -c 'import sys; print(sys._base_executable)')
"$BASE_PY" -m venv --without-pip "$TMP/venv"
VPY="$TMP/venv/bin/python"
"$PY" -m pip --python "$VPY" install -q --no-deps --no-index "$WHEEL"
# Dependencies: the test environment's site directories, after the venv's own (a plain path
# line in a .pth file: the editable install's own .pth hook there is not run).
"$PY" -c 'import site, sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
    > "$("$VPY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/test_env_deps.pth"

mkdir "$TMP/outside" && cd "$TMP/outside"
"$VPY" - "$REPO" <<'EOF'
import importlib, pkgutil, sys, sysconfig
from pathlib import Path

import avex

site = Path(sysconfig.get_path("purelib")).resolve()
if Path(avex.__file__).resolve().parent != site / "avex":
    sys.exit(f"wheel check FAILED: avex imported from {avex.__file__}, not from the wheel in {site}")
names = [m.name for m in pkgutil.walk_packages(avex.__path__, "avex.")
         if not m.name.endswith("__main__")]
# modules of an optional extra, importable where it is installed: module -> what it needs
OPTIONAL = {"avex.integrations.vllm.qwen2_5_vl": "vllm"}
skipped = []
for name in names:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:
        if OPTIONAL.get(name) != (err.name or "").split(".")[0]:
            raise
        skipped.append(f"{name} (needs {err.name})")
print(f"wheel check: imported {len(names) - len(skipped)} modules from {site}"
      + (f"; not {', '.join(skipped)}" if skipped else ""))
EOF
"$VPY" -m avex.train --help > "$TMP/train_help.txt"
grep -q -- "--epochs" "$TMP/train_help.txt" || {
    echo "wheel check FAILED: python -m avex.train --help printed no --epochs:"; cat "$TMP/train_help.txt"; exit 1; }
echo "wheel check: python -m avex.train --help runs"
# The README's pipeline snippet, found the way tests/test_readme_pipeline.py finds it.
"$VPY" - "$REPO" <<'EOF'
import importlib.util, sys
from pathlib import Path

repo = Path(sys.argv[1])
spec = importlib.util.spec_from_file_location("readme_test", repo / "tests/test_readme_pipeline.py")
readme_test = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_test)
snippet = readme_test.readme_pipeline_snippet((repo / "README.md").read_text(encoding="utf-8"))
if snippet is None:
    sys.exit("wheel check FAILED: README.md has no ```python block with prune_inputs under a "
             "heading that mentions 'pipeline'")
exec(compile(snippet, "README.md", "exec"), {})
print("wheel check: the README's pipeline snippet runs")
EOF
