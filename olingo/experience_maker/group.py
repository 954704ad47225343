"""`GroupExperienceMaker`: G responses per prompt, scored, with critic-free group advantages.

One collect step of the GRPO family, as the algorithm reads (Shao et al. 2024; DAPO, Yu et al. 2025):
    1. each prompt G times in a row (a group), generated in chunks of at most
       `inference_batch_size` sequences, so memory does not grow with G
    2. log pi_old of the response tokens, only when a learner step will need it (several
       updates per batch, or the KL in the reward); log pi_ref only with a reference model
       (kl_coef > 0); log pi_teacher (and then always log pi_old) only with a distillation
       teacher (a frozen model here, or its own engine: `ScoringEngine`); every forward chunked
       by `logits_forward_batch_size`
    3. the sequence score (reward functions and/or a reward model) plus DAPO's soft overlong
       punishment
    -> `sample` returns the batch without advantages: dynamic sampling may still drop groups
       and draw more prompts (`collect` does that, with every data-parallel rank in lockstep)
    4. `finish`: advantages of the final batch from the estimator (grpo, dr_grpo, rloo,
       reinforce_pp); batch-level statistics (REINFORCE++ whitening) see exactly the rows
       that will be trained on, on every rank (GDPO, `reward_aggregation: gdpo`: each reward term is
       normalised in its group at step 3, the weighted sum over the whole batch here); on-policy
       distillation then adds distill_coef x (log pi_teacher - log pi_old) per token
The maths is in `olingo.rl`; this module wires models to it. `GroupExperienceMaker` implements
`olingo.experience_maker.maker.ExperienceMaker`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from olingo.config import StrictModel
from olingo.engines import GenerationSettings, HFEngine, RolloutEngine, ScoringEngine
from olingo.experience_maker.advantages import (
    AdvantageInputs,
    GroupEstimator,
    build_group_estimator,
)
from olingo.experience_maker.engine_logprobs import OldLogProbsSource, policy_log_probs
from olingo.experience_maker.experience import (
    BufferItem,
    Experience,
    experience_info,
    make_experience_batch,
    split_experience_batch,
)
from olingo.experience_maker.maker import CollectedBatch, SourceBacked
from olingo.experience_maker.scoring import (
    ScoredRollout,
    action_log_probs,
    add_source_reward,
    fewest_over_ranks,
    kept_rows,
    score_rollout,
    select_rows,
    to_model_device,
)
from olingo.rewards.functions import CompositeReward
from olingo.rewards.judge import judge_counters
from olingo.rl.advantages import batch_normalize, distill_advantages, gdpo_group_sum, group_centred, overlong_penalty, per_token_rewards
from olingo.rl.kl import kl_estimate
from olingo.rl.masked import AllReduceSum
from olingo.rollout import PromptBatch, RolloutSource, SingleTurnSource

logger = logging.getLogger("olingo.experience")


class GroupExperienceConfig(StrictModel):
    """How groups of rollouts become experience: the `experience:` section of `olingo grpo`."""

    num_generations: int = Field(8, ge=2, description="G: responses sampled per prompt (a group)")
    advantage: GroupEstimator = Field(
        "grpo", description="grpo: (r - group mean) / (group std + eps); dr_grpo: r - group mean; rloo: r - mean of the other G-1; "
        "reinforce_pp: reward-to-go whitened over the batch (see docs/algorithms.md)",
    )
    std_eps: float = Field(1e-6, gt=0, description="grpo: added to the group std before dividing")
    reward_aggregation: Literal["sum", "gdpo"] = Field(
        "sum", description="sum: the weighted reward terms are summed, then normalised in the group (GRPO); gdpo: each term "
        "(and the overlong penalty) normalised in its group, the weighted sum then normalised over the batch (Liu et al. 2026; advantage grpo)",
    )
    group_baseline: bool = Field(True, description="reinforce_pp: subtract the group mean score first (REINFORCE++-baseline)")
    kl_coef: float = Field(0.0, ge=0, description="KL-to-reference coefficient (beta); 0: no reference model is loaded or run")
    kl_penalty: Literal["loss", "reward"] = Field("loss", description="the KL as a loss term (GRPO) or as a per-token reward penalty")
    kl_estimator: Literal["k1", "k2", "k3"] | None = Field(None, description="per-token KL estimator (default: k3 in the loss, k1 in the reward)")
    overlong_buffer: int = Field(
        0, ge=0,
        description="DAPO soft overlong punishment: "
        "the last N tokens before max_new_tokens are penalised linearly, down to -overlong_penalty (0: off)",
    )
    overlong_penalty: float = Field(1.0, ge=0, description="the penalty at max_new_tokens (scales DAPO's -1)")
    dynamic_sampling: bool = Field(False, description="DAPO: drop groups whose scores are all equal and sample more prompts until the batch is full")
    max_resample_rounds: int = Field(3, ge=0, description="dynamic sampling: extra prompt batches drawn per collect step at most; then train on what there is")
    old_logprobs: OldLogProbsSource = Field(
        "trainer",
        description="log pi_old in the ratio: the trainer's forward (trainer) "
        "or, with a separate engine (vllm), the log-probs it sampled with (engine; see docs/engines.md)",
    )
    inference_batch_size: int | None = Field(None, ge=1, description="sequences per generate call (default: the whole rollout batch x G)")
    logits_forward_batch_size: int | None = Field(
        None, ge=1,
        description="sequences per forward when scoring old and reference log-probs (default: all at once)",
    )
    distill_coef: float = Field(
        0.0, ge=0,
        description="on-policy distillation: adds coef x (log pi_teacher - log pi_old) to each sampled token's advantage "
        "(needs model.teacher; both at the sampling temperature; docs/algorithms.md)",
    )

    @model_validator(mode="after")
    def _gdpo_is_grpo(self) -> GroupExperienceConfig:
        if self.reward_aggregation == "gdpo" and self.advantage != "grpo":
            raise ValueError(f"experience.reward_aggregation gdpo normalises like grpo; set experience.advantage grpo, not {self.advantage}")
        return self

    @property
    def estimator_name(self) -> str:
        return self.kl_estimator or ("k3" if self.kl_penalty == "loss" else "k1")


def check_reference(kl_coef: float, reference: nn.Module | None) -> None:
    """The one rule of the reference model: a KL term (kl_coef > 0) needs one to compare with."""
    if kl_coef > 0 and reference is None:
        raise ValueError(f"kl_coef={kl_coef} needs a reference model (initial_model, model.reference); pass one, or set kl_coef=0")


def check_teacher(distill_coef: float, teacher: nn.Module | ScoringEngine | None) -> nn.Module | ScoringEngine | None:
    """On-policy distillation (distill_coef > 0) needs a teacher; a teacher model comes back frozen
    (an engine's weights are its own and never trained)."""
    if distill_coef > 0 and teacher is None:
        raise ValueError(f"experience.distill_coef={distill_coef} needs a teacher model (model.teacher); pass one, or set distill_coef=0")
    return teacher.eval().requires_grad_(False) if isinstance(teacher, nn.Module) else teacher


class GroupExperienceMaker(SourceBacked):
    """Makes experience in whole groups from prompt batches, without a critic.

    Args:
        actor: the policy (unwrapped), sampled from through `source` (default: a
            `SingleTurnSource` on `engine`, default `HFEngine` on the actor).
        reward: a reward model (scored at the last real token) or a `CompositeReward`.
        reference: the frozen initial model, or None (kl_coef 0: nothing to compare with).
        config: `GroupExperienceConfig`.
        generation: sampling settings; `max_new_tokens` is also the overlong limit.
        needs_old_log_probs: compute log pi_old at rollout time. The trainer turns it off when
            every batch is learnt in one optimizer step (the ratio is then exactly 1).
        all_reduce_sum: sums over data-parallel ranks, for batch statistics in `finish` and the
            ranks' agreement in dynamic sampling (None: one process).
        packing: the actor's, the reference's and a reward model's forwards over the rollouts
            run padding-free (`olingo.models.packing`, docs/packing.md; `model.packing`).
        teacher: the frozen teacher of on-policy distillation (`distill_coef`), sharing the
            actor's tokenizer, or None; with one, log pi_old is always computed. A model is run
            here like the reference; a `ScoringEngine` (a vLLM engine of its own,
            `model.teacher_engine`) scores the rows itself, at temperature 1 only.
    """

    def __init__(
        self, actor: nn.Module, reward: nn.Module | CompositeReward, reference: nn.Module | None, tokenizer: Any, *,
        config: GroupExperienceConfig | None = None, generation: GenerationSettings | None = None, engine: RolloutEngine | None = None,
        source: RolloutSource | None = None, needs_old_log_probs: bool = True, all_reduce_sum: AllReduceSum | None = None,
        packing: bool = True, teacher: nn.Module | ScoringEngine | None = None,
    ) -> None:
        self.config = config or GroupExperienceConfig()
        check_reference(self.config.kl_coef, reference)
        self.teacher = check_teacher(self.config.distill_coef, teacher)
        self.actor, self.reward, self.reference, self.tokenizer = actor, reward, reference if self.config.kl_coef > 0 else None, tokenizer
        self.generation = generation or GenerationSettings()
        self.source = source or SingleTurnSource(engine or HFEngine(actor, tokenizer), tokenizer.pad_token_id, self.config.inference_batch_size)
        self.needs_old_log_probs, self.packing = needs_old_log_probs, packing
        self.carry_engine_log_probs = False  # the trainer turns it on for truncated importance sampling
        self.all_reduce_sum = all_reduce_sum
        self.num_generations = self.config.num_generations
        # gdpo: `sample` leaves each group's decoupled sum (group mean 0) in the score and `finish` normalises it
        # over the batch, so the estimator only spreads it over the tokens (dr_grpo's group mean is then 0).
        gdpo = self.config.reward_aggregation == "gdpo"
        self.estimator = build_group_estimator(
            "dr_grpo" if gdpo else self.config.advantage, self.num_generations,
            eps=self.config.std_eps, group_baseline=self.config.group_baseline, all_reduce_sum=all_reduce_sum,
        )
        self.last_samples: list[dict[str, Any]] = []

    def plan(self, pi_old_needed: bool) -> None:
        """Compute log pi_old at rollout time only when a learner step can see a policy other
        than the one that sampled (several optimizer steps or passes per batch)."""
        self.needs_old_log_probs = pi_old_needed

    def state_dict(self) -> dict[str, Any]:
        return {}  # no KL controller, no running reward statistics: nothing to resume

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    @property
    def kl_in_reward(self) -> bool:
        return self.reference is not None and self.config.kl_penalty == "reward"

    # ---- 1-3: generate, log-probs, score ---------------------------------------------------------
    @torch.no_grad()
    def rollout_and_score(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, gt_answers: list[str | None] | None = None,
        generation: GenerationSettings | None = None, row_fields: dict[str, list[Any]] | None = None, *, n: int = 1,
        with_old_log_probs: bool | None = None, messages: list | None = None,
    ) -> ScoredRollout:
        """`n` responses to each of the B prompts (prompt-major), log-probs and raw scores.

        Evaluation calls it with n=1: the policy's log-probs are then computed only when there
        is a reference or a teacher model to compare them with (the KL metrics)."""
        settings = generation or self.generation
        device = next(self.actor.parameters()).device
        sampled = self.source.sample(PromptBatch(input_ids, attention_mask, gt_answers, row_fields, messages).to(device), settings, n)
        rollout, prompts = sampled.rollout, sampled.prompts
        temperature = settings.log_prob_temperature
        wants_old = self.reference is not None if with_old_log_probs is None else with_old_log_probs
        wants_old = wants_old or self.teacher is not None  # the distillation term and teacher_kl need log pi_old
        policy = policy_log_probs(rollout, getattr(self.engine, "shares_weights", True), lambda: self._log_probs(self.actor, rollout, temperature), wants_old)
        log_probs, ref_log_probs = policy.old(self.config.old_logprobs), None
        if self.reference is not None:
            ref_log_probs = self._log_probs(self.reference, rollout, temperature).to(device)
        teacher_log_probs = self._teacher_log_probs(rollout, temperature).to(device) if self.teacher is not None else None
        scored = score_rollout(self.reward, self.tokenizer, prompts.input_ids, rollout, prompts.gt_answers, prompts.row_fields, log_probs, ref_log_probs,
                              packing=self.packing)
        scored = dataclasses.replace(scored, teacher_log_probs=teacher_log_probs)
        return dataclasses.replace(add_source_reward(scored, sampled), engine_log_probs=policy.engine, engine_info=policy.info)

    def _teacher_log_probs(self, rollout: Any, temperature: float) -> torch.Tensor:
        """log pi_teacher(response tokens): (B, A), from the teacher model or its engine."""
        if isinstance(self.teacher, nn.Module):
            return self._log_probs(self.teacher, rollout, temperature)
        if temperature != 1.0:  # the recipe's config check says this first, naming the settings
            raise ValueError(f"a teacher engine scores at temperature 1 only, and these log-probs are taken at {temperature}")
        return self.teacher.score(rollout.sequences, rollout.attention_mask, rollout.num_actions, rollout.position_ids)

    def _log_probs(self, model: nn.Module, rollout: Any, temperature: float) -> torch.Tensor:
        """log pi(response tokens) under `model`, `logits_forward_batch_size` rows at a time: (B, A)."""
        seq, mask, num_actions, positions = rollout.sequences, rollout.attention_mask, rollout.num_actions, rollout.position_ids
        step = self.config.logits_forward_batch_size or seq.shape[0]
        parts = []
        for i in range(0, seq.shape[0], step):
            inputs = to_model_device(model, seq[i : i + step], mask[i : i + step])
            segments = positions[i : i + step].to(inputs[0].device) if positions is not None else None
            parts.append(action_log_probs(model, *inputs, num_actions, temperature, packing=self.packing, position_ids=segments))
        return torch.cat(parts).to(seq.device)

    @torch.no_grad()
    def sample(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, gt_answers: list[str | None] | None = None, policy_version: int = 0,
        row_fields: dict[str, list[Any]] | None = None, *, messages: list | None = None,
    ) -> Experience:
        """B prompts -> B x G scored rollouts, groups contiguous; `advantages` is None until `finish`.
        `messages`: the prompts as messages (`PromptBatch.messages`), for multi-turn template splits."""
        needs_old = self.needs_old_log_probs or self.config.old_logprobs == "engine"  # the engine's differ from the current policy's
        scored = self.rollout_and_score(
            input_ids, attention_mask, gt_answers, None, row_fields, n=self.num_generations, with_old_log_probs=needs_old or self.kl_in_reward,
            messages=messages,
        )
        if scored.dropped is not None:  # a source whose episodes may fail: those groups go
            # ranks agree on the groups kept here, or (dynamic sampling, whose ranks may sample
            # different numbers of batches) once the collection is full, in `collect`
            agree = (lambda kept, groups: kept) if self.config.dynamic_sampling else self._fewest_groups
            scored = select_rows(scored, kept_rows(scored.dropped, self.num_generations, agree))
        rollout, cfg = scored.rollout, self.config
        action_mask = rollout.action_mask
        kl = None  # with the KL as a loss and no pi_old needed, no forward is spent on it here: train/kl_loss reports it
        if scored.ref_log_probs is not None and scored.log_probs is not None:
            kl = kl_estimate(scored.log_probs, scored.ref_log_probs, cfg.estimator_name, action_mask)
        lengths = action_mask.sum(-1)
        overlong = overlong_penalty(lengths, self.generation.max_new_tokens, cfg.overlong_buffer).to(scored.raw_score.device)
        score = scored.raw_score.float() + cfg.overlong_penalty * overlong
        term_info: dict[str, float] = {}
        if cfg.reward_aggregation == "gdpo":
            score, term_info = self._decoupled_score(scored, overlong)
        kl_coef = cfg.kl_coef if self.kl_in_reward else 0.0
        rewards = per_token_rewards(score, kl if kl is not None else torch.zeros(action_mask.shape, device=score.device), action_mask, kl_coef, "last")
        experience = Experience(
            sequences=rollout.sequences, attention_mask=rollout.attention_mask, action_mask=action_mask,
            action_log_probs=scored.log_probs if needs_old or self.teacher is not None else None,  # `finish` drops it if unneeded
            base_action_log_probs=scored.ref_log_probs, kl=kl, rewards=rewards, advantages=None,
            score=score, raw_score=scored.raw_score, truncated=rollout.truncated, policy_version=policy_version,
            engine_log_probs=scored.engine_log_probs if self.carry_engine_log_probs else None, position_ids=rollout.position_ids,
            teacher_log_probs=scored.teacher_log_probs,
        )
        experience.info = {
            **experience_info(experience),
            "group_reward_std": _mean_group_std(scored.raw_score.float(), self.num_generations),
            **scored.engine_info,
            **scored.source_info,
        }
        experience.info.update({f"reward/{name}": float(v.float().mean()) for name, v in scored.reward_terms.items()})
        experience.info.update(term_info)
        experience.info.update(judge_counters(self.reward))  # a model as judge: calls, cache hits, unreadable grades
        if scored.teacher_log_probs is not None:  # the summed k1 estimate of KL(student || teacher), as eval/teacher_kl
            experience.info["teacher_kl"] = float(kl_estimate(scored.log_probs, scored.teacher_log_probs, "k1", action_mask).sum(-1).mean())
        self.last_samples = scored.samples()
        return experience

    def _decoupled_score(self, scored: ScoredRollout, overlong: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """GDPO (`gdpo_group_sum`): each reward term, and the overlong penalty when on, normalised in its
        group, then weighted by the reward's term weights (1 for the environment's or a reward model's);
        with each term's mean within-group std, logged as reward/<name>/group_std (0: no signal)."""
        terms = dict(scored.reward_terms) or {"reward": scored.raw_score}
        weights = dict(getattr(self.reward, "term_weights", {}))
        if self.config.overlong_buffer > 0:
            terms["overlong"], weights["overlong"] = overlong, self.config.overlong_penalty
        device = scored.raw_score.device
        values = torch.stack([v.float().to(device) for v in terms.values()], dim=-1)
        w = torch.tensor([weights.get(name, 1.0) for name in terms], dtype=torch.float32, device=device)
        info = {f"reward/{name}/group_std": _mean_group_std(v.float(), self.num_generations) for name, v in terms.items()}
        return gdpo_group_sum(values, w, self.num_generations, self.config.std_eps), info

    # ---- 4: advantages of the final batch ---------------------------------------------------------
    @torch.no_grad()
    def finish(self, experience: Experience) -> Experience:
        """The batch with its advantages, from the estimator over whole groups, plus the
        distillation term with a teacher (`distill_advantages`)."""
        if experience.batch_size % self.num_generations:
            raise ValueError(f"a batch of {experience.batch_size} rollouts is not whole groups of {self.num_generations}")
        kl_rewards = None
        if self.kl_in_reward and experience.kl is not None:
            kl_rewards = torch.where(experience.action_mask, -self.config.kl_coef * experience.kl, torch.zeros_like(experience.kl))
        score = experience.score
        if self.config.reward_aggregation == "gdpo":  # GDPO's last step: over the batch of every rank (Liu et al. 2026)
            # the group sums have mean 0 in every group: no batch mean to subtract, an all-equal group stays exactly 0
            score = batch_normalize(score.float(), self.config.std_eps, self.all_reduce_sum, centre=False)
        advantages, _ = self.estimator(AdvantageInputs(experience.rewards, score, experience.action_mask, None, kl_rewards))
        if experience.teacher_log_probs is None:
            return dataclasses.replace(experience, advantages=advantages)
        advantages = distill_advantages(
            advantages, experience.action_log_probs, experience.teacher_log_probs, experience.action_mask, self.config.distill_coef,
        )
        # log pi_old was kept for the term above; a learner that needs no pi_old (ratio exactly 1) gets none, as without a teacher
        needs_old = self.needs_old_log_probs or self.config.old_logprobs == "engine"
        return dataclasses.replace(experience, advantages=advantages, action_log_probs=experience.action_log_probs if needs_old else None)

    # ---- one collect step: sample (dynamic sampling: until the batch is full), finish ------------
    def collect(self, next_prompts: Callable[[], PromptBatch], policy_version: int) -> CollectedBatch:
        """B prompts (the size of the batch `next_prompts` draws) -> B x G rollouts with advantages;
        with dynamic sampling, only groups whose scores differ (see `collect_groups`)."""
        first = [next_prompts()]

        def draw() -> Experience:
            prompts = first.pop() if first else next_prompts()
            return self.sample(prompts.input_ids, prompts.attention_mask, prompts.gt_answers, policy_version, prompts.row_fields, messages=prompts.messages)

        if not self.config.dynamic_sampling:
            experience = draw()
            return CollectedBatch(self.finish(experience), experience.info, float(experience.action_mask.sum()))
        target = first[0].size
        collection = collect_groups(draw, next_prompts, self.num_generations, target, self.config.max_resample_rounds, self._all_ranks_full)
        agreed = self._fewest_groups(min(collection.kept_groups, target), target)
        if agreed == 0:
            logger.warning("dynamic sampling: no group with differing rewards after %d rounds; training on the last batch (advantages 0)", collection.rounds)
        elif agreed < target:
            logger.info("dynamic sampling: %d of %d groups have differing rewards after %d rounds; training on those", agreed, target, collection.rounds)
        experience = self.finish(collection.batch(agreed, self.tokenizer.pad_token_id or 0))
        return CollectedBatch(experience, collection.info(agreed), collection.tokens)

    def _all_ranks_full(self, full: bool) -> bool:
        """Whether every data-parallel rank has a full batch (ranks draw in lockstep)."""
        if self.all_reduce_sum is None:
            return full
        return bool(self.all_reduce_sum(torch.tensor(float(not full), device=self._device())) == 0)

    def _fewest_groups(self, kept: int, target: int) -> int:
        """The fewest kept groups over the ranks (each kept 0..target), so every rank takes the
        same optimizer steps (`fewest_over_ranks`)."""
        return fewest_over_ranks(kept, target, self.all_reduce_sum, self._device())

    def _device(self) -> torch.device:
        return next(self.actor.parameters()).device


def groups_with_signal(score: torch.Tensor, num_generations: int) -> torch.Tensor:
    """(B,) scores -> (B/G,) bool: the groups whose scores are not all equal (DAPO's dynamic
    sampling keeps only these: an all-equal group's score advantage is exactly 0 under the group
    estimators, and one value shared by all its tokens after reinforce_pp's batch whitening)."""
    groups = score.view(-1, num_generations)
    return (groups != groups[:, :1]).any(dim=-1)


@dataclass
class GroupCollection:
    """What dynamic sampling gathered: the kept groups' rows (unpadded, in group order), the
    diagnostics of every sampled batch, and counts."""

    num_generations: int
    items: list[BufferItem] = field(default_factory=list)
    infos: list[dict[str, float]] = field(default_factory=list)
    sampled_groups: int = 0
    rounds: int = 0
    tokens: float = 0.0
    last: Experience | None = None

    @property
    def kept_groups(self) -> int:
        return len(self.items) // self.num_generations

    def batch(self, groups: int, pad_token_id: int) -> Experience:
        """The first `groups` kept groups as one batch; with none, the last sampled batch (its
        advantages will be 0: only a KL term can move the policy on it)."""
        if groups == 0:
            return self.last
        return make_experience_batch(self.items[: groups * self.num_generations], pad_token_id)

    def info(self, kept: int) -> dict[str, float]:
        """The sampled batches' mean diagnostics plus the dynamic-sampling counts."""
        info = {key: sum(i[key] for i in self.infos) / len(self.infos) for key in self.infos[0]} if self.infos else {}
        return {
            **info,
            "dynamic_sampling/kept_groups": float(kept),
            "dynamic_sampling/sampled_groups": float(self.sampled_groups),
            "dynamic_sampling/rounds": float(self.rounds),
        }


def collect_groups(
    draw: Callable[[], Experience], skip: Callable[[], None], num_generations: int, target: int, max_resample_rounds: int,
    all_full: Callable[[bool], bool] = lambda full: full,
) -> GroupCollection:
    """DAPO's dynamic sampling (Yu et al. 2025, section 3.2): groups whose scores all agree have
    advantage 0 and are dropped; batches are drawn (`draw`: sample one prompt batch) until
    `target` groups are kept or `max_resample_rounds` extra batches were drawn.

    `all_full(full)` says whether every data-parallel rank is full (identity in one process):
    ranks then draw in lockstep, a full rank calling `skip` (advance its prompt stream without
    generating) while others still draw, so every rank's prompt position stays the same."""
    collection = GroupCollection(num_generations)
    for _ in range(1 + max_resample_rounds):
        full = collection.kept_groups >= target
        if all_full(full):
            break
        collection.rounds += 1
        if full:
            skip()
            continue
        experience = draw()
        collection.last = experience
        collection.infos.append(experience.info)
        collection.tokens += float(experience.action_mask.sum())
        collection.sampled_groups += experience.batch_size // num_generations
        items = split_experience_batch(experience)
        for g in groups_with_signal(experience.score, num_generations).nonzero().flatten().tolist():
            collection.items.extend(items[g * num_generations : (g + 1) * num_generations])
    return collection


def _mean_group_std(score: torch.Tensor, num_generations: int) -> float:
    """The mean population std of the groups, exactly 0 for groups of equal scores (`group_centred`)."""
    return float(group_centred(score.view(-1, num_generations)).pow(2).mean(dim=-1).sqrt().mean())
