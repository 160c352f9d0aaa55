"""The frozen captioner: any Hugging Face causal LM that takes ``inputs_embeds``, plus a
projector from the cached feature dim. The embedded default is a small Qwen2 trained here
(``python -m avex.captioner train``)."""
from .frozen import (AUDIO, PAD, TEXT, VISUAL, AVBatch, AVProjector,  # noqa: F401
                     FrozenCaptioner, tokenizer_dir)
from .train import (PRESETS, CaptionerConfig, default_captioner_path,  # noqa: F401
                    ensure_captioner, train_captioner)

__all__ = ["AUDIO", "PAD", "TEXT", "VISUAL", "AVBatch", "AVProjector", "FrozenCaptioner",
           "tokenizer_dir", "PRESETS", "CaptionerConfig", "default_captioner_path",
           "ensure_captioner", "train_captioner"]
