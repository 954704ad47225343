"""Environment tokens of a multi-turn episode condition the policy and nothing else: the buffer
keeps them out of the action mask, they get no gradient, and GAE steps over them."""

from __future__ import annotations

import torch

from olingo.experience_buffer import NaiveExperienceBuffer
from olingo.experience_maker import Experience, make_experience_batch, split_experience_batch
from olingo.rl.advantages import compute_gae, per_token_rewards, place_turn_rewards
from olingo.rl.logprobs import log_probs_from_logits
from olingo.rl.policy_loss import GroupPolicyLoss

# Two rows, prompt width 2, response width 7. Row 0: turn 1 (2 tokens), environment (2), turn 2
# (2), then padding. Row 1: a single turn of 3 tokens.
ACTIONS = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
ATTENDED = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]])


def multi_turn_batch() -> Experience:
    sequences = torch.tensor([[5, 6, 10, 11, 90, 91, 12, 13, 0], [0, 7, 20, 21, 22, 0, 0, 0, 0]])
    attention = torch.cat([torch.tensor([[1, 1], [0, 1]]), ATTENDED], dim=1)
    values = torch.arange(14, dtype=torch.float32).view(2, 7) / 10
    return Experience(
        sequences=sequences, attention_mask=attention, action_mask=ACTIONS, action_log_probs=-values,
        base_action_log_probs=None, kl=None, rewards=torch.zeros(2, 7), advantages=values * ACTIONS,
        score=torch.tensor([1.0, 0.0]), raw_score=torch.tensor([1.0, 0.0]), truncated=torch.tensor([False, False]),
    )


def test_splitting_and_rebuilding_keep_the_environment_tokens_out_of_the_actions():
    batch = multi_turn_batch()
    items = split_experience_batch(batch)
    assert items[0].response.tolist() == [10, 11, 90, 91, 12, 13]  # up to the last sampled token, environment tokens inside
    assert items[0].action_mask.tolist() == [True, True, False, False, True, True] and items[1].action_mask is None
    rebuilt = make_experience_batch(items, pad_token_id=0)
    assert torch.equal(rebuilt.action_mask, ACTIONS[:, :6])
    assert torch.equal(rebuilt.attention_mask[:, 2:], ATTENDED[:, :6])  # the environment's tokens stay context
    assert float(rebuilt.advantages[0, 2:4].abs().sum()) == 0.0


def test_the_buffers_minibatches_keep_the_environment_tokens_out_of_the_actions():
    buffer = NaiveExperienceBuffer(sample_batch_size=2, cpu_offload=False)
    buffer.append(multi_turn_batch())
    [minibatch] = list(buffer.minibatches(shuffle=False))
    assert torch.equal(minibatch.action_mask, ACTIONS[:, :6])
    assert torch.equal(minibatch.attention_mask[:, -6:], ATTENDED[:, :6])
    reference = make_experience_batch(split_experience_batch(multi_turn_batch()), 0)
    for name in ("sequences", "attention_mask", "action_mask", "advantages", "action_log_probs"):
        assert torch.equal(getattr(minibatch, name), getattr(reference, name)), name  # the two paths agree exactly


def test_the_loss_has_no_gradient_at_environment_positions():
    torch.manual_seed(0)
    logits = torch.randn(2, 7, 11, requires_grad=True)
    labels = torch.randint(0, 11, (2, 7))
    log_probs = log_probs_from_logits(logits, labels)
    loss, _ = GroupPolicyLoss(0.2, 0.28, None, "token_mean")(
        log_probs, log_probs.detach() - 0.1, torch.randn(2, 7), ACTIONS, float(ACTIONS.sum()), log_probs.detach() + 0.05,
    )
    loss.backward()
    grad = logits.grad.abs().sum(-1)
    assert torch.equal(grad[~ACTIONS], torch.zeros_like(grad[~ACTIONS]))  # exactly zero: the mask selects, it does not scale
    assert bool((grad[ACTIONS] > 0).all())


