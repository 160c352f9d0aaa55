"""A frozen captioner: a Hugging Face causal LM, its tokenizer, and a projector from the cached
feature dim d to the LM's hidden size D.

Inputs are laid out as VideoLLaMA 2 lays them out: prompt prefix text, the video tokens, the
audio tokens, then the prompt suffix text; the caption is generated after the suffix. Each
position carries a modality code (:data:`PAD` -1, :data:`VISUAL` 0, :data:`AUDIO` 1,
:data:`TEXT` 2). Batches are left-padded so that every row's generation starts at the last column.
"""
from __future__ import annotations


import hashlib
import inspect
import json
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file

from .. import _checks
from ..adapters import has_own_positions
from ..data.cache import Clip
from ..files import load_weights, save_tensors_atomically
from ..modality import AUDIO, PAD, TEXT, VISUAL
from ..paths import CAPTIONER_FILE, attention_dir, default_captioner_path
from ..progress import progress_bar, transformers_progress
from ..pruning import expand_av_keep, forward, generate, prune_inputs
from ..ptb_tokenizer import tokenize
from .batch import AVBatch, AVProjector, TeacherForced, TeacherForcedInputs, left_pad
from .reference import verify_reference

PROJECTOR_FILE = "avex_projector.safetensors"
CAPTIONER_FORMAT = "avex-captioner"


def tokenizer_dir(path) -> Path:
    """Where a captioner directory keeps its tokenizer: a ``tokenizer/`` subfolder when there is
    one, else the directory itself (an ordinary Hugging Face model). The embedded captioner uses
    the subfolder: beside a ``qwen2`` config.json, ``AutoTokenizer`` would swap a word-level
    tokenizer for Qwen2's byte-level one."""
    path = Path(path)
    return path / "tokenizer" if (path / "tokenizer" / "tokenizer_config.json").is_file() \
        else path


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _load_model(path: Path, dtype, progress: bool = True):
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


