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

from avex import _checks

__all__ = ["MediaError", "MediaSettings", "Media", "KINDS", "media_kind", "probe", "read_media",
           "check_media"]

VIDEO_SUFFIXES = (".mp4", ".mkv", ".webm", ".mov", ".avi", ".m4v")
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".m4a", ".aac", ".opus")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif")
SOUNDFILE_SUFFIXES = (".wav", ".flac", ".ogg")   # read with soundfile; the rest with PyAV
KINDS = {"video": VIDEO_SUFFIXES, "audio": AUDIO_SUFFIXES, "image": IMAGE_SUFFIXES}


@dataclass
class MediaSettings:
    """How a media file becomes a model's request, as ``python -m avex.data export`` reads it
    and a server answering with the exported policy should too. ``prompt``: the text after the
    media (the request the model answers with a caption); ``fps`` / ``max_frames``: video frame
    sampling (a video too long for ``max_frames`` frames at ``fps`` is sampled evenly at a lower
    rate, and the processor is told that rate); ``use_audio_in_video``: a video's audio track
    goes in with it (Qwen2.5-Omni interleaves the two)."""
    prompt: str = "Describe what you see and hear."
    fps: float = 2.0
    max_frames: int | None = 32
    use_audio_in_video: bool = True

    def validate(self) -> "MediaSettings":
        _checks.text("prompt", self.prompt)
        _checks.positive_float("fps", self.fps)
        _checks.optional_int_at_least("max_frames", self.max_frames, 1)
        _checks.flag("use_audio_in_video", self.use_audio_in_video)
        return self


class MediaError(ValueError):
    """A media file that can't be read; the message names it and says why."""


@dataclass
class Media:
    """One decoded file. ``frames``: the sampled video frames (a video) or the one image;
    ``fps``: the rate the frames were sampled at (below the rate asked for where
    ``max_frames`` spread them over a longer video); ``audio``: float32 mono samples at
    ``sampling_rate`` (an audio file or a video's track; None for a video without one or an
    image)."""
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


def _wav_declared_frames(path: Path) -> int | None:
    """The sample frames a WAV's RIFF header declares (its ``data`` chunk's size over the block
    size); None where it declares none (a streamed WAV's 0 or 0xFFFFFFFF, RF64). libsndfile and
    PyAV both clamp to the bytes present, so a cut file reads as a shorter, valid one."""
    with open(path, "rb") as handle:
        head = handle.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return None
        block = None
        while True:
            chunk = handle.read(8)
            if len(chunk) < 8:
                return None
            name, size = chunk[:4], int.from_bytes(chunk[4:], "little")
            if name == b"fmt ":
                fmt = handle.read(size)
                block = int.from_bytes(fmt[12:14], "little") if len(fmt) >= 14 else None
                handle.seek(size % 2, 1)
            elif name == b"data":
                if not block or size in (0, 0xFFFFFFFF):
                    return None
                return size // block
            else:
                handle.seek(size + size % 2, 1)


def _seconds(stream, container) -> float:
    """A stream's duration as its header states it (the container's where the stream has
    none); 0 where neither does."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    return (container.duration or 0) / 1e6


def _frame_size(stream) -> tuple[int, int]:
    """(width, height) of a video stream's frames as its header states them; 0 where not."""
    context = getattr(stream, "codec_context", None)
    return (int(getattr(context, "width", 0) or 0), int(getattr(context, "height", 0) or 0))


