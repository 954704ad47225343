"""`NaiveExperienceMaker`: rollouts -> scored, advantage-annotated `Experience`.

One call to `make_experience`, as the algorithm reads (InstructGPT / Ziegler et al. 2019):
    1. generate responses to left-padded prompts with the actor (sampling, KV cache)
    2. log pi_old and log pi_ref of every response token (actor and frozen initial model)
    3. V_old of the state before every response token (critic)
    4. the sequence score: reward model at the last real token (the rule RM training uses),
       or reward functions on decoded text; optional running normalisation, truncation
       penalty, clipping to [-reward_clip, reward_clip]
    5. per-token rewards: -kl_coef * KL_t, plus the score at the last response token
    6. GAE advantages and returns; optional advantage whitening (per rank, or global)
    7. update the KL controller (adaptive: towards `kl_target`) with the KL of every rank
All maths is in `olingo.models.functional`; this module only wires models to it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from olingo.experience_maker.experience import Experience, experience_info
from olingo.experience_maker.kl_controller import AdaptiveKLController, FixedKLController
from olingo.experience_maker.rollout import GenerationSettings, Rollout, generate_rollout
from olingo.models.functional import (
    AllReduceSum,
    KLEstimator,
    RunningMoments,
    compute_gae,
    kl_estimate,
    log_probs_from_logits,
    masked_whiten,
    per_token_rewards,
)
from olingo.models.rlvr import RLVRRewardModel
from olingo.models.utils import position_ids_from_mask

logger = logging.getLogger("olingo.experience")


def policy_logits(model: nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, temperature: float = 1.0) -> torch.Tensor:
    """Logits that predict the A response tokens: (B, A, V), divided by the sampling temperature.

    Position P+j-1 predicts response token j. Positions are counted over attended tokens, the
    way `generate` counts them on left-padded prompts, so these logits are the ones sampled from.
    Dividing by `temperature` makes log-probs those of the distribution actually sampled.
    """
    logits = model(input_ids=sequences, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask), use_cache=False).logits
    logits = logits[:, -num_actions - 1 : -1]
    return logits / temperature if temperature != 1.0 else logits


def action_log_probs(model: nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, temperature: float = 1.0) -> torch.Tensor:
    """log pi(response token j | prefix): (B, A)."""
    logits = policy_logits(model, sequences, attention_mask, num_actions, temperature)
    return log_probs_from_logits(logits, sequences[:, -num_actions:])


def action_values(critic: nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int) -> torch.Tensor:
    """V(state before response token j): (B, A), the critic at positions P-1 .. P+A-2."""
    return critic(sequences, attention_mask)[:, -num_actions - 1 : -1]


@dataclass
class ScoredRollout:
    """A rollout with the quantities both training and evaluation need.

    log_probs, ref_log_probs: (B, A); raw_score: (B,) (reward before any normalisation);
    prompts/responses: decoded text (responses without special tokens); gt_answers: B entries.
    """

    rollout: Rollout
    log_probs: torch.Tensor
    ref_log_probs: torch.Tensor
    raw_score: torch.Tensor
    prompts: list[str]
    responses: list[str]
    gt_answers: list[str | None]

    def samples(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per rollout: prompt, response, gt_answer, reward, truncated."""
        return [
            {"prompt": p, "response": r, "gt_answer": g, "reward": float(s), "truncated": bool(t)}
            for p, r, g, s, t in zip(self.prompts, self.responses, self.gt_answers, self.raw_score.tolist(), self.rollout.truncated.tolist(), strict=True)
        ]


