"""Off-policy corrections (olingo.rl.offpolicy): the masks and weights by hand, the decoupled PPO
loss by hand, the config rules, and a learner step on the tiny model where a row sampled far from
the proximal policy is masked out.

Ratios r = pi_prox / pi_behav are chosen away from the band edges, so no verdict hangs on rounding.
Tolerances: 1e-6 between float32 torch results and hand values.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from pydantic import ValidationError

from olingo.booster import Booster
from olingo.config import ConfigError, load_config, packaged_config
from olingo.experience_maker import Experience, policy_token_stats
from olingo.models import load_causal_lm
from olingo.rl.offpolicy import (
    OffPolicyCorrection,
    behaviour_kl,
    behaviour_log_ratio,
    geometric_keep_mask,
    keep_mask,
    masked_fraction,
    offpolicy_correction,
    sequence_keep_mask,
    token_keep_mask,
)
from olingo.rl.policy_loss import GroupPolicyLoss, PolicyLoss
from olingo.trainer.grpo_learner import GRPOLearner, GRPOLossConfig
from olingo.trainer.learner import learn_step
from olingo.trainer.ppo_learner import PolicyLearner, PPOLossConfig

LOG = math.log
TOL = dict(rtol=0, atol=1e-6)


def log_ratios(rows: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(log r (B, A) with 0 at padding, action mask) from rows of ratios of different lengths."""
    width = max(len(r) for r in rows)
    mask = torch.tensor([[j < len(r) for j in range(width)] for r in rows])
    ratios = torch.tensor([r + [1.0] * (width - len(r)) for r in rows])
    return torch.where(mask, ratios.log(), torch.zeros(())), mask


def test_behaviour_log_ratio_is_zero_at_padding_and_detached() -> None:
    proximal = torch.tensor([[LOG(0.5), LOG(0.2), -math.inf]], requires_grad=True)
    behaviour = torch.tensor([[LOG(0.25), LOG(0.4), -math.inf]])  # padding -inf - -inf would be NaN
    ratio = behaviour_log_ratio(proximal, behaviour, torch.tensor([[True, True, False]]))
    torch.testing.assert_close(ratio, torch.tensor([[LOG(2.0), LOG(0.5), 0.0]]), **TOL)
    assert not ratio.requires_grad


def test_token_mask_drops_tokens_outside_the_band() -> None:
    log_r, mask = log_ratios([[1.5, 0.4, 1.0, 3.0], [0.6]])
    keep = token_keep_mask(log_r, mask, 0.5, 2.0)
    assert keep.tolist() == [[True, False, True, False], [True, False, False, False]]  # padding is never kept
    assert masked_fraction(keep, mask).item() == pytest.approx(2 / 5)
    # low = 0: no lower bound, so only the ratio 3 is dropped.
    assert token_keep_mask(log_r, mask, 0.0, 2.0).tolist() == [[True, True, True, False], [True, False, False, False]]


def test_sequence_mask_uses_the_product_of_the_ratios() -> None:
    # Products: 1.5 x 1.5 = 2.25 (above 2), 1.5 x 0.9 = 1.35, 0.6 x 0.7 = 0.42 (below 0.5), 1.1^10 = 2.59 (above 2).
    log_r, mask = log_ratios([[1.5, 1.5], [1.5, 0.9], [0.6, 0.7], [1.1] * 10])
    keep = sequence_keep_mask(log_r, mask, 0.5, 2.0)
    assert keep.any(-1).tolist() == [False, True, False, False]
    assert torch.equal(keep[1], mask[1])  # a kept row keeps exactly its own tokens
    assert masked_fraction(keep, mask).item() == pytest.approx(14 / 16)


