"""Bad input to the loss terms (avex.training.losses), one case a line (tests/badinput.py); then the
defined values where a normalisation is undefined, and masked slots that hold NaN."""
import pytest
import torch

from avex.training.losses import (anchored_policy_gradient_loss, avex_objective, exchange_loss,
                                  exchange_weight, group_normalized_loss, leave_one_out_loss,
                                  policy_gradient_loss, saturation_for, set_level_loss)
from badinput import INF, NAN, case, raises
from conftest import requires_cuda

B, E = 2, 4


def t(*shape, fill=1.0, dtype=torch.float32, device="cpu"):
    return torch.full(shape, fill, dtype=dtype, device=device)


VALID = torch.ones(B, E, dtype=torch.bool)


def objective(log_prob=None, anchor=None, cf=None, delta_f=None, valid=None, **kw):
    return lambda: avex_objective(t(B) if log_prob is None else log_prob,
                                  t(B) if anchor is None else anchor,
                                  t(B, E) if cf is None else cf,
                                  t(B, E) if delta_f is None else delta_f,
                                  VALID if valid is None else valid, **kw)


def pg(log_prob=None, anchor=None, cf=None, valid=None, **kw):
    return lambda: policy_gradient_loss(t(B) if log_prob is None else log_prob,
                                        t(B) if anchor is None else anchor,
                                        t(B, E) if cf is None else cf,
                                        VALID if valid is None else valid, **kw)


def rloo(log_prob=None, rewards=None, set_size=None, anchors=4):
    return lambda: leave_one_out_loss(t(B, anchors) if log_prob is None else log_prob,
                                      t(B, anchors) if rewards is None else rewards,
                                      torch.full((B,), 8) if set_size is None else set_size)