def probe(path) -> dict:
    """Open ``path`` and read its header only: ``{"kind", "video_frames", "video_seconds",
    "audio", "audio_seconds", "duration", "width", "height"}`` (counts, durations and an image's
    or video frame's size as the header states them, 0 where it doesn't). A file that is
    missing, unreadable, or has nothing to decode is refused. The header is what
    :func:`read_media` checks the decoded file against."""
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
        return {"kind": kind, "video_frames": 1, "video_seconds": 0.0, "audio": False,
                "audio_seconds": 0.0, "duration": 0.0, "width": width, "height": height}
    if kind == "audio" and path.suffix.lower() in SOUNDFILE_SUFFIXES:
        try:
            info = soundfile.info(str(path))
        except Exception as err:  # soundfile.LibsndfileError and friends
            raise MediaError(f"{path}: unreadable audio ({err})") from None
        declared = _wav_declared_frames(path) if path.suffix.lower() == ".wav" else None
        frames = info.frames if declared is None else declared
        if frames == 0:
            raise MediaError(f"{path}: the audio file holds no samples")
        seconds = frames / info.samplerate
        return {"kind": kind, "video_frames": 0, "video_seconds": 0.0, "audio": True,
                "audio_seconds": seconds, "duration": seconds, "width": 0, "height": 0}
    try:
        with av.open(str(path)) as container:
            video = [s for s in container.streams if s.type == "video"]
            audio = [s for s in container.streams if s.type == "audio"]
            duration = (container.duration or 0) / 1e6
            frames = video[0].frames if video else 0
            video_seconds = _seconds(video[0], container) if video else 0.0
            audio_seconds = _seconds(audio[0], container) if audio else 0.0
            width, height = _frame_size(video[0]) if video else (0, 0)
    except Exception as err:  # av.error.* (InvalidDataError, ...), OSError
        raise MediaError(f"{path}: unreadable {kind} ({type(err).__name__}: {err})") from None
    if kind == "video" and not video:
        raise MediaError(f"{path}: a video file without a video stream")
    if kind == "audio" and not audio:
        raise MediaError(f"{path}: an audio file without an audio stream")
    return {"kind": kind, "video_frames": frames, "video_seconds": video_seconds,
            "audio": bool(audio), "audio_seconds": audio_seconds, "duration": duration,
            "width": width, "height": height}


#: a decoded stream may fall short of its header by this much (seconds, or a share of the
#: header's duration, whichever is larger) before the file counts as cut short
SHORT_SECONDS, SHORT_SHARE = 0.25, 0.02


def _check_length(path: Path, what: str, header: float, decoded: float, unit: str,
                  slack: float) -> None:
    if header > 0 and decoded < header - max(slack, SHORT_SHARE * header):
        shown = (lambda v: f"{v:g}") if unit == "frames" else (lambda v: f"{v:.2f}")
        raise MediaError(f"{path}: decodes short: its header says {shown(header)} {unit} of "
                         f"{what}, only {shown(decoded)} {unit} decode (a file cut short, or "
                         "damaged); re-encode or replace it")


def _check_video(path: Path, header: dict, count: int, times: list, fps_native) -> None:
    """The decoded frames against the header's frame count and video duration."""
    frames = header["video_frames"]
    if frames:
        _check_length(path, "video", frames, count, "frames", 2)
    step = 1.0 / float(fps_native) if fps_native else \
        (times[1] - times[0] if len(times) > 1 else 0.0)
    span = times[-1] - times[0] + step if times else 0.0
    _check_length(path, "video", header["video_seconds"], span, "s", SHORT_SECONDS)


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


def _decoded_audio(av, container, seconds_out: list):
    """The container's first audio stream's frames, its decoded seconds added to
    ``seconds_out``."""
    total = 0
    rate = None
    for frame in container.decode(audio=0):
        total += frame.samples
        rate = frame.sample_rate
        yield frame
    seconds_out.append(total / rate if rate else 0.0)


def _read_audio_file(path: Path, rate: int | None, header: dict):
    """The file's samples, float32 mono at ``rate`` (None: decoded and checked, not kept)."""
    av, soundfile = _decoders()
    if path.suffix.lower() in SOUNDFILE_SUFFIXES:
        samples, file_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        _check_length(path, "audio", header["audio_seconds"], len(samples) / file_rate, "s",
                      SHORT_SECONDS)
        if rate is None:
            return None
        mono = samples.mean(1)
        if file_rate == rate:
            return mono.astype(np.float32)
        frame = av.AudioFrame.from_ndarray(mono[None].astype(np.float32), format="flt",
                                           layout="mono")
        frame.sample_rate = file_rate
        return _resample(av, [frame], rate)
    seconds: list = []
    with av.open(str(path)) as container:
        frames = _decoded_audio(av, container, seconds)
        audio = _resample(av, frames, rate) if rate is not None else sum(1 for _ in frames)
    _check_length(path, "audio", header["audio_seconds"], seconds[0], "s", SHORT_SECONDS)
    return audio if rate is not None else None