def test_geometric_mask_uses_the_mean_log_ratio() -> None:
    # Geometric means: 1.5, sqrt(1.35) = 1.162, sqrt(0.42) = 0.648, 1.1: the long row sequence masking drops is kept.
    log_r, mask = log_ratios([[1.5, 1.5], [1.5, 0.9], [0.6, 0.7], [1.1] * 10])
    keep = geometric_keep_mask(log_r, mask, 0.8, 1.25)
    assert keep.any(-1).tolist() == [False, True, False, True]
    assert masked_fraction(keep, mask).item() == pytest.approx(4 / 16)
    assert keep_mask("none", log_r, mask, 0.8, 1.25) is None
    assert torch.equal(keep_mask("geometric", log_r, mask, 0.8, 1.25), keep)


def test_mask_bounds_are_checked() -> None:
    log_r, mask = log_ratios([[1.0]])
    with pytest.raises(ValueError, match="0 <= low < high"):
        token_keep_mask(log_r, mask, 2.0, 0.5)
    with pytest.raises(ValueError, match="unknown off-policy mask"):
        keep_mask("rows", log_r, mask, 0.5, 2.0)  # type: ignore[arg-type]


def test_behaviour_kl_by_hand() -> None:
    log_r, mask = log_ratios([[2.0, 0.5], [1.0]])
    # k3 = (r - 1) - log r: 1 - log 2 and -0.5 + log 2, then 0: mean over 3 tokens.
    assert behaviour_kl(log_r, mask).item() == pytest.approx(0.5 / 3)
    # A stale row hundreds of nats off: clamped at 20 nats, so e^20 - 21, not inf.
    assert behaviour_kl(torch.tensor([[300.0]]), torch.ones(1, 1, dtype=torch.bool)).item() == pytest.approx(math.exp(20) - 21)


CURRENT = torch.tensor([[LOG(0.5), LOG(0.2)]])
RECORDED = torch.tensor([[LOG(0.25), LOG(0.4)]])
ENGINE = torch.tensor([[LOG(0.5), LOG(0.1)]])
BOTH = torch.ones(1, 2, dtype=torch.bool)


def test_experience_behaviour_weights_by_the_recorded_log_probs() -> None:
    settings = OffPolicyCorrection(cap=1.5, behaviour="experience", mask="token", low=0.0, high=1.8)
    log_probs = CURRENT.clone().requires_grad_(True)
    proximal, weights, stats = offpolicy_correction(log_probs, RECORDED, None, BOTH, settings)
    # pi_prox = the current policy; w = 0.5/0.25 = 2 (above 1.8: masked, not truncated) and 0.2/0.4 = 0.5.
    torch.testing.assert_close(proximal, CURRENT, **TOL)
    assert not proximal.requires_grad and not weights.requires_grad
    torch.testing.assert_close(weights, torch.tensor([[0.0, 0.5]]), **TOL)
    assert stats["offpolicy_masked_frac"].item() == pytest.approx(0.5)
    assert stats["behaviour_kl"].item() == pytest.approx(0.25)  # k3 of r = 2 and r = 0.5, averaged
    # With the engine's log-probs carried they are the behaviour: w = 1 and 2 (truncated at 1.5).
    _, weights, _ = offpolicy_correction(log_probs, RECORDED, ENGINE, BOTH, dataclasses.replace(settings, mask="none"))
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.5]]), **TOL)


def test_engine_behaviour_is_the_existing_tis() -> None:
    settings = OffPolicyCorrection(cap=1.5)
    proximal, weights, stats = offpolicy_correction(CURRENT, RECORDED, ENGINE, BOTH, settings)
    # pi_prox = the recorded forward, pi_behav = the engine: w = 0.25/0.5 and 0.4/0.1 = 4 -> 1.5; no new stats.
    torch.testing.assert_close(proximal, RECORDED, **TOL)
    torch.testing.assert_close(weights, torch.tensor([[0.5, 1.5]]), **TOL)
    assert stats == {}
    assert offpolicy_correction(CURRENT, RECORDED, None, BOTH, settings)[1] is None  # no engine log-probs: nothing to correct
    proximal, weights, _ = offpolicy_correction(CURRENT, None, ENGINE, BOTH, OffPolicyCorrection())  # off: pi_old as before
    assert weights is None and torch.equal(proximal, CURRENT)


