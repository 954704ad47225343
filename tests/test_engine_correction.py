"""Engine/trainer log-prob mismatch: the metrics, truncated importance sampling (hand-computed),
the choice of pi_old, the config rules, and when a separate engine is synced."""

from __future__ import annotations

import math

import pytest
import torch

from olingo.engines import Rollout
from olingo.experience_maker.engine_logprobs import policy_log_probs
from olingo.rl.kl import engine_mismatch, truncated_is_weights
from olingo.rl.policy_loss import GroupPolicyLoss, PolicyLoss
from olingo.trainer.rl_support import EngineSync, check_engine_correction

LOG = math.log


def test_truncated_is_weights_by_hand() -> None:
    # pi_old / pi_engine = 0.5/0.25 = 2 (capped at 1.5), 0.2/0.4 = 0.5, and a padded column.
    trainer = torch.tensor([[LOG(0.5), LOG(0.2), 0.0]])
    engine = torch.tensor([[LOG(0.25), LOG(0.4), -50.0]])
    mask = torch.tensor([[True, True, False]])
    weights = truncated_is_weights(trainer, engine, 1.5, mask)
    torch.testing.assert_close(weights, torch.tensor([[1.5, 0.5, 1.0]]))
    trainer.requires_grad_(True)
    assert not truncated_is_weights(trainer, engine, 1.5, mask).requires_grad  # a constant weight
    with pytest.raises(ValueError, match="tis_cap"):
        truncated_is_weights(trainer, engine, 0.0, mask)


def test_engine_mismatch_by_hand() -> None:
    trainer = torch.tensor([[LOG(0.5), LOG(0.2), 0.0]])
    engine = torch.tensor([[LOG(0.25), LOG(0.2), 7.0]])
    mask = torch.tensor([[True, True, False]])
    metrics = engine_mismatch(trainer, engine, mask)
    # |log 2| and 0 over two tokens; the padded column is ignored.
    assert metrics["engine_logprob_abs_diff"].item() == pytest.approx(LOG(2) / 2)
    assert metrics["engine_logprob_max_diff"].item() == pytest.approx(LOG(2))
    # k3 of KL(engine || trainer): r = pi_trainer / pi_engine = 2 -> (2 - 1) - log 2; r = 1 -> 0.
    assert metrics["engine_kl"].item() == pytest.approx((1 - LOG(2)) / 2)
    same = engine_mismatch(trainer, trainer.clone(), mask)
    assert all(v.item() == 0 for v in same.values())


def test_group_policy_loss_multiplies_token_losses_by_the_weights() -> None:
    log_probs = torch.tensor([[LOG(0.5), LOG(0.2)]], requires_grad=True)
    advantages = torch.tensor([[2.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    weights = torch.tensor([[1.5, 0.5]])
    loss_fn = GroupPolicyLoss(aggregation="token_mean")
    # pi_old = the current policy: ratio 1, token losses -A = [-2, 1]; weighted [-3, 0.5]; mean over 2 tokens.
    loss, stats = loss_fn(log_probs, None, advantages, mask, units=2.0, tis_weights=weights)
    assert loss.item() == pytest.approx((-3.0 + 0.5) / 2)
    assert stats["tis_weight_mean"].item() == pytest.approx(1.0)
    loss.backward()
    # d/dlogp of -w * A * ratio at ratio 1 is -w * A / units.
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-1.5, 0.25]]))
    plain, _ = loss_fn(log_probs.detach(), None, advantages, mask, units=2.0)
    assert plain.item() == pytest.approx((-2.0 + 1.0) / 2)


def test_ppo_policy_loss_with_weights() -> None:
    log_probs = torch.tensor([[LOG(0.5), LOG(0.2)]])
    old = log_probs.clone()
    advantages = torch.tensor([[2.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, _, stats = PolicyLoss(0.2)(log_probs, old, advantages, mask, torch.tensor([[2.0, 1.0]]))
    assert loss.item() == pytest.approx((-4.0 + 1.0) / 2)
    assert stats["tis_weight_mean"].item() == pytest.approx(1.5)


class _Engine:
    def __init__(self, shares_weights: bool) -> None:
        self.shares_weights = shares_weights
        self.updates, self.calls = 0, []

    def update_weights(self, named_tensors, *, full: bool = True) -> int:
        self.updates += 1
        return len(list(named_tensors))

    def wake(self) -> None:
        self.calls.append("wake")

    def sleep(self) -> None:
        self.calls.append("sleep")


def _rollout(log_probs: torch.Tensor | None) -> Rollout:
    mask = torch.tensor([[True, True, False]])
    return Rollout(
        sequences=torch.zeros(1, 5, dtype=torch.long), attention_mask=torch.ones(1, 5, dtype=torch.long), action_mask=mask,
        truncated=torch.tensor([False]), num_prompt_tokens=2, log_probs=log_probs, finish_reasons=["stop"],
    )


def test_policy_log_probs_picks_pi_old_and_measures_the_gap() -> None:
    trainer = torch.tensor([[LOG(0.5), LOG(0.2), 0.0]])
    engine = torch.tensor([[LOG(0.25), LOG(0.2), 0.0]])
    scored = []
    score = lambda: scored.append(1) or trainer  # noqa: E731
    separate = policy_log_probs(_rollout(engine), engine_shares_weights=False, score=score, wanted=False)
    assert scored == [1]  # the mismatch needs the trainer's forward even when pi_old is not wanted
    assert separate.old("trainer") is trainer and separate.old("engine") is separate.engine
    assert separate.info["engine_logprob_abs_diff"] == pytest.approx(LOG(2) / 2)
    shared = policy_log_probs(_rollout(engine), engine_shares_weights=True, score=score, wanted=True)
    assert scored == [1] and shared.trainer is not None and shared.info == {}  # generate's own logits are the trainer's
    none = policy_log_probs(_rollout(None), engine_shares_weights=True, score=score, wanted=False)
    assert none.trainer is None and scored == [1]


def test_engine_sync_sends_once_per_policy_version() -> None:
    engine = _Engine(shares_weights=False)
    model = torch.nn.Linear(2, 2)
    sync = EngineSync(engine)
    metrics = sync.before_rollout(model, step=0)
    assert engine.updates == 1 and metrics["time/weight_sync"] > 0 and metrics["perf/weight_sync_GBps"] > 0
    assert sync.before_rollout(model, step=0) == {} and engine.updates == 1  # evaluation at the same step: nothing new
    sync.after_rollout()
    sync.before_rollout(model, step=1)
    assert engine.updates == 2 and engine.calls == ["wake", "wake", "sleep", "wake"]
    shared = _Engine(shares_weights=True)
    assert EngineSync(shared).before_rollout(model, step=0) == {} and shared.updates == 0 and shared.calls == []


def test_engine_correction_rules() -> None:
    check_engine_correction(_Engine(False), 2.0, "trainer")
    check_engine_correction(_Engine(False), None, "engine")
    with pytest.raises(ValueError, match="nothing to correct"):
        check_engine_correction(_Engine(True), 2.0, "trainer")
    with pytest.raises(ValueError, match="use 'trainer'"):
        check_engine_correction(_Engine(True), None, "engine")
    with pytest.raises(ValueError, match="twice"):
        check_engine_correction(_Engine(False), 2.0, "engine")


def test_generation_settings_are_engine_neutral() -> None:
    from olingo.recipes.online_config import GenerationSection

    settings = GenerationSection(engine="vllm", max_new_tokens=8).settings([3])
    assert settings.max_new_tokens == 8 and settings.stop_token_ids == [3]
