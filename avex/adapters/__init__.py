"""Model adapters, one thin file per Hugging Face model family (as ToMe's ``tome/patch/``):
what the model's processor returns in, what pruning needs out
(:class:`~avex.adapters._capture.AdaptedInputs`: merged ``inputs_embeds``, modality codes
from the placeholder ids, the model's own position ids, extra per-token inputs)::

    inputs = processor(text=..., videos=..., audio=..., return_tensors="pt")
    adapted = avex.adapters.adapt(model, **inputs)
    pruned = adapted.prune(scores=scores, retention=0.3)
    tokens = avex.pruning.generate(model, pruned, max_new_tokens=64)

docs/models.md lists the families, what is refused and why.
"""
from __future__ import annotations

from avex.adapters import gemma3n, llava_onevision, qwen2_5_omni, qwen2_5_vl, qwen2_audio
from avex.adapters._capture import AdaptedInputs
from avex.adapters._export import family_processor_inputs

__all__ = ["AdaptedInputs", "adapt", "adapter_for", "processor_inputs", "FAMILIES",
           "has_own_positions", "wrapper_hint"]

FAMILIES = {module.__name__.rsplit(".", 1)[1]: module
            for module in (qwen2_5_omni, qwen2_5_vl, llava_onevision, qwen2_audio, gemma3n)}
_BY_MODEL_TYPE = {kind: module for module in FAMILIES.values() for kind in module.MODEL_TYPES}
# model types that wrap a family's served part: model_type -> (its family, the attribute)
_WRAPPERS = {module.WRAPPED_BY[0]: (module, module.WRAPPED_BY[1])
             for module in FAMILIES.values() if hasattr(module, "WRAPPED_BY")}


def has_own_positions(model_type) -> bool:
    """Whether a model of ``model_type`` computes position ids of its own (M-RoPE), which its
    exported clips must carry; False for a type no adapter knows (plain 1-D positions)."""
    module = _BY_MODEL_TYPE.get(model_type)
    return bool(module is not None and module.OWN_POSITIONS)


def wrapper_hint(model_type) -> str | None:
    """What to pass instead of a model of ``model_type`` that wraps a family's served part
    (the full Qwen2.5-Omni: its thinker), or None for any other type."""
    if model_type not in _WRAPPERS:
        return None
    module, attribute = _WRAPPERS[model_type]
    return (f"pass model.{attribute} ({module.MODEL_TYPES[0]}), the part that reads the "
            "prompt and writes text")


def adapter_for(model):
    """The adapter module of ``model``'s family (by ``config.model_type``)."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    hint = wrapper_hint(kind)
    if hint is not None:
        raise ValueError(f"model ({type(model).__name__}, model_type {kind!r}) wraps the part "
                         f"pruning serves; {hint}")
    if kind not in _BY_MODEL_TYPE:
        raise ValueError(f"no adapter for model_type {kind!r} ({type(model).__name__}); "
                         f"supported: {sorted(_BY_MODEL_TYPE)}. For a text-only *ForCausalLM, "
                         "build inputs_embeds and modality codes yourself "
                         "(avex.modality.codes_from_ids) and call prune_inputs")
    return _BY_MODEL_TYPE[kind]


def adapt(model, **processor_outputs) -> AdaptedInputs:
    """``adapter_for(model).adapt(model, **processor_outputs)``."""
    return adapter_for(model).adapt(model, **processor_outputs)


def processor_inputs(model, processor, media, prompt: str, *,
                     use_audio_in_video: bool = True) -> tuple[dict, dict]:
    """(processor keywords, extra ``adapt`` keywords) of one decoded file
    (:func:`avex.data.media.read_media`) for ``model``, as export gives them its processor:
    serve with these, and the model sees what training saw (docs/workflow.md)."""
    return family_processor_inputs(adapter_for(model), model, processor, media, prompt,
                                   use_audio_in_video=use_audio_in_video)