class NaiveExperienceMaker:
    """Makes `Experience` from prompt batches with an actor, critic, reward and reference model.

    Args (beyond the four models and the tokenizer):
        kl_coef: initial KL penalty coefficient.
        kl_estimator: per-token KL estimate "k1" (log ratio, unbiased) or "k3" (always >= 0).
        kl_target, kl_horizon: when kl_target is set, the coefficient adapts towards it
            (Ziegler et al. 2019); otherwise it stays fixed.
        gamma, lam: GAE discount and trace decay.
        whiten_advantages: normalise advantages to zero mean, unit variance per batch.
        global_whitening: whiten with the mean and variance of every data-parallel rank's
            batch together (as one process on the whole batch), instead of per rank.
        normalize_reward: divide scores by a running std after subtracting a running mean.
        reward_clip: clip scores to [-reward_clip, reward_clip] (None: no clipping).
        reward_placement: add the score at the "last" response token or to "every" one.
        truncation_penalty: subtracted from the score of responses cut off without a stop.
        generation: sampling settings; `make_experience(**overrides)` can change them per call.
        reuse_rollout_log_probs: take log pi_old from the logits `generate` computed instead of
            a second actor forward (exact up to kernel rounding; memory B x A x V while
            generating, see `generate_rollout`).
        skip_reference_when_kl_zero: with a fixed KL coefficient of 0 the reference model
            cannot change any reward, so its forward is skipped (the logged KL then reads 0).
        all_reduce_sum: sums a tensor over data-parallel ranks (None: one process). It keeps
            what must agree across ranks global: the adaptive KL coefficient, the running
            reward statistics and, with `global_whitening`, the advantage statistics.
    """

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module,
        reward_model: nn.Module | RLVRRewardModel,
        initial_model: nn.Module,
        tokenizer: Any,
        kl_coef: float = 0.1,
        *,
        kl_estimator: KLEstimator = "k1",
        kl_target: float | None = None,
        kl_horizon: int = 10000,
        gamma: float = 1.0,
        lam: float = 0.95,
        whiten_advantages: bool = True,
        normalize_reward: bool = False,
        reward_clip: float | None = 5.0,
        reward_placement: Literal["last", "every"] = "last",
        truncation_penalty: float = 0.0,
        generation: GenerationSettings | None = None,
        global_whitening: bool = False,
        all_reduce_sum: AllReduceSum | None = None,
        reuse_rollout_log_probs: bool = False,
        skip_reference_when_kl_zero: bool = False,
    ) -> None:
        self.actor, self.critic, self.reward_model, self.initial_model = actor, critic, reward_model, initial_model
        self.tokenizer = tokenizer
        self.kl_estimator = kl_estimator
        self.kl_ctl = AdaptiveKLController(kl_coef, kl_target, kl_horizon) if kl_target is not None else FixedKLController(kl_coef)
        self.gamma, self.lam = gamma, lam
        self.whiten_advantages = whiten_advantages
        self.global_whitening = global_whitening
        self.all_reduce_sum = all_reduce_sum
        self.reuse_rollout_log_probs = reuse_rollout_log_probs
        self.skip_reference_when_kl_zero = skip_reference_when_kl_zero
        self.reward_moments = RunningMoments() if normalize_reward else None
        self.reward_clip = reward_clip
        self.reward_placement = reward_placement
        self.truncation_penalty = truncation_penalty
        self.generation = generation or GenerationSettings()
        self.last_samples: list[dict[str, Any]] = []  # texts of the last batch, for sample logs

    @property
    def temperature(self) -> float:
        return self.generation.temperature if self.generation.do_sample else 1.0

    @torch.no_grad()
    def rollout_and_score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, gt_answers: list[str | None] | None = None, generation: GenerationSettings | None = None) -> ScoredRollout:
        """Steps 1, 2 and 4 (before normalisation): generate, log-probs, raw reward."""
        settings = generation or self.generation
        device = next(self.actor.parameters()).device
        rollout = generate_rollout(self.actor, input_ids.to(device), attention_mask.to(device), self.tokenizer, settings, with_log_probs=self.reuse_rollout_log_probs)
        seq, mask, num_actions = rollout.sequences, rollout.attention_mask, rollout.num_actions
        temperature = settings.temperature if settings.do_sample else 1.0
        log_probs = rollout.log_probs if rollout.log_probs is not None else action_log_probs(self.actor, seq, mask, num_actions, temperature)
        if self.skip_reference_when_kl_zero and isinstance(self.kl_ctl, FixedKLController) and self.kl_ctl.value == 0:
            ref_log_probs = log_probs  # KL is exactly 0 and -0 * KL adds nothing to any reward
        else:
            ref_log_probs = action_log_probs(self.initial_model, *_on(self.initial_model, seq, mask), num_actions, temperature).to(device)
        prompts = self.tokenizer.batch_decode(input_ids, skip_special_tokens=True)
        responses = [
            self.tokenizer.decode(seq[i, -num_actions:][rollout.action_mask[i]], skip_special_tokens=True)
            for i in range(seq.shape[0])
        ]
        gt_answers = list(gt_answers) if gt_answers is not None else [None] * seq.shape[0]
        if isinstance(self.reward_model, RLVRRewardModel):
            raw_score = self.reward_model.score_texts(prompts, responses, gt_answers).to(device)
        else:  # scored at the last attended token: the stop token, exactly where RM training reads
            raw_score = self.reward_model(*_on(self.reward_model, seq, mask)).float().to(device)
        return ScoredRollout(rollout, log_probs, ref_log_probs, raw_score, prompts, responses, gt_answers)

    @torch.no_grad()
    def make_experience(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, gt_answers: list[str | None] | None = None, policy_version: int = 0, **generate_kwargs: Any) -> Experience:
        """One batch of experience from left-padded prompts (B, P); see the module docstring."""
        settings = self.generation if not generate_kwargs else GenerationSettings.from_kwargs(**{**vars(self.generation), **generate_kwargs})
        scored = self.rollout_and_score(input_ids, attention_mask, gt_answers, settings)
        rollout = scored.rollout
        seq, mask, action_mask = rollout.sequences, rollout.attention_mask, rollout.action_mask
        values = action_values(self.critic, seq, mask, rollout.num_actions).float()
        values = torch.where(action_mask.bool(), values, torch.zeros_like(values))  # a select: padding may hold inf
        kl = kl_estimate(scored.log_probs, scored.ref_log_probs, self.kl_estimator, action_mask)
        score = self.shape_score(scored.raw_score, rollout.truncated)
        rewards = per_token_rewards(score, kl, action_mask, self.kl_ctl.value, self.reward_placement)
        advantages, returns = compute_gae(rewards, values, action_mask, self.gamma, self.lam)
        if self.whiten_advantages:
            advantages = masked_whiten(advantages, action_mask, all_reduce_sum=self.all_reduce_sum if self.global_whitening else None)
        experience = Experience(
            sequences=seq, attention_mask=mask, action_mask=action_mask,
            action_log_probs=scored.log_probs, base_action_log_probs=scored.ref_log_probs,
            values=values, kl=kl, rewards=rewards, advantages=advantages, returns=returns,
            score=score, raw_score=scored.raw_score, truncated=rollout.truncated,
            policy_version=policy_version,
        )
        experience.info = {**experience_info(experience), "kl_coef": self.kl_ctl.value}
        self.last_samples = scored.samples()
        self.kl_ctl.update(*self._global_kl(experience.info["kl"], experience.batch_size))
        return experience

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
        score = score - self.truncation_penalty * truncated.float()
        if self.reward_clip is not None:
            score = score.clamp(-self.reward_clip, self.reward_clip)
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


def _on(model: nn.Module, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`tensors` moved to `model`'s device (inference models may sit elsewhere than the actor)."""
    device = next(model.parameters()).device
    return tuple(t.to(device) for t in tensors)