LOSS_CASES = [
    case("rloo one anchor", rloo(anchors=1), ValueError, "rewards has 1 anchor per sample; the leave-one-out baseline needs at least 2"),
    case("rloo rewards NaN", rloo(rewards=t(B, 4, fill=NAN)), ValueError, "rewards must be finite"),
    case("rloo rewards [B]", rloo(rewards=t(B)), ValueError, "rewards must be 2-D"),
    case("rloo shapes differ", rloo(rewards=t(B, 3)), ValueError, r"rewards has shape \[2, 3\] but log_prob has \[2, 4\]"),
    case("rloo set_size -1", rloo(set_size=torch.tensor([8, -1])), ValueError, "set_size must be >= 0, got -1"),
    case("rloo set_size float", rloo(set_size=t(B)), TypeError, "set_size must be an integer tensor"),
    case("lambda_ex nan", objective(lambda_ex=NAN), ValueError, "lambda_ex must be a finite number >= 0, got nan"),
    case("lambda_ex inf", objective(lambda_ex=INF), ValueError, "lambda_ex must be a finite number >= 0, got inf"),
    case("lambda_ex -1", objective(lambda_ex=-1), ValueError, "lambda_ex must be a finite number >= 0, got -1"),
    case("lambda_ex '1'", objective(lambda_ex="1"), TypeError, "lambda_ex must be a number, got str"),
    case("use_rl 'no'", objective(use_rl="no"), TypeError, "use_rl must be True or False, got str: 'no'"),
    case("normalize_rl 'yes'", objective(normalize_rl="yes", set_size=torch.ones(B, dtype=torch.long)), TypeError, "normalize must be True or False"),
    case("anchor reward nan", objective(anchor=torch.tensor([1.0, NAN])), ValueError, r"anchor_reward must be finite, got nan at \(1,\)"),
    case("log_prob inf", objective(log_prob=torch.tensor([-INF, 0.0])), ValueError, r"log_prob must be finite, got -inf at \(0,\)"),
    case("valid counterfactual reward nan", objective(cf=torch.tensor([[1.0, 1, 1, 1], [1, 1, NAN, 1]])), ValueError, r"counterfactual_rewards must be finite where valid is True, got nan at row 1, slot 2"),
    case("valid delta_f inf", objective(delta_f=torch.tensor([[1.0, INF, 1, 1], [1, 1, 1, 1]])), ValueError, r"delta_f must be finite where valid is True, got inf at row 0, slot 1"),
    case("float valid", objective(valid=torch.ones(B, E)), TypeError, "valid must be a bool tensor, got dtype torch.float32"),
    case("int valid", pg(valid=torch.ones(B, E, dtype=torch.long)), TypeError, "valid must be a bool tensor"),
    case("log_prob [B, 1]", pg(log_prob=t(B, 1), anchor=t(B, 1)), ValueError, r"log_prob must be 1-D, got shape \[2, 1\]"),
    case("anchor_reward [B, 1]", pg(anchor=t(B, 1)), ValueError, r"anchor_reward must be 1-D, got shape \[2, 1\]"),
    case("log_prob 3 samples, rewards 2", pg(log_prob=t(3), anchor=t(3)), ValueError, "counterfactual_rewards has 2 rows but log_prob has 3 samples"),
    case("counterfactual_rewards 1-D", pg(cf=t(B)), ValueError, r"counterfactual_rewards must be 2-D, got shape \[2\]"),
    case("counterfactual_rewards vs valid", pg(cf=t(B, 3)), ValueError, r"counterfactual_rewards has shape \[2, 3\] but valid has \[2, 4\]"),
    case("int log_prob", pg(log_prob=torch.ones(B, dtype=torch.long)), TypeError, "log_prob must be a floating-point tensor"),
    case("log_prob a list", pg(log_prob=[1.0, 2.0]), TypeError, "log_prob must be a torch.Tensor, got list"),
    case("normalize without set_size", pg(normalize=True), TypeError, "normalize=True divides log pi by the set size K: pass set_size"),
    case("set_size float", pg(normalize=True, set_size=t(B)), TypeError, "set_size must be an integer tensor"),
    case("set_size -1", pg(normalize=True, set_size=torch.tensor([3, -1])), ValueError, "set_size must be >= 0, got -1"),
    case("set_size wrong shape", pg(normalize=True, set_size=torch.tensor([3])), ValueError, r"set_size has shape \[1\] but log_prob has \[2\]"),
    case("meta log_prob", pg(log_prob=t(B, device="meta")), ValueError, r"log_prob is a meta tensor \(shape \[2\], no data\)"),
    case("set_level 2-D", lambda: set_level_loss(t(2, 3), t(2, 3)), ValueError, r"log_prob must be 1-D, got shape \[2, 3\]"),
    case("set_level shapes differ", lambda: set_level_loss(t(2), t(3)), ValueError, r"reward has shape \[3\] but log_prob has \[2\]"),
    case("set_level reward nan", lambda: set_level_loss(t(2), torch.tensor([0.0, NAN])), ValueError, "reward must be finite, got nan"),
    case("exchange_loss shapes differ", lambda: exchange_loss(t(B, E), t(B, 3), VALID), ValueError, r"delta_reward has shape \[2, 3\] but valid has \[2, 4\]"),
    case("exchange_loss 3-D", lambda: exchange_loss(t(B, E, 1), t(B, E, 1), VALID[..., None]), ValueError, r"valid must be 2-D"),
    case("exchange_weight(nan)", lambda: exchange_weight(NAN), ValueError, "delta_reward must be a finite number, got nan"),
    case("exchange_weight(inf)", lambda: exchange_weight(INF), ValueError, "delta_reward must be a finite number, got inf"),
    case("exchange_weight('1')", lambda: exchange_weight("1"), TypeError, "delta_reward must be a number, got str: '1'"),
    case("exchange_weight(None)", lambda: exchange_weight(None), TypeError, "delta_reward must be a number, got NoneType"),
    case("exchange_weight(True)", lambda: exchange_weight(True), TypeError, "delta_reward must be a number, got bool"),
    case("exchange_weight tensor nan", lambda: exchange_weight(torch.tensor([1.0, NAN])), ValueError, r"delta_reward must be finite, got nan at \(1,\)"),
    case("exchange_weight int tensor", lambda: exchange_weight(torch.tensor([1, 2])), TypeError, "delta_reward must be a floating-point tensor"),
    case("exchange_weight saturation 0", lambda: exchange_weight(0.5, saturation=0), ValueError, "saturation must be a finite number > 0, got 0.0"),
    case("exchange_weight saturation nan", lambda: exchange_weight(0.5, saturation=NAN), ValueError, "saturation must be a finite number > 0, got nan"),
    case("exchange_loss saturation -1", lambda: exchange_loss(t(B, E), t(B, E), VALID, saturation=-1.0), ValueError, "saturation must be a finite number > 0, got -1.0"),
    case("saturation_for(0)", lambda: saturation_for(0.0), ValueError, "full_token_reward must be a finite number > 0, got 0.0"),
    case("group loss one sample", lambda: group_normalized_loss(t(B, 1), t(B, 1), torch.full((B,), 8)), ValueError, "rewards has 1 sample per clip; a group-normalised advantage needs at least 2"),
    case("group loss rewards nan", lambda: group_normalized_loss(t(B, 4), t(B, 4, fill=NAN), torch.full((B,), 8)), ValueError, "rewards must be finite"),
    case("anchored owner out of range", lambda: anchored_policy_gradient_loss(t(B, 2), t(B, 2), t(B, E), VALID, [0, 1, 2, 0]), ValueError, r"owner must hold 4 anchor indices in \[0, 2\), got \[0, 1, 2, 0\]"),
    case("anchored owner too short", lambda: anchored_policy_gradient_loss(t(B, 2), t(B, 2), t(B, E), VALID, [0, 1]), ValueError, r"owner must hold 4 anchor indices"),
    case("devices differ", lambda: pg(anchor=t(B, device="cuda"))(), ValueError, "anchor_reward is on cuda:0 but log_prob is on cpu", marks=requires_cuda),
    case("valid on another device", lambda: pg(valid=VALID.cuda())(), ValueError, "counterfactual_rewards is on cpu but valid is on cuda:0", marks=requires_cuda),
]


