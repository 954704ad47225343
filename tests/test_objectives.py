"""The 2025 policy objectives (GSPO, GSPO-token, CISPO, SAPO) and GDPO's multi-reward normalisation:
hand-computed values and gradients, their limits, the default path unchanged, and short CLI runs.

One 2 x 3 example throughout: row 0 has 2 response tokens (the third is padding holding -inf, which
must not leak), row 1 has 3. Log-ratios d = log pi - log pi_old are [0.1, -0.2] and [0.05, 0.3, -0.1].
Tolerances: 1e-6 between float32 torch results and float64 hand values (a few float32 ulps).
"""

from __future__ import annotations

import math

import pytest
import torch

from olingo.cli.main import main
from olingo.rl.advantages import batch_normalize, gdpo_advantages, gdpo_group_sum, grpo_advantages
from olingo.rl.policy_loss import (
    GroupPolicyLoss,
    aggregate_loss,
    cispo_loss,
    clipped_surrogate,
    gspo_surrogate,
    sapo_loss,
)
from tests.conftest import read_jsonl
from tests.test_interrupt_exact import assert_same_run, eval_file, grpo_args, interrupt_and_resume  # noqa: F401 (eval_file: a fixture)

TOL = dict(rtol=0, atol=1e-6)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]]).bool()
D = torch.tensor([[0.1, -0.2, 0.0], [0.05, 0.3, -0.1]])


