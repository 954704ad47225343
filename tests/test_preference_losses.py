"""The DPO family's losses by hand: DPO, cDPO, IPO, SimPO, ORPO, KTO, the implicit rewards."""

from __future__ import annotations

import math

import pytest
import torch

from olingo.rl.preference import (
    dpo_loss,
    implicit_rewards,
    ipo_loss,
    kto_loss,
    log_odds,
    orpo_loss,
    preference_margin,
    simpo_loss,
)


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def test_margin_and_implicit_rewards():
    pc, pr, rc, rr = torch.tensor([-3.0]), torch.tensor([-5.0]), torch.tensor([-4.0]), torch.tensor([-4.5])
    # (-3 - -4) - (-5 - -4.5) = 1 + 0.5
    assert float(preference_margin(pc, pr, rc, rr)) == pytest.approx(1.5)
    assert float(implicit_rewards(pc, rc, 0.1)) == pytest.approx(0.1)
    assert float(implicit_rewards(pr, rr, 0.1)) == pytest.approx(-0.05)


def test_dpo_is_the_negative_log_sigmoid_of_the_scaled_margin():
    margin = torch.tensor([1.5, -2.0, 0.0])
    expected = [-log_sigmoid(0.1 * 1.5), -log_sigmoid(0.1 * -2.0), math.log(2)]
    torch.testing.assert_close(dpo_loss(margin, beta=0.1), torch.tensor(expected))


def test_cdpo_mixes_in_the_flipped_preference():
    margin = torch.tensor([2.0])
    e = 0.1
    expected = -(1 - e) * log_sigmoid(0.5 * 2.0) - e * log_sigmoid(-0.5 * 2.0)
    assert float(dpo_loss(margin, beta=0.5, label_smoothing=e)) == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(margin, beta=0.5, label_smoothing=0.5)


def test_ipo_is_squared_distance_to_one_over_two_beta():
    margin = torch.tensor([1.0, 5.0, 8.0])
    # beta 0.1: target 5
    torch.testing.assert_close(ipo_loss(margin, beta=0.1), torch.tensor([16.0, 0.0, 9.0]))


def test_simpo_uses_length_normalised_log_probs_and_a_margin():
    chosen, rejected = torch.tensor([-0.5]), torch.tensor([-1.5])
    # beta 2, gamma 0.5: -log sigmoid(2 * 1.0 - 0.5)
    assert float(simpo_loss(chosen, rejected, beta=2.0, gamma=0.5)) == pytest.approx(-log_sigmoid(1.5), rel=1e-6)


def test_orpo_odds_ratio_and_nll():
    chosen, rejected = torch.tensor([math.log(0.8)]), torch.tensor([math.log(0.2)])
    # odds 4 and 0.25: log odds ratio = log 16
    assert float(log_odds(chosen)) == pytest.approx(math.log(4), rel=1e-6)
    nll = torch.tensor([0.3])
    loss, ratio = orpo_loss(chosen, rejected, nll, lam=0.1)
    assert float(ratio) == pytest.approx(-log_sigmoid(math.log(16)), rel=1e-6)
    assert float(loss) == pytest.approx(0.3 + 0.1 * float(ratio), rel=1e-6)
    # p near 1 keeps its precision (log(1 - p) of a float rounding to 1 would be -inf)
    assert math.isfinite(float(log_odds(torch.tensor([-1e-7]))))


def test_kto_weighs_desirable_and_undesirable_rows_against_the_reference_point():
    policy, ref = torch.tensor([-2.0, -2.0, -6.0]), torch.tensor([-3.0, -3.0, -4.0])
    desirable = torch.tensor([True, False, False])
    # r = (1, 1, -2), z = 0.5, beta 1
    losses = kto_loss(policy, ref, desirable, kl=0.5, beta=1.0, desirable_weight=1.0, undesirable_weight=2.0)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    torch.testing.assert_close(losses, torch.tensor([1 - sig(0.5), 2 * (1 - sig(-0.5)), 2 * (1 - sig(2.5))]))
    # a negative KL estimate is clamped to 0, and z never carries a gradient
    kl = torch.tensor(-1.0, requires_grad=True)
    live = policy.clone().requires_grad_(True)
    clamped = kto_loss(live, ref, desirable, kl=kl, beta=1.0)
    torch.testing.assert_close(clamped, kto_loss(policy, ref, desirable, kl=0.0, beta=1.0).detach())
    clamped.sum().backward()
    assert kl.grad is None and live.grad is not None


def test_dpo_gradient_pushes_chosen_up_and_rejected_down():
    chosen = torch.tensor([-3.0], requires_grad=True)
    rejected = torch.tensor([-3.0], requires_grad=True)
    dpo_loss(preference_margin(chosen, rejected, torch.tensor([-3.0]), torch.tensor([-3.0])), beta=0.1).sum().backward()
    # d/dh -log sigmoid(beta h) at h = 0 is -beta / 2
    assert float(chosen.grad) == pytest.approx(-0.05) and float(rejected.grad) == pytest.approx(0.05)