def test_decoupled_ppo_loss_by_hand() -> None:
    # pi_theta = [0.75, 0.1], pi_prox = [0.5, 0.25], pi_behav = [0.25, 0.5], A = [1, 1], eps 0.2, cap 3.
    # Token 1: r = 1.5, clipped to 1.2 -> -1.2, x w = 2 -> -2.4 (no gradient). Token 2: r = 0.4, unclipped
    # -0.4 is the max, x w = 0.5 -> -0.2; its gradient -r w A / 2 tokens = -0.1.
    theta = torch.tensor([[LOG(0.75), LOG(0.1)]], requires_grad=True)
    prox, behav = torch.tensor([[LOG(0.5), LOG(0.25)]]), torch.tensor([[LOG(0.25), LOG(0.5)]])
    advantages = torch.ones(1, 2)
    old, weights, _ = offpolicy_correction(theta, prox, behav, BOTH, OffPolicyCorrection(cap=3.0))
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5]]), **TOL)
    loss, _ = GroupPolicyLoss(0.2, 0.2)(theta, old, advantages, BOTH, units=2.0, tis_weights=weights)
    assert loss.item() == pytest.approx((-2.4 - 0.2) / 2)
    loss.backward()
    torch.testing.assert_close(theta.grad, torch.tensor([[0.0, -0.1]]), **TOL)
    ppo_loss, _, _ = PolicyLoss(0.2)(theta.detach(), old, advantages, BOTH, weights)  # one row: the same mean
    assert ppo_loss.item() == pytest.approx((-2.4 - 0.2) / 2)


@pytest.mark.parametrize("section", [GRPOLossConfig, PPOLossConfig])
def test_the_loss_fields_default_off_and_refuse_what_does_nothing(section) -> None:
    default = section()
    assert (default.tis_cap, default.behaviour_log_probs, default.offpolicy_mask) == (None, "engine", "none")
    for name in ("tis_cap", "behaviour_log_probs", "offpolicy_mask", "offpolicy_mask_low", "offpolicy_mask_high"):
        assert section.model_fields[name].description  # what --help shows
    refused = [
        ({"offpolicy_mask": "sequence", "offpolicy_mask_high": 2.0}, "loss.tis_cap"),
        ({"behaviour_log_probs": "experience"}, "needs loss.tis_cap"),
        ({"tis_cap": 2.0, "offpolicy_mask": "token"}, "needs offpolicy_mask_low"),
        ({"tis_cap": 2.0, "offpolicy_mask_high": 2.0}, "offpolicy_mask, which is none"),
        ({"tis_cap": 2.0, "offpolicy_mask": "token", "offpolicy_mask_low": 1.5}, "less than 1"),
    ]
    for fields, message in refused:
        with pytest.raises(ValidationError, match=message):
            section(**fields)
    section(tis_cap=2.0, behaviour_log_probs="experience", offpolicy_mask="geometric", offpolicy_mask_low=0.999, offpolicy_mask_high=1.001)


def test_a_bad_override_is_a_config_error_naming_the_fix() -> None:
    from olingo.recipes.grpo import GRPOConfig

    with pytest.raises(ConfigError, match="tis_cap"):
        load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), ["loss.offpolicy_mask=token", "loss.offpolicy_mask_high=2"])


