"""PPO maths against hand-computed values: masked statistics, KL, rewards, GAE, losses."""

import json
import math

import pytest
import torch
from torch.distributions import Categorical

from olingo.experience_maker.kl_controller import AdaptiveKLController, FixedKLController
from olingo.rl.advantages import compute_gae, per_token_rewards
from olingo.rl.kl import kl_estimate
from olingo.rl.logprobs import entropy_from_logits, log_probs_from_logits
from olingo.rl.masked import explained_variance, masked_mean, masked_sum, masked_var, masked_whiten
from olingo.rl.moments import RunningMoments
from olingo.rl.policy_loss import PolicyLoss, ValueLoss


def close(actual: torch.Tensor, expected, tol: float = 1e-6) -> bool:
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    return torch.allclose(actual, expected, atol=tol, rtol=0)


# --- masked statistics ---------------------------------------------------------------------


def test_masked_sum_and_mean_all_and_per_row():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert close(masked_sum(x, mask), 7.0)  # 1 + 2 + 4
    assert close(masked_mean(x, mask), 7.0 / 3)
    assert close(masked_sum(x, mask, dim=-1), [3.0, 4.0])  # 1 + 2; 4
    assert close(masked_mean(x, mask, dim=-1), [1.5, 4.0])  # 3 / 2; 4 / 1


def test_masked_mean_empty_rows_and_garbage_in_padding():
    x = torch.tensor([[1.0, float("nan")], [3.0, float("inf")]])
    mask = torch.tensor([[0, 0], [1, 0]], dtype=torch.bool)
    assert close(masked_mean(x, mask, dim=-1), [0.0, 3.0])  # empty row -> 0; NaN/inf ignored
    assert close(masked_mean(x, torch.zeros_like(mask)), 0.0)
    assert close(masked_sum(x, torch.zeros_like(mask)), 0.0)


def test_masked_var_and_whiten():
    x = torch.tensor([[1.0, 2.0, 3.0], [100.0, 5.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 0]])
    # Masked values 1, 2, 3, 5: mean 11/4 = 2.75, deviations -1.75 -0.75 0.25 2.25,
    # squares 3.0625 + 0.5625 + 0.0625 + 5.0625 = 8.75 -> var 8.75/4 = 2.1875, unbiased 8.75/3.
    assert close(masked_var(x, mask), 2.1875)
    assert close(masked_var(x, mask, unbiased=True), 8.75 / 3)
    std = math.sqrt(2.1875)  # 1.4790199
    expected = torch.tensor([[-1.75 / std, -0.75 / std, 0.25 / std], [0.0, 2.25 / std, 0.0]])
    assert close(masked_whiten(x, mask), expected, 1e-5)
    assert close(expected[0, 0], -1.1832160, 1e-6)
    # shift_mean=False adds the mean 2.75 back on masked entries only.
    expected_unshifted = expected + 2.75 * mask
    assert close(masked_whiten(x, mask, shift_mean=False), expected_unshifted, 1e-5)


def test_masked_whiten_and_var_with_empty_mask_are_zero():
    x = torch.tensor([[1.0, 2.0]])
    empty = torch.zeros(1, 2)
    assert close(masked_whiten(x, empty), [[0.0, 0.0]])
    assert close(masked_var(x, empty, unbiased=True), 0.0)
    assert close(masked_var(x[:, :1], torch.ones(1, 1), unbiased=True), 0.0)  # one entry


# --- log-probabilities and entropy ---------------------------------------------------------


def test_log_probs_and_entropy_match_categorical():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, generator=gen) * 3
    labels = torch.randint(0, 7, (2, 3), generator=gen)
    dist = Categorical(logits=logits)
    assert close(log_probs_from_logits(logits, labels), dist.log_prob(labels), 1e-5)
    assert close(entropy_from_logits(logits), dist.entropy(), 1e-5)


