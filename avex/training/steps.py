"""What each step of ``python -m avex.train`` reads and computes: its clips and seeds (a pure
function of the run's seed, the phase and the step, so a resumed run reads what it would have),
the learning-rate schedule, and one micro-batch's losses in each phase (Sections 3.3 and 3.4):
the warmup's fit to the balanced attention selection, and the RL step with its exchange sets.

One RL step, per micro-batch (:func:`rl_loss`):
    scores      = policy(inputs_embeds, modality)                 on the AV axis [B, M]
    S, log pi   = gumbel_topk(scores, K)                          the anchors
    exchanges   = build_exchanges(scores, S, modality, g)         V>V, A>A, V>A, A>V
    R           = cfg.reward of every set (set_rewards):
      cider:          100 * CIDEr-D(captions, AV references)      one generation over all sets
      fidelity:       100 * mean log p(y_full | S) (or a margin)  one teacher-forced forward
      cider+fidelity: CIDEr, its ties broken by fidelity
    L           = L_RL + lambda_ex * L_ex
"""
from __future__ import annotations

import dataclasses
import json
import math
import zlib
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from avex.fidelity import break_ties, fidelity_reward, grounded_fidelity
from avex.kernels import build_exchanges, gumbel_topk
from avex.modality import AUDIO, PAD, VISUAL
from avex.scoring import caption_split, keep_all
from avex.selection import AVLayout, balanced_attention_keep, indices_to_keep, topk_keep
from avex.training.config import TrainConfig
from avex.training.distributed import unwrap
from avex.training.exchange_diagnostics import anchor_statistics, exchange_statistics, grad_norm
from avex.training.exchange_search import distill_loss, run_search, swap_delta_f
from avex.training.losses import (SATURATION_POINTS, anchored_policy_gradient_loss_unchecked,
                                  exchange_terms_unchecked, group_normalized_loss_unchecked,
                                  leave_one_out_advantages, leave_one_out_loss_unchecked,
                                  saturation_for, set_level_loss_unchecked)


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
    ``procs``: an :class:`avex.training.distributed.Processes`)."""
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

def warmup_targets(scores: dict, clips, retentions) -> list[torch.Tensor]:
    """Per clip, float [M]: the share of ``retentions`` at which each AV token is in the
    balanced keep-set of the teacher's scores (:func:`avex.selection.balanced_attention_keep`).
    One retention gives the 0/1 set; several give a graded target whose order serves every one
    of them. ``scores`` maps clip_id -> float [M]
    (:func:`avex.training.warmup_teachers.teacher_scores`: by default the caption's attention,
    :func:`avex.training.warmup_teachers.caption_attention`)."""
    return [torch.stack([balanced_attention_keep(scores[clip.clip_id], clip.n_visual,
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
    """Binary cross-entropy of the scores against the (graded) target, over AV tokens. No
    retention is passed: the target serves every retention, so a policy's retention input
    (RL's to learn) stays out of it."""
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


class SampledSets(NamedTuple):
    """The keep-sets of one micro-batch: the policy's AV-axis ``scores`` [B, M] and ``layout``,
    each clip's ``budget`` K [B], the anchors' ``indices`` [B, A, K] and ``log_prob`` [B, A],
    and ``sets`` [B, S, M]: the A anchors, then the exchanges' counterfactuals (``exchanges``,
    None without the exchange term)."""
    scores: torch.Tensor
    layout: AVLayout
    budget: torch.Tensor
    indices: torch.Tensor
    log_prob: torch.Tensor
    sets: torch.Tensor
    exchanges: ExchangeSlots | None


def sample_sets(cfg: TrainConfig, policy, batch, seed: int, retention: float) -> SampledSets:
    """``cfg.anchors`` sets per clip at ``retention``, drawn by the policy's selection rule
    (Gumbel-Top-K, or set-aware picks with their step-wise log-probability) and, with
    ``cfg.exchanges``, the exchanges around them (:func:`anchor_exchanges`)."""
    layout = AVLayout.of(batch.modality)
    budget = layout.budget(retention)
    count = cfg.anchors
    if unwrap(policy).set_aware:
        scores, hidden = policy(batch.inputs_embeds, batch.modality, retention=retention,
                                with_hidden=True)
        scores, hidden = layout.gather(scores), layout.gather_vectors(hidden)
        indices, log_prob = unwrap(policy).select(
            scores.repeat_interleave(count, 0), hidden.repeat_interleave(count, 0),
            budget.repeat_interleave(count), tau=cfg.tau, seed=seed, sample=True,
            log_prob=True)
    else:
        scores = layout.gather(policy(batch.inputs_embeds, batch.modality, retention=retention))
        indices, log_prob = gumbel_topk(scores.repeat_interleave(count, 0),
                                        budget.repeat_interleave(count), tau=cfg.tau, seed=seed)
    rows, width = scores.shape
    indices, log_prob = indices.view(rows, count, -1), log_prob.view(rows, count)
    sets = indices_to_keep(indices, width)                                    # [B, A, M]
    exchanges = None
    if cfg.exchanges:
        exchanges = anchor_exchanges(cfg, scores, indices, layout.modality, seed,
                                     group_size(cfg, budget))
        sets = torch.cat([sets, exchanges.keep], dim=1)
    return SampledSets(scores, layout, budget, indices, log_prob, sets, exchanges)


class SetRewards(NamedTuple):
    """The rewards of a micro-batch's keep-sets, [B, S] each: ``reward`` (``cfg.reward``'s,
    float32), and where they were computed ``cider`` (CIDEr points, float32) and ``fidelity``
    (the dense term, :func:`avex.fidelity.fidelity_reward`)."""
    reward: torch.Tensor
    cider: torch.Tensor | None
    fidelity: torch.Tensor | None


def set_rewards(cfg: TrainConfig, captioner, cider, batch, clips, sets: torch.Tensor,
                full_tokens: list | None = None, *, with_cider: bool = False) -> SetRewards:
    """``cfg.reward`` of every keep-set ``sets`` [B, S, M] of a micro-batch.

    CIDEr (``cider``: a :class:`avex.reward.CiderD`) captions every set in one batched
    generation; it is computed for ``cider`` and ``cider+fidelity``, and for ``fidelity`` only
    where ``with_cider`` asks (a diagnostic step) and ``cider`` is given. The fidelity term is
    one teacher-forced forward of y_full (``full_tokens``: its token ids per clip) per set."""
    num_sets = sets.shape[1]
    points = None
    if cfg.reward != "fidelity" or (with_cider and cider is not None):
        captions = captioner.caption_keep_sets(batch.inputs_embeds, batch.modality, sets,
                                               num_beams=cfg.num_beams,
                                               max_new_tokens=cfg.max_new_tokens,
                                               position_ids=batch.native_position_ids)
        flat = [c for row in captions for c in row]
        refs = [clip.refs_av for clip in clips for _ in range(num_sets)]
        points = 100.0 * cider.score(flat, refs)
    dense = None
    if cfg.reward != "cider":
        if full_tokens is None:
            raise ValueError(f"reward {cfg.reward!r} needs y_full's token ids of the batch "
                             "(full_tokens)")
        forced = sets
        if cfg.fidelity_form == "grounded":   # each clip's full and empty AV set at the end
            real = (AVLayout.of(batch.modality).modality != PAD).to(sets.device)[:, None]
            forced = torch.cat([sets, real, torch.zeros_like(real)], dim=1)
        scored = captioner.teacher_forced(batch.inputs_embeds, batch.modality, forced,
                                          full_tokens, position_ids=batch.native_position_ids)
        dense = (grounded_fidelity(scored) if cfg.fidelity_form == "grounded"
                 else fidelity_reward(scored, cfg.fidelity_form)).float()
    by_cider = None if points is None else torch.as_tensor(
        points, dtype=torch.float32, device=sets.device).view(-1, num_sets)
    if cfg.reward == "cider":
        reward = by_cider
    elif cfg.reward == "fidelity":
        reward = dense
    else:  # CIDEr in float64, its ties broken by fidelity: rounding after can't reorder
        exact = torch.as_tensor(points, dtype=torch.float64, device=sets.device)
        reward = break_ties(exact.view(-1, num_sets), dense).float()
    return SetRewards(reward, by_cider, dense)


def anchor_pair_term(scores: torch.Tensor, anchors: torch.Tensor,
                     rewards: torch.Tensor) -> torch.Tensor:
    """The anchor-pair exchange term (``cfg.lambda_pairs``): every pair (a, b) of a clip's A
    anchors is an exchange of their symmetric difference, G = S_a minus S_b for G' = S_b minus
    S_a, with dF = sum s_G - sum s_G' and dR = R(S_a) - R(S_b); the paper's pairwise loss
    w(dR) log(1 + exp(-sign(dR) dF)), averaged over a clip's pairs whose sets and rewards
    differ, then over the clips. w saturates at the median |dR| of those pairs in the
    micro-batch, so the term is on the reward's own scale whatever it is. The labels come from
    rewards RL has already computed: no extra captioner pass.

    ``scores`` [B, M] (differentiable), ``anchors`` [B, A, M] bool keep-sets, ``rewards``
    [B, A]. 0 (with a gradient of 0) where no pair differs."""
    first, second = torch.triu_indices(anchors.shape[1], anchors.shape[1], offset=1,
                                       device=anchors.device)
    swap = anchors[:, first].to(scores.dtype) - anchors[:, second].to(scores.dtype)  # [B, P, M]
    # past a row's AV tokens the scores are -inf and in no set: 0 there, not -inf x 0 = NaN
    finite = scores.masked_fill(~torch.isfinite(scores), 0.0)
    delta_f = (swap * finite[:, None, :]).sum(dim=-1)
    delta_reward = (rewards[:, first] - rewards[:, second]).detach().to(scores.dtype)
    valid = swap.ne(0).any(dim=-1) & delta_reward.ne(0)
    size = delta_reward.abs()[valid]
    saturation = size.median().clamp_min(torch.finfo(scores.dtype).tiny) if size.numel() \
        else torch.ones((), dtype=scores.dtype, device=scores.device)
    parts = exchange_terms_unchecked(delta_f, delta_reward, valid, saturation=saturation)
    return parts.sum(dim=1).mean()


def rl_loss(cfg: TrainConfig, policy, captioner, cider, batch, clips, seed: int,
            retention: float | None = None, targets: list | None = None, *,
            saturation: float = SATURATION_POINTS, grad_ratios: bool = False,
            full_tokens: list | None = None, diagnose: bool = False,
            advantage_scale: float | None = None) -> dict:
    """The losses of one micro-batch. ``cfg.anchors`` Gumbel-Top-K sets per clip; with
    ``cfg.exchanges``, the exchange sets around them (:func:`anchor_exchanges`); every keep-set
    is rewarded by ``cfg.reward`` (:func:`set_rewards`; ``full_tokens``: y_full's token ids of
    ``clips``, for a fidelity reward). ``saturation``: w(dR)'s; ``grad_ratios``: measure each
    exchange type's gradient norm against L_RL's (``terms["diagnostics"]``); ``diagnose``: a
    diagnostic step, where a fidelity reward is compared with CIDEr (generation, so not every
    step). ``terms["reward_diagnostics"]`` says how often the clips' anchors tied.
    With ``cfg.lambda_target`` > 0, the warmup's BCE on ``targets`` keeps the scores anchored
    (their scale and the attention ranking) while the reward terms move them.
    ``advantage_scale``: RLOO's advantages are divided by it instead of their standard deviation
    here (``--advantage-scale running``); ``terms["advantage_std"]`` is that deviation."""
    retention = cfg.retention if retention is None else retention
    if cfg.exchange_search:
        return search_loss(cfg, policy, captioner, cider, batch, clips, seed, retention,
                           targets, saturation=saturation, full_tokens=full_tokens,
                           diagnose=diagnose)
    drawn = sample_sets(cfg, policy, batch, seed, retention)
    scores, layout, budget, log_prob, sets, exchanges = (
        drawn.scores, drawn.layout, drawn.budget, drawn.log_prob, drawn.sets, drawn.exchanges)
    rows, count = scores.shape[0], cfg.anchors
    rewards = set_rewards(cfg, captioner, cider, batch, clips, sets, full_tokens,
                          with_cider=diagnose)
    anchor_rewards, counterfactual = rewards.reward[:, :count], rewards.reward[:, count:]
    rl = None
    if cfg.rl_estimator == "rloo" and (cfg.rl or not cfg.exchanges):
        rl = leave_one_out_loss_unchecked(log_prob, anchor_rewards, budget,
                                          scale=advantage_scale).mean()
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
                       "types": exchange_statistics(
                           delta_reward, exchanges.delta_f, exchanges.valid,
                           exchanges.group_size, budget, exchanges.types,
                           **label_deltas(rewards, count, exchanges.owner))}
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
    if cfg.lambda_pairs > 0:
        pairs = anchor_pair_term(scores, sets[:, :count], anchor_rewards)
        weight = cfg.lambda_pairs
        if in_loss:   # lambda_pairs is the ratio of the term's gradient norm to L_RL's
            params = [p for p in policy.parameters() if p.requires_grad]
            rl_norm, pairs_norm = grad_norm(rl, params), grad_norm(pairs, params)
            weight = cfg.lambda_pairs * float(rl_norm / pairs_norm) if pairs_norm > 0 else 0.0
        terms["loss"] = terms["loss"] + weight * pairs
        terms["pairs"] = pairs.detach()
        terms["pairs_scale"] = torch.tensor(weight)
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
    add_target_term(cfg, terms, scores, layout, targets)
    terms["reward"] = anchor_rewards[:, 0].mean()
    terms["reward_spread"] = anchor_rewards.std(dim=1).mean() if count > 1 else \
        torch.zeros(())
    if cfg.reward == "cider+fidelity":  # CIDEr alone: the check that captions score at all
        terms["cider_reward"] = rewards.cider[:, :count].mean()
    terms["retention"] = torch.tensor(float(retention))
    if cfg.rl_estimator == "rloo":
        terms["advantage_std"] = leave_one_out_advantages(anchor_rewards).std(unbiased=False)
    terms["reward_diagnostics"] = anchor_statistics(
        anchor_rewards, retention, int(budget.max()),
        # under the cider reward, CIDEr's statistics would repeat the reward's own
        cider=None if rewards.cider is None or cfg.reward == "cider"
        else rewards.cider[:, :count],
        dense=None if rewards.fidelity is None else rewards.fidelity[:, :count])
    return terms


