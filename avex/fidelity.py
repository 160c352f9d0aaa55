"""The fidelity reward: how faithfully a kept set lets the frozen captioner write y_full, its
own caption of the full-token input (issue #36). It needs no reference captions and no
generation: one teacher-forced forward per set (:meth:`FrozenCaptioner.teacher_forced`).

* :class:`FullCaptions`, :func:`full_captions`: y_full of every clip of a split, under a run's
  decoding, computed once and kept under ``<cache root>/full_captions/`` keyed by the
  captioner's and the benchmark's SHA-256 (:mod:`avex.judge_identity`), the split, the decoding
  and the device type and dtype it ran in;
* :func:`fidelity_reward`: R_fid of each set, ``"logp"`` (100 x the mean log p(y_full | S) per
  token) or ``"margin"`` (-100 x the mean hinge max(0, 1 - margin) of each step's logit
  margin: 0 when every step's margin is >= 1 logit);
* :func:`break_ties`: CIDEr with its ties broken by a dense term, never reordering two sets of
  one clip whose CIDEr differs;
* :func:`fidelity_split`: the evaluation without references: per clip, whether the pruned
  caption is y_full exactly, and the mean log p(y_full | S).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from avex import _checks
from avex.files import write_json_atomically
from avex.judge_identity import benchmark_sha256, captioner_sha256
from avex.paths import full_captions_dir
from avex.progress import progress_bar
from avex.selection import AVLayout

__all__ = ["FIDELITY_HINGE", "TIE_BREAK_POINTS", "FullCaptions", "full_captions",
           "full_captions_path", "fidelity_reward", "grounded_fidelity", "break_ties",
           "fidelity_split"]

FULL_CAPTIONS_FORMAT = "avex-full-captions/1"
#: the margin form's hinge, in logits: a step counts as safe once y_full's token leads by this
FIDELITY_HINGE = 1.0
#: the largest span the tie-break of ``cider+fidelity`` may add to a clip's CIDEr, in points
TIE_BREAK_POINTS = 1.0


@dataclass(frozen=True)
class FullCaptions:
    """y_full of each clip: ``tokens`` (clip id -> the token ids the captioner generated, its
    EOS included where the caption ended within ``max_new_tokens``) and ``texts`` (clip id ->
    the decoded caption), under ``num_beams`` and ``max_new_tokens``."""
    tokens: dict
    texts: dict
    num_beams: int
    max_new_tokens: int

    def targets(self, clips) -> list[list[int]]:
        """The token ids of ``clips`` (each a :class:`~avex.data.cache.Clip`), in order."""
        missing = [c.clip_id for c in clips if c.clip_id not in self.tokens]
        if missing:
            raise KeyError(f"no full-token caption for clip {missing[0]!r} (y_full is computed "
                           "per split; this clip is not in it)")
        return [self.tokens[c.clip_id] for c in clips]


def full_captions_key(captioner, cache, split: str, num_beams: int,
                      max_new_tokens: int) -> dict:
    """What y_full depends on: the captioner's weights and the benchmark's content (their
    SHA-256), the split, the decoding, and the device type and dtype the captioner runs in
    (greedy decoding can take another branch at a near-tie under other arithmetic)."""
    if captioner.path is None:
        raise ValueError("only a captioner loaded from a directory has a stable identity to "
                         "cache y_full under; load it with FrozenCaptioner.load(path)")
    return {"format": FULL_CAPTIONS_FORMAT,
            "captioner_sha256": captioner_sha256(captioner.path),
            "benchmark_sha256": benchmark_sha256(cache.root), "split": split,
            "num_beams": num_beams, "max_new_tokens": max_new_tokens,
            "device": captioner.device.type, "dtype": str(captioner.dtype).removeprefix("torch.")}


def full_captions_path(captioner, cache, split: str, *, num_beams: int = 1,
                       max_new_tokens: int = 24, cache_dir=None) -> Path:
    """Where :func:`full_captions` keeps y_full of ``split`` under this decoding:
    ``<cache_dir>/full_captions/<16 hex digits of the key's SHA-256>.json``."""
    _checks.int_at_least("num_beams", num_beams, 1)
    _checks.int_at_least("max_new_tokens", max_new_tokens, 1)
    identity = full_captions_key(captioner, cache, split, num_beams, max_new_tokens)
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return full_captions_dir(cache_dir) / f"{key}.json"


