"""Video frames into a model's processor without torchvision.

transformers' video processors run on torchvision, whose PyPI build fails to import beside a
CPU-only torch, so ``AutoProcessor`` can't be built there for any family that takes video.
The classes here do the same work on frames that are already decoded and sampled
(:func:`avex.data.media.read_media`), with torch alone, and stand in the processor's
``video_processor`` slot:

* :class:`QwenVLFramesProcessor` for the Qwen2-VL video processor (Qwen2.5-VL, the
  Qwen2.5-Omni thinker): resize to the patch grid, rescale and normalise, frames paired into
  temporal patches, patches in the order the vision tower merges them;
* :class:`LlavaOnevisionFramesProcessor` for LLaVA-OneVision's: each frame resized to one
  size, rescaled and normalised, stacked ``[videos, frames, 3, H, W]``.

Resizing runs torch's own interpolation on uint8 frames on the CPU, as torchvision's resize
does there, so the pixels equal transformers' video processor's wherever torchvision works
(tests/test_video.py compares them). Each reads the model's video processor configuration as
transformers saved it, and refuses settings it does not implement rather than approximate
them. Frames are sampled before they get here; the processor samples none (its
``do_sample_frames`` is refused).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from transformers import BatchFeature
try:
    from transformers.video_processing_utils import VideoProcessorMixin as VideoProcessorBase
except ImportError:  # transformers before the mixin (the GPU image's 5.17): the base class
    from transformers.video_processing_utils import BaseVideoProcessor as VideoProcessorBase
from transformers.video_utils import VideoMetadata

__all__ = ["FramesVideoProcessor", "QwenVLFramesProcessor", "LlavaOnevisionFramesProcessor",
           "VIDEO_PROCESSORS", "frames_video_processor"]

#: PIL's resampling codes that torch's interpolation implements as torchvision does
RESAMPLE = {2: "bilinear", 3: "bicubic"}
OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def _resize(frames: torch.Tensor, height: int, width: int, mode: str) -> torch.Tensor:
    """uint8 ``[T, C, H, W]`` frames resized as torchvision's ``resize`` does on the CPU
    (antialiased; uint8 throughout where torch has that kernel, else in float32, rounded)."""
    if tuple(frames.shape[-2:]) == (height, width):
        return frames
    native = mode == "bicubic" or torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    work = frames if native else frames.float()
    out = torch.nn.functional.interpolate(work, size=[height, width], mode=mode,
                                          align_corners=False, antialias=True)
    return out if native else out.round_().to(torch.uint8)


class FramesVideoProcessor(VideoProcessorBase):
    """What every frames processor shares: its settings (a transformers video processor
    configuration) and the pixel normalisation. ``STANDS_FOR`` is the transformers class it
    replaces; :meth:`to_dict` saves under that name, so a machine with torchvision loads the
    same configuration into the real class."""

    STANDS_FOR = ""
    DEFAULTS: dict = {}
    #: settings with no effect here (sampling is done before, RGB frames come in)
    IGNORED = ("do_convert_rgb", "video_processor_type", "processor_class", "image_processor_type",
               "return_metadata", "fps", "num_frames", "min_frames", "max_frames",
               "default_to_square", "data_format", "input_data_format", "device",
               "return_tensors", "video_metadata", "_processor_class")
    model_input_names = ["pixel_values_videos"]

    def __init__(self, **config):
        settings = dict(self.DEFAULTS)
        settings.update({k: v for k, v in config.items() if v is not None})
        if settings.get("do_sample_frames"):
            raise ValueError(f"{self.STANDS_FOR} config sets do_sample_frames=True; export "
                             "samples the frames itself (--fps, --max-frames), so this "
                             "processor takes them as they are")
        self._check(settings)
        super().__init__(**{k: v for k, v in settings.items() if k not in self.IGNORED})

    def _check(self, settings: dict) -> None:
        if settings.get("resample") not in RESAMPLE:
            raise ValueError(f"{self.STANDS_FOR} config: resample {settings.get('resample')!r} "
                             f"is not one this video path implements ({RESAMPLE})")
        if settings.get("do_center_crop"):
            raise ValueError(f"{self.STANDS_FOR} config: do_center_crop is not implemented by "
                             "this video path")

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["video_processor_type"] = self.STANDS_FOR
        return out

    def normalize_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 ``[..., C, H, W]`` -> float32, rescaled and normalised as transformers'
        torchvision backend does it (scale folded into the mean and std)."""
        x = frames.to(torch.float32)
        scale = float(self.rescale_factor)
        if self.do_normalize:
            mean = torch.tensor(self.image_mean, dtype=torch.float32)
            std = torch.tensor(self.image_std, dtype=torch.float32)
            if self.do_rescale:
                mean, std = mean * (1.0 / scale), std * (1.0 / scale)
            return (x - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
        return x * scale if self.do_rescale else x

    def __call__(self, videos, video_metadata=None, return_tensors=None, **kwargs):
        videos = [self._frames(v) for v in videos]
        metadata = self._metadata(videos, video_metadata, kwargs.get("fps"))
        return self._process(videos, metadata)

    @staticmethod
    def _frames(video) -> torch.Tensor:
        """One video's frames (a list of uint8 [H, W, 3] arrays, or one [T, H, W, 3] array)
        as uint8 [T, 3, H, W]."""
        array = np.stack([np.asarray(f) for f in video]) if isinstance(video, (list, tuple)) \
            else np.asarray(video)
        if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3:
            raise ValueError(f"a video must be uint8 RGB frames [T, H, W, 3], got "
                             f"{array.dtype} {list(array.shape)}")
        return torch.from_numpy(np.ascontiguousarray(array)).permute(0, 3, 1, 2).contiguous()

    @staticmethod
    def _metadata(videos, given, fps) -> list:
        """One VideoMetadata per video: as given, or frames taken at ``fps`` (2.0 when
        neither says)."""
        if given is not None:
            given = given if isinstance(given, (list, tuple)) else [given]
            if len(given) != len(videos):
                raise ValueError(f"{len(videos)} videos but {len(given)} video_metadata entries")
            return [m if isinstance(m, VideoMetadata) else VideoMetadata(**m) for m in given]
        rate = float(fps) if fps is not None else 2.0
        return [VideoMetadata(total_num_frames=len(v), fps=rate,
                              frames_indices=list(range(len(v)))) for v in videos]

    def _process(self, videos: list, metadata: list) -> BatchFeature:
        raise NotImplementedError


def _grid_size(height: int, width: int, factor: int, min_pixels: int,
               max_pixels: int) -> tuple[int, int]:
    """The Qwen2-VL resize rule: each side a multiple of ``factor`` near the original, the area
    brought inside [min_pixels, max_pixels] keeping the aspect ratio."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"a video frame of {height}x{width} is too elongated (aspect ratio > "
                         "200) for the Qwen2-VL resize")
    new_h = max(factor, round(height / factor) * factor)
    new_w = max(factor, round(width / factor) * factor)
    if new_h * new_w > max_pixels:
        shrink = math.sqrt(height * width / max_pixels)
        new_h = max(factor, math.floor(height / shrink / factor) * factor)
        new_w = max(factor, math.floor(width / shrink / factor) * factor)
    elif new_h * new_w < min_pixels:
        grow = math.sqrt(min_pixels / (height * width))
        new_h = math.ceil(height * grow / factor) * factor
        new_w = math.ceil(width * grow / factor) * factor
    return new_h, new_w


class QwenVLFramesProcessor(FramesVideoProcessor):
    """transformers' ``Qwen2VLVideoProcessor`` on decoded frames (Qwen2.5-VL and the
    Qwen2.5-Omni thinker use it)."""

    STANDS_FOR = "Qwen2VLVideoProcessor"
    DEFAULTS = {"resample": 3, "size": {"shortest_edge": 128 * 28 * 28,
                                        "longest_edge": 28 * 28 * 768},
                "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD,
                "rescale_factor": 1 / 255, "do_resize": True, "do_rescale": True,
                "do_normalize": True, "patch_size": 14, "temporal_patch_size": 2,
                "merge_size": 2, "cap_pixels_per_frame": False, "max_video_tokens": 128000}
    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, **config):
        size = dict(config.pop("size", None) or self.DEFAULTS["size"])
        for old, new in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            if config.get(old) is not None:
                size[new] = config.pop(old)
            config.pop(old, None)
        super().__init__(size=size, **config)

    def _pixel_budget(self, frames: int) -> int:
        """The largest frame area: the config's, or (``cap_pixels_per_frame``) an even share
        of the video's token budget, as transformers' option computes it."""
        longest = self.size["longest_edge"]
        if not self.cap_pixels_per_frame:
            return longest
        factor = self.patch_size * self.merge_size
        total = int(self.max_video_tokens * factor * factor * 0.9)
        return max(min(longest, total * self.temporal_patch_size // frames),
                   int(self.size["shortest_edge"] * 1.05))

    def _process(self, videos: list, metadata: list) -> BatchFeature:
        step, patch, merge = self.temporal_patch_size, self.patch_size, self.merge_size
        values, grids = [], []
        for frames in videos:
            if self.do_resize:
                height, width = _grid_size(frames.shape[-2], frames.shape[-1], patch * merge,
                                           self.size["shortest_edge"],
                                           self._pixel_budget(frames.shape[0]))
                frames = _resize(frames, height, width, RESAMPLE[self.resample])
            pixels = self.normalize_frames(frames)
            if pad := -pixels.shape[0] % step:       # the last frame repeated
                pixels = torch.cat([pixels, pixels[-1:].expand(pad, -1, -1, -1)])
            count, channels, height, width = pixels.shape
            t, h, w = count // step, height // patch, width // patch
            # (t, step, C, h/merge, merge, P, w/merge, merge, P) -> the vision tower's order:
            # each merge x merge block of patches together, each patch as (C, step, P, P)
            blocks = pixels.reshape(t, step, channels, h // merge, merge, patch, w // merge,
                                    merge, patch)
            blocks = blocks.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
            values.append(blocks.reshape(t * h * w, channels * step * patch * patch))
            grids.append([t, h, w])
        return BatchFeature({"pixel_values_videos": torch.cat(values),
                             "video_grid_thw": torch.tensor(grids),
                             "video_metadata": metadata},
                            skip_tensor_conversion=["video_metadata"])


class LlavaOnevisionFramesProcessor(FramesVideoProcessor):
    """transformers' ``LlavaOnevisionVideoProcessor`` on decoded frames."""

    STANDS_FOR = "LlavaOnevisionVideoProcessor"
    DEFAULTS = {"resample": 3, "size": {"height": 384, "width": 384},
                "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD,
                "rescale_factor": 1 / 255, "do_resize": True, "do_rescale": True,
                "do_normalize": True}

    def _check(self, settings: dict) -> None:
        super()._check(settings)
        size = settings.get("size") or {}
        if settings.get("do_resize") and not ("height" in size and "width" in size):
            raise ValueError(f"{self.STANDS_FOR} config: size {size!r} is not a fixed "
                             "{'height', 'width'}, the one form this video path implements")

    def _process(self, videos: list, metadata: list) -> BatchFeature:
        out = []
        for frames in videos:
            if self.do_resize:
                frames = _resize(frames, self.size["height"], self.size["width"],
                                 RESAMPLE[self.resample])
            out.append(self.normalize_frames(frames))
        shapes = {tuple(v.shape) for v in out}
        values = torch.stack(out) if len(shapes) == 1 else out
        return BatchFeature({"pixel_values_videos": values, "video_metadata": metadata},
                            skip_tensor_conversion=["video_metadata"])


#: a family's video style (its adapter's ``VIDEO``) -> the processor that does its work
VIDEO_PROCESSORS = {"qwen2_vl": QwenVLFramesProcessor,
                    "llava_onevision": LlavaOnevisionFramesProcessor}


def frames_video_processor(style: str, path=None, config: dict | None = None):
    """The frames processor of ``style``, configured as the model folder ``path`` saved its
    video processor (processor_config.json's, video_preprocessor_config.json, or the image
    processor's preprocessor_config.json, as transformers looks them up), or from
    ``config``."""
    cls = VIDEO_PROCESSORS[style]
    if config is None:
        config = {}
        if path is not None:
            try:
                config, _ = VideoProcessorBase.get_video_processor_dict(str(path),
                                                                         local_files_only=True)
            except OSError:
                config = {}   # no saved configuration: the class defaults, as transformers'
    return cls(**config)