def search_loss(cfg: TrainConfig, policy, captioner, cider, batch, clips, seed: int,
                retention: float, targets: list | None = None, *,
                saturation: float = SATURATION_POINTS, full_tokens: list | None = None,
                diagnose: bool = False) -> dict:
    """The exchange-search arm's losses of one micro-batch (``cfg.exchange_search``;
    :mod:`avex.training.exchange_search`): a search from the policy's Top-K set, every swap it
    scored trained with the exchange term's pairwise loss (w's ``saturation``), plus
    ``cfg.distill_weight`` x the loss toward the final set on the clips where the search beat
    Top-K. Every set is rewarded by ``cfg.reward`` (:func:`set_rewards`); ``diagnose`` also
    captions the first call's sets for CIDEr under a fidelity reward. The terms' ``search_*``
    entries say what the search did (accepted swaps, gain, ties, passes)."""
    layout = AVLayout.of(batch.modality)
    scores = layout.gather(policy(batch.inputs_embeds, batch.modality, retention=retention))
    budget = layout.budget(retention)
    g = group_size(cfg, budget)
    calls = []

    def evaluate(sets):
        got = set_rewards(cfg, captioner, cider, batch, clips, sets, full_tokens,
                          with_cider=diagnose and not calls)
        calls.append(sets.shape[1])
        return got
    found = run_search(scores, topk_keep(scores.detach(), budget), layout.modality, evaluate,
                       reward=cfg.reward, types=cfg.exchange_types, g=g,
                       candidates=cfg.search_candidates, rounds=cfg.search_rounds,
                       deep=cfg.search_deep, seed=seed)
    delta_f = swap_delta_f(scores, found.removed, found.inserted, found.valid)
    pair = exchange_terms_unchecked(delta_f, found.delta_reward.to(delta_f), found.valid,
                                    saturation=saturation).sum(dim=1).mean()
    improved = found.accepted > 0
    distill = (distill_loss(scores, found.final, tau=cfg.tau, form=cfg.distill_loss)
               * improved).sum() / max(1, int(improved.sum()))
    terms = {"loss": pair + cfg.distill_weight * distill, "exchange": pair.detach(),
             "distill": distill.detach()}
    add_target_term(cfg, terms, scores, layout, targets)
    valid = found.valid
    tied = (found.delta_reward == 0) & valid
    first = found.first_rewards
    terms.update({
        "reward": found.start_reward.mean(),            # the Top-K set's: what is deployed
        "reward_spread": found.first.std(dim=1).mean(),
        "search_reward": found.final_reward.mean(),
        "search_gain": (found.final_reward - found.start_reward).mean(),
        "search_accepted": found.accepted.float().mean(),
        "search_improved": improved.float().mean(),
        "search_tied": tied.sum() / valid.sum().clamp_min(1),
        "search_valid": valid.float().mean(),
        "search_passes": torch.tensor(float(sum(calls))),   # sets rewarded per clip
        "search_calls": torch.tensor(float(len(calls))),
        "retention": torch.tensor(float(retention))})
    if cfg.reward == "cider+fidelity":
        terms["cider_reward"] = first.cider[:, 0].mean()
    terms["reward_diagnostics"] = anchor_statistics(
        found.first, retention, int(budget.max()),
        cider=None if first.cider is None or cfg.reward == "cider" else first.cider,
        dense=None if first.fidelity is None else first.fidelity)
    return terms


