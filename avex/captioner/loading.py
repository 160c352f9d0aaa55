"""Reading a captioner directory: where its tokenizer is (:func:`tokenizer_dir`), its model
(:func:`load_model`), and the check that the tokenizer can write the references' words
(:func:`check_round_trip`)."""
from __future__ import annotations

from pathlib import Path

from ..progress import transformers_progress
from ..ptb_tokenizer import tokenize


def tokenizer_dir(path) -> Path:
    """Where a captioner directory keeps its tokenizer: a ``tokenizer/`` subfolder when there is
    one, else the directory itself (an ordinary Hugging Face model). The embedded captioner uses
    the subfolder: beside a ``qwen2`` config.json, ``AutoTokenizer`` would swap a word-level
    tokenizer for Qwen2's byte-level one."""
    path = Path(path)
    return path / "tokenizer" if (path / "tokenizer" / "tokenizer_config.json").is_file() \
        else path


def load_model(path: Path, dtype, progress: bool = True):
    """A local Hugging Face model directory: a ``*ForCausalLM``, or an audio-visual model whose
    class ``config.json`` names (Qwen2.5-VL, the Qwen2.5-Omni thinker, ...)."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.from_pretrained(str(path))
    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        model_class = AutoModelForCausalLM
    else:
        names = [n for n in (config.architectures or []) if hasattr(transformers, n)]
        if not names:
            raise ValueError(f"{path}/config.json (model_type {config.model_type!r}) names no "
                             "model class this transformers has; expected a *ForCausalLM or "
                             "an audio-visual model such as Qwen2_5_VLForConditionalGeneration")
        model_class = getattr(transformers, names[0])
    with transformers_progress(progress):
        model = model_class.from_pretrained(str(path), dtype=dtype)
    if getattr(model.config.get_text_config(), "vocab_size_per_layer_input", None) is not None:
        raise ValueError(f"{path}: {type(model).__name__} needs per-layer token inputs beside "
                         "inputs_embeds (Gemma 3n), which the feature cache does not hold; it "
                         "can't caption cached clips correctly. avex.adapters + generate prune "
                         "it at inference")
    return model


#: how many reference captions FrozenCaptioner.load(references=...) round-trips
ROUND_TRIP_SAMPLE = 32


def check_round_trip(tokenizer, references, path) -> None:
    """Refuse a tokenizer that can't write the references' words: a sample of them, encoded
    and decoded, must give the same words as the reward reads them (PTB tokens). Otherwise
    every caption comes out wrong (e.g. glued sub-words), every reward is 0 and nothing is
    learned."""
    sample = [r for r in references if isinstance(r, str) and r.strip()][:ROUND_TRIP_SAMPLE]
    for reference in sample:
        ids = tokenizer(reference, add_special_tokens=False)["input_ids"]
        decoded = tokenizer.decode(ids, skip_special_tokens=True)
        if tokenize(decoded) != tokenize(reference):
            where = tokenizer_dir(path)
            raise ValueError(
                f"captioner {path}: its tokenizer ({type(tokenizer).__name__}, loaded from "
                f"{where}) does not round-trip the cache's reference captions: "
                f"{reference!r} encodes and decodes to {decoded!r}, so no caption it writes "
                "could match a reference. A tokenizer saved beside a config.json is loaded as "
                "that model type's tokenizer (e.g. Qwen2Tokenizer for qwen2); save a custom one "
                f"in the tokenizer/ sub-folder ({Path(path) / 'tokenizer'}), which is read first")
