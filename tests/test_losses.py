"""Loss terms against values computed by hand on a fixed small example."""
import math

import pytest
import torch

from avex.training.losses import (anchored_policy_gradient_loss, avex_objective, exchange_loss,
                                  exchange_terms, exchange_weight, group_normalized_loss,
                                  leave_one_out_loss, policy_gradient_loss, saturation_for)


def test_exchange_weight_is_linear_then_saturates():
    dr = torch.tensor([0.0, 1.0, -2.5, 5.0, -12.0])
    assert exchange_weight(dr).tolist() == pytest.approx([0.0, 0.2, 0.5, 1.0, 1.0])


def test_exchange_weight_saturates_on_the_reward_scale_given():
    # the paper's 5 points at its full-token 56.8, scaled to a benchmark where full tokens score
    # 476: about 42 points
    assert saturation_for(56.8) == pytest.approx(5.0)
    assert saturation_for(476.0) == pytest.approx(41.9, abs=0.05)
    dr = torch.tensor([0.0, 21.0, -42.0, 100.0])
    assert exchange_weight(dr, 42.0).tolist() == pytest.approx([0.0, 0.5, 1.0, 1.0])


def test_exchange_weight_of_a_plain_number_is_a_float():
    assert exchange_weight(2.5) == pytest.approx(0.5) and isinstance(exchange_weight(2.5), float)
    assert exchange_weight(-50, saturation=40.0) == 1.0


def test_exchange_terms_are_the_loss_split_by_slot():
    delta_f = torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, -1.0, 3.0]])
    delta_r = torch.tensor([[2.5, 10.0, -1.0, 3.0], [0.0, -4.0, 8.0, 1.0]])
    valid = torch.tensor([[True, True, True, False], [True, True, True, True]])
    terms = exchange_terms(delta_f, delta_r, valid, saturation=8.0)
    assert terms.sum(1).tolist() == pytest.approx(
        exchange_loss(delta_f, delta_r, valid, saturation=8.0).tolist())
    assert terms[0, 3].item() == 0.0 and terms[1, 0].item() == 0.0  # masked; dR = 0


def test_group_normalized_advantage_by_hand():
    log_prob = torch.tensor([[-2.0, -4.0, -6.0]], requires_grad=True)
    rewards = torch.tensor([[10.0, 20.0, 30.0]])
    # advantages (R - 20) / std([10, 20, 30]) = [-1.2247, 0, 1.2247]; log pi / K with K = 2
    loss = group_normalized_loss(log_prob, rewards, torch.tensor([2]))
    a = 10.0 / math.sqrt(200.0 / 3)
    assert loss.item() == pytest.approx(-(-a * -1.0 + a * -3.0) / 3, rel=1e-6)
    # a clip whose samples all score the same gives no gradient (no division by ~0)
    flat = group_normalized_loss(log_prob, torch.full((1, 3), 7.0), torch.tensor([2]))
    assert flat.item() == 0.0


def test_anchored_policy_gradient_with_one_anchor_is_the_papers():
    torch.manual_seed(0)
    log_prob, anchor = torch.randn(3, 1), 10 * torch.randn(3, 1)
    cf, valid = 10 * torch.randn(3, 4), torch.rand(3, 4) > 0.3
    for normalize in (False, True):
        sizes = torch.tensor([4, 5, 0]) if normalize else None
        got = anchored_policy_gradient_loss(log_prob, anchor, cf, valid, [0, 0, 0, 0],
                                            normalize=normalize, set_size=sizes)
        want = policy_gradient_loss(log_prob[:, 0], anchor[:, 0], cf, valid,
                                    normalize=normalize, set_size=sizes)
        assert got.tolist() == pytest.approx(want.tolist())


