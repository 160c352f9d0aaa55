"""Reading media files for ``python -m avex.data export``: video frames and their audio track
with PyAV, audio files with soundfile (PyAV for the formats soundfile can't read), images with
Pillow. Both decoders come with the ``media`` extra (``pip install "avex-prune[media]"``).

Every reader returns what a Hugging Face processor takes: frames as uint8 ``[H, W, 3]`` arrays,
audio as float32 mono samples at the processor's sampling rate. A file that can't be read raises
:class:`MediaError` naming it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["MediaError", "Media", "KINDS", "media_kind", "probe", "read_media"]

VIDEO_SUFFIXES = (".mp4", ".mkv", ".webm", ".mov", ".avi", ".m4v")
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".m4a", ".aac", ".opus")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif")
KINDS = {"video": VIDEO_SUFFIXES, "audio": AUDIO_SUFFIXES, "image": IMAGE_SUFFIXES}


class MediaError(ValueError):
    """A media file that can't be read; the message names it and says why."""


@dataclass
class Media:
    """One decoded file. ``frames``: the sampled video frames (a video) or the one image;
    ``audio``: float32 mono samples at ``sampling_rate`` (an audio file or a video's track;
    None for a video without one or an image)."""
    path: Path
    kind: str
    frames: list | None = None
    audio: np.ndarray | None = None
    sampling_rate: int | None = None
    fps: float | None = None


def media_kind(path) -> str:
    """"video", "audio" or "image" from the file's suffix; anything else is refused."""
    suffix = Path(path).suffix.lower()
    for kind, suffixes in KINDS.items():
        if suffix in suffixes:
            return kind
    known = ", ".join(s for suffixes in KINDS.values() for s in suffixes)
    raise MediaError(f"{path}: unknown media type {suffix or '(no suffix)'!r}; known: {known}")


def _decoders():
    try:
        import av
        import soundfile
    except ImportError as err:
        raise ImportError(f"reading media needs PyAV and soundfile ({err.name} is missing): "
                          'pip install "avex-prune[media]" (or pip install av soundfile)') \
            from None
    return av, soundfile


def probe(path) -> dict:
    """Open ``path`` and read its header only: ``{"kind", "video_frames", "audio", "duration"}``
    (video frames and duration as the container states them, 0 when it doesn't). A file that
    is missing, unreadable, or has nothing to decode is refused."""
    path = Path(path)
    kind = media_kind(path)
    if not path.is_file():
        raise MediaError(f"{path}: no such file")
    av, soundfile = _decoders()
    if kind == "image":
        from PIL import Image, UnidentifiedImageError
        try:
            with Image.open(path) as image:
                image.verify()
                width, height = image.size
        except (UnidentifiedImageError, OSError, SyntaxError) as err:
            raise MediaError(f"{path}: unreadable image ({err})") from None
        if not width or not height:
            raise MediaError(f"{path}: the image is empty ({width}x{height})")
        return {"kind": kind, "video_frames": 1, "audio": False, "duration": 0.0}
    if kind == "audio" and path.suffix.lower() in (".wav", ".flac", ".ogg"):
        try:
            info = soundfile.info(str(path))
        except Exception as err:  # soundfile.LibsndfileError and friends
            raise MediaError(f"{path}: unreadable audio ({err})") from None
        if info.frames == 0:
            raise MediaError(f"{path}: the audio file holds no samples")
        return {"kind": kind, "video_frames": 0, "audio": True,
                "duration": info.frames / info.samplerate}
    try:
        with av.open(str(path)) as container:
            video = [s for s in container.streams if s.type == "video"]
            audio = [s for s in container.streams if s.type == "audio"]
            duration = (container.duration or 0) / 1e6
            frames = video[0].frames if video else 0
    except Exception as err:  # av.error.* (InvalidDataError, ...), OSError
        raise MediaError(f"{path}: unreadable {kind} ({type(err).__name__}: {err})") from None
    if kind == "video" and not video:
        raise MediaError(f"{path}: a video file without a video stream")
    if kind == "audio" and not audio:
        raise MediaError(f"{path}: an audio file without an audio stream")
    return {"kind": kind, "video_frames": frames, "audio": bool(audio), "duration": duration}


def _resample(av, chunks, rate: int) -> np.ndarray:
    """PyAV audio frames -> float32 mono at ``rate``."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    out = []
    for frame in chunks:
        for converted in resampler.resample(frame):
            out.append(converted.to_ndarray().reshape(-1))
    for converted in resampler.resample(None):   # flush
        out.append(converted.to_ndarray().reshape(-1))
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


def _read_audio_file(path: Path, rate: int):
    av, soundfile = _decoders()
    if path.suffix.lower() in (".wav", ".flac", ".ogg"):
        samples, file_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        mono = samples.mean(1)
        if file_rate == rate:
            return mono.astype(np.float32)
        frame = av.AudioFrame.from_ndarray(mono[None].astype(np.float32), format="flt",
                                           layout="mono")
        frame.sample_rate = file_rate
        return _resample(av, [frame], rate)
    with av.open(str(path)) as container:
        return _resample(av, container.decode(audio=0), rate)


def _sample_times(duration: float, fps: float, max_frames: int | None) -> np.ndarray:
    count = max(1, int(round(duration * fps)))
    if max_frames is not None and count > max_frames:
        return np.linspace(0.0, duration, max_frames, endpoint=False)
    return np.arange(count) / fps


def _read_video(path: Path, fps: float, max_frames: int | None, rate: int | None):
    """Frames sampled at ``fps`` (at most ``max_frames``, spread evenly), and the audio track
    at ``rate`` (None when there is none, or ``rate`` is None)."""
    av, _ = _decoders()
    decoded, times = [], []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            if frame.time is None:
                continue
            decoded.append(frame.to_ndarray(format="rgb24"))
            times.append(float(frame.time))
    if not decoded:
        raise MediaError(f"{path}: no video frame could be decoded")
    times = np.asarray(times)
    duration = times[-1] + (times[1] - times[0] if len(times) > 1 else 1.0 / fps)
    # the last decoded frame at or before each sampling time
    wanted = _sample_times(duration, fps, max_frames)
    index = np.clip(np.searchsorted(times, wanted + 1e-6, side="right") - 1, 0, len(decoded) - 1)
    frames = [decoded[i] for i in index]
    audio = None
    if rate is not None:
        with av.open(str(path)) as container:
            if container.streams.audio:
                audio = _resample(av, container.decode(audio=0), rate)
    return frames, audio


def read_media(path, *, fps: float = 2.0, max_frames: int | None = None,
               sampling_rate: int | None = 16000) -> Media:
    """Decode ``path``: a video's frames at ``fps`` (at most ``max_frames``) and its audio
    track, an audio file, or an image. ``sampling_rate`` None skips audio (a model that hears
    nothing)."""
    path = Path(path)
    kind = probe(path)["kind"]
    try:
        if kind == "image":
            from PIL import Image
            with Image.open(path) as image:
                return Media(path, kind, frames=[np.asarray(image.convert("RGB"))])
        if kind == "audio":
            if sampling_rate is None:
                return Media(path, kind)
            audio = _read_audio_file(path, sampling_rate)
            return Media(path, kind, audio=audio, sampling_rate=sampling_rate)
        frames, audio = _read_video(path, fps, max_frames, sampling_rate)
    except MediaError:
        raise
    except Exception as err:  # a decoder error past the header
        raise MediaError(f"{path}: can't decode ({type(err).__name__}: {err})") from None
    return Media(path, kind, frames=frames, audio=audio,
                 sampling_rate=None if audio is None else sampling_rate, fps=fps)
