"""What every adapter shares: run the model on its processor's output up to its decoder, and
keep what the decoder would have received.

The merged ``inputs_embeds`` and the native position ids are the model's own (its vision and
audio towers, its ``masked_scatter`` of features into placeholders, its ``get_rope_index``),
read by a forward pre-hook on ``model.get_decoder()`` that stops the forward there. Nothing is
re-implemented, so the adapter follows the installed transformers version.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple

import torch

from avex.modality import check_codes, codes_from_ids
from avex.pruning import PrunedInputs, prune_inputs

__all__ = ["AdaptedInputs", "capture_decoder_inputs", "adapted", "token_id"]


class AdaptedInputs(NamedTuple):
    """What pruning needs, built from a processor's output.

    Attributes:
        inputs_embeds: [B, L, D] the merged embeddings the decoder reads.
        modality: int64 [B, L] codes (:mod:`avex.modality`): placeholders VISUAL / AUDIO,
            markers and everything else TEXT, padding PAD.
        position_ids: the model's own positions ([3, B, L] for M-RoPE / TMRoPE), or None
            where the model counts non-padding tokens (1-D RoPE).
        per_token: name -> [B, L, ...] extra per-token decoder inputs (Gemma 3n's
            ``per_layer_inputs``); empty for most models.
        attention_mask: int64 [B, L], the processor's mask.
        input_ids: [B, L], the processor's ids.
        model_type: the model's ``config.model_type`` (a policy checks it against its own).
    """
    inputs_embeds: torch.Tensor
    modality: torch.Tensor
    position_ids: torch.Tensor | None
    per_token: dict
    attention_mask: torch.Tensor
    input_ids: torch.Tensor
    model_type: str | None = None

    def prune(self, *, scores=None, keep=None, retention=None, policy=None) -> PrunedInputs:
        """:func:`avex.pruning.prune_inputs` with these positions and per-token inputs.
        ``policy`` (a trained :class:`~avex.policy.AVEXPolicy`, ``avex.load_policy``) scores
        the AV tokens instead of ``scores``; the model these inputs came from must be the one
        it was trained with (model type, hidden size), and their layout the one it saw."""
        if policy is not None and policy.trained_on is not None and self.model_type is not None \
                and self.model_type != policy.trained_on.model_type:
            raise ValueError(f"the policy was trained with another model: these inputs come "
                             f"from model type {self.model_type!r}, the policy was trained with "
                             f"{policy.trained_on.model_type!r}")
        return prune_inputs(self.inputs_embeds, self.modality, scores=scores, keep=keep,
                            retention=retention, position_ids=self.position_ids,
                            per_token=self.per_token, policy=policy)


class _Captured(Exception):
    pass


def token_id(config, *names: str) -> int:
    """The first of ``names`` the config (or its text config) sets; the attribute names of
    placeholder ids differ between model families and transformers versions."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"{type(config).__name__} sets none of {list(names)}; can't find the "
                     "placeholder token id")


@torch.no_grad()
def capture_decoder_inputs(model, inputs: dict) -> dict:
    """The keyword arguments ``model.get_decoder()`` receives when ``model(**inputs)`` runs;
    the forward stops there (the decoder itself does not run)."""
    decoder = model.get_decoder()
    seen: dict = {}

    def hook(module, args, kwargs):
        if args:
            raise TypeError(f"{type(module).__name__} was called with positional arguments; "
                            "this adapter reads keyword arguments only")
        seen.update(kwargs)
        raise _Captured

    handle = decoder.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        model(**inputs, use_cache=False)
    except _Captured:
        pass
    finally:
        handle.remove()
    if seen.get("inputs_embeds") is None:
        raise RuntimeError(f"{type(model).__name__} did not hand inputs_embeds to its decoder "
                           f"{type(decoder).__name__}; it can't be adapted this way")
    return seen


def adapted(model, inputs: dict, *, visual_ids: Iterable[int], audio_ids: Iterable[int],
            per_token: tuple[str, ...] = (), text_embeddings: Iterable[torch.Tensor] = (),
            decoder_inputs: dict | None = None) -> AdaptedInputs:
    """Capture the decoder inputs and code the modalities from the placeholder ids.

    ``text_embeddings``: learned vectors a model writes into placeholder slots that are not
    features (LLaVA-OneVision's ``image_newline``); slots holding exactly one of them are
    TEXT. ``decoder_inputs``: already-captured decoder inputs, to skip the capture."""
    for key in ("input_ids", "attention_mask"):
        if inputs.get(key) is None:
            raise ValueError(f"the processor output must hold {key}")
    input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
    seen = decoder_inputs if decoder_inputs is not None else capture_decoder_inputs(model,
                                                                                   inputs)
    embeds = seen["inputs_embeds"]
    visual_ids, audio_ids = list(visual_ids), list(audio_ids)
    modality = codes_from_ids(input_ids, attention_mask, visual_ids=visual_ids,
                              audio_ids=audio_ids).to(embeds.device)
    for vector in text_embeddings:
        same = (embeds == vector.to(embeds.dtype)).all(-1)
        modality = torch.where(same & (modality >= 0), 2, modality)
    check_codes(modality, input_ids=input_ids.to(embeds.device),
                placeholder_ids=visual_ids + audio_ids)
    positions = seen.get("position_ids")
    if positions is not None and positions.dim() == 3 and positions.shape[0] == 4:
        positions = positions[1:]  # [text; t, h, w] as generate builds them: the last three
    extras = {}
    for name in per_token:
        if seen.get(name) is None:
            raise RuntimeError(f"{type(model).__name__} passed no {name} to its decoder")
        extras[name] = seen[name]
    return AdaptedInputs(embeds, modality, positions, extras, attention_mask.to(embeds.device),
                         input_ids.to(embeds.device), getattr(model.config, "model_type", None))