def full_captions(captioner, cache, split: str, *, num_beams: int = 1, max_new_tokens: int = 24,
                  cache_dir=None, batch_size: int = 64, progress: bool = False) -> FullCaptions:
    """y_full of every clip of ``split`` of the feature cache ``cache``: the captioner's
    caption of the full tokens under this decoding, generated once and then read from
    ``<cache_dir>/full_captions/<key>.json`` (default: the avex cache root;
    :func:`full_captions_key` names what the key covers). The clips are captioned in batches
    of ``batch_size``, as the evaluation captions full tokens."""
    _checks.int_at_least("batch_size", batch_size, 1)
    path = full_captions_path(captioner, cache, split, num_beams=num_beams,
                              max_new_tokens=max_new_tokens, cache_dir=cache_dir)
    identity = full_captions_key(captioner, cache, split, num_beams, max_new_tokens)
    if path.is_file():
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("identity") != identity:
            raise ValueError(f"{path}: written for {record.get('identity')!r}, not for "
                             f"{identity!r}; delete it to recompute")
    else:
        record = {"identity": identity, "clips": _generate(captioner, cache.split(split),
                                                           num_beams, max_new_tokens,
                                                           batch_size, progress)}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomically(path, record)
    clips = record["clips"]
    return FullCaptions({k: v["tokens"] for k, v in clips.items()},
                        {k: v["text"] for k, v in clips.items()}, num_beams, max_new_tokens)


def _generate(captioner, split, num_beams, max_new_tokens, batch_size, progress) -> dict:
    out = {}
    starts = range(0, len(split), batch_size)
    for start in progress_bar(starts, desc="full-token captions", unit="batch",
                              disable=not progress, leave=False):
        chunk = [split[i] for i in range(start, min(start + batch_size, len(split)))]
        batch = captioner.embed(chunk)
        everything = AVLayout.of(batch.modality).modality >= 0
        tokens = captioner.keep_set_tokens(batch.inputs_embeds, batch.modality,
                                           everything[:, None], num_beams=num_beams,
                                           max_new_tokens=max_new_tokens,
                                           position_ids=batch.native_position_ids)
        for clip, (row,) in zip(chunk, tokens):
            out[clip.clip_id] = {"tokens": row, "text": captioner.decode(row)}
    return out


def fidelity_reward(scored, form: str = "logp") -> torch.Tensor:
    """R_fid [B, S] of teacher-forced sets (a :class:`~avex.captioner.frozen.TeacherForced`).

    ``"logp"``: 100 x the mean log p(y_full | S) per token (<= 0; 0 is certainty).
    ``"margin"``: -100 x the mean over steps of max(0, FIDELITY_HINGE - margin), margin being
    y_full's logit minus the best other token's: 0 when every step leads by a logit or more;
    a step that greedy decoding would get wrong (margin <= 0) costs at least 100 / T."""
    _checks.choice("form", form, ("logp", "margin"))
    if form == "logp":
        return 100.0 * scored.mean_log_prob
    hinge = (FIDELITY_HINGE - scored.margin).clamp_min(0.0)   # +inf past the end: 0
    return -100.0 * hinge.sum(-1) / scored.length[:, None].to(hinge.dtype)


def grounded_fidelity(scored) -> torch.Tensor:
    """R_fid [B, S - 2] of the ``"grounded"`` form: 100 x the mean log p(y_full | S) per token,
    each token weighted by the evidence the clip's AV tokens give it,
    max(0, log p(token | every AV token) - log p(token | none)). Tokens the prompt alone
    predicts (the caption's template) weigh 0, so the reward ranks sets by the caption's
    content. ``scored``: a :class:`~avex.captioner.frozen.TeacherForced` whose last two sets of
    each sample are its full and its empty AV set; 0 for a clip whose AV tokens help no token."""
    log_prob = scored.token_log_prob
    if log_prob.shape[1] < 3:
        raise ValueError(f"the grounded form needs each sample's sets, then its full and its "
                         f"empty set: got {log_prob.shape[1]} sets")
    weight = (log_prob[:, -2] - log_prob[:, -1]).clamp_min(0.0)          # [B, T]; 0 past the end
    total = weight.sum(-1, keepdim=True)
    weighted = (log_prob[:, :-2] * weight[:, None]).sum(-1)
    return 100.0 * torch.where(total > 0, weighted / total.clamp_min(1e-30), 0.0)


