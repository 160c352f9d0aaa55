"""The clips an export makes (``python -m avex.data export``): the rows of a captions file
(JSON lines, one clip a line) or every media file of a folder, read and checked, headers
included, before anything is written (and before the CLI loads the model); and
:class:`ExportError`, what export refuses, naming the file, line or setting."""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from avex.adapters._export import unusable_header, unusable_kind
from avex.data.cache import CLIP_ID_PATTERN, SPLITS
from avex.data.media import KINDS, MediaError, media_kind, probe

__all__ = ["CaptionRow", "ExportError", "media_rows", "read_captions", "read_rows",
           "check_headers", "note_cut_audio", "note_unmeasured", "LABEL_FREE_SPLIT"]

#: the split of every clip of a label-free export (no captions file): python -m avex.train
#: needs a train split, and python -m avex.evaluate scores only clips with references, so a
#: cache of val or test clips without references could be used by neither
LABEL_FREE_SPLIT = "train"

#: suffixes of files a media folder may hold beside its media (notes, captions, subtitles,
#: metadata): a label-free export passes over them without a word. Any other file it doesn't
#: read is named in its notice.
NOT_MEDIA_SUFFIXES = frozenset(
    ".txt .md .rst .json .jsonl .csv .tsv .yaml .yml .toml .ini .cfg .xml .html .htm .srt .vtt "
    ".ass .ssa .sub .log .pdf .py .sh .sha256 .md5".split())


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
    header: dict | None = None   # the file's header (avex.data.media.probe), once read

    @property
    def where(self) -> str:
        return f"captions line {self.line}" if self.line else f"media file {self.file.name}"


def _clip_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", text)[-200:]


def _caption_list(path, line, name, value):
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(c, str) and c.strip() for c in value):
        raise ExportError(f"captions: {path} line {line}: {name!r} must be a list of non-empty "
                          f"strings (or left out), got {value!r}")
    return [" ".join(c.split()) for c in value]


def _caption_lines(path: Path):
    """(line number, object) of each non-blank line of the captions file: UTF-8 (a leading
    byte order mark is allowed), one JSON object a line; anything else is refused naming the
    line."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise ExportError(f"captions: {path} line {number} is not UTF-8 text (byte "
                                  f"0x{raw[err.start]:02x} at column {err.start + 1}); save "
                                  "the file as UTF-8") from None
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as err:
                raise ExportError(f"captions: {path} line {number}: not valid JSON ({err})") \
                    from None
            if not isinstance(value, dict):
                raise ExportError(f"captions: {path} line {number}: must be a JSON object, got "
                                  f"{type(value).__name__}")
            yield number, value


def _checked_line(path: Path, line: int, raw: dict) -> str:
    """The line's ``file``, after its fields, path, split and media type are checked."""
    unknown = set(raw) - {"file", "captions", "split", "id", "visual_captions",
                          "audio_captions"}
    if unknown:
        raise ExportError(f"captions: {path} line {line}: unknown field(s) {sorted(unknown)}")
    file = raw.get("file")
    if not isinstance(file, str) or not file.strip() or Path(file).is_absolute() \
            or ".." in Path(file).parts:
        raise ExportError(f"captions: {path} line {line}: 'file' must be a path inside the "
                          f"media folder, got {file!r}")
    if raw.get("split") not in SPLITS:
        raise ExportError(f"captions: {path} line {line}: 'split' must be one of "
                          f"{list(SPLITS)}, got {raw.get('split')!r}")
    try:
        media_kind(file)
    except MediaError as err:
        raise ExportError(f"captions: {path} line {line}: {err}") from None
    if "captions" in raw and raw["captions"] is None:
        raise ExportError(f"captions: {path} line {line}: 'captions' is null; leave the field "
                          "out for a clip without references")
    if raw.get("captions") == []:
        raise ExportError(f"captions: {path} line {line}: 'captions' is an empty list; leave "
                          "the field out for a clip without references")
    return file


def read_captions(path, media_dir) -> list[CaptionRow]:
    """The rows of a captions JSONL file, checked: JSON objects with ``file`` and ``split``,
    ``captions`` optional; files that exist under ``media_dir`` and have a known media suffix;
    clip ids unique; no media file in two splits. Every missing file is listed at once."""
    path, media_dir = Path(path), Path(media_dir)
    if not path.is_file():
        raise ExportError(f"captions: no file at {str(path)!r}")
    if not media_dir.is_dir():
        raise ExportError(f"media: no folder at {str(media_dir)!r}")
    rows, seen, missing = [], {}, []
    for line, raw in _caption_lines(path):
        file = _checked_line(path, line, raw)
        clip_id = raw.get("id", _clip_id(file))
        if not isinstance(clip_id, str) or not CLIP_ID_PATTERN.match(clip_id):
            raise ExportError(f"captions: {path} line {line}: 'id' must match "
                              f"[A-Za-z0-9_.-]{{1,200}}, got {clip_id!r}")
        if clip_id in seen:
            raise ExportError(f"captions: {path} line {line}: clip id {clip_id!r} repeats line "
                              f"{seen[clip_id]} (give distinct 'id's)")
        seen[clip_id] = line
        if not (media_dir / file).is_file():
            missing.append(f"line {line}: {file}")
        rows.append(CaptionRow(clip_id, media_dir / file, raw["split"],
                               _caption_list(path, line, "captions", raw.get("captions")),
                               _caption_list(path, line, "visual_captions",
                                             raw.get("visual_captions")),
                               _caption_list(path, line, "audio_captions",
                                             raw.get("audio_captions")), line, file))
    if missing:
        raise ExportError(f"captions: {path} names {len(missing)} file(s) missing from "
                          f"{media_dir}: {_first_ten(missing)}")
    _check_one_split_per_file(rows, path)
    return _checked_rows(rows, f"captions: {path}")


