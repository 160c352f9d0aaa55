"""Scoring a results file's runs again, served another way (``scripts/score_merging.py``,
``scripts/score_warmups.py``): the file's judge, checked by sha256, its split and clips, and
full tokens captioned again and compared with the file's clip for clip, which checks that the
decoding is the file's."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from avex.cache_and_captioner import load_cache_and_captioner
from avex.evaluate.ablation import scored
from avex.evaluate.common import split_clips
from avex.judge_identity import judge_record
from avex.paths import default_cache_dir
from avex.scoring import caption_split, keep_all

#: python -m avex.evaluate ablation's decoding, which the files were scored with (checked)
NUM_BEAMS, MAX_NEW_TOKENS = 1, 24


@dataclass
class Rescoring:
    """What a re-scoring captions with: the file's ``judge`` record, the ``captioner``, the
    file's ``clips`` and the ``decode`` settings of :func:`avex.scoring.caption_split`;
    ``started``: when the full-token check began (the scoring's wall time counts from it)."""
    judge: dict
    captioner: object
    clips: list
    decode: dict
    started: float = field(default_factory=time.perf_counter)


def rescoring(result: dict, source: str, cache_dir: Path | None, batch_size: int) -> Rescoring:
    """The judge, captioner and clips of ``result`` (an ablation.json's contents, read from
    ``source``, which errors name), under ``cache_dir`` (default: the avex cache); refused
    where the judge's sha256 or full tokens' per-clip scores differ from the file's."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    data = root / result["judge"]["benchmark"]["path"]
    captioner_path = root / result["judge"]["captioner"]["path"]
    judge = judge_record(data, captioner_path, cache_dir=root)
    for part in ("benchmark", "captioner"):
        if judge[part]["sha256"] != result["judge"][part]["sha256"]:
            raise ValueError(f"{part} at {judge[part]['path']} has sha256 "
                             f"{judge[part]['sha256'][:16]}, {source} scored with "
                             f"{result['judge'][part]['sha256'][:16]}")
    cache, captioner = load_cache_and_captioner(data, captioner_path)
    clips = split_clips(cache, result["split"], result["clips"])
    out = Rescoring(judge, captioner, clips, dict(batch_size=batch_size, num_beams=NUM_BEAMS,
                                                 max_new_tokens=MAX_NEW_TOKENS))
    full_here = scored(caption_split(captioner, clips, keep_all, 1.0, **out.decode), clips)
    if full_here["per_clip"] != result["full"]["per_clip"]:
        raise ValueError(f"full tokens scored here differ from {source}'s, clip for clip: "
                         f"another decoding than {NUM_BEAMS} beam(s) and {MAX_NEW_TOKENS} "
                         "tokens, or other clips")
    return out
