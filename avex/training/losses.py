"""Training objective of Section 3.4: L = L_RL + lambda_ex * L_ex.

Rewards are CIDEr-D in *points* (pycocoevalcap's score x 100, the unit of the paper's tables).
The paper's weight w(dR) = min(|dR| / 5, 1) saturates at 5 points on a reward scale where full
tokens score 56.8; ``saturation`` sets that scale (training derives it from the full-token
reward: :func:`saturation_for`).

Shapes: B samples, E exchange slots per sample (the four types, some of them skipped).
Every public function checks its shapes, dtypes (``valid`` is bool) and devices once, and
refuses NaN or inf where it would reach the loss; values in slots that ``valid`` masks out are
never read, so they can't reach the loss or its gradient. The ``*_unchecked`` forms are the same
arithmetic without the checks (whose host syncs cost every micro-batch), for a caller whose
inputs are built by this package: training's step (:mod:`avex.training.steps`), as the kernels'
``*_unchecked`` forms are.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from avex import _checks

SATURATION_POINTS = 5.0      # the paper's saturation of w(dR), in CIDEr points ...
PAPER_FULL_TOKEN_CIDER = 56.8  # ... on its reward scale: full-token C_av on AVCaps (Table 2)


def saturation_for(full_token_reward: float) -> float:
    """w's saturation on a reward scale where full tokens score ``full_token_reward``: the
    paper's 5 points at its 56.8, scaled (about 42 where full tokens score 476)."""
    full = _checks.positive_float("full_token_reward", full_token_reward)
    return SATURATION_POINTS * full / PAPER_FULL_TOKEN_CIDER


def exchange_weight(delta_reward, saturation: float = SATURATION_POINTS):
    """w(dR) = min(|dR| / saturation, 1): near-zero reward differences barely count.

    ``delta_reward``: a tensor (the weight of each element) or a plain number (a float back);
    NaN and inf are refused. ``saturation`` (> 0, CIDEr points): 5 is the paper's, on its
    reward scale; :func:`saturation_for` scales it to another."""
    saturation = _checks.positive_float("saturation", saturation)
    if isinstance(delta_reward, torch.Tensor):
        _checks.tensor("delta_reward", delta_reward, floating=True)
        _checks.finite("delta_reward", delta_reward.detach())
        return _weight(delta_reward, saturation)
    value = _checks.real("delta_reward", delta_reward)
    return min(abs(value) / saturation, 1.0)


def _weight(delta_reward: torch.Tensor, saturation: float) -> torch.Tensor:
    return (delta_reward.abs() / saturation).clamp(max=1.0)


def exchange_terms(delta_f: torch.Tensor, delta_reward: torch.Tensor, valid: torch.Tensor, *,
                   saturation: float = SATURATION_POINTS) -> torch.Tensor:
    """Each exchange's share of L_ex, [B, E]: w(dR) log(1 + exp(-sign(dR) dF)) divided by the
    sample's number of valid exchanges, 0 where ``valid`` is False. Summed over E it is
    :func:`exchange_loss`; summed over the slots of one exchange type, that type's part."""
    _check_slots(delta_f=delta_f, delta_reward=delta_reward, valid=valid)
    saturation = _checks.positive_float("saturation", saturation)
    return exchange_terms_unchecked(delta_f, delta_reward, valid, saturation=saturation)


def exchange_terms_unchecked(delta_f: torch.Tensor, delta_reward: torch.Tensor,
                             valid: torch.Tensor, *,
                             saturation: float = SATURATION_POINTS) -> torch.Tensor:
    """:func:`exchange_terms` without its checks (no host sync)."""
    # masked slots are replaced before any arithmetic: a NaN there must not reach the gradient
    delta_f = torch.where(valid, delta_f, torch.zeros_like(delta_f))
    delta_reward = torch.where(valid, delta_reward, torch.zeros_like(delta_reward))
    pairwise = _weight(delta_reward, saturation) * \
        F.softplus(-torch.sign(delta_reward) * delta_f)
    pairwise = torch.where(valid, pairwise, torch.zeros_like(pairwise))
    count = valid.sum(dim=1, keepdim=True)
    return pairwise / count.clamp(min=1)


