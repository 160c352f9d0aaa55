"""The frozen captioner: any Hugging Face causal LM that takes ``inputs_embeds``, plus a
projector from the cached feature dim. The embedded default is a small Qwen2 trained here
(``python -m avex.captioner train``)."""
from ..paths import default_captioner_path  # noqa: F401
from .batch import AVBatch, AVProjector  # noqa: F401
from .frozen import FrozenCaptioner, tokenizer_dir  # noqa: F401
from .train import PRESETS, CaptionerConfig, ensure_captioner, train_captioner  # noqa: F401

__all__ = ["AVBatch", "AVProjector", "FrozenCaptioner", "tokenizer_dir", "PRESETS",
           "CaptionerConfig", "default_captioner_path", "ensure_captioner", "train_captioner"]