@pytest.mark.parametrize("call,error,match", LOSS_CASES)
def test_bad_loss_input_is_refused(call, error, match):
    raises(call, error, match)


def test_normalised_advantage_of_one_sample_is_its_sign_not_a_division_by_1e_6():
    log_prob = torch.tensor([-2.0], requires_grad=True)
    loss = policy_gradient_loss(log_prob, torch.tensor([50.0]), torch.tensor([[40.0]]),
                                torch.tensor([[True]]), normalize=True, set_size=torch.tensor([4]))
    # advantage 50 - 45 = 5, std 0 -> +1; log pi / K = -0.5
    assert loss.tolist() == pytest.approx([0.5])


def test_normalised_advantages_all_equal_are_signs_and_all_zero_stay_zero():
    valid = torch.tensor([[True], [True], [True]])
    # advantages 0.1, 0.1, 0.1 (std ~1e-17 in float arithmetic): all +1, not ~1e16
    equal = policy_gradient_loss(torch.full((3,), -1.0), torch.full((3,), 0.3),
                                 torch.full((3, 1), 0.1), valid, normalize=True,
                                 set_size=torch.ones(3, dtype=torch.long))
    assert equal.tolist() == pytest.approx([1.0, 1.0, 1.0])
    zero = policy_gradient_loss(torch.full((3,), -1.0), torch.zeros(3), torch.zeros(3, 1), valid,
                                normalize=True, set_size=torch.ones(3, dtype=torch.long))
    assert zero.tolist() == [0.0, 0.0, 0.0]


def test_normalised_sample_with_set_size_zero_contributes_zero():
    log_prob = torch.tensor([-2.0, 0.0], requires_grad=True)
    loss = policy_gradient_loss(log_prob, torch.tensor([50.0, 30.0]),
                                torch.tensor([[40.0], [20.0]]), torch.tensor([[True], [True]]),
                                normalize=True, set_size=torch.tensor([4, 0]))
    assert torch.isfinite(loss).all() and loss[1].item() == 0.0
    loss.sum().backward()
    assert torch.isfinite(log_prob.grad).all()


def test_nan_in_a_masked_slot_reaches_neither_loss_nor_gradient():
    log_prob = torch.tensor([-1.0, -2.0], requires_grad=True)
    delta_f = torch.tensor([[0.5, NAN], [1.0, 2.0]], requires_grad=True)
    cf = torch.tensor([[40.0, NAN], [30.0, INF]])
    valid = torch.tensor([[True, False], [True, False]])
    out = avex_objective(log_prob, torch.tensor([50.0, 40.0]), cf, delta_f, valid,
                         use_rl=True)
    out["loss"].backward()
    assert torch.isfinite(out["loss"])
    assert torch.isfinite(delta_f.grad).all() and torch.isfinite(log_prob.grad).all()
    assert delta_f.grad[:, 1].tolist() == [0.0, 0.0]