def _first_ten(items: list) -> str:
    return "; ".join(items[:10]) + (f"; and {len(items) - 10} more" if len(items) > 10 else "")


def _check_one_split_per_file(rows: list[CaptionRow], path: Path) -> None:
    """A media file (however its path is spelt, or linked) in two splits would be trained on
    and scored on: refused, naming both lines."""
    first = {}
    for row in rows:
        real = os.path.realpath(row.file)
        if real not in first:
            first[real] = row
            continue
        other = first[real]
        if other.split != row.split:
            raise ExportError(
                f"captions: {path} line {row.line} ({row.name!r}, split {row.split!r}) and line "
                f"{other.line} ({other.name!r}, split {other.split!r}) are the same media file "
                f"{real}; a clip in two splits is trained on and scored on, so keep each file "
                "in one split")


def media_rows(media_dir, split: str = LABEL_FREE_SPLIT,
               skipped: list | None = None) -> list[CaptionRow]:
    """Every media file under ``media_dir`` (a known suffix, hidden files and folders left
    out), in path order, as clips of ``split`` without references: a label-free export.
    ``skipped`` (a list) gets what else is there and is not read, each with the reason: files
    of another type (notes, captions and the like, :data:`NOT_MEDIA_SUFFIXES`, aside) and
    linked folders (not followed). A link that points nowhere is refused."""
    media_dir = Path(media_dir)
    if not media_dir.is_dir():
        raise ExportError(f"media: no folder at {str(media_dir)!r}")
    if split != LABEL_FREE_SPLIT:
        raise ExportError(
            f"split: a label-free export (no captions file) makes {LABEL_FREE_SPLIT!r} clips, "
            f"got {split!r}: python -m avex.train needs a train split and python -m "
            "avex.evaluate scores only clips with references, so nothing could use these. For "
            "val or test clips, list them in a captions file with their 'split' ('captions' "
            "may be left out)")
    files, notes, dangling = _walk(media_dir)
    if dangling:
        raise ExportError(f"media: {len(dangling)} link(s) under {media_dir} point to nothing: "
                          f"{_first_ten(dangling)}; remove or repair them")
    if skipped is not None:
        skipped.extend(notes)
    rows, seen = [], {}
    for file in files:
        relative = file.relative_to(media_dir).as_posix()
        clip_id = _clip_id(relative)
        if clip_id in seen:
            raise ExportError(f"media: {relative} and {seen[clip_id]} make the same clip id "
                              f"{clip_id!r}; rename one, or give ids in a captions file")
        seen[clip_id] = relative
        rows.append(CaptionRow(clip_id, file, split, name=relative))
    return _checked_rows(rows, f"media: folder {media_dir}")


def _walk(media_dir: Path) -> tuple[list[Path], list[str], list[str]]:
    """(media files in path order, what is passed over with why, links to nothing) under
    ``media_dir``; hidden files and folders are left out."""
    suffixes = {s for group in KINDS.values() for s in group}
    files, notes, dangling = [], [], []

    def unreadable(err: OSError) -> None:
        notes.append(f"{err.filename} (can't be read: {err.strerror})")

    for folder, dirs, names in os.walk(media_dir, onerror=unreadable):
        here = Path(folder)
        for name in sorted(dirs):
            if not name.startswith(".") and (here / name).is_symlink():
                notes.append(f"{_shown(here / name, media_dir)}/ (a linked folder, not "
                             "followed)")
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and not (here / d).is_symlink())
        for name in sorted(names):
            path = here / name
            if name.startswith("."):
                continue
            if path.is_symlink() and not path.exists():
                dangling.append(f"{_shown(path, media_dir)} -> {os.readlink(path)}")
            elif path.suffix.lower() in suffixes and path.is_file():
                files.append(path)
            elif path.suffix.lower() in suffixes:
                notes.append(f"{_shown(path, media_dir)} (not a regular file)")
            elif path.suffix.lower() not in NOT_MEDIA_SUFFIXES:
                notes.append(f"{_shown(path, media_dir)} (type "
                             f"{path.suffix.lower() or '(no suffix)'!r} is not read)")
    return sorted(files), sorted(notes), sorted(dangling)