def test_anchored_policy_gradient_baseline_per_anchor():
    # two anchors, one exchange each: b_a = (R_a + R_cf(a)) / 2
    log_prob = torch.tensor([[-1.0, -2.0]])
    loss = anchored_policy_gradient_loss(log_prob, torch.tensor([[10.0, 30.0]]),
                                         torch.tensor([[4.0, 40.0]]),
                                         torch.tensor([[True, True]]), [0, 1])
    # advantages 3 and -5: -(3 * -1 + -5 * -2) / 2
    assert loss.item() == pytest.approx(-3.5)


def test_exchange_loss_by_hand():
    delta_f = torch.tensor([[0.5, -1.0, 2.0, 0.0]])
    delta_r = torch.tensor([[2.5, 10.0, -1.0, 3.0]])
    valid = torch.tensor([[True, True, True, False]])
    # w * log(1 + exp(-sign(dR) * dF)), mean over the three valid exchanges
    by_hand = (0.5 * math.log(1 + math.exp(-0.5))
               + 1.0 * math.log(1 + math.exp(1.0))
               + 0.2 * math.log(1 + math.exp(2.0))) / 3
    assert exchange_loss(delta_f, delta_r, valid).item() == pytest.approx(by_hand, rel=1e-6)


def test_exchange_loss_of_a_sample_without_exchanges_is_zero():
    out = exchange_loss(torch.ones(2, 4), torch.ones(2, 4), torch.zeros(2, 4, dtype=torch.bool))
    assert out.tolist() == [0.0, 0.0]


def test_exchange_loss_pushes_the_better_group_up():
    # removing G hurt (dR > 0): the loss falls as dF = s_G - s_G' grows
    delta_f = torch.tensor([[0.0]], requires_grad=True)
    exchange_loss(delta_f, torch.tensor([[4.0]]), torch.tensor([[True]])).sum().backward()
    assert delta_f.grad.item() < 0


def test_policy_gradient_loss_by_hand():
    log_prob = torch.tensor([-3.0, -2.0], requires_grad=True)
    anchor = torch.tensor([50.0, 40.0])
    cf = torch.tensor([[40.0, 60.0, 0.0], [30.0, 0.0, 0.0]])
    valid = torch.tensor([[True, True, False], [True, False, False]])
    # baselines: (50 + 40 + 60) / 3 = 50 and (40 + 30) / 2 = 35
    loss = policy_gradient_loss(log_prob, anchor, cf, valid)
    assert loss.tolist() == pytest.approx([-(0.0) * -3.0, -(5.0) * -2.0])
    loss.sum().backward()
    assert log_prob.grad.tolist() == pytest.approx([0.0, -5.0])


def test_objective_combines_terms_with_lambda():
    args = (torch.tensor([-1.0]), torch.tensor([10.0]), torch.tensor([[4.0, 12.0]]),
            torch.tensor([[1.0, -0.5]]), torch.tensor([[True, True]]))
    full = avex_objective(*args, lambda_ex=2.0)
    assert full["loss"].item() == pytest.approx(full["rl"].item() + 2.0 * full["exchange"].item())
    only_ex = avex_objective(*args, use_rl=False)
    assert only_ex["loss"].item() == pytest.approx(only_ex["exchange"].item())
    only_rl = avex_objective(*args, use_exchange=False)
    assert only_rl["loss"].item() == pytest.approx(only_rl["rl"].item())


def test_bad_shapes_and_lambda_are_rejected():
    with pytest.raises(ValueError, match=r"delta_reward has shape \[2, 3\]"):
        exchange_loss(torch.ones(2, 4), torch.ones(2, 3), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="lambda_ex must be a finite number >= 0, got -1"):
        avex_objective(torch.ones(1), torch.ones(1), torch.ones(1, 2), torch.ones(1, 2),
                       torch.ones(1, 2, dtype=torch.bool), lambda_ex=-1)


