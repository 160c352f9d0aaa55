"""Qwen2.5-VL with AVEX pruning in vLLM: each image and video keeps K = round(rho N) of its N
tokens, the ones the policy scores highest given the prompt's text, at the model's own
positions. Imported by vLLM's model registry (``avex.integrations.vllm.register``).

Three pieces of vLLM's multimodal-pruning interface, and what this file does with each:

* The processor fixes each item's placeholder count when the prompt is processed:
  ``_get_prompt_updates`` writes K placeholders, rho the request's own
  (``mm_processor_kwargs={"avex_retention": rho}``) or the engine's. The policy reads the
  prompt's text, which the vision encoder never sees, so ``apply`` adds the prompt's text
  token ids and the request's rho to every item's inputs (``avex_text_ids``,
  ``avex_retention``), and each item's cache identity (its hash: the processor cache, the
  encoder cache, prefix caching) folds in the text, the policy and that rho.
* ``embed_multimodal`` runs the vision tower, scores each item's tokens with the policy
  (``avex.pruning.select_keep``, the selection ``prune_inputs(per_item=True)`` makes) and
  returns the kept rows, each with its original (t, h, w) position and the start of the text
  after its item appended as exact channels (:mod:`.positions`).
* ``get_mrope_input_positions`` lays out the text up front (vLLM's rule for Qwen2.5-VL: the
  text after an item starts at the item's largest position + 1, which the keep-set doesn't
  change); ``recompute_mrope_positions`` strips the channels and puts the kept tokens at
  their own positions, one prefill chunk at a time (:func:`.positions.place_kept`).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
from collections.abc import Sequence
from functools import partial

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.qwen2_5_vl import (Qwen2_5_VLDummyInputsBuilder,
                                                   Qwen2_5_VLForConditionalGeneration,
                                                   Qwen2_5_VLMultiModalProcessor,
                                                   Qwen2_5_VLProcessingInfo)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import MultiModalBatchedField, MultiModalFieldElem
from vllm.multimodal.processing import PromptReplacement

from avex import _checks
from avex.integrations.vllm import (ARCHITECTURE, RETENTION_KEY, check_engine, positions,
                                   settings_of)
from avex.modality import TEXT, VISUAL
from avex.policy import AVEXPolicy
from avex.pruning import select_keep
from avex.selection import num_kept

TEXT_IDS = "avex_text_ids"
#: the request being processed: its rho (the processor object serves every request, so the
#: request's value travels in a context variable, not on the processor)
_REQUEST_RETENTION = contextvars.ContextVar("avex_request_retention")


def request_retention(mm_kwargs, default: float) -> float:
    """A request's rho: its ``mm_processor_kwargs["avex_retention"]``, checked, else the
    engine's ``default``."""
    value = (mm_kwargs or {}).get(RETENTION_KEY)
    if value is None:
        return default
    return _checks.ratio(f"mm_processor_kwargs[{RETENTION_KEY!r}]", value)