def break_ties(primary: torch.Tensor, secondary: torch.Tensor) -> torch.Tensor:
    """``primary`` [B, S] (CIDEr points) plus a tie-break from ``secondary`` [B, S] (a dense
    reward), per row (the sets of one clip, which every estimator compares):

        R = primary + span_b * (secondary - min_b) / (max_b - min_b)

    with span_b = min(TIE_BREAK_POINTS, half the smallest non-zero gap between the row's
    primary values) (0 where the row's secondary values are all equal). The added term lies in
    [0, span_b], so two sets whose primary values differ keep their order (by at least half
    their gap), and sets that tie are ordered by ``secondary``. Computed in float64; any later
    rounding is monotone, so it may merge but never reverse two values."""
    _checks.tensor("primary", primary, ndim=2, floating=True)
    _checks.tensor("secondary", secondary, ndim=2, floating=True)
    if primary.shape != secondary.shape:
        raise ValueError(f"secondary has shape {list(secondary.shape)} but primary has "
                         f"{list(primary.shape)}")
    _checks.finite("primary", primary)
    _checks.finite("secondary", secondary)
    first, second = primary.double(), secondary.double().to(primary.device)
    gaps = (first[:, :, None] - first[:, None, :]).abs()
    gaps = torch.where(gaps > 0, gaps, torch.full_like(gaps, float("inf")))
    span = (gaps.flatten(1).amin(1) / 2).clamp(max=TIE_BREAK_POINTS)              # [B]
    low, high = second.amin(1, keepdim=True), second.amax(1, keepdim=True)
    spread = high - low
    scaled = torch.where(spread > 0, (second - low) / spread.clamp_min(1e-300),
                         torch.zeros_like(second))
    return first + span[:, None] * scaled


@torch.no_grad()
def fidelity_split(captioner, clips, selector, retention: float, full: FullCaptions, *,
                   batch_size: int = 64, progress: bool = False,
                   desc: str = "fidelity") -> dict:
    """The reference-free evaluation of one selection: per clip, its pruned caption (greedy
    or beams, as ``full`` was decoded), whether it is y_full exactly, and the mean
    log p(y_full | S) per token. Returns {"captions", "exact" (bool per clip), "log_prob"
    (float per clip)}. ``selector``: as :func:`avex.scoring.caption_split` takes it."""
    if not callable(selector):
        raise TypeError(f"selector must be callable (batch, layout, retention) -> keep, got "
                        f"{type(selector).__name__}")
    _checks.ratio("retention", retention)
    _checks.int_at_least("batch_size", batch_size, 1)
    out = {"captions": [], "exact": [], "log_prob": []}
    starts = range(0, len(clips), batch_size)
    for start in progress_bar(starts, desc=desc, unit="batch", disable=not progress,
                              leave=False):
        chunk = [clips[i] for i in range(start, min(start + batch_size, len(clips)))]
        batch = captioner.embed(chunk)
        keep = selector(batch, AVLayout.of(batch.modality), retention)
        embeds = batch.inputs_embeds
        if isinstance(keep, tuple):  # Selection(keep, inputs_embeds): a merging method
            keep, embeds = keep
        sets = keep[:, None]
        captions = [row[0] for row in captioner.caption_keep_sets(
            embeds, batch.modality, sets, num_beams=full.num_beams,
            max_new_tokens=full.max_new_tokens, position_ids=batch.native_position_ids)]
        scored = captioner.teacher_forced(embeds, batch.modality, sets, full.targets(chunk),
                                          position_ids=batch.native_position_ids)
        out["captions"] += captions
        out["exact"] += [text == full.texts[c.clip_id] for c, text in zip(chunk, captions)]
        out["log_prob"] += scored.mean_log_prob[:, 0].tolist()
    return out
