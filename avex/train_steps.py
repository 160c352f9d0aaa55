"""What each step of ``python -m avex.train`` reads and computes: its clips and seeds (a pure
function of the run's seed, the phase and the step, so a resumed run reads what it would have),
the learning-rate schedule, and one micro-batch's losses in each phase (Sections 3.3 and 3.4):
the warmup's fit to the balanced attention selection, and the RL step with its exchange sets.

One RL step, per micro-batch (:func:`rl_loss`):
    scores      = policy(inputs_embeds, modality)                 on the AV axis [B, M]
    S, log pi   = gumbel_topk(scores, K)                          the anchors
    exchanges   = build_exchanges(scores, S, modality, g)         V>V, A>A, V>A, A>V
    captions    = one generation over anchors + counterfactuals   compacted, original positions
    R           = 100 * CIDEr-D(captions, AV references)
    L           = L_RL + lambda_ex * L_ex
"""
from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from avex.config import TrainConfig
from avex.exchange_diagnostics import exchange_statistics, grad_norm
from avex.kernels import build_exchanges, gumbel_topk
from avex.losses import (SATURATION_POINTS, anchored_policy_gradient_loss_unchecked,
                         exchange_terms_unchecked, group_normalized_loss_unchecked,
                         leave_one_out_loss_unchecked, saturation_for,
                         set_level_loss_unchecked)
from avex.modality import AUDIO, VISUAL
from avex.scoring import caption_split, keep_all
from avex.selection import AVLayout, balanced_attention_keep, indices_to_keep


# ----------------------------------------------------------------------------------------------
# Batches, seeds and the learning rate: functions of (seed, phase, step), so a resumed run
# reads what it would have
# ----------------------------------------------------------------------------------------------

def batch_indices(step: int, batch_size: int, n: int, seed: int, phase: str) -> list[int]:
    """Clip indices of global batch ``step``: consecutive slices of per-epoch permutations."""
    out = []
    position = step * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(position, n)
        gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{phase}:{epoch}".encode()))
        perm = torch.randperm(n, generator=gen).tolist()
        take = perm[offset:offset + batch_size - len(out)]
        out.extend(take)
        position += len(take)
    return out


def micro_batches(indices: list[int], micro: int, procs) -> list[list[int]]:
    """This rank's micro-batches of a global batch (rank r takes chunks r, r + W, ...;
    ``procs``: an :class:`avex.distributed.Processes`)."""
    chunks = [indices[i:i + micro] for i in range(0, len(indices), micro)]
    return chunks[procs.rank::procs.world]


def sample_seed(seed: int, step: int, chunk: int) -> int:
    return zlib.crc32(f"gumbel:{seed}:{step}:{chunk}".encode())


def cosine_with_warmup(total_steps: int, warmup_fraction: float):
    warm = max(1, round(total_steps * warmup_fraction)) if warmup_fraction > 0 else 0

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, total_steps - warm)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


# ----------------------------------------------------------------------------------------------
# Warmup: fit the policy to a balanced attention-based selection
# ----------------------------------------------------------------------------------------------

def warmup_targets(attention: dict, clips, retentions) -> list[torch.Tensor]:
    """Per clip, float [M]: the share of ``retentions`` at which each AV token is in the
    balanced attention keep-set (:func:`avex.selection.balanced_attention_keep`). One retention
    gives the 0/1 set; several give a graded target whose order serves every one of them.
    ``attention`` maps clip_id -> float [M] (``FrozenCaptioner.cached_text_to_av_attention``)."""
    return [torch.stack([balanced_attention_keep(attention[clip.clip_id], clip.n_visual,
                                                 clip.n_audio, r, av_modality=_av_order(clip)
                                                 ).float()
                         for r in retentions]).mean(0) for clip in clips]


def _av_order(clip):
    """The modality of each AV token in sequence order for a clip exported from a model (its AV
    tokens may interleave, as Qwen2.5-Omni's audio and video do); None: video then audio."""
    if clip.merged is None:
        return None
    codes = clip.merged["modality"]
    return codes[(codes == VISUAL) | (codes == AUDIO)]


def warmup_loss(policy, batch, layout: AVLayout, targets: list[torch.Tensor]) -> torch.Tensor:
    """Binary cross-entropy of the scores against the (graded) target, over AV tokens."""
    return target_loss(layout.gather(policy(batch.inputs_embeds, batch.modality)), layout,
                       targets)


