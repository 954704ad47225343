"""The GRPO family's maths by hand: estimators, overlong punishment, aggregation, clipping, KL term."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from olingo.experience_maker.advantages import AdvantageInputs, build_group_estimator
from olingo.experience_maker.group import groups_with_signal
from olingo.rl.advantages import (
    dr_grpo_advantages,
    grpo_advantages,
    overlong_penalty,
    reinforce_pp_advantages,
    reward_to_go,
    rloo_advantages,
)
from olingo.rl.policy_loss import GroupPolicyLoss, aggregate_loss, clipped_surrogate, loss_units

# Two groups of G=3: rewards (1, 0, 0) and (2, 2, 2).
SCORES = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 2.0])


def test_grpo_divides_by_the_unbiased_group_std():
    # group 1: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    std = math.sqrt(1 / 3)
    expected = torch.tensor([(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), 0.0, 0.0, 0.0])
    torch.testing.assert_close(grpo_advantages(SCORES, 3), expected)


def test_dr_grpo_only_centres():
    torch.testing.assert_close(dr_grpo_advantages(SCORES, 3), torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0]))


def test_rloo_subtracts_the_mean_of_the_others():
    # r_1 = 1, others (0, 0): 1; r_2 = 0, others (1, 0): -0.5; equals G/(G-1) (r - mean)
    expected = torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0, 0.0])
    torch.testing.assert_close(rloo_advantages(SCORES, 3), expected)
    torch.testing.assert_close(rloo_advantages(SCORES, 3), 1.5 * dr_grpo_advantages(SCORES, 3))


def test_group_estimators_refuse_partial_groups_and_single_samples():
    with pytest.raises(ValueError, match="whole groups"):
        grpo_advantages(torch.ones(5), 3)
    with pytest.raises(ValueError, match="at least 2"):
        grpo_advantages(torch.ones(4), 1)
    with pytest.raises(ValueError, match="at least 2"):
        rloo_advantages(torch.ones(4), 1)


def test_reward_to_go_with_and_without_discount():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    torch.testing.assert_close(reward_to_go(rewards, mask), torch.tensor([[6.0, 5.0, 3.0], [9.0, 5.0, 0.0]]))
    torch.testing.assert_close(reward_to_go(rewards, mask, gamma=0.5), torch.tensor([[1 + 1 + 0.75, 2 + 1.5, 3.0], [4 + 2.5, 5.0, 0.0]]))


def test_reinforce_pp_baseline_then_global_whitening():
    # two groups of 2, one token each with the score as reward: returns = scores
    scores = torch.tensor([1.0, 3.0, 0.0, 0.0])
    rewards = scores.unsqueeze(-1)
    mask = torch.ones(4, 1)
    # baseline: group means (2, 2, 0, 0) -> (-1, 1, 0, 0); whitened: mean 0, population var 0.5
    expected = torch.tensor([[-1.0], [1.0], [0.0], [0.0]]) / math.sqrt(0.5 + 1e-8)
    torch.testing.assert_close(reinforce_pp_advantages(rewards, scores, mask, num_generations=2), expected)
    # without baseline: returns (1, 3, 0, 0), mean 1, var (0 + 4 + 1 + 1) / 4 = 1.5
    plain = torch.tensor([[0.0], [2.0], [-1.0], [-1.0]]) / math.sqrt(1.5 + 1e-8)
    torch.testing.assert_close(reinforce_pp_advantages(rewards, scores, mask, num_generations=None), plain)


def thread_all_reduce(world: int):
    """An all-reduce sum between `world` threads (one per fake rank), for collective maths."""
    barrier, slots = threading.Barrier(world), {}

    def for_rank(rank: int):
        def reduce(x: torch.Tensor) -> torch.Tensor:
            slots[rank] = x.clone()
            barrier.wait()
            total = sum(slots[r] for r in range(world))
            barrier.wait()
            return total
        return reduce

    return for_rank


def test_reinforce_pp_whitening_over_ranks_equals_one_process():
    scores = torch.tensor([1.0, 3.0, 0.0, 2.0])
    rewards = torch.tensor([[0.1, 1.0], [0.0, 3.0], [0.2, 0.0], [0.0, 2.0]])
    mask = torch.tensor([[1, 1], [1, 1], [0, 1], [1, 1]]).bool()
    whole = reinforce_pp_advantages(rewards, scores, mask, 2)
    reducer, out = thread_all_reduce(2), {}

    def rank(r: int) -> None:
        rows = slice(2 * r, 2 * r + 2)
        out[r] = reinforce_pp_advantages(rewards[rows], scores[rows], mask[rows], 2, all_reduce_sum=reducer(r))

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.testing.assert_close(torch.cat([out[0], out[1]]), whole)
    local = reinforce_pp_advantages(rewards[:2], scores[:2], mask[:2], 2)
    assert not torch.allclose(local, whole[:2]), "per-rank whitening should differ from the global one here"


def test_group_estimator_adds_the_kl_penalty_still_to_come():
    estimator = build_group_estimator("dr_grpo", 2)
    score = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    kl_rewards = torch.tensor([[-0.1, -0.2, -0.3], [-0.4, -0.5, 0.0]])
    advantages, returns = estimator(AdvantageInputs(torch.zeros(2, 3), score, mask, None, kl_rewards))
    assert returns is None
    expected = torch.tensor([[0.5 - 0.6, 0.5 - 0.5, 0.5 - 0.3], [-0.5 - 0.9, -0.5 - 0.5, 0.0]])
    torch.testing.assert_close(advantages, expected)


def test_overlong_penalty_is_zero_then_linear_then_minus_one():
    lengths = torch.tensor([10, 12, 14, 16, 20])
    # limit 16, cache 4: zone (12, 16]; 14 -> (12 - 14) / 4 = -0.5; 16 -> -1; beyond -> -1
    torch.testing.assert_close(overlong_penalty(lengths, 16, 4), torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    torch.testing.assert_close(overlong_penalty(lengths, 16, 0), torch.zeros(5))
    with pytest.raises(ValueError, match="longer than the length limit"):
        overlong_penalty(lengths, 4, 8)


def test_dynamic_sampling_keeps_groups_whose_scores_differ():
    score = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.0, 0.0])
    assert groups_with_signal(score, 2).tolist() == [False, True, False, False]
    assert groups_with_signal(score, 4).tolist() == [True, True]


# ---- aggregation ------------------------------------------------------------------------------
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_token_mean_divides_by_every_token_of_the_step():
    assert float(loss_units(MASK, "token_mean")) == 4.0
    assert float(aggregate_loss(LOSS, MASK, "token_mean", 4.0)) == pytest.approx(10 / 4)
    # a micro-batch's share when the step has 8 tokens
    assert float(aggregate_loss(LOSS, MASK, "token_mean", 8.0)) == pytest.approx(10 / 8)


def test_seq_mean_token_mean_averages_each_response_first():
    assert float(loss_units(MASK, "seq_mean_token_mean")) == 2.0
    assert float(aggregate_loss(LOSS, MASK, "seq_mean_token_mean", 2.0)) == pytest.approx((2.0 + 4.0) / 2)


def test_seq_mean_token_sum_norm_uses_a_constant_length():
    assert float(aggregate_loss(LOSS, MASK, "seq_mean_token_sum_norm", 2.0, max_length=8)) == pytest.approx((6 / 8 + 4 / 8) / 2)
    with pytest.raises(ValueError, match="max_length"):
        aggregate_loss(LOSS, MASK, "seq_mean_token_sum_norm", 2.0)


def test_empty_rows_count_no_units():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert float(loss_units(mask, "token_mean")) == 2.0 and float(loss_units(mask, "seq_mean_token_mean")) == 1.0


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_shares_of_split_batches_add_up_to_the_whole(mode):
    torch.manual_seed(0)
    loss, mask = torch.randn(8, 5), torch.rand(8, 5) > 0.3
    mask[:, 0] = True
    whole = aggregate_loss(loss, mask, mode, loss_units(mask, mode), max_length=5)
    units = sum(loss_units(mask[i : i + 2], mode) for i in range(0, 8, 2))
    split = sum(aggregate_loss(loss[i : i + 2], mask[i : i + 2], mode, units, max_length=5) for i in range(0, 8, 2))
    torch.testing.assert_close(split, whole)


# ---- clipping ---------------------------------------------------------------------------------
def test_clip_higher_bounds_are_asymmetric():
    ratio = torch.tensor([[0.5, 1.25, 1.5]])
    log_ratio = ratio.log()
    positive = torch.ones(1, 3)
    loss, clipped = clipped_surrogate(log_ratio, positive, eps_low=0.2, eps_high=0.28)
    # A > 0: min(r, clip(r)) with clip range [0.8, 1.28]: 0.5 -> 0.5, 1.25 -> 1.25, 1.5 -> 1.28
    torch.testing.assert_close(loss, -torch.tensor([[0.5, 1.25, 1.28]]))
    assert clipped.tolist() == [[False, False, True]]
    loss, clipped = clipped_surrogate(log_ratio, -positive, eps_low=0.2, eps_high=0.28)
    # A < 0: -min(-r, -clip(r)) = max(r, clip(r)): 0.5 -> 0.8 (clipped), 1.25 -> 1.25, 1.5 -> 1.5
    torch.testing.assert_close(loss, torch.tensor([[0.8, 1.25, 1.5]]))
    assert clipped.tolist() == [[True, False, False]]


def test_dual_clip_caps_the_loss_of_negative_advantages():
    ratio = torch.tensor([[5.0, 2.0, 5.0]])
    advantages = torch.tensor([[-1.0, -1.0, 1.0]])
    loss, _ = clipped_surrogate(ratio.log(), advantages, 0.2, 0.2, dual_clip=3.0)
    # A = -1, r = 5: the PPO loss is 5, capped at c |A| = 3; r = 2 -> 2 (under the cap); A > 0 untouched: -1.2
    torch.testing.assert_close(loss, torch.tensor([[3.0, 2.0, -1.2]]))
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_surrogate(ratio.log(), advantages, 0.2, 0.2, dual_clip=1.0)


def test_group_policy_loss_with_ratio_one_has_the_gradient_of_log_pi():
    log_probs = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    advantages = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, stats = GroupPolicyLoss()(log_probs, None, advantages, mask, units=3.0)
    loss.backward()
    # token_mean: -(1 + 1 - 2) / 3 = 0; d/dlogp = -A / 3 on masked tokens
    assert float(loss.detach()) == pytest.approx(0.0)
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-1 / 3, -1 / 3], [2 / 3, 0.0]]))
    assert float(stats["clipfrac"]) == 0.0 and float(stats["ratio_max"]) == 1.0


def test_group_policy_loss_adds_the_k3_kl_term():
    log_probs = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    mask = torch.ones(1, 2)
    loss_fn = GroupPolicyLoss(kl_coef=0.1, aggregation="seq_mean_token_mean")
    loss, stats = loss_fn(log_probs, None, torch.zeros(1, 2), mask, units=1.0, ref_log_probs=ref)
    k3 = math.exp(-0.5) + 0.5 - 1  # exp(ref - logp) - (ref - logp) - 1 for the first token, 0 for the second
    assert float(stats["kl_loss"]) == pytest.approx(k3 / 2, rel=1e-6)
    assert float(loss) == pytest.approx(0.1 * k3 / 2, rel=1e-6)
    # without reference log-probs (kl_coef 0 run) the term is absent
    loss, stats = loss_fn(log_probs, None, torch.zeros(1, 2), mask, units=1.0)
    assert float(loss) == 0.0 and float(stats["kl_loss"]) == 0.0
