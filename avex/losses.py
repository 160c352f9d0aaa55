"""Training objective of Section 3.4: L = L_RL + lambda_ex * L_ex.

Rewards are CIDEr-D in *points* (pycocoevalcap's score x 100, the unit of the paper's tables),
so that w(dR) = min(|dR| / 5, 1) saturates at 5 points as the paper states.

Shapes: B samples, E exchange slots per sample (the four types, some of them skipped).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from avex import _checks

SATURATION_POINTS = 5.0


def exchange_weight(delta_reward: torch.Tensor) -> torch.Tensor:
    """w(dR) = min(|dR| / 5, 1): near-zero reward differences barely count."""
    return (delta_reward.abs() / SATURATION_POINTS).clamp(max=1.0)


def exchange_loss(delta_f: torch.Tensor, delta_reward: torch.Tensor,
                  valid: torch.Tensor) -> torch.Tensor:
    """L_ex, per sample [B]: mean over the sample's valid exchanges of
    w(dR) * log(1 + exp(-sign(dR) * dF)); 0 for a sample with none.

    delta_f = sum s_G - sum s_G' (differentiable), delta_reward = R(S) - R(S') (constants),
    valid marks the exchanges that were built (group size >= 2).
    """
    _check_same_shape(delta_f=delta_f, delta_reward=delta_reward, valid=valid)
    pairwise = exchange_weight(delta_reward) * F.softplus(-torch.sign(delta_reward) * delta_f)
    pairwise = torch.where(valid, pairwise, torch.zeros_like(pairwise))
    count = valid.sum(dim=1)
    return pairwise.sum(dim=1) / count.clamp(min=1)


def policy_gradient_loss(log_prob: torch.Tensor, anchor_reward: torch.Tensor,
                         counterfactual_rewards: torch.Tensor, valid: torch.Tensor, *,
                         normalize: bool = False, set_size=None) -> torch.Tensor:
    """L_RL, per sample [B]: -(R(S) - b) * log pi(S|x), with the baseline b the mean reward of
    the anchor and its valid counterfactuals (no gradient flows through b).

    ``normalize`` (not in the paper; off in its preset) divides the advantages by their batch
    standard deviation and log pi by the set size K (``set_size`` [B]), so that L_RL is O(1)
    like L_ex whatever the reward scale and K.
    """
    _check_same_shape(counterfactual_rewards=counterfactual_rewards, valid=valid)
    _check_same_shape(log_prob=log_prob, anchor_reward=anchor_reward)
    cf = torch.where(valid, counterfactual_rewards, torch.zeros_like(counterfactual_rewards))
    baseline = (anchor_reward + cf.sum(dim=1)) / (1 + valid.sum(dim=1))
    advantage = (anchor_reward - baseline).detach()
    if normalize:
        advantage = advantage / (advantage.std(unbiased=False) + 1e-6)
        log_prob = log_prob / set_size.to(log_prob.dtype)
    return -advantage * log_prob


def set_level_loss(log_prob: torch.Tensor, reward: torch.Tensor) -> torch.Tensor:
    """REINFORCE with a set-level reward only (exchanges off, the CaCoVID-AV variant), per
    sample [B]. Without counterfactuals the baseline is the mean reward of the *other* samples
    of the batch (leave-one-out), so that it does not depend on the sample's own action."""
    _check_same_shape(log_prob=log_prob, reward=reward)
    count = reward.shape[0]
    if count < 2:
        baseline = torch.zeros_like(reward)
    else:
        baseline = (reward.sum() - reward) / (count - 1)
    return -(reward - baseline).detach() * log_prob


def leave_one_out_loss(log_prob: torch.Tensor, rewards: torch.Tensor,
                       set_size: torch.Tensor) -> torch.Tensor:
    """L_RL with a leave-one-out baseline (RLOO), per sample [B].

    ``log_prob`` and ``rewards`` are [B, A]: A >= 2 keep-sets sampled independently for each
    sample (Gumbel-Top-K anchors) and their rewards. Anchor a's baseline is the mean reward of
    the sample's other A - 1 anchors, so it does not depend on anchor a and the estimator stays
    unbiased. The advantages are divided by their standard deviation over the batch and log pi
    by the set size K (``set_size`` [B]), so the term is O(1) whatever the reward scale and K.
    """
    _check_same_shape(log_prob=log_prob, rewards=rewards)
    count = rewards.shape[1]
    if count < 2:
        raise ValueError(f"rewards has {count} anchor per sample; the leave-one-out baseline "
                         "needs at least 2")
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (count - 1)
    advantage = (rewards - baseline).detach()
    advantage = advantage / (advantage.std(unbiased=False) + 1e-6)
    scaled = log_prob / set_size.to(log_prob.dtype)[:, None]
    return -(advantage * scaled).mean(dim=1)


def avex_objective(log_prob, anchor_reward, counterfactual_rewards, delta_f, valid,
                   *, lambda_ex: float = 1.0, use_rl: bool = True, use_exchange: bool = True,
                   normalize_rl: bool = False, set_size=None) -> dict[str, torch.Tensor]:
    """The batch-mean losses: {"loss", "rl", "exchange"}. dR = R(S) - R(S') per exchange."""
    if lambda_ex < 0:
        raise ValueError(f"lambda_ex must be >= 0, got {lambda_ex}")
    delta_reward = anchor_reward[:, None] - counterfactual_rewards
    rl = policy_gradient_loss(log_prob, anchor_reward, counterfactual_rewards, valid,
                              normalize=normalize_rl, set_size=set_size).mean()
    ex = exchange_loss(delta_f, delta_reward, valid).mean()
    zero = torch.zeros((), dtype=rl.dtype, device=rl.device)
    loss = (rl if use_rl else zero) + (lambda_ex * ex if use_exchange else zero)
    return {"loss": loss, "rl": rl.detach(), "exchange": ex.detach()}


def _check_same_shape(**tensors):
    (first_name, first), *rest = tensors.items()
    _checks.tensor(first_name, first)
    for name, t in rest:
        _checks.tensor(name, t)
        if t.shape != first.shape:
            raise ValueError(f"{name} has shape {list(t.shape)} but {first_name} has "
                             f"{list(first.shape)}")