def target_loss(scores: torch.Tensor, layout: AVLayout, targets: list[torch.Tensor]):
    """BCE of AV-axis scores [B, M] against the warmup targets (padding ignored)."""
    scores = scores.masked_fill(layout.modality < 0, 0.0)
    labels = torch.zeros_like(scores)
    for row, target in enumerate(targets):
        labels[row, :len(target)] = target.to(labels)
    present = layout.modality >= 0
    return F.binary_cross_entropy_with_logits(scores[present], labels[present])



def training_retentions(cfg: TrainConfig) -> list[float]:
    return list(cfg.train_retentions) or [cfg.retention]


def draw_retention(cfg: TrainConfig, seed: int) -> float:
    """The retention of one RL micro-batch, drawn from ``train_retentions`` by its seed."""
    choices = training_retentions(cfg)
    return choices[zlib.crc32(f"retention:{seed}".encode()) % len(choices)]


def group_size(cfg: TrainConfig, budget: torch.Tensor) -> int:
    """g: fixed, or ``g_fraction`` of the micro-batch's largest K (at least 2)."""
    if cfg.g_fraction <= 0:
        return cfg.g
    return max(2, round(cfg.g_fraction * int(budget.max())))


# ----------------------------------------------------------------------------------------------
# RL + AVEX step
# ----------------------------------------------------------------------------------------------

class ExchangeSlots(NamedTuple):
    """The exchanges of a micro-batch as E slots per sample: [B, E] tensors (``keep`` [B, E, M]),
    ``owner`` (the anchor each slot was built around) and ``types`` (each slot's type)."""
    delta_f: torch.Tensor
    valid: torch.Tensor
    group_size: torch.Tensor
    keep: torch.Tensor
    owner: list
    types: list


def anchor_exchanges(cfg: TrainConfig, scores, indices, modality, seed: int,
                     g: int) -> ExchangeSlots:
    """The exchanges of ``cfg.exchange_types`` around the anchors ``indices`` [B, A, K]:
    around the first anchor (``exchange_anchors="first"``), one per anchor with the types taken
    in turn (``"each"``), or every type around every anchor (``"all"``)."""
    rows, count = indices.shape[:2]
    types = tuple(cfg.exchange_types)
    around = [0] if cfg.exchange_anchors == "first" else list(range(count))
    n = len(around)
    flat_scores = scores.repeat_interleave(n, 0) if n > 1 else scores
    flat_indices = indices[:, around].reshape(rows * n, -1)
    flat_modality = modality.repeat_interleave(n, 0) if n > 1 else modality
    if cfg.exchange_selection == "random":
        built = random_exchanges(flat_scores, flat_indices, flat_modality, cfg, seed, g)
    else:
        built = build_exchanges(flat_scores, flat_indices, flat_modality, g=g, types=types)
    shape = (rows, n, len(types))
    delta_f, size = built.delta_f.view(shape), built.group_size.view(shape)
    keep = built.keep.view(*shape, -1)
    if cfg.exchange_anchors == "each":
        pick = torch.tensor([a % len(types) for a in range(n)], device=scores.device)
        slot = torch.arange(n, device=scores.device)
        delta_f, size, keep = delta_f[:, slot, pick], size[:, slot, pick], keep[:, slot, pick]
        owner, slot_types = list(range(n)), [types[a % len(types)] for a in range(n)]
    else:
        delta_f, size = delta_f.reshape(rows, -1), size.reshape(rows, -1)
        keep = keep.reshape(rows, n * len(types), -1)
        owner, slot_types = [a for a in around for _ in types], list(types) * n
    return ExchangeSlots(delta_f, size > 0, size, keep, owner, slot_types)


