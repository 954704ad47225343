"""Pairwise losses against hand-computed values."""

import math

import torch

from olingo.rl.preference import LogExpLoss, LogSigLoss


def test_logsig_hand_values():
    chosen, rejected = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0])
    # -log(sigmoid(1)) = log(1 + e^-1) = 0.3132617; -log(sigmoid(0)) = log 2 = 0.6931472
    expected = (math.log(1 + math.exp(-1)) + math.log(2)) / 2
    assert abs(LogSigLoss()(chosen, rejected).item() - expected) < 1e-6
    assert abs(expected - 0.5032044) < 1e-6


def test_logexp_equals_logsig_and_hand_value():
    chosen, rejected = torch.tensor([2.0, -1.0, 0.5]), torch.tensor([0.0, 1.0, 0.5])
    expected = (math.log(1 + math.exp(-2)) + math.log(1 + math.exp(2)) + math.log(2)) / 3
    assert abs(LogExpLoss()(chosen, rejected).item() - expected) < 1e-6
    assert abs(LogSigLoss()(chosen, rejected).item() - expected) < 1e-6


def test_beta_scales_the_margin():
    chosen, rejected = torch.tensor([1.0]), torch.tensor([0.0])
    assert abs(LogSigLoss(beta=0.1)(chosen, rejected).item() - math.log(1 + math.exp(-0.1))) < 1e-6


def test_losses_are_stable_for_huge_margins():
    chosen, rejected = torch.tensor([-1000.0, 1000.0]), torch.tensor([1000.0, -1000.0])
    for loss_fn in (LogSigLoss(), LogExpLoss()):
        value = loss_fn(chosen, rejected)
        assert torch.isfinite(value)
        assert abs(value.item() - 1000.0) < 1e-3  # (2000 + 0) / 2


def test_losses_have_finite_gradients_for_huge_margins():
    chosen = torch.tensor([-1000.0], requires_grad=True)
    LogExpLoss()(chosen, torch.tensor([1000.0])).backward()
    assert torch.isfinite(chosen.grad).all() and abs(chosen.grad.item() + 1.0) < 1e-6


def test_the_colossalchat_loss_path_re_exports_the_rl_classes():
    """`olingo.models.loss` is ColossalChat's documented path (`coati.models.loss`): the same
    classes as olingo.rl, not copies, so both paths train identically."""
    from olingo.models import loss
    from olingo.rl import logprobs, policy_loss, preference

    assert (loss.PolicyLoss, loss.ValueLoss) == (policy_loss.PolicyLoss, policy_loss.ValueLoss)
    assert (loss.LogSigLoss, loss.LogExpLoss) == (preference.LogSigLoss, preference.LogExpLoss)
    assert loss.GPTLMLoss is logprobs.GPTLMLoss

