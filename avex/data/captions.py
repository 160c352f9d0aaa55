"""The clips an export makes (``python -m avex.data export``): the rows of a captions file
(JSON lines, one clip a line) or every media file of a folder, read and checked before anything
is written; and :class:`ExportError`, what export refuses, naming the file, line or setting."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from avex.data.cache import CLIP_ID_PATTERN, SPLITS, json_lines
from avex.data.media import KINDS, MediaError, media_kind

__all__ = ["CaptionRow", "ExportError", "media_rows", "read_captions"]


class ExportError(ValueError):
    """Input export refuses, before it writes anything: the message names the file, row or
    setting at fault."""


@dataclass
class CaptionRow:
    clip_id: str
    file: Path
    split: str
    captions: list = field(default_factory=list)    # empty: a label-free clip
    visual_captions: list = field(default_factory=list)
    audio_captions: list = field(default_factory=list)
    line: int = 0
    name: str = ""        # the file's path inside the media folder, as the manifest records it

    @property
    def where(self) -> str:
        return f"captions line {self.line}" if self.line else f"media file {self.file.name}"


def _clip_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", text)[-200:]


def _caption_list(path, line, name, value):
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(c, str) and c.strip() for c in value):
        raise ExportError(f"{path} line {line}: {name!r} must be a list of non-empty strings "
                          f"(or left out), got {value!r}")
    return [" ".join(c.split()) for c in value]


def read_captions(path, media_dir) -> list[CaptionRow]:
    """The rows of a captions JSONL file, checked: JSON objects with ``file`` and ``split``,
    ``captions`` optional; files that exist under ``media_dir`` and have a known media suffix;
    clip ids unique. Every missing file is listed at once."""
    path, media_dir = Path(path), Path(media_dir)
    if not path.is_file():
        raise ExportError(f"captions: no file at {str(path)!r}")
    if not media_dir.is_dir():
        raise ExportError(f"media: no folder at {str(media_dir)!r}")
    rows, seen, missing = [], {}, []
    for line, raw in json_lines(path, ExportError, unit="line"):
        unknown = set(raw) - {"file", "captions", "split", "id", "visual_captions",
                              "audio_captions"}
        if unknown:
            raise ExportError(f"{path} line {line}: unknown field(s) {sorted(unknown)}")
        file = raw.get("file")
        if not isinstance(file, str) or not file.strip() or Path(file).is_absolute() \
                or ".." in Path(file).parts:
            raise ExportError(f"{path} line {line}: 'file' must be a path inside the media "
                              f"folder, got {file!r}")
        if raw.get("split") not in SPLITS:
            raise ExportError(f"{path} line {line}: 'split' must be one of {list(SPLITS)}, "
                              f"got {raw.get('split')!r}")
        try:
            media_kind(file)
        except MediaError as err:
            raise ExportError(f"{path} line {line}: {err}") from None
        clip_id = raw.get("id", _clip_id(file))
        if not isinstance(clip_id, str) or not CLIP_ID_PATTERN.match(clip_id):
            raise ExportError(f"{path} line {line}: 'id' must match [A-Za-z0-9_.-]{{1,200}}, "
                              f"got {clip_id!r}")
        if clip_id in seen:
            raise ExportError(f"{path} line {line}: clip id {clip_id!r} repeats line "
                              f"{seen[clip_id]} (give distinct 'id's)")
        seen[clip_id] = line
        if not (media_dir / file).is_file():
            missing.append(f"line {line}: {file}")
        captions = _caption_list(path, line, "captions", raw.get("captions"))
        if "captions" in raw and not captions:
            raise ExportError(f"{path} line {line}: 'captions' is an empty list; leave the "
                              "field out for a clip without references")
        rows.append(CaptionRow(clip_id, media_dir / file, raw["split"], captions,
                               _caption_list(path, line, "visual_captions",
                                             raw.get("visual_captions")),
                               _caption_list(path, line, "audio_captions",
                                             raw.get("audio_captions")), line, file))
    if missing:
        shown = "; ".join(missing[:10]) + (f"; and {len(missing) - 10} more"
                                           if len(missing) > 10 else "")
        raise ExportError(f"{path} names {len(missing)} file(s) missing from {media_dir}: "
                          f"{shown}")
    return _checked_rows(rows, str(path))


def media_rows(media_dir, split: str = "train") -> list[CaptionRow]:
    """Every media file under ``media_dir`` (a known suffix, hidden files and folders left
    out), in path order, as clips of ``split`` without references: a label-free export."""
    media_dir = Path(media_dir)
    if not media_dir.is_dir():
        raise ExportError(f"media: no folder at {str(media_dir)!r}")
    if split not in SPLITS:
        raise ExportError(f"split must be one of {list(SPLITS)}, got {split!r}")
    suffixes = {s for group in KINDS.values() for s in group}
    files = sorted(p for p in media_dir.rglob("*") if p.is_file()
                   and p.suffix.lower() in suffixes
                   and not any(part.startswith(".") for part in p.relative_to(media_dir).parts))
    rows, seen = [], {}
    for file in files:
        relative = file.relative_to(media_dir).as_posix()
        clip_id = _clip_id(relative)
        if clip_id in seen:
            raise ExportError(f"media: {relative} and {seen[clip_id]} make the same clip id "
                              f"{clip_id!r}; rename one, or give ids in a captions file")
        seen[clip_id] = relative
        rows.append(CaptionRow(clip_id, file, split, name=relative))
    return _checked_rows(rows, f"media folder {media_dir}")


def _checked_rows(rows: list[CaptionRow], where: str) -> list[CaptionRow]:
    if not rows:
        raise ExportError(f"{where}: holds no clips")
    if not any(r.split == "train" for r in rows):
        raise ExportError(f"{where}: no row has split 'train'; python -m avex.train needs one")
    return rows