class AVEXQwen2_5_VLMultiModalProcessor(Qwen2_5_VLMultiModalProcessor):
    """K = round(rho N) placeholders per item, and the prompt's text routed to the encoder."""

    def _placeholder_ids(self, hf_processor_mm_kwargs) -> dict:
        hf_processor = self.info.get_hf_processor(**hf_processor_mm_kwargs)
        vocab = self.info.get_tokenizer().get_vocab()
        return {"image": vocab[hf_processor.image_token], "video": vocab[hf_processor.video_token]}

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
        settings = settings_of(self.info.get_hf_config())
        placeholder = self._placeholder_ids(hf_processor_mm_kwargs)
        merge = self.info.get_image_processor(**hf_processor_mm_kwargs).merge_size

        retention = _REQUEST_RETENTION.get(settings.retention)

        def replacement(item_idx: int, modality: str):
            grid = out_mm_kwargs[modality][item_idx][f"{modality}_grid_thw"].data
            tokens = int(grid.prod()) // merge ** 2
            return [placeholder[modality]] * int(num_kept(retention, tokens))

        return [PromptReplacement(modality=modality, target=[placeholder[modality]],
                                  replacement=partial(replacement, modality=modality))
                for modality in ("image", "video")]

    def _text_ids(self, prompt: Sequence[int]) -> list[int]:
        """The prompt's text: every token but the image and video placeholders (what
        avex.modality codes TEXT), the same before and after the placeholders are expanded."""
        config = self.info.get_hf_config()
        media = {config.image_token_id, config.video_token_id}
        return [int(token) for token in prompt if int(token) not in media]

    def _get_mm_hashes(self, inputs):
        hashes = super()._get_mm_hashes(inputs)
        settings = settings_of(self.info.get_hf_config())
        text = np.asarray(self._text_ids(inputs.prompt), dtype=np.int64).tobytes()
        retention = _REQUEST_RETENTION.get(settings.retention)
        salt = f"avex|{settings.policy}|{retention!r}|".encode() + text
        return {modality: [hashlib.sha256(item.encode() + b"|" + salt).hexdigest()
                           for item in items]
                for modality, items in hashes.items()}

    def apply(self, inputs, timing_ctx):
        # the request's rho is read here and kept from the Hugging Face processor, which
        # would take an unknown keyword for one of its own
        kwargs = dict(inputs.hf_processor_mm_kwargs)
        retention = request_retention(kwargs, settings_of(self.info.get_hf_config()).retention)
        kwargs.pop(RETENTION_KEY, None)
        inputs = dataclasses.replace(inputs, hf_processor_mm_kwargs=kwargs)
        token = _REQUEST_RETENTION.set(retention)
        try:
            result = super().apply(inputs, timing_ctx)
        finally:
            _REQUEST_RETENTION.reset(token)
        text = torch.tensor(self._text_ids(result["prompt_token_ids"]), dtype=torch.long)
        rho = torch.tensor([retention], dtype=torch.float64)
        field = MultiModalBatchedField(keep_on_cpu=True)
        for items in result["mm_kwargs"].values():
            for item in items:
                if item is not None:  # None: the engine has this item (same hash) cached
                    item[TEXT_IDS] = MultiModalFieldElem(data=text, field=field)
                    item[RETENTION_KEY] = MultiModalFieldElem(data=rho, field=field)
        return result


@MULTIMODAL_REGISTRY.register_processor(AVEXQwen2_5_VLMultiModalProcessor,
                                        info=Qwen2_5_VLProcessingInfo,
                                        dummy_inputs=Qwen2_5_VLDummyInputsBuilder)
