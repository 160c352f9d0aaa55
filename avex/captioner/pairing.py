"""Which embedded benchmark a captioner belongs to: an embedded captioner records the benchmark
it was trained on, and a cache of another world (other generator settings) is refused beside it.
Training, evaluation and ``python -m avex.captioner caption`` check here."""
from __future__ import annotations

import json
from pathlib import Path

from avex.data.embedded import SPLIT_SIZE_SETTINGS
from avex.paths import CAPTIONER_FILE


def check_captioner_benchmark(source, captioner_path, data_root, name: str = "captioner") -> None:
    """An embedded captioner records the embedded benchmark it was trained on (its
    avex_captioner.json); given a feature cache that the same generator made with other
    settings (``source``: the cache's meta.json source; a 200- and a 1000-clip build of one
    seed agree), it would caption another world's features with its own words and score
    nothing that means anything, so it is refused, naming the settings that differ. A
    captioner or cache without that record (your own model, an exported cache) passes."""
    record = Path(captioner_path) / CAPTIONER_FILE
    if not isinstance(source, dict) or source.get("kind") != "embedded" or not record.is_file():
        return
    try:
        info = json.loads(record.read_text(encoding="utf-8"))
    except (ValueError, OSError):  # FrozenCaptioner.load names a corrupt record
        return
    trained = info.get("benchmark") if isinstance(info, dict) else None
    trained_source = trained.get("source") if isinstance(trained, dict) else None
    if not isinstance(trained_source, dict) or trained_source.get("kind") != "embedded":
        return
    mine, theirs = _world(trained_source), _world(source)
    differ = [f"{key} {mine.get(key)!r} against {theirs.get(key)!r}"
              for key in sorted(set(mine) | set(theirs)) if mine.get(key) != theirs.get(key)]
    if differ:
        seed = theirs.get("seed")
        # a shipped reference records the benchmark's name, a captioner trained here its path
        label = trained.get("name") or Path(str(trained.get("path") or "")).name
        raise ValueError(
            f"{name}: {captioner_path} was trained on the embedded benchmark "
            f"{label or '(not named)'!r}, and the feature cache {data_root} was generated with "
            f"other settings ({'; '.join(differ)}: the captioner's, then the cache's). Its "
            "captions would judge another benchmark's clips with its own words; pass the "
            "captioner of this benchmark"
            + (f" (`python -m avex.captioner install --seed {seed}` for a shipped one)"
               if isinstance(seed, int) else ""))


def _world(source: dict) -> dict:
    """An embedded benchmark's generator settings, less its split sizes: what its clips are."""
    config = source.get("config") if isinstance(source.get("config"), dict) else {}
    return {**{k: v for k, v in config.items() if k not in SPLIT_SIZE_SETTINGS},
            "generator_version": source.get("generator_version"),
            "layout": source.get("layout")}