class FrozenCaptioner:
    """A frozen causal LM that captions audio-visual token sets.

    ``FrozenCaptioner.load(path)`` takes the embedded captioner's directory (written by
    ``python -m avex.captioner train``), or any local Hugging Face causal-LM directory that
    takes ``inputs_embeds`` (its features must then already be in the LM's hidden size, or a
    projector file must sit beside it). ``path=None`` loads the default embedded captioner.
    ``references`` (reference captions of the cache it will caption) are round-tripped
    through its tokenizer first (:func:`check_round_trip`).
    """

    def __init__(self, model, tokenizer, projector: AVProjector, *, path=None,
                 max_new_tokens: int = 32, info: dict | None = None):
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.projector = projector.to(self.device, self.dtype).eval()
        for p in self.projector.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.path = None if path is None else Path(path)
        self.max_new_tokens = max_new_tokens
        self.info = dict(info or {})
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no eos_token_id; captions could not end")
        self.eos_token_id = eos

    # -- loading --------------------------------------------------------------------------------
    @classmethod
    def load(cls, path=None, *, device=None, dtype: torch.dtype = torch.float32,
             feature_dim: int | None = None, references=None,
             progress: bool = True) -> "FrozenCaptioner":
        from transformers import AutoTokenizer

        if path is None or path == "embedded":
            path = default_captioner_path()
            if not (path / CAPTIONER_FILE).is_file():
                raise FileNotFoundError(
                    f"no embedded captioner at {path}; train it with `python -m avex.captioner "
                    "train` (or call avex.captioner.ensure_captioner())")
        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a Hugging Face model directory "
                                    "(no config.json)")
        info, max_new = {}, 32
        if (path / CAPTIONER_FILE).is_file():  # checked before the model is loaded
            try:
                info = json.loads((path / CAPTIONER_FILE).read_text(encoding="utf-8"))
            except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
                raise ValueError(f"{path / CAPTIONER_FILE}: corrupt or truncated ({err}); "
                                 "retrain with --overwrite") from None
            if not isinstance(info, dict) or info.get("format") != CAPTIONER_FORMAT:
                got = info.get("format") if isinstance(info, dict) else info
                raise ValueError(f"{path / CAPTIONER_FILE}: 'format' must be "
                                 f"{CAPTIONER_FORMAT!r}, got {got!r}")
            if isinstance(info.get("feature_dim"), bool) or \
                    not isinstance(info.get("feature_dim"), int) or info["feature_dim"] < 1:
                raise ValueError(f"{path / CAPTIONER_FILE}: 'feature_dim' must be a positive "
                                 f"int, got {info.get('feature_dim')!r}")
            if info.get("reference") is not None:  # a shipped reference: the same bytes
                verify_reference(path, info["reference"])
        if device is not None and not isinstance(device, torch.device):
            # a CUDA index this machine lacks is named here, not by torch's assert at .to()
            device = None if _checks.available_device("device", device) == "auto" else device
        device = torch.device(device) if device is not None else default_device()
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir(path)))
        if references is not None:  # before the weights are loaded: a bad tokenizer fails fast
            check_round_trip(tokenizer, references, path)
        model = _load_model(path, dtype, progress).to(device)
        hidden = model.get_input_embeddings().embedding_dim
        if info:
            projector = AVProjector(info["feature_dim"], hidden, info.get("projector", "mlp"))
            if projector.kind == "mlp":
                load_weights(projector, path / PROJECTOR_FILE)
            max_new = int(info.get("max_new_tokens", max_new))
        else:  # a plain Hugging Face model: features must already be in its hidden size
            projector = AVProjector(hidden, hidden, "identity")
        if feature_dim is not None and feature_dim != projector.feature_dim:
            raise ValueError(f"feature_dim={feature_dim} but the captioner at {path} takes "
                             f"features of dim {projector.feature_dim}"
                             + ("" if projector.kind == "mlp" else
                                " (no avex projector beside it: features must be in the LM's "
                                "hidden size)"))
        return cls(model, tokenizer, projector, path=path, max_new_tokens=max_new, info=info)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def hidden_size(self) -> int:
        return self.model.get_input_embeddings().embedding_dim

    @property
    def feature_dim(self) -> int:
        return self.projector.feature_dim

    # -- inputs ---------------------------------------------------------------------------------
    def embed_text(self, ids) -> torch.Tensor:
        """Token ids [L] -> the LM's input embeddings [L, D] (e.g. the policy's H_t)."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device)
        with torch.no_grad():
            return self.model.get_input_embeddings()(ids)

    def _prompt_side(self, clip: Clip, side: str) -> torch.Tensor:
        ids = getattr(clip, f"prompt_{side}_ids")
        if ids is not None:
            return self.embed_text(ids)
        embeds = getattr(clip, f"prompt_{side}_embeds")
        if embeds is None or embeds.shape[-1] != self.hidden_size:
            raise ValueError(f"clip {clip.clip_id!r}: prompt_{side} embeddings must have dim "
                             f"{self.hidden_size}, got "
                             f"{None if embeds is None else list(embeds.shape)}")
        return embeds.to(self.device, self.dtype)

    def embed(self, clips: Sequence[Clip]) -> AVBatch:
        """Clips -> an :class:`AVBatch` (prefix text, video, audio, suffix text; left-padded).
        Clips exported from a real model (``Clip.merged``) are taken as stored: the model's
        merged embeddings, codes and positions."""
        if isinstance(clips, (str, Clip)) or not hasattr(clips, "__len__"):
            raise TypeError(f"clips must be a sequence of Clip, got {type(clips).__name__}")
        if len(clips) == 0:
            raise ValueError("clips is empty")
        for i, clip in enumerate(clips):
            if not isinstance(clip, Clip):
                raise TypeError(f"clips[{i}] must be a Clip (from a FeatureCache), got "
                                f"{type(clip).__name__}")
        merged = [clip.merged is not None for clip in clips]
        if any(merged):
            if not all(merged):
                raise ValueError("a batch mixes clips exported from a model (merged) with "
                                 "plain ones; a cache holds one kind")
            return self._embed_merged(clips)
        if has_own_positions(self.model.config.model_type):
            raise ValueError(f"{type(self.model).__name__} has its own positions ([3, B, L]); "
                             "its clips must be exported with them (CacheWriter.add_merged), "
                             f"clip {clips[0].clip_id!r} was not")
        embeds, mods, counts = [], [], []
        with torch.no_grad():
            for clip in clips:
                for name in ("visual", "audio"):
                    tensor = getattr(clip, name)
                    if tensor.dim() != 2 or tensor.shape[1] != self.feature_dim:
                        raise ValueError(f"clip {clip.clip_id!r}: {name} has shape "
                                         f"{list(tensor.shape)} but the captioner takes "
                                         f"features of dim {self.feature_dim}")
                prefix = self._prompt_side(clip, "prefix")
                suffix = self._prompt_side(clip, "suffix")
                visual = self.projector(clip.visual.to(self.device, self.dtype), VISUAL)
                audio = self.projector(clip.audio.to(self.device, self.dtype), AUDIO)
                embeds.append(torch.cat([prefix, visual, audio, suffix]))
                mods.append(torch.cat([torch.full((len(prefix),), TEXT),
                                       torch.full((len(visual),), VISUAL),
                                       torch.full((len(audio),), AUDIO),
                                       torch.full((len(suffix),), TEXT)]).to(self.device))
                counts.append((len(visual), len(audio)))
        masks = [torch.ones(len(m), dtype=torch.long, device=self.device) for m in mods]
        attention_mask = left_pad(masks, 0)
        position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
        return AVBatch(inputs_embeds=left_pad(embeds, 0.0), attention_mask=attention_mask,
                       modality=left_pad(mods, PAD), position_ids=position_ids,
                       clip_ids=[c.clip_id for c in clips], av_counts=counts)

    def _embed_merged(self, clips: Sequence[Clip]) -> AVBatch:
        embeds, mods, positions = [], [], []
        for clip in clips:
            stored = clip.merged["inputs_embeds"]
            if stored.shape[-1] != self.hidden_size:
                raise ValueError(f"clip {clip.clip_id!r}: merged embeddings have width "
                                 f"{stored.shape[-1]} but {type(self.model).__name__} takes "
                                 f"{self.hidden_size}")
            embeds.append(stored.to(self.device, self.dtype))
            mods.append(clip.merged["modality"].to(self.device))
            positions.append(clip.merged["position_ids"])
        native = None
        if any(p is not None for p in positions):
            if any(p is None for p in positions) or len({p.dim() for p in positions}) > 1:
                raise ValueError("the clips of a batch must all hold position ids of one rank")
            native = left_pad([p.to(self.device).movedim(-1, 0) for p in positions], 0)
            native = native.permute(*range(2, native.dim()), 0, 1)  # [B, L, ...] -> [..., B, L]
        elif has_own_positions(self.model.config.model_type):
            raise ValueError(f"{type(self.model).__name__} has its own positions; clip "
                             f"{clips[0].clip_id!r} was exported without them")
        masks = [torch.ones(len(m), dtype=torch.long, device=self.device) for m in mods]
        attention_mask = left_pad(masks, 0)
        counts = [(int((m == VISUAL).sum()), int((m == AUDIO).sum())) for m in mods]
        return AVBatch(inputs_embeds=left_pad(embeds, 0.0), attention_mask=attention_mask,
                       modality=left_pad(mods, PAD),
                       position_ids=(attention_mask.cumsum(1) - 1).clamp(min=0),
                       clip_ids=[c.clip_id for c in clips], av_counts=counts,
                       native_position_ids=native)

    # -- generation -----------------------------------------------------------------------------
    def _sequence_keep(self, batch: AVBatch, keep) -> torch.Tensor:
        """``keep`` in any accepted form -> bool [B, L] in the sequence layout."""
        device = batch.modality.device
        if keep is None:
            return batch.modality != PAD
        if isinstance(keep, (list, tuple)):
            width = max(sum(c) for c in batch.av_counts)
            rows = torch.zeros(len(keep), width, dtype=torch.bool)
            for b, row in enumerate(keep):
                row = torch.as_tensor(row)
                if row.dtype != torch.bool or row.dim() != 1 or row.numel() > width:
                    raise ValueError(f"keep[{b}] must be a 1-D bool tensor over the row's AV "
                                     f"tokens, got {row.dtype} of shape {list(row.shape)}")
                rows[b, :row.numel()] = row
            keep = rows
        if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool or keep.dim() != 2:
            raise ValueError("keep must be a bool tensor [B, M] over the AV tokens (video then "
                             "audio), [B, L] over sequence positions, or a list of B bool "
                             f"tensors; got {type(keep).__name__}")
        if keep.shape[0] != len(batch):
            raise ValueError(f"keep has {keep.shape[0]} rows but the batch has {len(batch)}")
        keep = keep.to(device)
        if keep.shape == batch.modality.shape:
            return keep | (batch.modality == TEXT)
        return expand_av_keep(keep, batch.modality)

    @torch.no_grad()
    def generate_tokens(self, inputs_embeds: torch.Tensor, modality: torch.Tensor,
                        keep: torch.Tensor, *, max_new_tokens: int, num_beams: int = 1,
                        position_ids=None) -> list[list[int]]:
        """The one captioning path: prune to ``keep`` (bool [B, L] or [B, S, L] in the sequence
        layout), generate greedily (or with beams) at original positions (the model's own
        ``position_ids`` where given: ``AVBatch.native_position_ids``). Returns B * S token id
        lists, row b * S + s, each cut after its first EOS (kept: the caption ended there) or
        at ``max_new_tokens``: the sequence :meth:`teacher_forced` scores."""
        if position_ids is None and has_own_positions(self.model.config.model_type):
            raise ValueError(f"{type(self.model).__name__} needs its own position_ids "
                             "(AVBatch.native_position_ids); a count of tokens is wrong for it")
        pruned = prune_inputs(inputs_embeds, modality, keep=keep, positions="original",
                              position_ids=position_ids)
        pad = self.tokenizer.pad_token_id
        tokens = generate(self.model, pruned, max_new_tokens=max_new_tokens,
                          num_beams=num_beams, do_sample=False, eos_token_id=self.eos_token_id,
                          pad_token_id=self.eos_token_id if pad is None else pad)
        rows = []
        for row in tokens.tolist():
            if self.eos_token_id in row:
                row = row[:row.index(self.eos_token_id) + 1]
            rows.append(row)
        return rows

    def decode(self, tokens: Sequence[int]) -> str:
        """A caption's text from its token ids (:meth:`generate_tokens`): cut at EOS, special
        tokens dropped, whitespace collapsed."""
        tokens = list(tokens)
        if self.eos_token_id in tokens:
            tokens = tokens[:tokens.index(self.eos_token_id)]
        return " ".join(self.tokenizer.decode(tokens, skip_special_tokens=True).split())

    def generate_captions(self, inputs_embeds: torch.Tensor, modality: torch.Tensor,
                          keep: torch.Tensor, *, max_new_tokens: int,
                          num_beams: int = 1, position_ids=None) -> list[str]:
        """:meth:`generate_tokens`, decoded (:meth:`decode`). Returns B * S captions, row
        b * S + s."""
        return [self.decode(row) for row in self.generate_tokens(
            inputs_embeds, modality, keep, max_new_tokens=max_new_tokens, num_beams=num_beams,
            position_ids=position_ids)]

    def keep_set_tokens(self, inputs_embeds: torch.Tensor, modality: torch.Tensor,
                        av_keep: torch.Tensor, *, num_beams: int = 1, max_new_tokens: int = 24,
                        position_ids=None) -> list[list[list[int]]]:
        """:meth:`caption_keep_sets` as token ids (:meth:`generate_tokens`): [B][S] lists."""
        batch, sets = av_keep.shape[:2]
        flat = self.generate_tokens(inputs_embeds, modality, expand_av_keep(av_keep, modality),
                                    max_new_tokens=max_new_tokens, num_beams=num_beams,
                                    position_ids=position_ids)
        return [flat[b * sets:(b + 1) * sets] for b in range(batch)]

    def caption_keep_sets(self, inputs_embeds: torch.Tensor, modality: torch.Tensor,
                          av_keep: torch.Tensor, *, num_beams: int = 1,
                          max_new_tokens: int = 24, position_ids=None) -> list[list[str]]:
        """Caption every keep-set of every sample in one batched generation.

        ``av_keep`` is bool [B, S, M] on the AV axis (e.g. ``Exchanges.sets()``); the S sets of
        a sample are compacted from its one copy of ``inputs_embeds``. Returns captions [B][S].
        """
        return [[self.decode(row) for row in sets] for sets in self.keep_set_tokens(
            inputs_embeds, modality, av_keep, num_beams=num_beams,
            max_new_tokens=max_new_tokens, position_ids=position_ids)]

    def teacher_forced_inputs(self, inputs_embeds: torch.Tensor, modality: torch.Tensor,
                              av_keep: torch.Tensor, targets: Sequence[Sequence[int]], *,
                              position_ids=None) -> "TeacherForcedInputs":
        """The inputs :meth:`teacher_forced` runs its one forward on (checked as it documents):
        each keep-set's compacted prompt with its sample's target tokens appended at the
        positions decoding would give them. Also what the caption-attention warmup teacher
        (:mod:`avex.training.warmup_teachers`) reads its attention maps from."""
        _checks.tensor("av_keep", av_keep, ndim=3, boolean=True)
        if isinstance(targets, torch.Tensor) or not isinstance(targets, (list, tuple)):
            raise TypeError(f"targets must be a list of B token id sequences, got "
                            f"{type(targets).__name__}")
        batch, sets = av_keep.shape[:2]
        if len(targets) != batch:
            raise ValueError(f"targets has {len(targets)} sequences but av_keep has {batch} "
                             "samples")
        vocab = self.model.get_input_embeddings().num_embeddings
        lengths = []
        for b, target in enumerate(targets):
            ids = list(target)
            if not ids or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab
                              for t in ids):
                raise ValueError(f"targets[{b}] must be a non-empty list of token ids in "
                                 f"[0, {vocab}), got {ids!r}")
            lengths.append(len(ids))
        if position_ids is None and has_own_positions(self.model.config.model_type):
            raise ValueError(f"{type(self.model).__name__} needs its own position_ids "
                             "(AVBatch.native_position_ids); a count of tokens is wrong for it")
        steps = max(lengths)
        device = inputs_embeds.device
        pruned = prune_inputs(inputs_embeds, modality, keep=expand_av_keep(av_keep, modality),
                              positions="original", position_ids=position_ids)
        # a short target is padded with EOS after its end; those steps sit after every real
        # token of the row (causal attention: nothing real reads them) and are masked below
        padded = torch.full((batch, steps), self.eos_token_id, dtype=torch.long, device=device)
        for b, target in enumerate(targets):
            padded[b, :lengths[b]] = torch.as_tensor(list(target), dtype=torch.long)
        length = torch.as_tensor(lengths, device=device)
        valid = torch.arange(steps, device=device)[None, :] < length[:, None]      # [B, T]
        rows = padded.repeat_interleave(sets, 0)                                    # [R, T]
        offsets = torch.arange(steps, device=device)
        positions = pruned.next_position[..., None] + offsets                     # [..., R, T]
        extended = pruned._replace(
            inputs_embeds=torch.cat([pruned.inputs_embeds,
                                     self.embed_text(rows).to(pruned.inputs_embeds.dtype)], 1),
            attention_mask=torch.cat([pruned.attention_mask, torch.ones_like(rows)], 1),
            position_ids=torch.cat([pruned.position_ids, positions], -1),
            # the sequence the forward stands for: the full prompt and the caption's steps
            original_length=None if pruned.original_length is None
            else pruned.original_length + steps)
        return TeacherForcedInputs(extended, rows, valid.repeat_interleave(sets, 0), length,
                                   steps)

    @torch.no_grad()
    def teacher_forced(self, inputs_embeds: torch.Tensor, modality: torch.Tensor,
                       av_keep: torch.Tensor, targets: Sequence[Sequence[int]], *,
                       position_ids=None) -> "TeacherForced":
        """How well each keep-set supports a given caption: the caption's tokens fed after the
        kept prompt, ONE forward pass for every set of every sample.

        ``av_keep`` is bool [B, S, M] on the AV axis, as :meth:`caption_keep_sets` takes it
        (compacted by the same ``prune_inputs`` path, at original positions, the model's own
        ``position_ids`` respected); ``targets`` holds B token id sequences, sample b's caption
        (e.g. y_full: :meth:`generate_tokens` of the full tokens, its EOS included where the
        caption ended), scored under each of the sample's S sets. Step t's token sits at the
        position decoding would give it (the row's last original position + 1 + t).

        Returns a :class:`TeacherForced`: per step the target token's log-probability and its
        logit margin over the best other token. Greedy decoding under a set writes exactly the
        target iff every margin is > 0 (0 is a tie)."""
        forced = self.teacher_forced_inputs(inputs_embeds, modality, av_keep, targets,
                                            position_ids=position_ids)
        batch, sets = av_keep.shape[:2]
        steps, rows, length = forced.steps, forced.targets, forced.length
        keep_logits = ({"logits_to_keep": steps + 1} if "logits_to_keep" in
                       inspect.signature(self.model.forward).parameters else {})
        logits = forward(self.model, forced.inputs, use_cache=False, **keep_logits).logits
        # the logits of the last prompt token predict step 0; step T - 1's own are unused
        logits = logits[:, -(steps + 1):-1].float()                                 # [R, T, V]
        log_prob = torch.log_softmax(logits, -1).gather(-1, rows[..., None])[..., 0]
        chosen = logits.gather(-1, rows[..., None])[..., 0]
        rival = logits.scatter(-1, rows[..., None], float("-inf")).amax(-1)
        margin = chosen - rival
        valid_rows = forced.valid
        log_prob = torch.where(valid_rows, log_prob, torch.zeros_like(log_prob))
        margin = torch.where(valid_rows, margin, torch.full_like(margin, float("inf")))
        return TeacherForced(log_prob.view(batch, sets, steps), margin.view(batch, sets, steps),
                             length)

    def caption(self, inputs, *, keep=None, max_new_tokens: int | None = None,
                num_beams: int = 1, batch_size: int = 128, progress: bool = False) -> list:
        """One caption per clip (``inputs``: a sequence of :class:`Clip`) or per row of an
        :class:`AVBatch`, from the full tokens or, with ``keep``, from the text plus the kept
        AV tokens at their original positions (``avex.pruning.prune_inputs`` + ``generate``).

        ``keep``: bool [N, M] over each row's AV tokens (video then audio; extra columns
        ignored), a list of N bool tensors [M_i], or bool [N, L] over sequence positions (AVBatch
        input only). Greedy decoding by default; ``num_beams=3`` is the paper's setting."""
        max_new = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
            raise ValueError(f"num_beams must be an int >= 1, got {num_beams!r}")
        _checks.int_at_least("batch_size", batch_size, 1)
        if isinstance(inputs, (str, Clip)):
            raise TypeError(f"inputs must be an AVBatch or a sequence of Clip, got "
                            f"{type(inputs).__name__}")
        if isinstance(inputs, AVBatch):
            return self.generate_captions(inputs.inputs_embeds, inputs.modality,
                                          self._sequence_keep(inputs, keep),
                                          max_new_tokens=max_new, num_beams=num_beams,
                                          position_ids=inputs.native_position_ids)
        clips = list(inputs)
        if keep is not None and len(keep) != len(clips):
            raise ValueError(f"keep has {len(keep)} rows but {len(clips)} clips were given")
        texts = []
        starts = range(0, len(clips), batch_size)
        if progress:
            starts = progress_bar(starts, desc="captioning", unit="batch")
        for start in starts:
            chunk = self.embed(clips[start:start + batch_size])
            part = None if keep is None else keep[start:start + batch_size]
            texts.extend(self.generate_captions(chunk.inputs_embeds, chunk.modality,
                                                self._sequence_keep(chunk, part),
                                                max_new_tokens=max_new, num_beams=num_beams,
                                                position_ids=chunk.native_position_ids))
        return texts

    # -- attention ------------------------------------------------------------------------------
    @torch.no_grad()
    def text_to_av_attention(self, inputs, *, query: str = "suffix",
                             batch_size: int = 64) -> list:
        """Attention from prompt text to each AV token in the full-token prefill: the softmax
        weight on the AV token, averaged over every layer, every head and the query positions
        (``query="suffix"``: all prompt-suffix text tokens; ``"last"``: the last prompt token
        only, as FastV scores). Returns one float32 tensor [M_b] per row, video then audio."""
        if query not in ("suffix", "last"):
            raise ValueError(f"query must be 'suffix' or 'last', got {query!r}")
        if not isinstance(inputs, AVBatch):
            clips = list(inputs)
            out = []
            for start in range(0, len(clips), batch_size):
                out.extend(self.text_to_av_attention(self.embed(clips[start:start + batch_size]),
                                                     query=query))
            return out
        return text_to_av_attention(self.model, inputs, query=query)

    def cached_text_to_av_attention(self, cache, split: str, *, query: str = "suffix",
                                    cache_dir=None, batch_size: int = 64,
                                    progress: bool = False) -> dict:
        """:meth:`text_to_av_attention` for every clip of ``split`` of a
        :class:`~avex.data.FeatureCache`, computed once and kept in a safetensors file under
        ``<cache_dir>/attention/`` (default: the avex cache directory). The file is keyed by the
        captioner (its directory and weight files' sizes and times), the cache (its meta.json)
        and the split and query. Returns clip_id -> float32 [M]."""
        if self.path is None:
            raise ValueError("only a captioner loaded from a directory has a stable identity to "
                             "cache attention under; call text_to_av_attention instead")
        identity = [str(self.path.resolve()), str(Path(cache.root).resolve()),
                    (Path(cache.root) / "meta.json").read_text(), split, query]
        for weights in sorted(self.path.glob("*.safetensors")):
            stat = weights.stat()
            identity.append(f"{weights.name}:{stat.st_size}:{stat.st_mtime_ns}")
        key = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
        path = attention_dir(cache_dir) / f"{key}.safetensors"
        if path.is_file():
            return load_file(str(path))
        clips = cache.split(split)
        out = {}
        starts = range(0, len(clips), batch_size)
        if progress:
            starts = progress_bar(starts, desc=f"attention ({split})", unit="batch")
        for start in starts:
            chunk = [clips[i] for i in range(start, min(start + batch_size, len(clips)))]
            for clip, att in zip(chunk, self.text_to_av_attention(chunk, query=query)):
                out[clip.clip_id] = att.float().contiguous()
        path.parent.mkdir(parents=True, exist_ok=True)
        save_tensors_atomically(path, out)
        return out