def test_gae_runs_over_the_policy_tokens_only():
    """Hand-computed, gamma 0.9, lambda 0.5; columns 2-3 are the environment's, 6 padding.
    Policy tokens t0, t1 | env | t4, t5; reward 1 on t5 (the last sampled token).
    delta5 = 1 - V5; A5 = delta5
    delta4 = 0 + 0.9 V5 - V4; A4 = delta4 + 0.45 A5
    delta1 = 0 + 0.9 V4 - V1; A1 = delta1 + 0.45 A4     (t1 bootstraps from t4, across the env tokens)
    delta0 = 0 + 0.9 V1 - V0; A0 = delta0 + 0.45 A1"""
    values = torch.tensor([[0.1, 0.2, 7.0, 7.0, 0.4, 0.5, 9.0]])  # 7.0, 9.0: must not be read
    rewards = torch.tensor([[0.0, 0.0, 3.0, 3.0, 0.0, 1.0, 5.0]])  # 3.0, 5.0: masked out
    advantages, returns = compute_gae(rewards, values, ACTIONS[:1], 0.9, 0.5)
    a5 = 1 - 0.5
    a4 = 0.9 * 0.5 - 0.4 + 0.45 * a5
    a1 = 0.9 * 0.4 - 0.2 + 0.45 * a4
    a0 = 0.9 * 0.2 - 0.1 + 0.45 * a1
    expected = torch.tensor([[a0, a1, 0.0, 0.0, a4, a5, 0.0]])
    torch.testing.assert_close(advantages, expected)  # float32 vs python floats: default tolerance (1e-5)
    torch.testing.assert_close(returns, torch.where(ACTIONS[:1], expected + values, torch.zeros(1, 7)))


def test_gae_of_a_single_turn_is_unchanged_by_the_skipping():
    """A right-padded mask has no holes: skipping changes nothing, bit for bit."""
    torch.manual_seed(1)
    rewards, values = torch.randn(3, 6), torch.randn(3, 6)
    mask = torch.arange(6) < torch.tensor([[6], [4], [1]])
    advantages, returns = compute_gae(rewards, values, mask, 1.0, 0.95)
    r, v = rewards * mask, values * mask
    expected, running = torch.zeros(3, 6), torch.zeros(3)
    for t in reversed(range(6)):  # the textbook recursion on the masked values
        next_v = v[:, t + 1] if t + 1 < 6 else torch.zeros(3)
        running = r[:, t] + next_v - v[:, t] + 0.95 * running
        expected[:, t] = running
    torch.testing.assert_close(advantages, expected * mask)  # the same operations in another order: 1e-5


def test_step_rewards_land_on_the_turns_they_answered():
    """Hand-computed: turn 1 is columns 0-1, the environment's reply columns 2-3, turn 2 columns
    4-5, then padding. The episode's score 1.5 holds a reward function's 0.5 and the environment's
    step rewards 0.25 (answering turn 1) and 0.75 (turn 2)."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0]], dtype=torch.bool)
    steps = torch.tensor([[0.0, 0.25, 0.0, 0.0, 0.0, 0.75, 0.0]])
    rewards = per_token_rewards(torch.tensor([1.5]), torch.zeros(1, 7), mask, kl_coef=0.1)
    placed = place_turn_rewards(rewards, steps, mask)
    assert placed.tolist() == [[0.0, 0.25, 0.0, 0.0, 0.0, 1.25, 0.0]]  # 0.5 + 0.75 stays at the end
    # a score normalised by 1/std = 0.5: the environment's part moves scaled by the same factor
    halved = place_turn_rewards(per_token_rewards(torch.tensor([0.75]), torch.zeros(1, 7), mask, kl_coef=0.1), steps, mask, scale=0.5)
    assert halved.tolist() == [[0.0, 0.125, 0.0, 0.0, 0.0, 0.625, 0.0]]
    assert torch.equal(placed.sum(-1), rewards.sum(-1))  # the total is unchanged (exact: binary fractions)
    # an empty row stays all zero
    assert place_turn_rewards(torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool)).tolist() == [[0.0, 0.0, 0.0]]


def test_reward_functions_read_the_replies_between_turns_and_nothing_after_the_last():
    """The span reward functions decode: sampled tokens and the environment's tokens between two
    turns (attended, not actions), never the padding after the last sampled token."""
    from olingo.engines import Rollout
    from olingo.experience_maker.scoring import response_span

    action = torch.tensor([[1, 1, 0, 0, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    attention = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0, 0]])  # row 1: a single turn, one attended pad after it
    rollout = Rollout(
        sequences=torch.zeros(2, 9, dtype=torch.long), attention_mask=torch.cat([torch.ones(2, 2, dtype=torch.long), attention], dim=1),
        action_mask=action, truncated=torch.zeros(2, dtype=torch.bool), num_prompt_tokens=2,
    )
    assert response_span(rollout).tolist() == [[True] * 5 + [False] * 2, [True] * 3 + [False] * 4]