def tiny_experience(lengths: list[int], prompt: int = 3, seed: int = 0) -> Experience:
    """Rows of `prompt` prompt tokens and random responses of `lengths` tokens, advantage 1 everywhere."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    action = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    sequences = torch.randint(3, 100, (len(lengths), prompt + width), generator=generator)
    sequences[:, prompt:] = sequences[:, prompt:].masked_fill(~action, 0)
    attention = torch.cat([torch.ones(len(lengths), prompt, dtype=torch.long), action.long()], dim=1)
    zeros, rows = torch.zeros(action.shape), torch.zeros(len(lengths))
    return Experience(sequences, attention, action, None, None, None, zeros, action.float(), rows, rows, rows.bool())


def grads(learner: GRPOLearner, experience: Experience) -> list[torch.Tensor]:
    """The gradient one micro-batch's step share leaves on the actor (then cleared)."""
    learner.training_step(experience, learner.step_share([experience]))
    out = [p.grad.clone() for p in learner.actor.parameters() if p.grad is not None]
    learner.optim.zero_grad()
    return out


def test_a_grpo_step_masks_out_a_row_sampled_far_off(assets) -> None:
    torch.manual_seed(0)
    actor = load_causal_lm(str(assets.model_dir))
    booster = Booster()
    model, optim, *_ = booster.boost(actor, torch.optim.SGD(actor.parameters(), lr=1e-3))
    on = dict(tis_cap=2.0, behaviour_log_probs="experience")
    masked = GRPOLearner(booster, model, optim, None, GRPOLossConfig(**on, offpolicy_mask="sequence", offpolicy_mask_low=0.5, offpolicy_mask_high=2.0),
                         max_length=4, packing=False)
    plain = GRPOLearner(booster, model, optim, None, GRPOLossConfig(**on), max_length=4, packing=False)
    experience = tiny_experience([4, 3, 2, 4])
    with torch.no_grad():
        current, _ = policy_token_stats(model, experience.sequences, experience.attention_mask, 4, entropy=False)
    # Rows 1-3 were sampled by the current weights; row 0 by weights 3 nats per token less likely: e^9 or more.
    recorded = current - 3.0 * (torch.arange(4) == 0)[:, None]
    stale = dataclasses.replace(experience, action_log_probs=recorded)
    without_row0 = dataclasses.replace(stale, advantages=stale.advantages * (torch.arange(4) != 0)[:, None])
    g_masked, g_without, g_plain = grads(masked, stale), grads(plain, without_row0), grads(plain, stale)
    for a, b in zip(g_masked, g_without, strict=True):  # masked: exactly as if row 0 carried no advantage
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    assert any(g.abs().max() > 0 for g in g_masked)  # the other rows still learn
    assert any((a - b).abs().max() > 1e-4 for a, b in zip(g_plain, g_without, strict=True))  # unmasked, row 0 does count
    ppo = PolicyLearner(booster, model, optim, None, offpolicy=masked.offpolicy, packing=False)
    _, _, stats = ppo.losses(stale, 1.0, None)  # PPO's policy loss, the same correction
    assert stats["offpolicy_masked_frac"].item() == pytest.approx(4 / 13)
    metrics = learn_step(masked, [stale], 1.0)
    assert metrics["train/offpolicy_masked_frac"] == pytest.approx(4 / 13)  # row 0's 4 of 13 response tokens
    assert metrics["train/behaviour_kl"] > 0 and 0 < metrics["train/tis_weight_mean"] < 1


def test_experience_behaviour_is_refused_where_an_episode_takes_several_optimizer_steps():
    """The proximal policy of `behaviour_log_probs: experience` is the learner's current weights:
    right at an episode's first optimizer step only, so a loop of more is a config error."""
    from olingo.config import ConfigError
    from olingo.recipes.grpo_config import GRPOConfig, check_grpo_config

    fields = {"tis_cap": 2.0, "behaviour_log_probs": "experience"}
    check_grpo_config(GRPOConfig(loss=fields, loop={"update_steps": 1, "rollout_batch_size": 16, "train_batch_size": 128}))
    with pytest.raises(ConfigError, match="needs one optimizer step per episode \\(this loop takes 2\\)"):
        check_grpo_config(GRPOConfig(loss=fields, loop={"update_steps": 2, "rollout_batch_size": 16, "train_batch_size": 128}))
