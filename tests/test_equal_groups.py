"""A group whose rewards are all equal gets advantage exactly 0 (docs/algorithms.md), for every G,
magnitude and dtype: a mean one ulp off, divided by std 0 + eps, once gave 8 x 1.2 an advantage of 0.1.
Exactness is the claim, so these tests compare with `torch.equal`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from olingo.experience_maker import Experience
from olingo.experience_maker.advantages import AdvantageInputs, build_group_estimator
from olingo.experience_maker.group import GroupExperienceConfig, GroupExperienceMaker, _mean_group_std
from olingo.rewards.functions import CompositeReward
from olingo.rl.advantages import (
    dr_grpo_advantages,
    gdpo_advantages,
    gdpo_group_sum,
    group_mean,
    grpo_advantages,
    per_token_rewards,
    reinforce_pp_advantages,
    reward_to_go,
    rloo_advantages,
)

SIZES = range(2, 65)
DTYPES = [torch.float32, torch.bfloat16]
# values whose float32 group mean is an ulp off for some G, then random ones of many magnitudes and both signs
KNOWN = [1.2, 1.3, 3.7, -0.7, 0.1, 1 / 3, 123.456, 1e6 + 0.1]
MAGNITUDES = [1e-4, 1.0, 1e3, 1e7, 1e30]

SEQUENCE_ESTIMATORS = {
    "grpo": lambda s, g: grpo_advantages(s, g),
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "gdpo_one_term": lambda s, g: gdpo_advantages(s.unsqueeze(-1), torch.ones(1, dtype=s.dtype), g),
}


def constants(generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """(C,) group values: the known ulp-off ones and random ones, rounded to `dtype`."""
    random = [(torch.rand(6, generator=generator, dtype=torch.float64) * 2 - 1) * m for m in MAGNITUDES]
    return torch.cat([torch.tensor(KNOWN, dtype=torch.float64), *random]).to(dtype)


def unequal(generator: torch.Generator, groups: int, size: int) -> torch.Tensor:
    """(groups, size) rewards, every group with at least two different values."""
    values = torch.randn(groups, size, generator=generator, dtype=torch.float64)
    values[:, 0] = values[:, 1] + 1.0
    return values


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(SEQUENCE_ESTIMATORS))
def test_equal_groups_get_exactly_zero_for_every_size_and_magnitude(name, dtype):
    estimator, generator = SEQUENCE_ESTIMATORS[name], torch.Generator().manual_seed(0)
    for size in SIZES:
        values = constants(generator, dtype)
        advantages = estimator(values.repeat_interleave(size), size)
        assert torch.equal(advantages, torch.zeros_like(advantages)), (name, size, advantages.abs().max())
        for value in values[: len(KNOWN)]:  # a batch of one group: torch reduces it another way than many
            assert torch.equal(estimator(value.expand(size), size), torch.zeros(size, dtype=dtype)), (name, size, float(value))


@pytest.mark.parametrize("name", list(SEQUENCE_ESTIMATORS))
def test_an_equal_group_among_unequal_ones_is_zero_and_the_others_keep_their_values(name):
    estimator, generator = SEQUENCE_ESTIMATORS[name], torch.Generator().manual_seed(1)
    for size in (2, 3, 7, 8, 16, 63):
        groups = unequal(generator, 4, size)
        groups[2] = 1.2  # the reported case, in the middle of the batch
        scores = groups.flatten().float()
        advantages = estimator(scores, size).view(4, size)
        assert torch.equal(advantages[2], torch.zeros(size))
        reference = estimator(groups.flatten(), size).view(4, size)  # the same formulas in float64
        torch.testing.assert_close(advantages.double(), reference, rtol=0, atol=1e-5)


def test_the_estimators_still_compute_the_published_formulas():
    generator = torch.Generator().manual_seed(2)
    groups = unequal(generator, 5, 6)
    centred = groups - groups.mean(-1, keepdim=True)
    flat = groups.flatten()
    torch.testing.assert_close(dr_grpo_advantages(flat, 6), centred.flatten(), rtol=0, atol=1e-12)
    torch.testing.assert_close(grpo_advantages(flat, 6), (centred / (groups.std(-1, keepdim=True) + 1e-6)).flatten(), rtol=0, atol=1e-12)
    others = (groups.sum(-1, keepdim=True) - groups) / 5
    torch.testing.assert_close(rloo_advantages(flat, 6), (groups - others).flatten(), rtol=0, atol=1e-12)
    torch.testing.assert_close(group_mean(flat, 6), groups.mean(-1).repeat_interleave(6), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_group_mean_of_equal_values_is_the_value(dtype):
    generator = torch.Generator().manual_seed(3)
    for size in SIZES:
        scores = constants(generator, dtype).repeat_interleave(size)
        assert torch.equal(group_mean(scores, size), scores)


@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_the_configured_estimators_give_equal_groups_zero(kind):
    # the path `finish` takes: float32 scores, the score at each response's last token, ragged masks
    generator = torch.Generator().manual_seed(4)
    for dtype in DTYPES:
        for size in SIZES:
            score = constants(generator, dtype).repeat_interleave(size)
            lengths = torch.randint(1, 6, (score.numel(),), generator=generator)
            mask = torch.arange(5) < lengths.unsqueeze(-1)
            rewards = per_token_rewards(score, torch.zeros(mask.shape), mask, 0.0)
            advantages, _ = build_group_estimator(kind, size)(AdvantageInputs(rewards, score, mask))
            assert torch.equal(advantages, torch.zeros(mask.shape)), (kind, dtype, size)


def test_with_the_kl_in_the_reward_an_equal_group_gets_only_its_kl_to_go():
    generator = torch.Generator().manual_seed(5)
    score = torch.tensor([3.7] * 8 + [1.0, 0.0] * 4)
    mask = torch.ones(16, 4, dtype=torch.bool)
    kl_rewards = -0.1 * torch.rand(16, 4, generator=generator)
    for kind in ("grpo", "dr_grpo", "rloo"):
        advantages, _ = build_group_estimator(kind, 8)(AdvantageInputs(torch.zeros(16, 4), score, mask, None, kl_rewards))
        assert torch.equal(advantages[:8], reward_to_go(kl_rewards, mask)[:8]), kind


def test_reinforce_pp_baseline_leaves_an_equal_group_one_shared_value_in_a_mixed_batch():
    # The returns less the group mean are exactly 0; the batch whitening then subtracts the batch's token mean
    # from every token (Hu 2025), so each token of the equal group gets the same value, -mean / std.
    generator = torch.Generator().manual_seed(6)
    score = torch.cat([torch.full((8,), 1.3), torch.randn(16, generator=generator)])
    mask = torch.arange(6) < torch.randint(1, 7, (24,), generator=generator).unsqueeze(-1)
    rewards = per_token_rewards(score, torch.zeros(mask.shape), mask, 0.0)
    assert torch.equal((reward_to_go(rewards, mask) - group_mean(score, 8).unsqueeze(-1))[:8][mask[:8]], torch.zeros(int(mask[:8].sum())))
    equal_group = reinforce_pp_advantages(rewards, score, mask, 8)[:8][mask[:8]]
    assert torch.equal(equal_group, equal_group[:1].expand_as(equal_group))


def test_gdpo_terms_equal_within_a_group_give_zero_alone_and_in_a_mixed_batch():
    generator = torch.Generator().manual_seed(7)
    weights = torch.tensor([1.0, 0.5, 2.0])
    for size in SIZES:
        for dtype in DTYPES:
            # every term constant within each group (a different constant per term and group)
            terms = (torch.randn(5, 1, 3, generator=generator) * 10).to(dtype).expand(5, size, 3).reshape(-1, 3)
            assert torch.equal(gdpo_group_sum(terms, weights.to(dtype), size), torch.zeros(5 * size, dtype=dtype))
            assert torch.equal(gdpo_advantages(terms, weights.to(dtype), size), torch.zeros(5 * size, dtype=dtype))
        mixed = torch.randn(4, size, 3, generator=generator)
        mixed[1] = torch.tensor([1.2, 0.0, -3.7])  # group 1: every term equal
        advantages = gdpo_advantages(mixed.view(-1, 3), weights, size).view(4, size)
        assert torch.equal(advantages[1], torch.zeros(size)) and advantages.abs().sum() > 0


def test_a_weighted_sum_of_terms_equal_within_a_group_gives_zero():
    # the `sum` aggregation: CompositeReward's weighted sum, then the group estimator
    def first(prompts, responses, gt_answers, a):
        return a

    def second(prompts, responses, gt_answers, b):
        return b

    reward = CompositeReward([(first, 0.3), (second, 1.7)])
    a, b = [1.2] * 8 + [0.0, 1.0] * 4, [3.7] * 8 + [-0.7] * 8
    scores = reward.score(["p"] * 16, ["r"] * 16, [None] * 16, {"a": a, "b": b})
    for kind in ("grpo", "dr_grpo", "rloo"):
        advantages, _ = build_group_estimator(kind, 8)(AdvantageInputs(torch.zeros(16, 1), scores.total, torch.ones(16, 1, dtype=torch.bool)))
        assert torch.equal(advantages[:8], torch.zeros(8, 1)) and advantages[8:].abs().sum() > 0, kind


def test_the_gdpo_group_maker_gives_an_equal_group_zero_and_logs_no_spread():
    # one term (and the overlong penalty off): the (B/G, G, 1) reductions where a float32 mean is an ulp off
    reward = CompositeReward({"exact_match": 1.0})
    config = GroupExperienceConfig(num_generations=8, reward_aggregation="gdpo")
    maker = GroupExperienceMaker(torch.nn.Linear(1, 1), reward, None, None, config=config, source=object())
    exact = torch.tensor([1.3] * 8 + [1.0, 0.0] * 4)
    score, info = maker._decoupled_score(SimpleNamespace(reward_terms={"exact_match": exact}, raw_score=exact), torch.zeros(16))
    mask = torch.ones(16, 2, dtype=torch.bool)
    experience = Experience(
        sequences=torch.zeros(16, 3, dtype=torch.long), attention_mask=torch.ones(16, 3, dtype=torch.long), action_mask=mask,
        action_log_probs=None, base_action_log_probs=None, kl=None, rewards=torch.zeros(16, 2), advantages=None,
        score=score, raw_score=exact, truncated=torch.zeros(16, dtype=torch.bool),
    )
    advantages = maker.finish(experience).advantages
    assert torch.equal(advantages[:8], torch.zeros(8, 2))
    # the equal group's exact 0 leaves the batch std to the other group alone (an ulp blown up to 0.12 did not)
    expected = gdpo_advantages(exact.double().unsqueeze(-1), torch.ones(1, dtype=torch.float64), 8)
    torch.testing.assert_close(advantages[:, 0].double(), expected, rtol=0, atol=1e-5)
    assert info == {"reward/exact_match/group_std": 0.25}


def test_the_logged_group_std_of_equal_groups_is_zero():
    generator = torch.Generator().manual_seed(8)
    for size in SIZES:
        values = constants(generator, torch.float32)
        assert _mean_group_std(values.repeat_interleave(size), size) == 0.0, size
        assert _mean_group_std(values[:1].expand(size), size) == 0.0, size  # one group: torch reduces it another way
