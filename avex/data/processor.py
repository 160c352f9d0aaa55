"""A model's processor from its local folder, with the video path of our own
(:mod:`avex.data.video`) in its ``video_processor`` slot: no torchvision is needed, and the
frames reach the model the same way on every machine.

``AutoProcessor`` can't build the processor of any family that takes video where torchvision
doesn't import (the PyPI torchvision is a CUDA build that fails beside a CPU-only torch), so
the processor is assembled from its parts as transformers saved them: the tokenizer
(``AutoTokenizer``), the image processor (``AutoImageProcessor``: Pillow where torchvision is
missing), the audio feature extractor (``AutoFeatureExtractor``), the processor's own settings
and chat template, and the frames video processor configured by the saved video processor
configuration.
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path

from avex.adapters import adapter_for
from avex.data.video import VideoProcessorBase, frames_video_processor

__all__ = ["load_processor", "assemble_processor", "with_frames_video_processor"]

#: parts of processor_config.json that are not the processor's own settings
_PARTS = ("image_processor", "video_processor", "feature_extractor", "tokenizer",
          "audio_processor", "processor_class", "chat_template", "auto_map")


def _processor_settings(path: Path, cls) -> dict:
    """The processor's own keywords that ``save_pretrained`` wrote (LLaVA-OneVision's
    ``num_image_tokens``, the placeholder tokens, ...), for its constructor."""
    file = path / "processor_config.json"
    if not file.is_file():
        return {}
    saved = json.loads(file.read_text(encoding="utf-8"))
    takes = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in saved.items() if k not in _PARTS and k in takes}


def _chat_template(path: Path):
    for name in ("chat_template.jinja", "chat_template.json"):
        file = path / name
        if file.is_file():
            text = file.read_text(encoding="utf-8")
            return json.loads(text)["chat_template"] if name.endswith(".json") else text
    return None


def load_processor(path, model):
    """``model``'s processor from the folder ``path`` (as ``save_pretrained`` wrote it, or a
    model repository's files), with :mod:`avex.data.video`'s frames processor for video."""
    import transformers

    path = Path(path)
    family = adapter_for(model)
    cls = getattr(transformers, family.PROCESSOR)
    parts = {}
    for name in cls.get_attributes():
        try:
            if name == "tokenizer":
                parts[name] = transformers.AutoTokenizer.from_pretrained(str(path))
            elif name == "image_processor":
                parts[name] = transformers.AutoImageProcessor.from_pretrained(str(path))
            elif name == "feature_extractor":
                parts[name] = transformers.AutoFeatureExtractor.from_pretrained(str(path))
            elif name == "video_processor":
                parts[name] = frames_video_processor(family.VIDEO, path)
            else:
                raise ValueError(f"{cls.__name__} has a part {name!r} this loader doesn't know")
        except (OSError, ValueError) as err:
            raise ValueError(f"processor: can't load the {name} of {cls.__name__} from "
                             f"{path} ({type(err).__name__}: {str(err)[:300]})") from None
    return assemble_processor(cls, parts, chat_template=_chat_template(path),
                              **_processor_settings(path, cls))


def assemble_processor(cls, parts: dict, **settings):
    """``cls(**parts, **settings)``, a transformers processor, where ``parts`` may hold a
    frames video processor. Without torchvision, transformers' check of the video processor's
    class fails looking the class name up (``VideoProcessorMixin`` is not exported then):
    that one check is made here instead, the others are transformers' own."""
    processor = cls.__new__(cls)

    def check(name, argument):
        if name == "video_processor":
            if not isinstance(argument, VideoProcessorBase):
                raise TypeError(f"video_processor must be a video processor, got "
                                f"{type(argument).__name__}")
            return VideoProcessorBase
        return cls.check_argument_for_proper_class(processor, name, argument)

    processor.check_argument_for_proper_class = check
    try:
        cls.__init__(processor, **parts, **settings)
    finally:
        del processor.check_argument_for_proper_class
    return processor


def with_frames_video_processor(processor, model):
    """``processor`` with its video processor replaced by the frames processor of ``model``'s
    family, configured as the one it replaces (the same settings, no torchvision). A processor
    whose family takes no video, or that has none, is returned as it is."""
    family = adapter_for(model)
    current = getattr(processor, "video_processor", None)
    if family.VIDEO is None or current is None:
        return processor
    if type(current).__module__.startswith("avex."):
        return processor
    processor.video_processor = frames_video_processor(family.VIDEO, config=current.to_dict())
    return processor
