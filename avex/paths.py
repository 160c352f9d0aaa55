"""Where the toolkit keeps what it builds: one cache root and the folders under it.

``$AVEX_CACHE`` if set, else ``$XDG_CACHE_HOME/avex``, else ``~/.cache/avex``; under it
``benchmarks/<name>/`` (feature caches), ``captioners/<benchmark>-<preset>/`` (frozen captioners),
``attention/`` (cached full-token attention), ``full_captions/`` (cached full-token captions,
y_full) and ``warmup_teachers/`` (cached warmup-teacher scores that read y_full). A leaf
module: it imports nothing of avex.

Results files record paths relative to the cache root (the benchmark, the captioner) or to
their own folder (the runs they scored), never a machine's absolute path
(:func:`relative_path`, :func:`portable_command`), so that a results file reads the same on
every machine.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

__all__ = ["default_cache_dir", "benchmarks_dir", "default_captioner_path", "attention_dir",
           "full_captions_dir", "warmup_teachers_dir", "CAPTIONER_FILE", "CACHE_VARIABLE",
           "relative_path", "cache_relative", "portable_command"]

#: a captioner directory's record of what it is (format, feature dim, training, reference)
CAPTIONER_FILE = "avex_captioner.json"


#: the environment variable that names the cache root (a portable command line writes it)
CACHE_VARIABLE = "AVEX_CACHE"


def default_cache_dir() -> Path:
    """``$AVEX_CACHE`` if set, else ``$XDG_CACHE_HOME/avex``, else ``~/.cache/avex``."""
    if os.environ.get("AVEX_CACHE"):
        return Path(os.environ["AVEX_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "avex"


def _root(cache_dir) -> Path:
    return Path(cache_dir) if cache_dir is not None else default_cache_dir()


def benchmarks_dir(cache_dir=None) -> Path:
    return _root(cache_dir) / "benchmarks"


def default_captioner_path(benchmark: str = "embedded-default-seed0", preset: str = "default",
                           cache_dir=None) -> Path:
    """The embedded captioner trained with ``preset`` on the benchmark named ``benchmark``."""
    return _root(cache_dir) / "captioners" / f"{benchmark}-{preset}"


def attention_dir(cache_dir=None) -> Path:
    return _root(cache_dir) / "attention"


def full_captions_dir(cache_dir=None) -> Path:
    return _root(cache_dir) / "full_captions"


def warmup_teachers_dir(cache_dir=None) -> Path:
    return _root(cache_dir) / "warmup_teachers"


def relative_path(path, root) -> str:
    """``path`` relative to the folder ``root``, in POSIX form ("." for the root itself, ".."
    steps where ``path`` lies outside it): what a results file records instead of a machine's
    absolute path. Relative inputs are taken from the working directory."""
    return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(root))).as_posix()


def cache_relative(path, cache_dir=None) -> str:
    """``path`` relative to the cache root (``cache_dir``, else :func:`default_cache_dir`)."""
    return relative_path(path, _root(cache_dir))


def portable_command(argv, cache_dir=None) -> str:
    """A command line's arguments as a results file records them, quoted as a shell reads
    them: a path under the cache root as ``$AVEX_CACHE/...``, any other absolute path relative
    to the working directory, the rest as typed (``--flag=PATH`` and ``NAME=PATH`` values
    too)."""
    root = os.path.abspath(_root(cache_dir)).rstrip("/") or "/"

    def portable(value: str) -> str:
        if value == root or value.startswith(root + "/"):
            return f"${CACHE_VARIABLE}" + shlex.quote(value[len(root):]) if value != root \
                else f"${CACHE_VARIABLE}"
        return shlex.quote(os.path.relpath(value))

    out = []
    for arg in argv:
        head, sep, tail = arg.rpartition("=")
        if os.path.isabs(arg):
            out.append(portable(arg))
        elif sep and os.path.isabs(tail):
            out.append(shlex.quote(head + sep) + portable(tail))
        else:
            out.append(shlex.quote(arg))
    return " ".join(out)