def rl_loss(cfg: TrainConfig, policy, captioner, cider, batch, clips, seed: int,
            retention: float | None = None, targets: list | None = None, *,
            saturation: float = SATURATION_POINTS, grad_ratios: bool = False) -> dict:
    """The losses of one micro-batch. ``cfg.anchors`` Gumbel-Top-K sets per clip; with
    ``cfg.exchanges``, the exchange sets around them (:func:`anchor_exchanges`); every keep-set
    is captioned in one generation. ``saturation``: w(dR)'s; ``grad_ratios``: measure each
    exchange type's gradient norm against L_RL's (``terms["diagnostics"]``).
    With ``cfg.lambda_target`` > 0, the warmup's BCE on ``targets`` keeps the scores anchored
    (their scale and the attention ranking) while the reward terms move them."""
    layout = AVLayout.of(batch.modality)
    scores = layout.gather(policy(batch.inputs_embeds, batch.modality))
    retention = cfg.retention if retention is None else retention
    budget = layout.budget(retention)
    rows, width, count = scores.shape[0], scores.shape[1], cfg.anchors
    indices, log_prob = gumbel_topk(scores.repeat_interleave(count, 0),
                                    budget.repeat_interleave(count), tau=cfg.tau, seed=seed)
    indices, log_prob = indices.view(rows, count, -1), log_prob.view(rows, count)
    sets = indices_to_keep(indices, width)                                    # [B, A, M]
    exchanges = None
    if cfg.exchanges:
        exchanges = anchor_exchanges(cfg, scores, indices, layout.modality, seed,
                                     group_size(cfg, budget))
        sets = torch.cat([sets, exchanges.keep], dim=1)
    captions = captioner.caption_keep_sets(batch.inputs_embeds, batch.modality, sets,
                                           num_beams=cfg.num_beams,
                                           max_new_tokens=cfg.max_new_tokens,
                                           position_ids=batch.native_position_ids)
    num_sets = sets.shape[1]
    flat = [c for row in captions for c in row]
    refs = [clip.refs_av for clip in clips for _ in range(num_sets)]
    rewards = torch.as_tensor(100.0 * cider.score(flat, refs), dtype=torch.float32,
                              device=scores.device).view(-1, num_sets)
    anchor_rewards, counterfactual = rewards[:, :count], rewards[:, count:]
    rl = None
    if cfg.rl_estimator == "rloo" and (cfg.rl or not cfg.exchanges):
        rl = leave_one_out_loss_unchecked(log_prob, anchor_rewards, budget).mean()
    elif cfg.rl_estimator == "group" and (cfg.rl or not cfg.exchanges):
        rl = group_normalized_loss_unchecked(log_prob, anchor_rewards, budget).mean()
    elif cfg.rl_estimator == "paper" and exchanges is not None:
        rl = anchored_policy_gradient_loss_unchecked(
            log_prob, anchor_rewards, counterfactual, exchanges.valid, exchanges.owner,
            normalize=cfg.normalize_rl, set_size=budget).mean()
    elif cfg.rl_estimator == "paper":  # the set-level reward is the only signal: always on
        rl = set_level_loss_unchecked(log_prob[:, 0], anchor_rewards[:, 0]).mean()
    # --no-rl drops L_RL beside the exchange term (logged all the same); alone it always counts
    in_loss = rl is not None and (cfg.rl or exchanges is None)
    terms = {"loss": rl if in_loss else torch.zeros((), device=scores.device)}
    if rl is not None:
        terms["rl"] = rl.detach()
    if exchanges is not None:
        delta_reward = anchor_rewards[:, exchanges.owner] - counterfactual
        parts = exchange_terms_unchecked(exchanges.delta_f, delta_reward, exchanges.valid,
                                         saturation=saturation)                # [B, E]
        ex = parts.sum(dim=1).mean()
        weight = cfg.lambda_ex
        diagnostics = {"retention": float(retention), "k": int(budget.max()),
                       "types": exchange_statistics(delta_reward, exchanges.delta_f,
                                                    exchanges.valid, exchanges.group_size,
                                                    budget, exchanges.types)}
        if cfg.normalize_exchange or grad_ratios:
            params = [p for p in policy.parameters() if p.requires_grad]
            rl_norm = grad_norm(rl, params) if rl is not None else None
            ex_norm = grad_norm(ex, params)
            if cfg.normalize_exchange:
                weight = cfg.lambda_ex * float(rl_norm / ex_norm) if ex_norm > 0 else 0.0
            diagnostics["exchange_scale"] = weight
            ratios = {"total": None, "unscaled": None}   # undefined where L_RL has none
            if rl_norm is not None and rl_norm > 0:
                ratios = {"total": weight * float(ex_norm / rl_norm),
                          "unscaled": float(ex_norm / rl_norm)}
                if grad_ratios:
                    for name in dict.fromkeys(exchanges.types):
                        cols = [t == name for t in exchanges.types]
                        part = parts[:, torch.tensor(cols, device=parts.device)].sum(1).mean()
                        ratios[name] = weight * float(grad_norm(part, params) / rl_norm)
            diagnostics["grad_ratio"] = ratios
        terms["loss"] = terms["loss"] + weight * ex
        terms["exchange"] = ex.detach()
        terms["valid_exchanges"] = exchanges.valid.float().mean(0)
        terms["diagnostics"] = diagnostics
    if cfg.lambda_best > 0:  # self-imitation: the clip's best anchor, where it beat the rest
        best = anchor_rewards.argmax(dim=1)
        keep = sets[torch.arange(rows, device=sets.device), best].float()     # [B, M]
        ahead = anchor_rewards.max(dim=1).values > anchor_rewards.mean(dim=1)
        if bool(ahead.any()):
            imitation = target_loss(scores[ahead], AVLayout(layout.positions[ahead],
                                                            layout.modality[ahead]),
                                    [k for k, a in zip(keep, ahead.tolist()) if a])
            terms["loss"] = terms["loss"] + cfg.lambda_best * imitation
            terms["imitation"] = imitation.detach()
    if cfg.lambda_target > 0:
        if targets is None:
            raise ValueError("lambda_target > 0 needs the warmup targets of the batch")
        anchor = target_loss(scores, layout, targets)
        terms["loss"] = terms["loss"] + cfg.lambda_target * anchor
        terms["target"] = anchor.detach()
    terms["reward"] = anchor_rewards[:, 0].mean()
    terms["reward_spread"] = anchor_rewards.std(dim=1).mean() if count > 1 else \
        torch.zeros(())
    terms["retention"] = torch.tensor(float(retention))
    return terms