def test_leave_one_out_loss_by_hand():
    """Anchor a's baseline is the mean of the clip's other anchors; advantages over the batch
    std; log pi over K."""
    log_prob = torch.tensor([[-4.0, -8.0, -2.0], [-6.0, -6.0, -6.0]], requires_grad=True)
    rewards = torch.tensor([[30.0, 60.0, 30.0], [10.0, 10.0, 40.0]])
    k = torch.tensor([2, 3])
    # baselines: (60+30)/2, (30+30)/2, (30+60)/2 = 45, 30, 45; (10+40)/2, 25, 10
    adv = torch.tensor([[-15.0, 30.0, -15.0], [-15.0, -15.0, 30.0]])
    adv = adv / adv.std(unbiased=False)
    scaled = log_prob.detach() / k[:, None]
    by_hand = -(adv * scaled).mean(1)
    loss = leave_one_out_loss(log_prob, rewards, k)
    torch.testing.assert_close(loss, by_hand)
    loss.sum().backward()
    torch.testing.assert_close(log_prob.grad, -adv / k[:, None] / 3)


def test_leave_one_out_baseline_ignores_the_anchors_own_reward():
    """Raising one anchor's reward moves the other anchors' advantages, never its baseline:
    its raw advantage grows by exactly the raise."""
    log_prob = torch.zeros(1, 4, requires_grad=True)
    rewards = torch.tensor([[10.0, 20.0, 30.0, 40.0]])
    raised = rewards.clone()
    raised[0, 0] += 12.0
    grads = []
    for r in (rewards, raised):
        log_prob.grad = None
        leave_one_out_loss(log_prob, r, torch.tensor([1])).sum().backward()
        grads.append(log_prob.grad.clone())
    # with one sample the std scale differs between the two; compare the unscaled advantages
    raw = [-(g * 4) for g in grads]
    scale = [(r - (r.sum() - r) / 3).std(unbiased=False) for r in (rewards, raised)]
    before, after = raw[0] * scale[0], raw[1] * scale[1]
    assert (after[0, 0] - before[0, 0]).item() == pytest.approx(12.0, rel=1e-5)
    assert (after[0, 1:] - before[0, 1:]).tolist() == pytest.approx([-4.0] * 3, rel=1e-5)


# rewards whose mean is not exact in float32: (sum - r) / (A - 1) differs from r by rounding
TIED = (27.87, 0.3, 463.7)


@pytest.mark.parametrize("value", TIED)
def test_tied_rewards_give_no_gradient_whatever_the_rounding(value):
    """A micro-batch whose every set ties (CIDEr's identical greedy captions) has no signal. The
    leave-one-out and the paper's baselines are means of equal floats, and their rounding
    error, standardised by its own std, once made advantages of +-1: full-size steps on noise."""
    torch.manual_seed(0)
    log_prob = torch.randn(4, 8, requires_grad=True)
    k = torch.full((4,), 10)
    leave_one_out_loss(log_prob, torch.full((4, 8), value), k).sum().backward()
    assert log_prob.grad.abs().max().item() == 0.0
    one = torch.randn(1, requires_grad=True)   # B = 1: the std fallback divides by |advantage|
    policy_gradient_loss(one, torch.tensor([value]), torch.full((1, 3), value),
                         torch.ones(1, 3, dtype=torch.bool), normalize=True,
                         set_size=torch.tensor([5])).sum().backward()
    assert one.grad.item() == 0.0
    anchors = torch.randn(2, 4, requires_grad=True)
    anchored_policy_gradient_loss(anchors, torch.full((2, 4), value), torch.full((2, 4), value),
                                  torch.ones(2, 4, dtype=torch.bool), [0, 1, 2, 3],
                                  normalize=True, set_size=torch.tensor([5, 5])).sum().backward()
    assert anchors.grad.abs().max().item() == 0.0