def _shown(path: Path, media_dir: Path) -> str:
    """``path`` inside ``media_dir`` as text; a name that is not UTF-8 is shown as its bytes."""
    relative = path.relative_to(media_dir).as_posix()
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        return repr(os.fsencode(relative))
    return relative


def _check_names(rows: list[CaptionRow]) -> None:
    """The cache records each file's name and path as UTF-8 text: a name that isn't (bytes
    no encoding decodes, from another system) is refused before any clip is written."""
    for row in rows:
        for text in (row.name, str(row.file.resolve())):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                where = f"captions line {row.line}" if row.line else "in the media folder"
                raise ExportError(f"media: the file {os.fsencode(text)!r} ({where}) has a "
                                  "name that is not valid UTF-8 text, which the cache can't "
                                  "record; rename it") from None


def _checked_rows(rows: list[CaptionRow], where: str) -> list[CaptionRow]:
    if not rows:
        raise ExportError(f"{where}: holds no clips")
    _check_names(rows)
    if not any(r.split == "train" for r in rows):
        raise ExportError(f"{where}: no row has split 'train'; python -m avex.train needs one")
    return rows


def _main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def read_rows(media_dir, captions, split: str = LABEL_FREE_SPLIT) -> list[CaptionRow]:
    """The clips of ``captions`` (:func:`read_captions`), or without it every media file
    under ``media_dir`` (:func:`media_rows`), whose notice of what it passes over (files of
    other types, linked folders) is printed here (by the first process under torchrun)."""
    if captions is not None:
        return read_captions(captions, media_dir)
    skipped: list = []
    rows = media_rows(media_dir, split, skipped)
    if skipped and _main_process():
        shown = _first_ten(skipped)
        known = " ".join(s for group in KINDS.values() for s in group)
        print(f"note: {len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'} under "
              f"{media_dir} not exported: {shown}. Export reads {known}; convert other media "
              "to one of these, or link the files themselves into the folder", file=sys.stderr)
    return rows


def check_headers(rows: list[CaptionRow], family, *, extractor=None,
                  use_audio_in_video: bool = True) -> None:
    """Every file's header (read once: ``row.header``), whether ``family`` (an adapter
    module) takes its kind, and whether its processor can make tokens of it (an image not too
    elongated, audio long enough for one token with ``extractor``, the processor's feature
    extractor: :func:`avex.adapters._export.unusable_header`), before anything is decoded or
    written."""
    for row in rows:
        if row.header is None:
            try:
                row.header = probe(row.file)
            except MediaError as err:
                raise ExportError(f"{err} ({row.where})") from None
        reason = unusable_kind(family, row.header["kind"], row.header["audio"]) or \
            unusable_header(family, row.header, extractor=extractor,
                            use_audio_in_video=use_audio_in_video)
        if reason:
            raise ExportError(f"{row.file} ({row.where}): {reason}")


def note_unmeasured(rows: list[CaptionRow], family, hears: bool) -> None:
    """Name the files whose header states no length for a stream the export decodes
    (streamed WebM, say): a cut one can't be told from a whole one there, so it is exported
    as far as it decodes. ``hears``: whether the audio is read."""
    if not _main_process():
        return
    unmeasured = []
    for r in rows:
        h = r.header or {}
        streams = [name for name, missing in (
            ("video", h.get("kind") == "video" and family.SEES
             and not h.get("video_frames") and not h.get("video_seconds")),
            ("audio", hears and h.get("audio") and not h.get("audio_seconds"))) if missing]
        if streams:
            unmeasured.append(f"{r.name or r.file.name} ({' and '.join(streams)})")
    if unmeasured:
        shown = ", ".join(unmeasured[:10]) + (f" and {len(unmeasured) - 10} more"
                                              if len(unmeasured) > 10 else "")
        print(f"note: {len(unmeasured)} file(s) state no length in their header, so a file cut "
              f"short can't be told from a whole one there; each is exported as far as it "
              f"decodes: {shown}", file=sys.stderr)


def note_cut_audio(rows: list[CaptionRow], family, processor, settings) -> None:
    """Name the files whose audio the feature extractor will cut to its window (its
    ``n_samples``, ``chunk_length`` seconds): the clip holds the first window only."""
    extractor = getattr(processor, "feature_extractor", None)
    samples = getattr(extractor, "n_samples", None)
    if not family.HEARS or not samples or not _main_process():
        return
    window = samples / extractor.sampling_rate
    heard_in_video = not family.SEES or (getattr(family, "AUDIO_IN_VIDEO", False)
                                         and settings.use_audio_in_video)
    long = [f"{r.name or r.file.name} ({r.header['audio_seconds']:.1f} s)" for r in rows
            if r.header and r.header["audio"] and r.header["audio_seconds"] > window + 1e-3
            and (r.header["kind"] == "audio" or heard_in_video)]
    if long:
        shown = ", ".join(long[:10]) + (f" and {len(long) - 10} more" if len(long) > 10 else "")
        print(f"note: {len(long)} file(s) hold more audio than the feature extractor's "
              f"{window:g} s window ({type(extractor).__name__}); the model hears the first "
              f"{window:g} s of each: {shown}", file=sys.stderr)