def exchange_loss(delta_f: torch.Tensor, delta_reward: torch.Tensor,
                  valid: torch.Tensor, *, saturation: float = SATURATION_POINTS) -> torch.Tensor:
    """L_ex, per sample [B]: mean over the sample's valid exchanges of
    w(dR) * log(1 + exp(-sign(dR) * dF)); 0 for a sample with none.

    delta_f = sum s_G - sum s_G' (differentiable), delta_reward = R(S) - R(S') (constants),
    valid marks the exchanges that were built (group size >= 2); ``saturation``: w's (see
    :func:`exchange_weight`).
    """
    return exchange_terms(delta_f, delta_reward, valid, saturation=saturation).sum(dim=1)


def policy_gradient_loss(log_prob: torch.Tensor, anchor_reward: torch.Tensor,
                         counterfactual_rewards: torch.Tensor, valid: torch.Tensor, *,
                         normalize: bool = False, set_size=None) -> torch.Tensor:
    """L_RL, per sample [B]: -(R(S) - b) * log pi(S|x), with the baseline b the mean reward of
    the anchor and its valid counterfactuals (no gradient flows through b).

    ``normalize`` (not in the paper; off in its preset) divides the advantages by their batch
    standard deviation and log pi by the set size K (``set_size`` [B]), so that L_RL is O(1)
    like L_ex whatever the reward scale and K. Where that is undefined the value is defined
    here: a batch whose advantages are all equal (std 0, e.g. B = 1) divides them by their
    common magnitude instead (each becomes -1, 0 or +1), and a sample with K = 0 (no
    audio-visual token, log pi = 0) contributes 0.
    """
    _check_samples(log_prob=log_prob, anchor_reward=anchor_reward)
    _check_slots(counterfactual_rewards=counterfactual_rewards, valid=valid)
    _check_batch(log_prob, counterfactual_rewards)
    _check_normalize(normalize, set_size, log_prob)
    return policy_gradient_loss_unchecked(log_prob, anchor_reward, counterfactual_rewards, valid,
                                          normalize=normalize, set_size=set_size)


def policy_gradient_loss_unchecked(log_prob, anchor_reward, counterfactual_rewards, valid, *,
                                   normalize: bool = False, set_size=None) -> torch.Tensor:
    """:func:`policy_gradient_loss` without its checks (no host sync)."""
    cf = torch.where(valid, counterfactual_rewards, torch.zeros_like(counterfactual_rewards))
    baseline = (anchor_reward + cf.sum(dim=1)) / (1 + valid.sum(dim=1))
    tied = (~valid | (counterfactual_rewards == anchor_reward[:, None])).all(dim=1)
    advantage = _zero_where_tied(anchor_reward - baseline, tied).detach()
    if normalize:
        advantage = advantage / _advantage_scale(advantage)
        k = set_size.to(log_prob.dtype)
        log_prob = torch.where(set_size > 0, log_prob / k.clamp_min(1), torch.zeros_like(log_prob))
    return -advantage * log_prob


def set_level_loss(log_prob: torch.Tensor, reward: torch.Tensor) -> torch.Tensor:
    """REINFORCE with a set-level reward only (exchanges off, the CaCoVID-AV variant), per
    sample [B]. Without counterfactuals the baseline is the mean reward of the *other* samples
    of the batch (leave-one-out), so that it does not depend on the sample's own action."""
    _check_samples(log_prob=log_prob, reward=reward)
    return set_level_loss_unchecked(log_prob, reward)


def set_level_loss_unchecked(log_prob: torch.Tensor, reward: torch.Tensor) -> torch.Tensor:
    """:func:`set_level_loss` without its checks (no host sync)."""
    count = reward.shape[0]
    if count < 2:
        return -reward.detach() * log_prob
    baseline = (reward.sum() - reward) / (count - 1)
    advantage = _zero_where_tied(reward - baseline, (reward == reward[:1]).all())
    return -advantage.detach() * log_prob