def test_a_tied_clip_beside_untied_ones_gets_exactly_zero():
    """Only the tied clip is zeroed; the others keep their by-hand advantages, and an invalid
    counterfactual slot does not count as a difference."""
    log_prob = torch.zeros(2, 3, requires_grad=True)
    rewards = torch.tensor([[27.87, 27.87, 27.87], [10.0, 10.0, 40.0]])
    leave_one_out_loss(log_prob, rewards, torch.tensor([1, 1])).sum().backward()
    assert log_prob.grad[0].tolist() == [0.0, 0.0, 0.0]
    adv = torch.tensor([-15.0, -15.0, 30.0])
    adv = adv / torch.cat([torch.zeros(3), adv]).std(unbiased=False)
    torch.testing.assert_close(log_prob.grad[1], -adv / 3)
    one = torch.randn(2, requires_grad=True)
    valid = torch.tensor([[True, False], [True, True]])
    policy_gradient_loss(one, torch.tensor([5.0, 5.0]), torch.tensor([[5.0, 9.0], [5.0, 9.0]]),
                         valid).sum().backward()
    assert one.grad[0].item() == 0.0 and one.grad[1].item() != 0.0


def test_leave_one_out_needs_two_anchors():
    with pytest.raises(ValueError, match="rewards has 1 anchor per sample"):
        leave_one_out_loss(torch.zeros(2, 1), torch.zeros(2, 1), torch.ones(2))


def test_the_unchecked_forms_are_the_checked_arithmetic():
    """Training's step calls the *_unchecked forms (no host syncs): the same values, bit for
    bit, as the checked public functions on valid input."""
    from avex.training import losses

    torch.manual_seed(0)
    log_prob, rewards = torch.randn(3, 4), 50 * torch.rand(3, 4)
    k = torch.tensor([5, 0, 7])
    cf, valid = 50 * torch.rand(3, 6), torch.rand(3, 6) > 0.3
    delta_f = torch.randn(3, 6)
    pairs = [
        (losses.leave_one_out_loss(log_prob, rewards, k),
         losses.leave_one_out_loss_unchecked(log_prob, rewards, k)),
        (losses.group_normalized_loss(log_prob, rewards, k),
         losses.group_normalized_loss_unchecked(log_prob, rewards, k)),
        (losses.set_level_loss(log_prob[:, 0], rewards[:, 0]),
         losses.set_level_loss_unchecked(log_prob[:, 0], rewards[:, 0])),
        (losses.anchored_policy_gradient_loss(log_prob, rewards, cf, valid, [0, 1, 2, 3, 0, 1],
                                              normalize=True, set_size=k),
         losses.anchored_policy_gradient_loss_unchecked(log_prob, rewards, cf, valid,
                                                        [0, 1, 2, 3, 0, 1], normalize=True,
                                                        set_size=k)),
        (losses.policy_gradient_loss(log_prob[:, 0], rewards[:, 0], cf, valid),
         losses.policy_gradient_loss_unchecked(log_prob[:, 0], rewards[:, 0], cf, valid)),
        (losses.exchange_terms(delta_f, cf, valid, saturation=8.0),
         losses.exchange_terms_unchecked(delta_f, cf, valid, saturation=8.0)),
    ]
    for checked, unchecked in pairs:
        assert torch.equal(checked, unchecked)


def test_the_objective_checks_its_inputs_once(monkeypatch):
    """avex_objective checks at its boundary; the terms it computes trust their inputs (each
    check is a host sync on every micro-batch)."""
    from avex.training import losses

    calls = {"samples": 0, "slots": 0}
    for name, key in (("_check_samples", "samples"), ("_check_slots", "slots")):
        original = getattr(losses, name)

        def counted(*args, _original=original, _key=key, **kwargs):
            calls[_key] += 1
            return _original(*args, **kwargs)
        monkeypatch.setattr(losses, name, counted)
    avex_objective(torch.tensor([-1.0]), torch.tensor([10.0]), torch.tensor([[4.0, 12.0]]),
                   torch.tensor([[1.0, -0.5]]), torch.tensor([[True, True]]))
    assert calls == {"samples": 1, "slots": 1}