def label_deltas(rewards: SetRewards, count: int, owner) -> dict:
    """CIDEr's and the dense term's dR of each exchange slot [B, E], where both were computed
    (``exchange_statistics``' ``cider_delta`` and ``dense_delta``); {} otherwise."""
    if rewards.cider is None or rewards.fidelity is None:
        return {}
    return {name: values[:, owner] - values[:, count:]
            for name, values in (("cider_delta", rewards.cider),
                                 ("dense_delta", rewards.fidelity))}


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


#: the train clips w's saturation is measured on: 256 full-token captions for CIDEr (a cheap
#: generation each), 64 clips' anchors and exchanges for a fidelity reward
SATURATION_CLIPS = {"cider": 256, "fidelity": 64}
#: with a fidelity reward, w saturates at this percentile of the non-zero |dR| measured at the
#: start of RL: half of the informative labels get full weight, the smaller half less
SATURATION_PERCENTILE = 50


def exchange_saturation(cfg: TrainConfig, calibration_file: Path, captioner, cider, clips, *,
                        write: bool, policy=None, full=None) -> float:
    """w(dR)'s saturation: ``cfg.exchange_saturation``, or measured once at the start of RL
    (kept in the run's ``calibration_file``, written where ``write``) on the reward's own
    scale. CIDEr: the paper's 5 points scaled by the mean full-token reward of the first 256
    train clips. A fidelity reward (``fidelity``, ``cider+fidelity``): the median non-zero
    |dR| of the exchanges ``policy`` draws on the first 64 train clips (:func:`measured_delta`;
    ``full``: their y_full, a :class:`avex.fidelity.FullCaptions`)."""
    if not (cfg.exchanges or cfg.exchange_search) or cfg.exchange_saturation is not None:
        return cfg.exchange_saturation or SATURATION_POINTS
    if calibration_file.is_file():
        return float(json.loads(calibration_file.read_text())["saturation"])
    if cfg.reward == "cider":
        sample = clips[:SATURATION_CLIPS["cider"]]
        captions = caption_split(captioner, sample, keep_all, 1.0, num_beams=cfg.num_beams,
                                 max_new_tokens=cfg.max_new_tokens)
        reward = float(100.0 * cider.score(captions, [c.refs_av for c in sample]).mean())
        record = {"full_token_reward": reward, "clips": len(sample),
                  "saturation": saturation_for(reward)}
    else:
        record = measured_delta(cfg, policy, captioner, cider, clips[:SATURATION_CLIPS["fidelity"]],
                                full)
    if write:
        calibration_file.write_text(json.dumps(record, indent=1) + "\n")
    return record["saturation"]