def example(advantages: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log_probs (leaf, padding -inf), old_log_probs, advantages), all (2, 3)."""
    log_probs = torch.tensor([[-1.0, -0.5, -math.inf], [-0.3, -1.2, -0.7]], requires_grad=True)
    old = torch.where(MASK, log_probs.detach() - D, torch.zeros(2, 3))
    return log_probs, old, torch.tensor(advantages)


def grad_of_sum(loss: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(torch.where(MASK, loss, torch.zeros_like(loss)).sum(), log_probs)
    return grad


def test_gspo_clips_the_sequence_ratio_and_gspo_token_keeps_token_advantages():
    # s_0 = exp(mean(0.1, -0.2)) = 0.951229 (A > 0, below the band: the unclipped term is taken);
    # s_1 = exp(mean(0.05, 0.3, -0.1)) = 1.086904 > 1 + 4e-4 with A > 0: clipped, no gradient.
    s0 = math.exp(-0.05)
    log_probs, old, adv = example([[1.0, 2.0, 0.0], [1.0, 1.0, 1.0]])
    loss, clipped, ratio = gspo_surrogate(log_probs, old, adv, MASK, 3e-4, 4e-4)
    torch.testing.assert_close(loss, torch.tensor([[-s0, -2 * s0, 0.0], [-1.0004] * 3]), **TOL)
    assert clipped.tolist() == [[False, False, False], [True, True, True]]
    torch.testing.assert_close(ratio[1], torch.full((3,), math.exp(0.25 / 3)), **TOL)
    # d/dlogpi_u sum_t -s_0 A_t = -s_0 mean_t(A_t) = -1.5 s_0 for both tokens of row 0.
    torch.testing.assert_close(grad_of_sum(loss, log_probs), torch.tensor([[-1.5 * s0, -1.5 * s0, 0], [0, 0, 0]]), **TOL)
    # GSPO-token: the same values, but token u's gradient is -s_0 A_u.
    log_probs, old, adv = example([[1.0, 2.0, 0.0], [1.0, 1.0, 1.0]])
    token_loss, _, _ = gspo_surrogate(log_probs, old, adv, MASK, 3e-4, 4e-4, token_level=True)
    torch.testing.assert_close(token_loss, loss.detach(), **TOL)
    torch.testing.assert_close(grad_of_sum(token_loss, log_probs), torch.tensor([[-s0, -2 * s0, 0], [0, 0, 0]]), **TOL)


def test_gspo_equals_the_clipped_surrogate_on_one_token_responses():
    # With one token the sequence ratio is the token ratio: GSPO is GRPO's clipped surrogate exactly
    # (1e-7: mean over one token is the token itself, up to the float32 division by 1).
    log_probs = torch.tensor([[-1.0], [-0.3], [-2.0], [-0.1]], requires_grad=True)
    old = log_probs.detach() - torch.tensor([[0.5], [-0.5], [0.1], [-0.1]])
    adv, mask = torch.tensor([[1.0], [-1.0], [-1.0], [1.0]]), torch.ones(4, 1, dtype=torch.bool)
    gspo, gspo_clipped, _ = gspo_surrogate(log_probs, old, adv, mask, 0.2, 0.28)
    ppo, ppo_clipped = clipped_surrogate(log_probs - old, adv, 0.2, 0.28)
    torch.testing.assert_close(gspo, ppo, rtol=0, atol=1e-7)
    assert torch.equal(gspo_clipped, ppo_clipped) and gspo_clipped.any() and not gspo_clipped.all()
    g1, g2 = (torch.autograd.grad(x.sum(), log_probs, retain_graph=True)[0] for x in (gspo, ppo))
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-7)


def test_cispo_gives_every_token_a_gradient_through_its_capped_weight():
    # Weights w = clip(exp(d), 0, 1.2): 1.105171, 0.818731 | 1.051271, 1.2 (capped from 1.349859), 0.904837.
    log_probs, old, adv = example([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, clipped = cispo_loss(log_probs, old, adv, MASK, max_ratio=1.2)
    w = [[math.exp(0.1), math.exp(-0.2), 0.0], [math.exp(0.05), 1.2, math.exp(-0.1)]]
    lp = [[-1.0, -0.5, 0.0], [-0.3, -1.2, -0.7]]
    torch.testing.assert_close(loss, torch.tensor([[-wi * li for wi, li in zip(rw, rl, strict=True)] for rw, rl in zip(w, lp, strict=True)]), **TOL)
    assert clipped.tolist() == [[False, False, False], [False, True, False]]
    torch.testing.assert_close(grad_of_sum(loss, log_probs), -torch.tensor(w), **TOL)
    # The clipped surrogate gives that token (A > 0, ratio above 1 + 0.2) no gradient at all.
    log_probs, old, adv = example([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    ppo, _ = clipped_surrogate(torch.where(MASK, log_probs - old, torch.zeros(2, 3)), adv, 0.2, 0.2)
    assert grad_of_sum(ppo, log_probs)[1, 1] == 0


def test_sapo_hand_values_and_gate_limits():
    # f(r) = 4/tau sigmoid(tau (r - 1)); tau 1 for A > 0 (row 0), 1.05 for A < 0 (row 1).
    log_probs, old, adv = example([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])
    loss, weight = sapo_loss(torch.where(MASK, log_probs - old, torch.zeros(2, 3)), adv, 1.0, 1.05)
    hand_loss = torch.tensor([[-2.105074084570819, -1.8192254811024078], [1.9560206220308896, 2.2507387151233678]])
    torch.testing.assert_close(loss[:, :2], hand_loss, **TOL)
    torch.testing.assert_close(loss[1, 2], torch.tensor(1.8096784202725338), **TOL)
    grad = grad_of_sum(loss, log_probs)
    hand_grad = torch.tensor([[-1.1021204907203224, -0.8120418401734699, 0], [1.050509773641651, 1.3053238613376028, 0.902582663152702]])
    torch.testing.assert_close(grad, hand_grad, **TOL)
    torch.testing.assert_close(weight[0, :2], -grad[0, :2], **TOL)  # A = 1: the gate weight is the gradient
    # Limits: weight exactly 1 at r = 1 (the policy gradient), -> 0 far from it; the loss stays within 4/tau |A|.
    log_ratio = torch.tensor([0.0, 3.0, -20.0])
    loss, weight = sapo_loss(log_ratio, torch.ones(3), 1.0, 1.05)
    assert weight[0] == 1 and weight[1] < 1e-6 and weight[2] < 1e-8
    torch.testing.assert_close(loss, torch.tensor([-2.0, -4.0, -4 * (1 / (1 + math.e))]), rtol=0, atol=1e-6)
    _, neg = sapo_loss(torch.tensor([0.5]), -torch.ones(1), 1.0, 1.05)
    _, pos = sapo_loss(torch.tensor([0.5]), torch.ones(1), 1.0, 1.05)
    assert neg < pos  # the larger tau_neg attenuates a negative update more at the same ratio


def test_default_objective_is_bit_identical_to_the_clipped_surrogate_path():
    torch.manual_seed(0)
    log_probs = torch.randn(4, 5, requires_grad=True)
    old, adv, ref = log_probs.detach() + 0.3 * torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)
    mask = torch.rand(4, 5) > 0.3
    fn = GroupPolicyLoss(0.2, 0.28, 3.0, "seq_mean_token_mean", kl_coef=0.1)
    loss, stats = fn(log_probs, old, adv, mask, 4.0, ref)
    (grad,) = torch.autograd.grad(loss, log_probs)
    # The path GroupPolicyLoss took before the objectives existed, written out.
    log_ratio = torch.where(mask, log_probs - old, torch.zeros_like(log_probs))
    token_loss, _ = clipped_surrogate(log_ratio, torch.where(mask, adv, torch.zeros_like(adv)), 0.2, 0.28, 3.0)
    from olingo.rl.kl import kl_estimate

    old_loss = aggregate_loss(token_loss, mask, "seq_mean_token_mean", 4.0) + 0.1 * aggregate_loss(
        kl_estimate(log_probs, ref, "k3", mask), mask, "seq_mean_token_mean", 4.0
    )
    (old_grad,) = torch.autograd.grad(old_loss, log_probs)
    assert torch.equal(loss, old_loss) and torch.equal(grad, old_grad)
    assert "seq_ratio_mean" not in stats and "sapo_gate_weight" not in stats


@pytest.mark.parametrize("objective", ["gspo", "gspo_token", "cispo", "sapo"])
def test_group_policy_loss_runs_each_objective_with_finite_loss_and_stats(objective):
    log_probs, old, adv = example([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])
    loss, stats = GroupPolicyLoss(objective=objective, aggregation="seq_mean_token_mean")(log_probs, old, adv, MASK, 2.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(log_probs.grad).all() and log_probs.grad[0, 2] == 0
    assert all(torch.isfinite(v) for v in stats.values())
    with pytest.raises(ValueError, match="dual_clip applies to the ppo_clip objective only"):
        GroupPolicyLoss(dual_clip=3.0, objective=objective)


def test_gdpo_hand_values_two_terms_two_per_group():
    # Group A: (1, 1) vs (0, 0): both terms split the pair, each normalised to +-1/sqrt(2), sum +-sqrt(2).
    # Group B: (1, 0) vs (0, 0): only term 1 does: +-1/sqrt(2). Batch: mean 0, unbiased std sqrt(5/3).
    terms = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    weights = torch.ones(2, dtype=torch.float64)
    sums = gdpo_group_sum(terms, weights, 2, eps=1e-12)
    torch.testing.assert_close(sums, torch.tensor([2**0.5, -(2**0.5), 0.5**0.5, -(0.5**0.5)], dtype=torch.float64), rtol=0, atol=1e-9)
    adv = gdpo_advantages(terms, weights, 2, eps=1e-12)
    torch.testing.assert_close(adv, torch.tensor([1.2**0.5, -(1.2**0.5), 0.3**0.5, -(0.3**0.5)], dtype=torch.float64), rtol=0, atol=1e-9)
    # GRPO on the summed reward (2 vs 0, 1 vs 0) gives both groups +-1/sqrt(2): the collapse GDPO avoids.
    grpo = grpo_advantages((terms * weights).sum(-1), 2, eps=1e-12)
    torch.testing.assert_close(grpo, torch.tensor([0.5**0.5, -(0.5**0.5)] * 2, dtype=torch.float64), rtol=0, atol=1e-9)
    # The weights scale each term's normalised value: weight 0 removes term 2 from the sum.
    torch.testing.assert_close(gdpo_group_sum(terms, torch.tensor([1.0, 0.0], dtype=torch.float64), 2, 1e-12)[:2], sums[2:], rtol=0, atol=1e-9)
    torch.testing.assert_close(batch_normalize(sums, 1e-12), adv, rtol=0, atol=1e-12)  # the same calls: 1e-12


def test_gdpo_in_the_group_maker_trains_on_the_published_advantages():
    # The maker's two halves (`sample`'s decoupled score, `finish`'s batch step) equal `gdpo_advantages`
    # with the reward's own term weights (float32 against float32 on another path: 1e-6).
    from types import SimpleNamespace

    from olingo.experience_maker import Experience
    from olingo.experience_maker.group import GroupExperienceConfig, GroupExperienceMaker
    from olingo.rewards.functions import CompositeReward

    reward = CompositeReward({"exact_match": 1.0, "length_penalty": 0.5})
    config = GroupExperienceConfig(num_generations=2, reward_aggregation="gdpo")
    maker = GroupExperienceMaker(torch.nn.Linear(1, 1), reward, None, None, config=config, source=object())
    terms = torch.tensor([[1.0, 0.0], [0.0, -1.0], [1.0, -0.5], [1.0, 0.0]])
    scored = SimpleNamespace(reward_terms={"exact_match": terms[:, 0], "length_penalty": terms[:, 1]}, raw_score=terms[:, 0])
    score, info = maker._decoupled_score(scored, torch.zeros(4))
    assert info == {"reward/exact_match/group_std": 0.25, "reward/length_penalty/group_std": 0.375}
    mask = torch.ones(4, 2, dtype=torch.bool)
    experience = Experience(
        sequences=torch.zeros(4, 3, dtype=torch.long), attention_mask=torch.ones(4, 3, dtype=torch.long), action_mask=mask,
        action_log_probs=None, base_action_log_probs=None, kl=None, rewards=torch.zeros(4, 2), advantages=None,
        score=score, raw_score=terms[:, 0], truncated=torch.zeros(4, dtype=torch.bool),
    )
    advantages = maker.finish(experience).advantages
    expected = gdpo_advantages(terms, torch.tensor([1.0, 0.5]), 2, config.std_eps)
    torch.testing.assert_close(advantages, expected.unsqueeze(-1).expand(4, 2), **TOL)


def test_objective_settings_validate_and_agree_with_the_loss_defaults():
    from olingo.experience_maker.group import GroupExperienceConfig
    from olingo.rl.policy_loss import ObjectiveParams
    from olingo.trainer.grpo_learner import GRPOLossConfig

    assert GRPOLossConfig().objective_params() == ObjectiveParams() and GRPOLossConfig().objective == "ppo_clip"
    with pytest.raises(ValueError, match="loss.dual_clip applies to loss.objective ppo_clip only"):
        GRPOLossConfig(objective="gspo", dual_clip=3.0)
    with pytest.raises(ValueError, match="set experience.advantage grpo, not rloo"):
        GroupExperienceConfig(reward_aggregation="gdpo", advantage="rloo")


# ---- short runs through the CLI ------------------------------------------------------------------
def varied_reward(prompt: str, response: str, gt_answer: str | None) -> float:
    """A reward that differs within most groups (the tiny model rarely answers right), so steps have a gradient."""
    return float(len(response) % 3)


def short_grpo(tmp_path, assets, name: str, *overrides: str) -> list[dict]:
    """2 episodes, 4 prompts x 2 generations, 2 optimizer steps per episode (pi_old differs from pi)."""
    args = [
        "grpo", f"run.output_dir={tmp_path}", f"run.name={name}", "logging.progress=false", f"model.actor={assets.model_dir}",
        "loop.episodes=2", "loop.rollout_batch_size=4", "loop.train_batch_size=4", "loop.update_steps=1", "loop.eval_interval=0",
        "experience.num_generations=2", "generation.max_new_tokens=4", "actor_optim.lr=1e-3", *overrides,
    ]
    assert main(args) == 0
    return [r for r in read_jsonl(tmp_path / name / "metrics.jsonl") if r["split"] == "train"]


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["gspo", "gspo_token", "cispo", "sapo"])
def test_cli_grpo_run_with_each_objective_completes_with_finite_loss(tmp_path, assets, objective):
    rows = short_grpo(
        tmp_path, assets, objective, f"loss.objective={objective}", "loss.aggregation=seq_mean_token_mean",
        "reward.functions={tests.test_objectives:varied_reward: 1.0}",
    )
    steps = [r for r in rows if "train/policy_loss" in r]
    assert len(steps) == 4 and all(math.isfinite(r["train/policy_loss"]) and math.isfinite(r["train/approx_kl"]) for r in steps)
    own = {"gspo": "train/seq_ratio_mean", "gspo_token": "train/seq_ratio_mean", "sapo": "train/sapo_gate_weight"}.get(objective)
    assert own is None or all(math.isfinite(r[own]) for r in steps)
    assert any(r["train/actor_grad_norm"] > 0 for r in steps)
    assert any(r["train/approx_kl"] > 0 for r in steps)  # the second step of an episode sees pi != pi_old


@pytest.mark.slow
def test_cli_grpo_run_with_gdpo_logs_each_term(tmp_path, assets):
    rows = short_grpo(
        tmp_path, assets, "gdpo", "experience.reward_aggregation=gdpo", "reward.functions={tests.test_objectives:varied_reward: 1.0, arithmetic_format: 0.5}",
    )
    logged = {k for r in rows for k in r}
    assert {"rollout/reward/tests.test_objectives:varied_reward/group_std", "rollout/reward/arithmetic_format/group_std"} <= logged
    # The score trained on is each group's decoupled sum, whose group mean is 0 (float32: 1e-5).
    assert all(abs(r["rollout/score_mean"]) < 1e-5 for r in rows if "rollout/score_mean" in r)
    assert all(math.isfinite(r["train/policy_loss"]) for r in rows if "train/policy_loss" in r)


@pytest.mark.slow
def test_cispo_run_stopped_mid_episode_resumes_exactly(tmp_path, assets, eval_file, capsys):  # noqa: F811 (the fixture)
    extra = ["loss.objective=cispo", "loop.update_steps=2"]
    assert main([*grpo_args(tmp_path, "straight", assets, eval_file, stop_step=0), *extra]) == 0
    interrupt_and_resume([*grpo_args(tmp_path, "stopped", assets, eval_file, stop_step=3), *extra], capsys)
    assert_same_run(tmp_path / "straight", tmp_path / "stopped", ("actor",))


# ---- against a peer: TRL 1.16's per-token losses ----------------------------------------------------
def trl_per_token_loss(loss_type: str, level: str, logps: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                       eps_low: float, eps_high: float, tau_pos: float = 1.0, tau_neg: float = 1.05) -> torch.Tensor:
    """TRL 1.16.0's `GRPOTrainer._compute_loss` per-token loss (trl/trainer/grpo_trainer.py, the
    `importance_sampling_level` and `loss_type` branches), transcribed line for line so that the
    test runs without TRL installed. advantages: (B, 1), as TRL unsqueezes them."""
    log_ratio = logps - old
    if level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    if loss_type == "cispo":
        clamped_ratios = torch.clamp(coef_1, max=eps_high).detach()
        return -clamped_ratios * advantages * logps
    if loss_type == "grpo":
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        return -torch.min(coef_1 * advantages, coef_2 * advantages)
    temperatures = torch.where(advantages > 0, tau_pos, tau_neg)
    return -(torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures) * advantages


@pytest.mark.parametrize("objective", ["gspo", "cispo", "sapo"])
def test_each_objective_equals_trls_per_token_loss_and_its_gradient(objective):
    """Random rows of uneven lengths, ratios far enough from 1 that clipping and capping happen:
    the loss of every response token, and the gradient of TRL's `grpo` aggregation (mean over
    sequences of the token mean) with respect to log pi, agree with TRL's within float32
    rounding (1e-6; the two differ only in the order of a few float32 operations)."""
    gen = torch.Generator().manual_seed(0)
    mask = torch.arange(6)[None] < torch.tensor([6, 3, 5, 1])[:, None]
    old = -torch.rand(4, 6, generator=gen) * 3
    logps = (old + torch.randn(4, 6, generator=gen) * 0.4).requires_grad_(True)
    advantages = torch.tensor([[1.3], [-0.7], [0.4], [-1.1]])
    token_advantages = advantages.expand(4, 6)
    trl_type, level = {"gspo": ("grpo", "sequence"), "cispo": ("cispo", "token"), "sapo": ("sapo", "token")}[objective]
    eps_high = 1.2 if objective == "cispo" else 0.28  # CISPO's cap is TRL's epsilon_high (5 in ScaleRL; 1.2 here, so that it binds)
    ours = {
        "gspo": lambda: gspo_surrogate(logps, old, token_advantages, mask, 0.2, eps_high)[0],
        "cispo": lambda: cispo_loss(logps, old, token_advantages, mask, max_ratio=eps_high)[0],
        "sapo": lambda: sapo_loss(torch.where(mask, logps - old, torch.zeros_like(logps)), token_advantages, 1.0, 1.05)[0],
    }[objective]()
    theirs = trl_per_token_loss(trl_type, level, logps, old, advantages, mask.float(), 0.2, eps_high).expand(4, 6)
    assert torch.allclose(ours[mask], theirs[mask], **TOL)
    per_row = lambda loss: ((loss * mask).sum(-1) / mask.sum(-1)).mean()  # noqa: E731 - TRL's `grpo` aggregation
    (our_grad,) = torch.autograd.grad(per_row(torch.where(mask, ours, torch.zeros_like(ours))), logps)
    (their_grad,) = torch.autograd.grad(per_row(theirs), logps)
    assert torch.allclose(our_grad, their_grad, **TOL)
    assert our_grad[mask].abs().sum() > 0
    ratios = (logps - old).detach().exp()[mask]
    sequence = (((logps - old) * mask).sum(-1) / mask.sum(-1)).detach().exp()
    assert {"gspo": ((sequence < 0.8) | (sequence > 1.28)).any(), "cispo": (ratios > 1.2).any(), "sapo": True}[objective]  # the bounds bind
