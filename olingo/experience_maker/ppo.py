"""`PPOExperienceMaker`: rollouts -> scored, advantage-annotated `Experience`.

One call to `make_experience`, as the algorithm reads (InstructGPT / Ziegler et al. 2019):
    1. sample responses to left-padded prompts from the rollout source (through its engine)
    2. log pi_old and log pi_ref of every response token (actor and frozen initial model)
    3. V_old of the state before every response token (critic; skipped without one)
    4. the sequence score: reward model at the last real token (the rule RM training uses),
       or reward functions on decoded text; optional running normalisation, truncation
       penalty, clipping to [-clip, clip] (`RewardShaping`)
    5. per-token rewards: -kl_coef * KL_t, plus the score at the last response token
    6. advantages from the configured estimator (GAE: with returns for the critic); optional
       whitening (per rank, or global)
    7. update the KL controller (adaptive: towards `kl_target`) with the KL of every rank
All maths is in `olingo.rl`; this module only wires models to it (`NaiveExperienceMaker` is
its ColossalChat name, exported beside it from `olingo.experience_maker`). It implements
`olingo.experience_maker.maker.ExperienceMaker`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from olingo.engines import GenerationSettings, HFEngine, RolloutEngine
from olingo.experience_maker.advantages import (
    AdvantageEstimator,
    AdvantageInputs,
    build_advantage_estimator,
)
from olingo.experience_maker.config import ExperienceConfig, RewardShaping
from olingo.experience_maker.engine_logprobs import policy_log_probs
from olingo.experience_maker.experience import Experience, experience_info
from olingo.experience_maker.kl_controller import AdaptiveKLController, FixedKLController
from olingo.experience_maker.maker import CollectedBatch, SourceBacked
from olingo.experience_maker.scoring import (
    ScoredRollout,
    action_log_probs,
    action_values,
    add_source_reward,
    fewest_over_ranks,
    kept_rows,
    score_rollout,
    select_rows,
    to_model_device,
)
from olingo.rewards.functions import CompositeReward
from olingo.rewards.judge import judge_counters
from olingo.rl.advantages import per_token_rewards, place_turn_rewards
from olingo.rl.kl import kl_estimate
from olingo.rl.masked import AllReduceSum, masked_whiten
from olingo.rl.moments import RunningMoments
from olingo.rollout import PromptBatch, RolloutSource, SingleTurnSource

logger = logging.getLogger("olingo.experience")


class PPOExperienceMaker(SourceBacked):
    """Makes `Experience` from prompt batches with an actor, critic, reward and reference model.

    Args (beyond the four models and the tokenizer; `critic=None`: no values, no returns, and
    an advantage estimator that needs no critic):
        kl_coef: initial KL penalty coefficient; None takes `config.kl_coef`.
        config: `ExperienceConfig`: KL estimator and adaptive target, advantage estimator,
            whitening (per rank or global), and the two shortcuts `reuse_rollout_log_probs`
            (log pi_old from the engine's own logits) and `skip_reference_when_kl_zero`.
        shaping: `RewardShaping`: running normalisation, clipping, placement, truncation penalty.
        engine: the `RolloutEngine` to generate with (default: `HFEngine` on the actor).
        source: where rollouts come from (default: `SingleTurnSource` on `engine`).
        estimator: the advantage estimator (default: the one `config.advantage` names). A
            maker without a critic can score rollouts (evaluation) but makes experience only
            with an estimator that needs no critic.
        generation: sampling settings; `make_experience(**overrides)` can change them per call.
        all_reduce_sum: sums a tensor over data-parallel ranks (None: one process). It keeps
            what must agree across ranks global: the adaptive KL coefficient, the running
            reward statistics and, with `global_whitening`, the advantage statistics.
        packing: the actor's, reference's, critic's and a reward model's forwards over the
            rollouts run padding-free (`olingo.models.packing`, docs/packing.md; `model.packing`).
    """

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module | None,
        reward_model: nn.Module | CompositeReward,
        initial_model: nn.Module,
        tokenizer: Any,
        kl_coef: float | None = None,
        *,
        config: ExperienceConfig | None = None,
        shaping: RewardShaping | None = None,
        engine: RolloutEngine | None = None,
        source: RolloutSource | None = None,
        estimator: AdvantageEstimator | None = None,
        generation: GenerationSettings | None = None,
        all_reduce_sum: AllReduceSum | None = None,
        packing: bool = True,
    ) -> None:
        config = config or ExperienceConfig()
        if kl_coef is not None:
            config = config.model_copy(update={"kl_coef": kl_coef})
        self.config, self.shaping = config, shaping or RewardShaping()
        self.actor, self.critic, self.reward_model, self.initial_model = actor, critic, reward_model, initial_model
        self.tokenizer, self.packing = tokenizer, packing
        self.source = source or SingleTurnSource(engine or HFEngine(actor, tokenizer, with_log_probs=config.reuse_rollout_log_probs), tokenizer.pad_token_id)
        self.estimator = estimator or build_advantage_estimator(config)
        self.kl_ctl = (
            AdaptiveKLController(config.kl_coef, config.kl_target, config.kl_horizon)
            if config.kl_target is not None
            else FixedKLController(config.kl_coef)
        )
        self.all_reduce_sum = all_reduce_sum
        self.reward_moments = RunningMoments() if self.shaping.normalize else None
        self.generation = generation or GenerationSettings()
        self.carry_engine_log_probs = False  # the trainer turns it on for truncated importance sampling
        self.num_generations = 1  # one response per prompt
        self.last_samples: list[dict[str, Any]] = []  # texts of the last batch, for sample logs

    def plan(self, pi_old_needed: bool) -> None:
        """PPO always computes log pi_old: its per-token reward holds the KL to the reference."""

    def collect(self, next_prompts: Callable[[], PromptBatch], policy_version: int) -> CollectedBatch:
        """One collect step: a prompt batch made into experience (see `make_experience`)."""
        prompts = next_prompts()
        experience = self.make_experience(
            prompts.input_ids, prompts.attention_mask, prompts.gt_answers, policy_version, prompts.row_fields, messages=prompts.messages,
        )
        return CollectedBatch(experience, experience.info, float(experience.action_mask.sum()))

    @torch.no_grad()
    def rollout_and_score(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, gt_answers: list[str | None] | None = None,
        generation: GenerationSettings | None = None, row_fields: dict[str, list[Any]] | None = None, *, messages: list | None = None,
    ) -> ScoredRollout:
        """Steps 1, 2 and 4 (before normalisation): generate, log-probs, raw reward.

        `row_fields`: the prompt rows' extra fields (`{field: B values}`), for reward functions;
        `messages`: the prompts as messages (`PromptBatch.messages`), for multi-turn template splits."""
        settings = generation or self.generation
        device = next(self.actor.parameters()).device
        sampled = self.source.sample(PromptBatch(input_ids, attention_mask, gt_answers, row_fields, messages).to(device), settings)
        rollout = sampled.rollout
        seq, mask, num_actions, positions = rollout.sequences, rollout.attention_mask, rollout.num_actions, rollout.position_ids
        temperature = settings.log_prob_temperature
        def score() -> torch.Tensor:
            return action_log_probs(self.actor, seq, mask, num_actions, temperature, packing=self.packing, position_ids=positions)

        policy = policy_log_probs(rollout, getattr(self.engine, "shares_weights", True), score, wanted=True)
        log_probs = policy.old(self.config.old_logprobs)
        if self.config.skip_reference_when_kl_zero and isinstance(self.kl_ctl, FixedKLController) and self.kl_ctl.value == 0:
            ref_log_probs = log_probs  # KL is exactly 0 and -0 * KL adds nothing to any reward
        else:
            inputs = to_model_device(self.initial_model, seq, mask)
            segments = positions.to(inputs[0].device) if positions is not None else None
            ref_log_probs = action_log_probs(self.initial_model, *inputs, num_actions, temperature, packing=self.packing, position_ids=segments).to(device)
        scored = score_rollout(self.reward_model, self.tokenizer, input_ids, rollout, gt_answers, row_fields, log_probs, ref_log_probs, packing=self.packing)
        return dataclasses.replace(add_source_reward(scored, sampled), engine_log_probs=policy.engine, engine_info=policy.info)

    @torch.no_grad()
    def make_experience(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, gt_answers: list[str | None] | None = None, policy_version: int = 0,
        row_fields: dict[str, list[Any]] | None = None, *, messages: list | None = None, **generate_kwargs: Any,
    ) -> Experience:
        """One batch of experience from left-padded prompts (B, P); see the module docstring."""
        settings = self.generation if not generate_kwargs else GenerationSettings.from_kwargs(**{**vars(self.generation), **generate_kwargs})
        scored = self.rollout_and_score(input_ids, attention_mask, gt_answers, settings, row_fields, messages=messages)
        if scored.dropped is not None:  # a source whose episodes may fail: those rows go
            scored = select_rows(scored, kept_rows(scored.dropped, 1, self._fewest_rows))
        if self.critic is None and self.estimator.needs_critic:
            raise ValueError(f"the advantage estimator '{self.config.advantage}' needs a critic, and this maker has none")
        rollout, cfg = scored.rollout, self.config
        seq, mask, action_mask = rollout.sequences, rollout.attention_mask, rollout.action_mask
        values = None
        if self.critic is not None:
            values = action_values(self.critic, seq, mask, rollout.num_actions, packing=self.packing, position_ids=rollout.position_ids).float()
            values = torch.where(action_mask, values, torch.zeros_like(values))  # a select: padding may hold inf
        kl = kl_estimate(scored.log_probs, scored.ref_log_probs, cfg.kl_estimator, action_mask)
        score = self.shape_score(scored.raw_score, rollout.truncated)
        rewards = per_token_rewards(score, kl, action_mask, self.kl_ctl.value, self.shaping.placement)
        if scored.turn_rewards is not None and self.shaping.placement == "last":
            scale = 1.0 / float(self.reward_moments.std) if self.reward_moments is not None else 1.0
            rewards = place_turn_rewards(rewards, scored.turn_rewards.to(rewards.device), action_mask, scale)
        advantages, returns = self.estimator(AdvantageInputs(rewards, score, action_mask, values))
        if cfg.whiten_advantages:
            advantages = masked_whiten(advantages, action_mask, all_reduce_sum=self.all_reduce_sum if cfg.global_whitening else None)
        experience = Experience(
            sequences=seq, attention_mask=mask, action_mask=action_mask,
            action_log_probs=scored.log_probs, base_action_log_probs=scored.ref_log_probs,
            kl=kl, rewards=rewards, advantages=advantages, values=values, returns=returns,
            score=score, raw_score=scored.raw_score, truncated=rollout.truncated,
            policy_version=policy_version, engine_log_probs=scored.engine_log_probs if self.carry_engine_log_probs else None,
            position_ids=rollout.position_ids,
        )
        experience.info = {**experience_info(experience), "kl_coef": self.kl_ctl.value, **scored.engine_info, **scored.source_info}
        experience.info.update(judge_counters(self.reward_model))  # a model as judge: calls, cache hits, unreadable grades
        experience.info.update({f"reward/{name}": float(values.float().mean()) for name, values in scored.reward_terms.items()})
        self.last_samples = scored.samples()
        self.kl_ctl.update(*self._global_kl(experience.info["kl"], experience.batch_size))
        return experience

    def _fewest_rows(self, kept: int, rows: int) -> int:
        """The fewest rows any data-parallel rank keeps (each keeps the first so many of its own)."""
        return fewest_over_ranks(kept, rows, self.all_reduce_sum, next(self.actor.parameters()).device)

    def _global_kl(self, kl: float, rows: int) -> tuple[float, int]:
        """The mean per-sequence KL over every rank's rows and their number: each rank then
        moves its KL coefficient the same way, as one process on the whole batch would."""
        if self.all_reduce_sum is None:
            return kl, rows
        totals = self.all_reduce_sum(torch.tensor([kl * rows, float(rows)], dtype=torch.float64, device=next(self.actor.parameters()).device))
        return float(totals[0] / totals[1]), int(totals[1])

    def shape_score(self, raw_score: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
        """Step 4: running normalisation, truncation penalty, clipping. (B,) -> (B,)."""
        score = raw_score.float()
        if self.reward_moments is not None:
            self.reward_moments.update(score, self.all_reduce_sum)
            score = (score - self.reward_moments.mean) / self.reward_moments.std
        score = score - self.shaping.truncation_penalty * truncated.float()
        if self.shaping.clip is not None:
            score = score.clamp(-self.shaping.clip, self.shaping.clip)
        return score

    # ---- resumable state: the KL coefficient and the reward statistics ---------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "kl_ctl": self.kl_ctl.state_dict(),
            "reward_moments": self.reward_moments.state_dict() if self.reward_moments is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        if self.reward_moments is not None and state.get("reward_moments") is not None:
            self.reward_moments.load_state_dict(state["reward_moments"])

