"""The feature cache: safetensors shards plus a JSON-lines manifest (docs/benchmark.md's
"Feature-cache format").

    format.py   the format's names, the clip and meta records, the checks both sides share
    writer.py   CacheWriter: clips in, a cache directory out
    reader.py   FeatureCache: a cache directory in, clips out (CacheSplit: a split as a dataset)
"""
from avex.data.cache.format import (CLIP_ID_PATTERN, FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE,
                                    META_FILE, SHARD_DIR, SPLITS, CacheError, CacheMeta, Clip,
                                    is_feature_cache, json_lines, peek_meta)
from avex.data.cache.reader import CacheSplit, FeatureCache
from avex.data.cache.writer import CacheWriter, check_replaceable, install_cache

__all__ = ["CLIP_ID_PATTERN", "FORMAT_NAME", "FORMAT_VERSION", "MANIFEST_FILE", "META_FILE",
           "SHARD_DIR", "SPLITS", "CacheError", "CacheMeta", "CacheSplit", "CacheWriter", "Clip",
           "FeatureCache", "check_replaceable", "install_cache", "is_feature_cache", "json_lines",
           "peek_meta"]