def test_log_probs_and_entropy_are_float32_for_bf16_logits():
    logits = torch.randn(1, 2, 5, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    labels = torch.tensor([[0, 4]])
    dist = Categorical(logits=logits.float())
    assert log_probs_from_logits(logits, labels).dtype == torch.float32
    assert entropy_from_logits(logits).dtype == torch.float32
    assert close(log_probs_from_logits(logits, labels), dist.log_prob(labels), 1e-5)
    assert close(entropy_from_logits(logits), dist.entropy(), 1e-5)


def test_entropy_with_minus_inf_logits_is_finite_with_finite_gradient():
    logits = torch.tensor([[[0.0, 0.0, float("-inf")]]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    assert close(entropy, [[math.log(2)]])  # two equally likely tokens
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()


# --- KL estimators -------------------------------------------------------------------------


def test_kl_estimators_hand_values():
    log_probs = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-2.0, -1.0, -3.0]])
    # logp - logp_ref = 1, -1, 0
    assert close(kl_estimate(log_probs, ref, "k1"), [[1.0, -1.0, 0.0]])
    assert close(kl_estimate(log_probs, ref), [[1.0, -1.0, 0.0]])  # k1 is the default
    # 0.5 * 1^2, 0.5 * (-1)^2, 0
    assert close(kl_estimate(log_probs, ref, "k2"), [[0.5, 0.5, 0.0]])
    # log r = ref - logp = -1, 1, 0: e^-1 + 1 - 1 = 0.3678794; e - 1 - 1 = 0.7182818; 0
    assert close(kl_estimate(log_probs, ref, "k3"), [[0.3678794, 0.7182818, 0.0]])