class AVEXQwen2_5_VLForConditionalGeneration(Qwen2_5_VLForConditionalGeneration):
    """Qwen2.5-VL whose images and videos keep the tokens an AVEX policy chooses."""

    avex_pruning = True  # the runners' cue (avex.integrations.vllm._let_runners_prune)

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        # the refusal table again, in the worker, before any weights load
        settings = check_engine(vllm_config.model_config.hf_config, ARCHITECTURE)
        mm_config = vllm_config.model_config.get_multimodal_config()
        if mm_config.is_multimodal_pruning_enabled():
            raise ValueError(f"video_pruning_rate={mm_config.video_pruning_rate} turns on vLLM's "
                             "own video pruning; AVEX pruning replaces it: leave it unset")
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.is_multimodal_pruning_enabled = False  # the parent's flag means EVS
        self.avex_retention = settings.retention
        # float32 on the CPU whatever vLLM's default dtype and device are while it builds
        # the model; kept out of the module tree, so vLLM's weight loader doesn't look for it
        with _default_dtype(torch.float32), torch.device("cpu"):
            policy = AVEXPolicy.from_pretrained(settings.policy)
        self.__dict__["avex_policy"] = policy

    def get_encoder_cudagraph_config(self):
        """No encoder CUDA graphs (GPU): that path bypasses embed_multimodal, where the
        pruning happens (vLLM turns them off for its own pruning the same way)."""
        config = super().get_encoder_cudagraph_config()
        return dataclasses.replace(config, modalities=[], max_frames_per_video=1)

    # -- the encoder: the kept rows of each item, with their positions ---------------------------
    def embed_multimodal(self, **kwargs: object):
        texts = kwargs.pop(TEXT_IDS, None)
        rates = kwargs.pop(RETENTION_KEY, None)
        inputs = self._parse_and_validate_multimodal_inputs(**kwargs)
        if not inputs:
            return []
        if texts is None:
            raise RuntimeError(f"{ARCHITECTURE}: the media items came without {TEXT_IDS}; they "
                               "were not processed by the plugin's processor")
        texts = list(texts)
        rates = [self.avex_retention] * len(texts) if rates is None else \
            [float(r.reshape(-1)[0]) for r in rates]
        out = []
        for modality, item_inputs in inputs.items():
            if modality == "image":
                embeds = self._process_image_input(item_inputs)
                factors = [1.0] * len(embeds)
            else:
                embeds = self._process_video_input(item_inputs)
                seconds = item_inputs.get("second_per_grid_ts")
                seconds = [1.0] * len(embeds) if seconds is None else seconds.tolist()
                per_second = getattr(self.config.vision_config, "tokens_per_second", 1.0)
                factors = [s * per_second for s in seconds]
            grids = item_inputs[f"{modality}_grid_thw"].tolist()
            for emb, grid, factor in zip(embeds, grids, factors):
                out.append(self._kept_rows(emb, grid, factor, texts[len(out)],
                                           rates[len(out)]))
        if len(out) != len(texts):
            raise RuntimeError(f"{len(texts)} {TEXT_IDS} for {len(out)} media items")
        return tuple(out)

    def _kept_rows(self, embeds, grid, t_factor, text_ids, retention) -> torch.Tensor:
        merge = self.visual.spatial_merge_size
        where = positions.item_positions(grid, merge, t_factor)
        if int(num_kept(retention, embeds.shape[0])) < embeds.shape[0]:
            keep = self._keep(embeds, text_ids, retention)
            codes = torch.full((1, len(keep)), VISUAL, dtype=torch.long, device=embeds.device)
            # a policy saved with a merge threshold folds the item's dropped tokens in first
            embeds = self.avex_policy.merge(embeds[None], codes, keep[None])[0]
            embeds, where = embeds[keep], where[keep.cpu()]
        channels = positions.encode(where[:, :3], embeds.dtype).to(embeds.device)
        return torch.cat([embeds, channels], 1)

    def _keep(self, embeds, text_ids, retention) -> torch.Tensor:
        """bool [N]: the item's K tokens by the policy's selection rule (Top-K, or set-aware
        where the saved policy says so), scored with the prompt's text as
        ``prune_inputs(per_item=True)`` scores one item of a row."""
        policy = self.avex_policy
        if policy.modality_embedding.weight.device != embeds.device:
            policy.to(embeds.device)
        text_ids = torch.as_tensor(text_ids, dtype=torch.long).to(embeds.device).flatten()
        text = self.language_model.embed_input_ids(text_ids).to(embeds.dtype)
        row = torch.cat([text, embeds])[None]
        codes = torch.full(row.shape[:2], VISUAL, dtype=torch.long, device=embeds.device)
        codes[:, :text.shape[0]] = TEXT
        keep = select_keep(row, codes, policy=policy, retention=retention)
        return keep[0, text.shape[0]:]

    # -- positions --------------------------------------------------------------------------------
    def get_mrope_input_positions(self, input_tokens, mm_features):
        """Positions of the pruned prompt: text counts on from the end of the text or item
        before it (an item ends at its largest position + 1, the item of the full prompt);
        an item's K placeholders get provisional positions that ``recompute_mrope_positions``
        replaces with the kept tokens' own when their embeddings arrive."""
        merge = self.config.vision_config.spatial_merge_size
        chunks, at, next_position = [], 0, 0
        for offset, grid_t, grid_h, grid_w, t_factor in self.iter_mm_grid_thw(mm_features):
            feature = next(f for f in mm_features if f.mm_position.offset == offset)
            text = offset - at
            chunks.append(np.broadcast_to(np.arange(text), (3, text)) + next_position)
            start = next_position + text
            kept = feature.mm_position.length
            chunks.append(np.broadcast_to(np.arange(kept), (3, kept)) + start)
            grid = (grid_t, grid_h * merge, grid_w * merge)
            next_position = start + int(positions.item_positions(grid, merge, t_factor)[0, 3])
            at = offset + kept
        text = len(input_tokens) - at
        chunks.append(np.broadcast_to(np.arange(text), (3, text)) + next_position)
        llm_positions = np.concatenate(chunks, axis=1).reshape(3, -1)
        return torch.from_numpy(llm_positions), int(llm_positions.max() + 1 - len(input_tokens))

    def recompute_mrope_positions(self, input_ids, multimodal_embeddings, mrope_positions,
                                  num_computed_tokens):
        """vLLM calls this with each prefill chunk's media rows: strip the channels and put
        the kept tokens at their own positions (:func:`.positions.place_kept`); the text's
        positions, laid out by ``get_mrope_input_positions``, don't move."""
        width = positions.CHANNELS
        embeds = [mm[:, :-width] for mm in multimodal_embeddings]
        kept = [positions.decode(mm[:, -width:]) for mm in multimodal_embeddings]
        new_positions = positions.place_kept(
            input_ids, kept, mrope_positions, num_computed_tokens,
            (self.config.image_token_id, self.config.video_token_id))
        return embeds, new_positions, int(new_positions.max() + 1 - len(input_ids))


@contextlib.contextmanager
def _default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
