"""What every adapter shares: run the model on its processor's output up to its decoder, and
keep what the decoder would have received.

The merged ``inputs_embeds`` and the native position ids are the model's own (its vision and
audio towers, its ``masked_scatter`` of features into placeholders, its ``get_rope_index``),
read by a forward pre-hook on ``model.get_decoder()`` that stops the forward there. Nothing is
re-implemented, so the adapter follows the installed transformers version.
"""
from __future__ import annotations

import inspect
from typing import Iterable, NamedTuple

import torch

from avex import _checks
from avex.modality import AUDIO, VISUAL, check_attention_mask, check_codes, codes_from_ids
from avex.pruning import PrunedInputs, prune_inputs

__all__ = ["AdaptedInputs", "capture_decoder_inputs", "adapted", "token_id",
           "check_processor_outputs", "placeholder_runs", "check_placeholders",
           "refuse_unused", "require", "grid_token_counts", "audio_token_counts"]

# Forward arguments that are not processor outputs: the adapter computes them, or runs no
# decoding. Given to adapt, they would replace what the model computes, or do nothing.
NOT_PROCESSOR_OUTPUTS = {
    "inputs_embeds": "the adapter builds the embeddings from input_ids",
    "position_ids": "the adapter reads the model's own positions",
    "labels": "the adapter computes no loss",
    "cache": "the adapter runs no decoding", "past_key_values": "the adapter runs no decoding",
    "use_cache": "the adapter runs no decoding", "cache_position": "the adapter runs no decoding",
    "logits_to_keep": "the adapter stops before the decoder",
    "mm_encoder_outputs": "the adapter checks the features against the placeholders before "
                          "the towers run; pass the pixel values or audio features",
    "per_layer_inputs": "the adapter reads them from the model",
}


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

    def prune(self, *, scores=None, keep=None, retention=None, policy=None,
              per_item: bool = False) -> PrunedInputs:
        """:func:`avex.pruning.prune_inputs` with these positions and per-token inputs.
        ``policy`` (a trained :class:`~avex.policy.AVEXPolicy`, ``avex.load_policy``) scores
        the AV tokens instead of ``scores``; the model these inputs came from must be the one
        it was trained with (model type, hidden size), and their layout the one it saw.
        ``per_item``: K = round(rho N) per image or video, each scored alone with the prompt's
        text (what ``avex.integrations.vllm`` serves)."""
        if policy is not None and policy.trained_on is not None and self.model_type is not None \
                and self.model_type != policy.trained_on.model_type:
            raise ValueError(f"the policy was trained with another model: these inputs come "
                             f"from model type {self.model_type!r}, the policy was trained with "
                             f"{policy.trained_on.model_type!r}")
        return prune_inputs(self.inputs_embeds, self.modality, scores=scores, keep=keep,
                            retention=retention, position_ids=self.position_ids,
                            per_token=self.per_token, policy=policy, per_item=per_item)


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


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor {list(value.shape)} {value.dtype}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_processor_outputs(model, outputs: dict, *, refused: dict | None = None) -> dict:
    """The processor outputs ``adapt`` was given, checked before anything runs: every keyword
    one that ``model.forward`` takes by name (an unknown one would be dropped there, such as
    another family's pixel values or audio features), none of ``NOT_PROCESSOR_OUTPUTS`` or
    ``refused`` (name -> reason), ``input_ids`` a [B, L] integer tensor and
    ``attention_mask`` 0/1 of its shape with a token in every row. Returns the outputs without
    the keywords given as None."""
    refused = {**NOT_PROCESSOR_OUTPUTS, **(refused or {})}
    parameters = inspect.signature(type(model).forward).parameters
    takes = {name for name, p in parameters.items() if name != "self"
             and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - set(refused)
    family = type(model).__name__
    for name, value in outputs.items():
        if value is not None and name in refused:
            raise ValueError(f"adapt: {name}= is not a processor output ({refused[name]}); "
                             f"got {_describe(value)}")
    unknown = [name for name, value in outputs.items()
               if value is not None and name not in takes]
    if unknown:
        raise ValueError(
            f"adapt: {family} takes no keyword {', '.join(map(repr, unknown))} (got "
            f"{'; '.join(f'{n}={_describe(outputs[n])}' for n in unknown)}); its forward would "
            f"drop it. Is this another model family's processor output? {family} takes "
            f"{sorted(takes)}")
    inputs = {name: value for name, value in outputs.items() if value is not None}
    for key in ("input_ids", "attention_mask"):
        if key not in inputs:
            raise ValueError(f"the processor output must hold {key}")
    ids = inputs["input_ids"]
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor [B, L] of token ids (the processor's "
                        f"return_tensors='pt'), got {type(ids).__name__}")
    _checks.tensor("input_ids", ids, ndim=2, integer=True)
    mask = inputs["attention_mask"]
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor [B, L], got "
                        f"{type(mask).__name__}")
    check_attention_mask(mask, ids)
    empty = mask.sum(1) == 0
    if bool(empty.any()):
        raise ValueError(f"attention_mask row {int(torch.nonzero(empty)[0, 0])} is all 0: that "
                         "sample has no token")
    return inputs