@torch.no_grad()
def text_to_av_attention(model, batch: AVBatch, *, query: str = "suffix") -> list:
    """:meth:`FrozenCaptioner.text_to_av_attention` of one :class:`AVBatch` on the LLM ``model``
    (any model that takes ``inputs_embeds``): what the captioner computes, for callers that hold
    the LLM alone (the profiling suite's Attention-AV)."""
    if query not in ("suffix", "last"):
        raise ValueError(f"query must be 'suffix' or 'last', got {query!r}")
    previous = model.config._attn_implementation
    # only the attention maps are read: the LM head need not run over every position
    logits = ({"logits_to_keep": 1} if "logits_to_keep" in
              inspect.signature(model.forward).parameters else {})
    model.set_attn_implementation("eager")
    try:
        out = model(inputs_embeds=batch.inputs_embeds,
                    attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids if batch.native_position_ids is None
                    else batch.native_position_ids, output_attentions=True, **logits)
    finally:
        model.set_attn_implementation(previous)
    # [B, L_query, L_key], averaged over layers and heads
    weights = torch.stack([a.float().mean(1) for a in out.attentions]).mean(0)
    results = []
    for b in range(len(batch)):
        mod = batch.modality[b]
        av = torch.nonzero((mod == VISUAL) | (mod == AUDIO)).flatten()
        after = torch.nonzero((mod == TEXT) & (torch.arange(len(mod), device=mod.device)
                                               > av.max())).flatten()
        queries = after[-1:] if query == "last" else after
        results.append(weights[b][queries][:, av].mean(0).cpu())
    return results