def random_exchanges(scores, anchor_idx, modality, cfg: TrainConfig, seed: int,
                     g: int | None = None):
    """The "random exchange" ablation: the same number and size of exchanges, but G and G' are
    drawn uniformly at random (from seeded noise) instead of by lowest / highest score; delta F
    is still sum s_G - sum s_G' of the policy's scores, so L_ex trains the same parameters.
    ``g``: the group size (default ``cfg.g``)."""
    # drawn on the scores' device (a CPU run draws exactly what it always did; a GPU run copies
    # nothing from the host)
    gen = torch.Generator(device=scores.device).manual_seed(
        zlib.crc32(f"random-exchange:{seed}".encode()))
    noise = torch.rand(scores.shape, generator=gen, dtype=torch.float32, device=scores.device)
    noise = noise.masked_fill(~torch.isfinite(scores.detach()), float("-inf"))
    drawn = build_exchanges(noise, anchor_idx, modality, g=cfg.g if g is None else g,
                            types=tuple(cfg.exchange_types))
    finite = scores.masked_fill(~torch.isfinite(scores), 0.0)

    def group_sum(index):
        values = finite.gather(1, index.clamp_min(0).flatten(1)).view(index.shape)
        return values.masked_fill(index < 0, 0.0).sum(-1)
    delta_f = (group_sum(drawn.removed) - group_sum(drawn.inserted)).to(drawn.delta_f.dtype)
    return drawn._replace(delta_f=torch.where(drawn.valid, delta_f, torch.zeros_like(delta_f)))


def exchange_saturation(cfg: TrainConfig, calibration_file: Path, captioner, cider, clips, *,
                        write: bool) -> float:
    """w(dR)'s saturation: ``cfg.exchange_saturation``, or the paper's scaled by the mean
    full-token reward of the first 256 train clips (measured once, kept in the run's
    ``calibration_file``, written where ``write``)."""
    if not cfg.exchanges or cfg.exchange_saturation is not None:
        return cfg.exchange_saturation or SATURATION_POINTS
    if calibration_file.is_file():
        return float(json.loads(calibration_file.read_text())["saturation"])
    sample = clips[:256]
    captions = caption_split(captioner, sample, keep_all, 1.0, num_beams=cfg.num_beams,
                             max_new_tokens=cfg.max_new_tokens)
    reward = float(100.0 * cider.score(captions, [c.refs_av for c in sample]).mean())
    record = {"full_token_reward": reward, "clips": len(sample),
              "saturation": saturation_for(reward)}
    if write:
        calibration_file.write_text(json.dumps(record, indent=1) + "\n")
    return record["saturation"]