def placeholder_runs(input_ids: torch.Tensor, tokens: Iterable[int]) -> list[tuple]:
    """(row, start, end) of every maximal run of positions holding one of ``tokens``, row by
    row: the order in which a model's ``masked_scatter`` fills them with features."""
    tokens = torch.tensor(list(tokens), dtype=input_ids.dtype, device=input_ids.device)
    hit = torch.isin(input_ids, tokens)
    width = hit.shape[1] + 1  # a False column between rows ends every run at its row's end
    flat = torch.cat([hit, hit.new_zeros(hit.shape[0], 1)], 1).flatten().to(torch.int8)
    edges = torch.diff(flat, prepend=flat.new_zeros(1))
    starts = torch.nonzero(edges == 1).flatten().tolist()
    ends = torch.nonzero(edges == -1).flatten().tolist()
    return [(start // width, start % width, end % width) for start, end in zip(starts, ends)]


def check_placeholders(what: str, token: int, blocks: list[tuple], expected: list[int],
                       source: str) -> None:
    """Each block (row, start, end, tokens) of ``what`` placeholders (id ``token``) holds the
    number of tokens its features give (``expected``, from ``source``), one block per item."""
    if len(blocks) != len(expected):
        raise ValueError(f"input_ids hold {len(blocks)} {what} block(s) (placeholder id "
                         f"{token}) but {source} describe(s) {len(expected)} {what}(s)")
    for i, ((row, start, end, count), want) in enumerate(zip(blocks, expected)):
        if count != want:
            raise ValueError(f"{what} {i} (sample {row}, positions {start}..{end - 1}) has "
                             f"{count} placeholder tokens (id {token}) but {source} give(s) "
                             f"it {want}; the processor's input_ids and features disagree")


def refuse_unused(inputs: dict, keys: Iterable[str], what: str, token: int) -> None:
    """Features given for a modality whose placeholder is nowhere in ``input_ids``: the model
    would ignore them."""
    for key in keys:
        if key in inputs:
            raise ValueError(f"{key} was given but input_ids hold no {what} placeholder (id "
                             f"{token}), so the model would ignore it; are these input_ids "
                             "from this model's processor?")


def require(inputs: dict, keys: Iterable[str], what: str, token: int, count: int) -> None:
    for key in keys:
        if key not in inputs:
            raise ValueError(f"input_ids hold {count} {what} placeholder tokens (id {token}) "
                             f"but no {key} was given (the processor returns it with the "
                             f"{what}); without it they would stay token embeddings, or the "
                             "model fails inside")


def grid_token_counts(inputs: dict, pixels_key: str, grid_key: str, merge: int) -> list[int]:
    """Qwen-style vision inputs: ``pixels_key`` [patches, d] and ``grid_key`` [items, 3]
    (t, h, w) agree, and each item's placeholder count, t * h * w / merge**2."""
    grid, pixels = inputs[grid_key], inputs[pixels_key]
    _checks.tensor(grid_key, grid, ndim=2, integer=True)
    if grid.shape[1] != 3 or bool((grid < 1).any()) or bool((grid[:, 1:] % merge != 0).any()):
        raise ValueError(f"{grid_key} must be [items, 3] rows of (t, h, w) >= 1 with h and w "
                         f"multiples of the spatial merge size {merge}, got {grid.tolist()}")
    _checks.tensor(pixels_key, pixels, ndim=2, floating=True)
    patches = int(grid.prod(-1).sum())
    if pixels.shape[0] != patches:
        raise ValueError(f"{pixels_key} has {pixels.shape[0]} patch rows but {grid_key} "
                         f"{grid.tolist()} describes {patches} (t * h * w summed)")
    return (grid.prod(-1) // merge ** 2).tolist()


def audio_token_counts(model, inputs: dict, features_key: str = "input_features",
                       mask_key: str = "feature_attention_mask") -> list[int]:
    """Whisper-style audio inputs: ``features_key`` [audios, mel, frames] and ``mask_key``
    [audios, frames] agree, and each audio's placeholder count, from its valid frames through
    the audio tower's own length formula."""
    features, mask = inputs[features_key], inputs[mask_key]
    _checks.tensor(features_key, features, ndim=3, floating=True)
    _checks.tensor(mask_key, mask, ndim=2)
    if mask.shape != (features.shape[0], features.shape[-1]):
        raise ValueError(f"{mask_key} must have shape [{features.shape[0]}, "
                         f"{features.shape[-1]}] (one row per audio of {features_key} "
                         f"{list(features.shape)}), got {list(mask.shape)}")
    check_attention_mask(mask, name=mask_key)
    tower = next((module for name, module in model.named_modules()
                  if name.rsplit(".", 1)[-1] == "audio_tower"), None)
    if tower is None:
        raise RuntimeError(f"{type(model).__name__} has no audio_tower to count its audio "
                           "tokens with")
    return tower._get_feat_extract_output_lengths(mask.sum(-1).long())[1].tolist()


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
            decoder_inputs: dict | None = None,
            native_positions: bool = False) -> AdaptedInputs:
    """Capture the decoder inputs and code the modalities from the placeholder ids.

    ``inputs``: what :func:`check_processor_outputs` returned, after the family's checks of
    its placeholders against its features. ``text_embeddings``: learned vectors a model
    writes into placeholder slots that are not features (LLaVA-OneVision's
    ``image_newline``); slots holding exactly one of them are TEXT. ``decoder_inputs``:
    already-captured decoder inputs, to skip the capture. ``native_positions``: the model
    must have computed its own position ids ([3, B, L] M-RoPE) where the prompt holds
    audio-visual tokens."""
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
    has_av = bool(((modality == VISUAL) | (modality == AUDIO)).any())
    if native_positions and has_av and (positions is None or positions.dim() != 3):
        raise RuntimeError(f"{type(model).__name__} computed no M-RoPE positions for this "
                           "prompt, so its audio-visual tokens would sit at 1-D positions; "
                           "pass every processor output (grids, mm_token_type_ids, ...)")
    extras = {}
    for name in per_token:
        if seen.get(name) is None:
            raise RuntimeError(f"{type(model).__name__} passed no {name} to its decoder")
        extras[name] = seen[name]
    return AdaptedInputs(embeds, modality, positions, extras, attention_mask.to(embeds.device),
                         input_ids.to(embeds.device), getattr(model.config, "model_type", None))