def leave_one_out_loss(log_prob: torch.Tensor, rewards: torch.Tensor,
                       set_size: torch.Tensor, *, scale=None) -> torch.Tensor:
    """L_RL with a leave-one-out baseline (RLOO), per sample [B].

    ``log_prob`` and ``rewards`` are [B, A]: A >= 2 keep-sets sampled independently for each
    sample (Gumbel-Top-K anchors) and their rewards. Anchor a's baseline is the mean reward of
    the sample's other A - 1 anchors, so it does not depend on anchor a and the estimator stays
    unbiased. The advantages are divided by their standard deviation over the batch and log pi
    by the set size K (``set_size`` [B]), so the term is O(1) whatever the reward scale and K.
    Where that is undefined the value is defined as in :func:`policy_gradient_loss`: advantages
    that are all equal are divided by their common magnitude, and a sample with K = 0 gives 0.
    ``scale`` (a finite number > 0) divides the advantages instead of their batch standard
    deviation: a scale shared by batches whose rewards spread differently (``--advantage-scale
    running``) keeps their updates in proportion to their spread.
    """
    _check_sets(log_prob, rewards, set_size, "anchor per sample; the leave-one-out baseline")
    if scale is not None:
        scale = float(scale.detach()) if isinstance(scale, torch.Tensor) else scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale must be a finite number > 0 or None, got {scale!r}")
    return leave_one_out_loss_unchecked(log_prob, rewards, set_size, scale=scale)


