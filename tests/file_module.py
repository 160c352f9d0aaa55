"""A Python file outside any package (a script under scripts/ or bench/, an example) loaded
as a module, so tests can call its functions."""
import importlib.util
from pathlib import Path


def load_file(path, name: str | None = None):
    """The module that ``path`` defines, named ``name`` (default: the file's stem)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
