"""Feature caches and the embedded audio-visual benchmark.

* :class:`FeatureCache` / :class:`CacheWriter`: read and write the cache format (safetensors shards
  plus a JSON-lines manifest; see the README's "Feature-cache format").
* :func:`ensure_benchmark` / :func:`build_benchmark`: the generated benchmark, written in that
  format (``python -m avex.data build``).
"""
from .cache import (SPLITS, CacheError, CacheMeta, CacheSplit, CacheWriter, Clip,  # noqa: F401
                    FeatureCache)
from .embedded import (PRESETS, BenchmarkConfig, build_benchmark, build_tokenizer,  # noqa: F401
                       default_benchmark_path, ensure_benchmark,
                       resolve_config)

__all__ = ["SPLITS", "CacheError", "CacheMeta", "CacheSplit", "CacheWriter", "Clip",
           "FeatureCache", "PRESETS", "BenchmarkConfig", "build_benchmark", "build_tokenizer",
           "default_benchmark_path", "ensure_benchmark", "resolve_config"]
