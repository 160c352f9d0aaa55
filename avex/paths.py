"""Where the toolkit keeps what it builds: one cache root and the folders under it.

``$AVEX_CACHE`` if set, else ``$XDG_CACHE_HOME/avex``, else ``~/.cache/avex``; under it
``benchmarks/<name>/`` (feature caches), ``captioners/<benchmark>-<preset>/`` (frozen captioners),
``attention/`` (cached full-token attention) and ``full_captions/`` (cached full-token captions,
y_full). A leaf module: it imports nothing of avex.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_cache_dir", "benchmarks_dir", "default_captioner_path", "attention_dir",
           "full_captions_dir", "CAPTIONER_FILE"]

#: a captioner directory's record of what it is (format, feature dim, training, reference)
CAPTIONER_FILE = "avex_captioner.json"


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