def test_unknown_kl_estimator_names_the_choices():
    with pytest.raises(ValueError, match="'k1', 'k2', 'k3'"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k4")  # type: ignore[arg-type]


# --- shaped rewards ------------------------------------------------------------------------


REWARD_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
REWARD_KL = torch.tensor(
    [[0.1, 0.2, 0.3, 0.4], [0.2, -0.4, float("inf"), 9.0], [1.0, 1.0, 1.0, 1.0]]
)
REWARD_SCORE = torch.tensor([1.0, 2.0, 3.0])


def test_per_token_rewards_score_at_last_token():
    rewards = per_token_rewards(REWARD_SCORE, REWARD_KL, REWARD_MASK, kl_coef=0.5)
    # row 0: -0.5 * kl = -0.05 -0.1 -0.15 -0.2, score 1 at token 3: -0.2 + 1 = 0.8
    # row 1: -0.1, 0.2, then padding 0 (inf is masked); score 2 at token 1: 0.2 + 2 = 2.2
    # row 2: empty mask -> all zeros, score dropped
    expected = [[-0.05, -0.1, -0.15, 0.8], [-0.1, 2.2, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert close(rewards, expected)


def test_per_token_rewards_score_at_every_token():
    rewards = per_token_rewards(REWARD_SCORE, REWARD_KL, REWARD_MASK, 0.5, placement="every")
    # row 0: 1 - 0.05, 1 - 0.1, 1 - 0.15, 1 - 0.2; row 1: 2 - 0.1, 2 + 0.2, 0, 0
    expected = [[0.95, 0.9, 0.85, 0.8], [1.9, 2.2, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert close(rewards, expected)
    with pytest.raises(ValueError, match="'last' or 'every'"):
        per_token_rewards(REWARD_SCORE, REWARD_KL, REWARD_MASK, 0.5, "first")  # type: ignore[arg-type]


# --- GAE -----------------------------------------------------------------------------------


def test_gae_three_tokens_gamma_one():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    advantages, returns = compute_gae(rewards, values, torch.ones(1, 3), gamma=1.0, lam=0.95)
    # t=2: delta = 1 + 0 - 0.7 = 0.3;   A2 = 0.3
    # t=1: delta = 0 + 0.7 - 0.6 = 0.1; A1 = 0.1 + 0.95 * 0.3 = 0.385
    # t=0: delta = 0 + 0.6 - 0.5 = 0.1; A0 = 0.1 + 0.95 * 0.385 = 0.46575
    assert close(advantages, [[0.46575, 0.385, 0.3]])
    assert close(returns, [[0.96575, 0.985, 1.0]])  # A + V


def test_gae_masked_third_token_contributes_nothing():
    rewards = torch.tensor([[0.5, 1.0, 7.0], [1.0, 1.0, 1.0]])
    values = torch.tensor([[0.2, 0.4, 5.0], [3.0, 3.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    advantages, returns = compute_gae(rewards, values, mask, gamma=0.9, lam=0.95)
    # row 0, token 2 is padding: its reward 7 and value 5 are dropped, V_2 = A_2 = 0.
    # t=1: delta = 1.0 + 0.9 * 0 - 0.4 = 0.6;          A1 = 0.6
    # t=0: delta = 0.5 + 0.9 * 0.4 - 0.2 = 0.66;       A0 = 0.66 + 0.9 * 0.95 * 0.6 = 1.173
    # returns: 1.173 + 0.2 = 1.373, 0.6 + 0.4 = 1.0, 0. Row 1 is empty: all zeros.
    assert close(advantages, [[1.173, 0.6, 0.0], [0.0, 0.0, 0.0]])
    assert close(returns, [[1.373, 1.0, 0.0], [0.0, 0.0, 0.0]])


# --- explained variance and running moments ------------------------------------------------


def test_explained_variance_hand_values():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0, 50.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    # Var(returns) over 1..4: mean 2.5, (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25.
    # values 1, 2, 3, 3: residual 0, 0, 0, 1, mean 0.25, var (3 * 0.0625 + 0.5625) / 4 = 0.1875.
    values = torch.tensor([[1.0, 2.0, 3.0, 3.0, -9.0]])
    assert close(explained_variance(values, returns, mask), 0.85)  # 1 - 0.1875 / 1.25
    assert close(explained_variance(returns, returns, mask), 1.0)
    assert close(explained_variance(torch.zeros_like(returns), returns, mask), 0.0)


def test_explained_variance_is_zero_when_undefined():
    constant = torch.full((1, 3), 2.0)
    assert close(explained_variance(torch.zeros(1, 3), constant, torch.ones(1, 3)), 0.0)
    assert close(explained_variance(torch.zeros(1, 3), constant, torch.zeros(1, 3)), 0.0)


def test_running_moments_hand_values():
    moments = RunningMoments()
    assert (moments.mean, moments.std, moments.count) == (0.0, 1.0, 0)  # identity before data
    batch_mean, batch_std = moments.update(torch.tensor([1.0, 2.0, 3.0]))
    assert batch_mean == pytest.approx(2.0) and batch_std == pytest.approx(math.sqrt(2 / 3))
    moments.update(torch.tensor([5.0]))
    # 1, 2, 3, 5: mean 2.75, population var 2.1875 (see test_masked_var_and_whiten)
    assert moments.count == 4
    assert moments.mean == pytest.approx(2.75)
    assert moments.std == pytest.approx(math.sqrt(2.1875))


def test_running_moments_equal_concatenation_and_resume_exactly():
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(n, generator=gen) * 3 + 7 for n in (5, 1, 12, 8)]
    moments = RunningMoments()
    for batch in batches:
        moments.update(batch)
    everything = torch.cat(batches).double()
    assert moments.mean == pytest.approx(everything.mean().item(), abs=1e-12)
    assert moments.std == pytest.approx(everything.std(unbiased=False).item(), abs=1e-12)

    resumed = RunningMoments()
    resumed.load_state_dict(json.loads(json.dumps(moments.state_dict())))
    extra = torch.randn(6, generator=gen)
    moments.update(extra)
    resumed.update(extra)
    assert resumed.state_dict() == moments.state_dict()


def test_running_moments_std_floor_and_empty_batch():
    moments = RunningMoments(eps=1e-3)
    moments.update(torch.full((4,), 2.0))
    assert moments.std == 1e-3
    with pytest.raises(ValueError):
        moments.update(torch.tensor([]))


# --- PolicyLoss ----------------------------------------------------------------------------


def policy_loss(ratio: float, advantage: float) -> tuple[float, float, dict]:
    """Loss and d loss / d log_prob for one token with the given ratio and advantage."""
    log_probs = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, _, stats = PolicyLoss(clip_eps=0.2)(
        log_probs, torch.zeros(1, 1), torch.tensor([[advantage]]), torch.ones(1, 1)
    )
    loss.backward()
    return loss.item(), log_probs.grad.item(), stats


def test_policy_loss_unclipped_branch():
    loss, grad, stats = policy_loss(1.1, 2.0)
    # 1.1 is inside [0.8, 1.2]: loss = -1.1 * 2 = -2.2; d/dlogp (-ratio * A) = -ratio * A
    assert loss == pytest.approx(-2.2) and grad == pytest.approx(-2.2)
    assert stats["clipfrac"].item() == 0.0
    # k3 of KL(old || new): (1.1 - 1) - ln 1.1 = 0.1 - 0.0953102 = 0.0046898
    assert stats["approx_kl"].item() == pytest.approx(0.0046898, abs=1e-6)


def test_policy_loss_clipped_positive_advantage_has_no_gradient():
    loss, grad, stats = policy_loss(1.5, 1.0)
    # min(1.5 * 1, 1.2 * 1) = 1.2 -> loss -1.2, taken from the constant clipped branch
    assert loss == pytest.approx(-1.2) and grad == 0.0
    assert stats["clipfrac"].item() == 1.0


def test_policy_loss_clipped_negative_advantage():
    loss, grad, _ = policy_loss(0.5, -1.0)
    # min(0.5 * -1, 0.8 * -1) = -0.8 -> loss 0.8, clipped: no gradient
    assert loss == pytest.approx(0.8) and grad == 0.0
    loss, grad, _ = policy_loss(1.5, -1.0)
    # min(1.5 * -1, 1.2 * -1) = -1.5 -> loss 1.5: the pessimistic bound keeps the unclipped
    # term, so the gradient -ratio * A = 1.5 still pushes the ratio down
    assert loss == pytest.approx(1.5) and grad == pytest.approx(1.5)


def test_policy_loss_skip_flag_ignores_padding():
    ones = torch.ones(1, 2)
    old = torch.zeros(1, 2)
    _, skip, _ = PolicyLoss()(torch.full((1, 2), math.log(25.0)), old, ones, ones)
    assert skip  # mean ratio 25 > 20
    # A huge ratio in padding neither sets the flag nor makes the loss or gradient NaN.
    log_probs = torch.tensor([[math.log(1.1), 1000.0]], requires_grad=True)
    loss, skip, stats = PolicyLoss()(log_probs, old, ones, torch.tensor([[1, 0]]))
    loss.backward()
    assert not skip and torch.isfinite(loss) and torch.isfinite(log_probs.grad).all()
    assert stats["ratio_max"].item() == pytest.approx(1.1)


def test_policy_loss_averages_per_sequence_then_batch():
    zeros = torch.zeros(2, 3)  # ratio 1 everywhere: loss_t = -A_t
    advantages = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    loss, _, _ = PolicyLoss()(zeros, zeros, advantages, mask)
    # row means -(1 + 2 + 3) / 3 = -2 and -4 -> batch mean -3 (a token mean would be -2.5)
    assert loss.item() == pytest.approx(-3.0)


def test_policy_loss_stats():
    log_probs = torch.log(torch.tensor([[1.1, 0.5, 1.0]]))
    log_probs[0, 2] = 50.0  # padding
    _, _, stats = PolicyLoss()(
        log_probs, torch.zeros(1, 3), torch.ones(1, 3), torch.tensor([[1, 1, 0]])
    )
    # masked ratios 1.1 and 0.5: max 1.1, mean 0.8, only |0.5 - 1| > 0.2 -> clipfrac 1/2
    assert stats["ratio_max"].item() == pytest.approx(1.1)
    assert stats["ratio_mean"].item() == pytest.approx(0.8)
    assert stats["clipfrac"].item() == pytest.approx(0.5)
    # ((0.1 - ln 1.1) + (-0.5 - ln 0.5)) / 2 = (0.0046898 + 0.1931472) / 2 = 0.0989185
    assert stats["approx_kl"].item() == pytest.approx(0.0989185, abs=1e-6)
    assert all(not value.requires_grad and value.dim() == 0 for value in stats.values())


# --- ValueLoss -----------------------------------------------------------------------------


def test_value_loss_clipped_and_unclipped_branches():
    values = torch.tensor([[0.5, 0.1], [0.5, 9.0]], requires_grad=True)
    returns = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, stats = ValueLoss(clip_eps=0.2)(values, torch.zeros(2, 2), returns, mask)
    # (0,0): v_clip 0.2: (0.2 - 1)^2 = 0.64 > (0.5 - 1)^2 = 0.25 -> 0.64, clipped term wins
    # (0,1): v_clip 0.1 = v: both 0.81 -> 0.81
    # (1,0): v_clip 0.2: (1.2)^2 = 1.44 < (1.5)^2 = 2.25 -> 2.25
    # rows (0.64 + 0.81) / 2 = 0.725 and 2.25 -> 0.5 * (0.725 + 2.25) / 2 = 0.74375
    assert loss.item() == pytest.approx(0.74375)
    assert stats["value_clipfrac"].item() == pytest.approx(1 / 3)
    loss.backward()
    # d loss / dv = 0.5 * (1/2 rows) * (1/row length) * 2 (v - R) on the winning branch:
    # (0,0) clipped branch, clamp saturated -> 0; (0,1) 0.5 * 0.5 * 0.5 * 2 * (0.1 - 1) = -0.225;
    # (1,0) 0.5 * 0.5 * 1 * 2 * (0.5 + 1) = 0.75; padding 0
    assert close(values.grad, [[0.0, -0.225], [0.75, 0.0]])


@pytest.mark.parametrize("clip_eps", [None, 0.0])
def test_value_loss_without_clipping(clip_eps):
    loss, stats = ValueLoss(clip_eps=clip_eps)(
        torch.tensor([[0.5]]), torch.zeros(1, 1), torch.tensor([[1.0]]), torch.ones(1, 1)
    )
    assert loss.item() == pytest.approx(0.125)  # 0.5 * (0.5 - 1)^2, old value ignored
    assert stats["value_clipfrac"].item() == 0.0


# --- KL controllers ------------------------------------------------------------------------


def test_fixed_kl_controller_stays_fixed():
    controller = FixedKLController(0.1)
    controller.update(current_kl=100.0, n_steps=64)
    assert controller.value == 0.1
    other = FixedKLController(0.5)
    other.load_state_dict(json.loads(json.dumps(controller.state_dict())))
    assert other.value == 0.1


@pytest.mark.parametrize(
    ("current_kl", "expected"),
    [
        (6.6, 0.202),  # e = 6.6/6 - 1 = 0.1:  0.2 * (1 + 0.1 * 1000/10000) = 0.2 * 1.01
        (5.4, 0.198),  # e = -0.1:             0.2 * 0.99
        (7.5, 0.204),  # e = 0.25, clipped to 0.2:  0.2 * 1.02
        (0.0, 0.196),  # e = -1, clipped to -0.2:   0.2 * 0.98
        (6.0, 0.2),  # on target: unchanged
    ],
)
def test_adaptive_kl_controller(current_kl, expected):
    controller = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000)
    controller.update(current_kl, n_steps=1000)
    assert controller.value == pytest.approx(expected, abs=1e-12)
    resumed = AdaptiveKLController(init_kl_coef=1.0, target=6.0, horizon=10000)
    resumed.load_state_dict(json.loads(json.dumps(controller.state_dict())))
    assert resumed.value == controller.value


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"init_kl_coef": 0.1, "target": 0.0, "horizon": 10}, "target"),
        ({"init_kl_coef": 0.1, "target": 6.0, "horizon": 0}, "horizon"),
        ({"init_kl_coef": 0.0, "target": 6.0, "horizon": 10}, "init_kl_coef"),
    ],
)
def test_adaptive_kl_controller_validates(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveKLController(**kwargs)
