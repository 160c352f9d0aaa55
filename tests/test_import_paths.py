"""Every public import path that README.md, docs/ and examples/ name resolves: each
``from avex... import name`` and each dotted ``avex.x.y`` they write is imported and looked up."""
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
           *sorted((ROOT / "examples").glob("*.py"))]
FROM_IMPORT = re.compile(r"^\s*from (avex[\w.]*) import \(?([\w, \n]+?)\)?\s*(?:#.*)?$", re.M)
DOTTED = re.compile(r"(?<![\w/.])(avex(?:\.\w+)+)")


def _paths() -> dict:
    """dotted path -> the first file that names it."""
    found = {}
    for source in SOURCES:
        text = source.read_text(encoding="utf-8")
        for match in FROM_IMPORT.finditer(text):
            for name in re.split(r"[,\s]+", match.group(2).strip()):
                if name and name != "as":
                    found.setdefault(f"{match.group(1)}.{name}", source.name)
        for match in DOTTED.finditer(text):
            found.setdefault(match.group(1), source.name)
    return found


PATHS = _paths()
#: the optional extras a documented path may need (pyproject's extras); a missing required
#: dependency fails the test instead
OPTIONAL = {"vllm", "torchvision", "av", "soundfile", "PIL", "flash_attn", "fvcore"}


def _resolve(path: str):
    """The object at ``path``: its longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            if err.name and err.name.split(".")[0] in OPTIONAL:
                pytest.skip(f"{path} needs {err.name} (an optional extra), not installed here")
            if err.name and not err.name.startswith("avex"):   # a required dependency
                raise
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(path)


def test_the_documents_name_import_paths():
    assert len(PATHS) > 50 and "avex.train.train" in PATHS and "avex.load_policy" in PATHS


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_named_import_path_resolves(path):
    try:
        _resolve(path)
    except (ImportError, AttributeError) as err:
        pytest.fail(f"{PATHS[path]} names {path}, which does not resolve: {err}")


def test_the_checkout_root_shadows_no_pypi_package():
    """Run from the checkout's root, ``python -m``/``-c`` put the root first on sys.path; after
    ``import avex`` its kernels/ and profiling/ folders are not what ``import kernels`` and
    ``import profiling`` find (transformers 5.25 imports PyPI's kernels), and transformers'
    hub-kernels module imports."""
    import subprocess
    import sys

    code = ("import sys, importlib.util, avex\n"
            "assert '' not in sys.path, sys.path\n"
            "for name in ('kernels', 'profiling'):\n"
            "    spec = importlib.util.find_spec(name)\n"
            "    print(name, spec.origin if spec else None)\n"
            "import avex.kernels, avex.profiling\n"
            "import transformers.integrations.hub_kernels\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for line in done.stdout.splitlines():
        name, origin = line.split(" ", 1)
        assert origin == "None" or not Path(origin).resolve().is_relative_to(ROOT / name), line