@torch.no_grad()
def measured_delta(cfg: TrainConfig, policy, captioner, cider, clips, full) -> dict:
    """w's saturation on ``cfg.reward``'s scale: the ``SATURATION_PERCENTILE``-th percentile of
    the non-zero |dR| = |R(S) - R(S')| of the exchanges drawn, as training draws them, around
    ``policy``'s anchors on ``clips`` (micro-batches of ``cfg.micro_batch_size``, each at the
    next of ``train_retentions`` in turn, from seeds of their own). The paper's 5 points where
    no exchange changed the reward."""
    if policy is None or full is None:
        raise ValueError(f"measuring w's saturation for reward {cfg.reward!r} needs the policy "
                         "and y_full (policy=, full=)")
    if cfg.exchange_search:  # measured as the exchange term measures it, around 8 anchors
        cfg = dataclasses.replace(cfg, exchange_search=False, exchanges=True, anchors=8,
                                  exchange_anchors="each")
    retentions = training_retentions(cfg)
    deltas = []
    for i, start in enumerate(range(0, len(clips), cfg.micro_batch_size)):
        chunk = clips[start:start + cfg.micro_batch_size]
        batch = captioner.embed(chunk)
        seed = zlib.crc32(f"saturation:{cfg.seed}:{i}".encode())
        drawn = sample_sets(cfg, policy, batch, seed, retentions[i % len(retentions)])
        rewards = set_rewards(cfg, captioner, cider, batch, chunk, drawn.sets,
                              full.targets(chunk)).reward
        slots = drawn.exchanges
        delta = rewards[:, slots.owner] - rewards[:, cfg.anchors:]
        deltas.append(delta[slots.valid].abs().double().cpu())
    deltas = torch.cat(deltas) if deltas else torch.zeros(0, dtype=torch.float64)
    informative = deltas[deltas > 0]
    saturation = float(torch.quantile(informative, SATURATION_PERCENTILE / 100)) \
        if informative.numel() else SATURATION_POINTS
    return {"reward": cfg.reward, "fidelity_form": cfg.fidelity_form, "clips": len(clips),
            "exchanges": int(deltas.numel()), "nonzero": int(informative.numel()),
            "percentile": SATURATION_PERCENTILE, "saturation": saturation}


def add_target_term(cfg, terms: dict, scores, layout, targets) -> None:
    """Add ``lambda_target`` x the warmup-target loss to ``terms["loss"]`` (and log it as
    ``terms["target"]``) where ``cfg.lambda_target > 0``; the targets must then be given."""
    if cfg.lambda_target > 0:
        if targets is None:
            raise ValueError("lambda_target > 0 needs the warmup targets of the batch")
        anchor = target_loss(scores, layout, targets)
        terms["loss"] = terms["loss"] + cfg.lambda_target * anchor
        terms["target"] = anchor.detach()