def _sample_times(duration: float, fps: float, max_frames: int | None) -> np.ndarray:
    count = max(1, int(round(duration * fps)))
    if max_frames is not None and count > max_frames:
        return np.linspace(0.0, duration, max_frames, endpoint=False)
    return np.arange(count) / fps


def _read_video(path: Path, fps: float, max_frames: int | None, rate: int | None,
                header: dict, keep: bool = True):
    """(frames, audio, the rate the frames were taken at): frames sampled at ``fps`` (at
    most ``max_frames``, spread evenly: a lower rate), and the audio track at ``rate`` (None
    when there is none, or ``rate`` is None), both checked against the header. ``keep``
    False decodes and checks only (the probe pass)."""
    av, _ = _decoders()
    decoded, times = [], []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        native = stream.average_rate
        for frame in container.decode(stream):
            if frame.time is None:
                continue
            if keep:
                decoded.append(frame.to_ndarray(format="rgb24"))
            times.append(float(frame.time))
    if not times:
        raise MediaError(f"{path}: no video frame could be decoded")
    _check_video(path, header, len(times), times, native)
    audio = None
    if rate is not None and header["audio"]:
        seconds: list = []
        with av.open(str(path)) as container:
            frames = _decoded_audio(av, container, seconds)
            audio = _resample(av, frames, rate) if keep else sum(1 for _ in frames)
        _check_length(path, "audio", header["audio_seconds"], seconds[0], "s", SHORT_SECONDS)
    if not keep:
        return None, None, None
    times = np.asarray(times)
    duration = times[-1] + (times[1] - times[0] if len(times) > 1 else 1.0 / fps)
    # the last decoded frame at or before each sampling time
    wanted = _sample_times(duration, fps, max_frames)
    index = np.clip(np.searchsorted(times, wanted + 1e-6, side="right") - 1, 0, len(decoded) - 1)
    rate = fps if len(wanted) < 2 else 1.0 / float(wanted[1] - wanted[0])
    return [decoded[i] for i in index], audio, rate


def read_media(path, *, fps: float = 2.0, max_frames: int | None = None,
               sampling_rate: int | None = 16000) -> Media:
    """Decode ``path``: a video's frames at ``fps`` (at most ``max_frames``) and its audio
    track, an audio file, or an image. ``sampling_rate`` None skips audio (a model that hears
    nothing). Every stream decoded is checked against the header: a file that decodes shorter
    than its header says (a cut file) is refused, as is one that can't be decoded."""
    path = Path(path)
    header = probe(path)
    kind = header["kind"]
    try:
        if kind == "image":
            from PIL import Image
            with Image.open(path) as image:
                return Media(path, kind, frames=[np.asarray(image.convert("RGB"))])
        if kind == "audio":
            if sampling_rate is None:
                return Media(path, kind)
            audio = _read_audio_file(path, sampling_rate, header)
            return Media(path, kind, audio=audio, sampling_rate=sampling_rate)
        frames, audio, taken = _read_video(path, fps, max_frames, sampling_rate, header)
    except MediaError:
        raise
    except Exception as err:  # a decoder error past the header
        raise MediaError(f"{path}: can't decode ({type(err).__name__}: {err})") from None
    return Media(path, kind, frames=frames, audio=audio,
                 sampling_rate=None if audio is None else sampling_rate, fps=taken)


def check_media(path, *, audio: bool = True) -> dict:
    """Decode all of ``path`` without keeping it, as :func:`read_media` would (``audio``:
    the audio too), and return its header: the probe pass export runs over every file
    before it writes anything. Raises :class:`MediaError` where :func:`read_media` would."""
    path = Path(path)
    header = probe(path)
    kind = header["kind"]
    try:
        if kind == "image":
            from PIL import Image
            with Image.open(path) as image:
                image.load()
        elif kind == "audio":
            _read_audio_file(path, None, header)
        else:
            _read_video(path, 1.0, None, 1 if audio else None, header, keep=False)
    except MediaError:
        raise
    except Exception as err:  # a decoder error past the header
        raise MediaError(f"{path}: can't decode ({type(err).__name__}: {err})") from None
    return header