def leave_one_out_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Each anchor's reward minus the mean of its sample's other anchors [B, A], 0 for a
    sample whose anchors all tie (detached)."""
    count = rewards.shape[1]
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (count - 1)
    tied = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    return _zero_where_tied(rewards - baseline, tied).detach()


def leave_one_out_loss_unchecked(log_prob: torch.Tensor, rewards: torch.Tensor,
                                 set_size: torch.Tensor, *, scale=None) -> torch.Tensor:
    """:func:`leave_one_out_loss` without its checks (no host sync)."""
    advantage = leave_one_out_advantages(rewards)
    advantage = advantage / (_advantage_scale(advantage) if scale is None else scale)
    k = set_size.to(log_prob.dtype)[:, None]
    scaled = torch.where(k > 0, log_prob / k.clamp_min(1), torch.zeros_like(log_prob))
    return -(advantage * scaled).mean(dim=1)


def group_normalized_loss(log_prob: torch.Tensor, rewards: torch.Tensor,
                          set_size: torch.Tensor) -> torch.Tensor:
    """L_RL with a group-normalised advantage (GRPO's), per sample [B].

    ``log_prob`` and ``rewards`` are [B, A]: A >= 2 keep-sets sampled independently for each
    sample and their rewards. Each set's advantage is its reward minus the mean of the sample's
    A rewards, divided by their standard deviation (population); a sample whose rewards are all
    equal gives advantages of 0. log pi is divided by the set size K (``set_size`` [B]; a sample
    with K = 0 gives 0), as in :func:`leave_one_out_loss`.
    """
    _check_sets(log_prob, rewards, set_size, "sample per clip; a group-normalised advantage")
    return group_normalized_loss_unchecked(log_prob, rewards, set_size)


def group_normalized_loss_unchecked(log_prob: torch.Tensor, rewards: torch.Tensor,
                                    set_size: torch.Tensor) -> torch.Tensor:
    """:func:`group_normalized_loss` without its checks (no host sync)."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, unbiased=False, keepdim=True)
    spread = std > 1e-6 * rewards.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
    advantage = torch.where(spread, centred / std.clamp_min(1e-12),
                            torch.zeros_like(centred)).detach()
    k = set_size.to(log_prob.dtype)[:, None]
    scaled = torch.where(k > 0, log_prob / k.clamp_min(1), torch.zeros_like(log_prob))
    return -(advantage * scaled).mean(dim=1)


def anchored_policy_gradient_loss(log_prob: torch.Tensor, anchor_rewards: torch.Tensor,
                                  counterfactual_rewards: torch.Tensor, valid: torch.Tensor,
                                  owner, *, normalize: bool = False,
                                  set_size=None) -> torch.Tensor:
    """The paper's L_RL for exchanges built around several anchors, per sample [B].

    ``log_prob``, ``anchor_rewards``: [B, A]; ``counterfactual_rewards``, ``valid``: [B, E];
    ``owner``: E anchor indices, the anchor each exchange slot was built around. Anchor a's
    baseline is the mean reward of a and its valid counterfactuals (the paper's b); the loss is
    averaged over the anchors that own at least one slot. With one anchor this is
    :func:`policy_gradient_loss`; ``normalize`` as there (the std over every anchor of the
    batch).
    """
    _check_anchors(log_prob=log_prob, anchor_rewards=anchor_rewards)
    _check_slots(counterfactual_rewards=counterfactual_rewards, valid=valid)
    _check_batch(log_prob, counterfactual_rewards)
    anchors, slots = log_prob.shape[1], valid.shape[1]
    owner_t = torch.as_tensor(owner, dtype=torch.long, device=log_prob.device)
    if owner_t.shape != (slots,) or bool(((owner_t < 0) | (owner_t >= anchors)).any()):
        raise ValueError(f"owner must hold {slots} anchor indices in [0, {anchors}), got "
                         f"{owner_t.tolist()}")
    _check_normalize(normalize, set_size, log_prob[:, 0])
    return anchored_policy_gradient_loss_unchecked(log_prob, anchor_rewards,
                                                   counterfactual_rewards, valid, owner,
                                                   normalize=normalize, set_size=set_size)


def anchored_policy_gradient_loss_unchecked(log_prob, anchor_rewards, counterfactual_rewards,
                                            valid, owner, *, normalize: bool = False,
                                            set_size=None) -> torch.Tensor:
    """:func:`anchored_policy_gradient_loss` without its checks (no host sync)."""
    anchors = log_prob.shape[1]
    owner = torch.as_tensor(owner, dtype=torch.long, device=log_prob.device)
    member = F.one_hot(owner, anchors).to(anchor_rewards.dtype)               # [E, A]
    cf = torch.where(valid, counterfactual_rewards, torch.zeros_like(counterfactual_rewards))
    baseline = (anchor_rewards + cf @ member) / (1 + valid.to(member.dtype) @ member)
    differs = valid & (counterfactual_rewards != anchor_rewards[:, owner])   # [B, E]
    tied = (differs.to(member.dtype) @ member) == 0                          # [B, A]
    advantage = _zero_where_tied(anchor_rewards - baseline, tied).detach()
    if normalize:
        advantage = advantage / _advantage_scale(advantage)
        k = set_size.to(log_prob.dtype)[:, None]
        log_prob = torch.where(k > 0, log_prob / k.clamp_min(1), torch.zeros_like(log_prob))
    used = member.sum(dim=0) > 0                                              # [A]
    return -(advantage * log_prob)[:, used].mean(dim=1)


def avex_objective(log_prob, anchor_reward, counterfactual_rewards, delta_f, valid,
                   *, lambda_ex: float = 1.0, use_rl: bool = True, use_exchange: bool = True,
                   normalize_rl: bool = False, set_size=None,
                   saturation: float = SATURATION_POINTS) -> dict[str, torch.Tensor]:
    """The batch-mean losses: {"loss", "rl", "exchange"}. dR = R(S) - R(S') per exchange;
    ``saturation``: w's (:func:`exchange_weight`)."""
    _checks.real("lambda_ex", lambda_ex, low=0)
    _checks.flag("use_rl", use_rl)
    _checks.flag("use_exchange", use_exchange)
    _check_samples(log_prob=log_prob, anchor_reward=anchor_reward)
    _check_slots(counterfactual_rewards=counterfactual_rewards, delta_f=delta_f, valid=valid)
    _check_batch(log_prob, counterfactual_rewards)
    _check_normalize(normalize_rl, set_size, log_prob)
    saturation = _checks.positive_float("saturation", saturation)
    # checked once here: the terms below trust their inputs
    delta_reward = anchor_reward[:, None] - counterfactual_rewards
    rl = policy_gradient_loss_unchecked(log_prob, anchor_reward, counterfactual_rewards, valid,
                                        normalize=normalize_rl, set_size=set_size).mean()
    ex = exchange_terms_unchecked(delta_f, delta_reward, valid,
                                  saturation=saturation).sum(dim=1).mean()
    zero = torch.zeros((), dtype=rl.dtype, device=rl.device)
    loss = (rl if use_rl else zero) + (lambda_ex * ex if use_exchange else zero)
    return {"loss": loss, "rl": rl.detach(), "exchange": ex.detach()}


def _zero_where_tied(advantage: torch.Tensor, tied: torch.Tensor) -> torch.Tensor:
    """``advantage`` with exact zeros wherever every reward it compares is the same (``tied``,
    broadcast to it). A baseline computed as a mean of equal floats need not equal them, and
    the batch std of the rounding left over would standardise it to +-1: a full-size step on
    no signal, where every set of a micro-batch ties (CIDEr's greedy captions often do)."""
    return torch.where(tied, torch.zeros_like(advantage), advantage)


def _advantage_scale(advantage: torch.Tensor) -> torch.Tensor:
    """The batch std of the advantages; their common magnitude where they are (numerically) all
    equal, so that the standardised advantage is -1, 0 or +1 there; 1 where all are 0."""
    std = advantage.std(unbiased=False)
    rms = advantage.square().mean().sqrt()
    scale = torch.where(std > 1e-6 * rms, std, rms)
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _check_samples(**tensors):
    """Per-sample tensors: 1-D [B] floats, same shape and device, finite."""
    _check_matching(1, **tensors)


def _check_anchors(**tensors):
    """Per-anchor tensors: 2-D [B, A] floats, same shape and device, finite."""
    _check_matching(2, **tensors)


def _check_matching(ndim: int, **tensors):
    (first_name, first), *_ = tensors.items()
    for name, t in tensors.items():
        _checks.tensor(name, t, ndim=ndim, floating=True)
        _checks.same_device(name, t, first_name, first)
        if t.shape != first.shape:
            raise ValueError(f"{name} has shape {list(t.shape)} but {first_name} has "
                             f"{list(first.shape)}")
        _checks.finite(name, t.detach())


def _check_slots(valid, **tensors):
    """Per-exchange tensors: 2-D [B, E] floats finite wherever ``valid`` (bool [B, E]) is True."""
    _checks.tensor("valid", valid, ndim=2, boolean=True)
    for name, t in tensors.items():
        _checks.tensor(name, t, ndim=2, floating=True)
        _checks.same_device(name, t, "valid", valid)
        if t.shape != valid.shape:
            raise ValueError(f"{name} has shape {list(t.shape)} but valid has "
                             f"{list(valid.shape)}")
        bad = valid & ~torch.isfinite(t.detach())
        if bool(bad.any()):
            row, slot = torch.nonzero(bad)[0].tolist()
            raise ValueError(f"{name} must be finite where valid is True, got "
                             f"{t[row, slot].item()} at row {row}, slot {slot}")


def _check_batch(per_sample: torch.Tensor, per_slot: torch.Tensor):
    if per_slot.shape[0] != per_sample.shape[0]:
        raise ValueError(f"counterfactual_rewards has {per_slot.shape[0]} rows but log_prob has "
                         f"{per_sample.shape[0]} samples")
    _checks.same_device("counterfactual_rewards", per_slot, "log_prob", per_sample)


def _check_sets(log_prob, rewards, set_size, needs: str):
    """[B, A] log-probabilities and rewards of A >= 2 sampled sets per sample, and their
    size K [B]; ``needs`` says what the A sets are for, in the error."""
    _check_anchors(log_prob=log_prob, rewards=rewards)
    if rewards.shape[1] < 2:
        raise ValueError(f"rewards has {rewards.shape[1]} {needs} needs at least 2")
    _check_set_size(set_size, log_prob[:, 0])


def _check_normalize(normalize, set_size, log_prob):
    _checks.flag("normalize", normalize)
    if normalize:
        if set_size is None:
            raise TypeError("normalize=True divides log pi by the set size K: pass set_size, "
                            "an integer tensor [B]")
        _check_set_size(set_size, log_prob)


def _check_set_size(set_size, log_prob):
    _checks.tensor("set_size", set_size, ndim=1, integer=True)
    _checks.same_device("set_size", set_size, "log_prob", log_prob)
    if set_size.shape != log_prob.shape:
        raise ValueError(f"set_size has shape {list(set_size.shape)} but log_prob has "
                         f"{list(log_prob.shape)}")
    if bool((set_size < 0).any()):
        raise ValueError(f"set_size must be >= 0, got {int(set_size.min())}")
