"""What an `ExperienceMakerHolder` makes: the strategy that turns prompt batches into experience.

The holder (actor lifecycle, working loop, sends, weight syncs, evaluation) is the same for
every algorithm; only these four steps differ, so they are a small strategy object the holder
is given (pickled on the driver, `build` called inside the actor):

    build(models, tokenizer, generation, engine_fn) -> maker   the experience maker on the models
    make(maker, batch, next_batch, policy_version)  -> batch   one batch of experience to send
    state_dict(maker) / load_state_dict(maker, state)          what a checkpoint keeps of the maker

`PPOMaking` (the default) builds `PPOExperienceMaker` over (actor, critic, reward, reference).
`GroupMaking` builds `GroupExperienceMaker` over (actor, reward, reference or None), plus the
frozen teacher with on-policy distillation, for the GRPO family: each prompt batch becomes whole
groups of G rows, contiguous, with their advantages already computed, so a trainer may split the
rows as it likes. Both make a batch with the maker's own `collect`, the step the local
`OnlineTrainer` runs.
With an `environment` section (the recipes' `environment:`, docs/agents.md) each maker builds
its own `MultiTurnSource` on its own engine: its responses are multi-turn episodes, as in a
local run, and the episode metrics ride in the batch's `info` to the trainer.
No ray here: both are plain, picklable configuration plus code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from olingo.engines import GenerationSettings, HFEngine, RolloutEngine
from olingo.experience_maker import (
    Experience,
    ExperienceConfig,
    PPOExperienceMaker,
    RewardShaping,
)
from olingo.experience_maker.group import GroupExperienceConfig, GroupExperienceMaker
from olingo.rollout import PromptBatch, RolloutSource

EngineFn = Callable[[Any, Any], RolloutEngine]
Collated = dict[str, Any]  # a prompt batch as the prompt collator gives it


class SourceSection(Protocol):
    """A config section that builds a rollout source on an engine (the recipes' `environment:`
    section, `EnvironmentConfig`): None when it names no environment."""

    def source(self, engine: Any, tokenizer: Any, *, split_rows: bool = False) -> RolloutSource | None: ...


def episode_source(
    section: SourceSection | None, engine: RolloutEngine | None, actor: Any, tokenizer: Any, *, split_rows: bool = False,
) -> RolloutSource | None:
    """The maker's multi-turn source from `section`, sampling through `engine` (default:
    transformers `generate` on the maker's actor, as a local run does); None: single-turn.
    split_rows: a template split goes on in a new segment of the row (the maker's forwards pack)."""
    if section is None:
        return None
    return section.source(engine or HFEngine(actor, tokenizer, with_log_probs=getattr(section, "engine_log_probs", False)), tokenizer, split_rows=split_rows)


def draws(batch: Collated, next_batch: Callable[[], Collated]) -> Callable[[], PromptBatch]:
    """The prompt batches of one collect step: `batch` first, then more from `next_batch`."""
    first = [batch]
    return lambda: PromptBatch.from_collated(first.pop() if first else next_batch())


class PPOMaking:
    """PPO experience: `PPOExperienceMaker` over the four models `model_fn` returns
    (actor, critic, reward, reference). Its state: the KL controller and reward statistics.
    `environment`: the `environment:` section; its episodes are the maker's rollouts.
    `packing`: the maker's forwards over rollouts run padding-free (`model.packing`)."""

    def __init__(
        self, kl_coef: float | None = None, config: ExperienceConfig | None = None, shaping: RewardShaping | None = None, *,
        carry_engine_log_probs: bool = False, environment: SourceSection | None = None, packing: bool = True,
    ) -> None:
        self.kl_coef, self.config, self.shaping, self.environment, self.packing = kl_coef, config, shaping, environment, packing
        self.carry_engine_log_probs = carry_engine_log_probs  # truncated importance sampling in the trainer
        self.counts: dict[str, float] = {}  # nothing beyond the holder's own counts

    def build(self, models: tuple, tokenizer: Any, generation: GenerationSettings, engine_fn: EngineFn | None) -> PPOExperienceMaker:
        actor, critic, reward_model, initial_model = models
        engine = engine_fn(actor, tokenizer) if engine_fn is not None else None
        maker = PPOExperienceMaker(
            actor.eval(), critic.eval(), reward_model, initial_model, tokenizer, self.kl_coef,
            config=self.config, shaping=self.shaping, generation=generation, engine=engine,
            source=episode_source(self.environment, engine, actor, tokenizer, split_rows=self.packing), packing=self.packing,
        )
        maker.carry_engine_log_probs = self.carry_engine_log_probs
        return maker

    def make(self, maker: PPOExperienceMaker, batch: Collated, next_batch: Callable[[], Collated], policy_version: int) -> Experience:
        return maker.collect(draws(batch, next_batch), policy_version).experience

    def state_dict(self, maker: PPOExperienceMaker) -> dict[str, Any]:
        return maker.state_dict()

    def load_state_dict(self, maker: PPOExperienceMaker, state: dict[str, Any]) -> None:
        maker.load_state_dict(state)


class GroupMaking:
    """GRPO-family experience: `GroupExperienceMaker` over (actor, reward, reference or None), or
    (actor, reward, reference or None, teacher) with on-policy distillation (`distill_coef` > 0):
    the frozen teacher, loaded by the maker like the reference, scores the maker's own rollouts.

    Per prompt batch of B prompts: B x G rollouts (`sample`), and with DAPO's dynamic sampling
    (`config.dynamic_sampling`) only the groups whose scores differ, drawing up to
    `max_resample_rounds` more prompt batches until B groups are kept (else what was kept; if
    none, the last batch, whose advantages are 0); then advantages (`finish`).

    Args:
        config: the `GroupExperienceConfig` (the `experience:` section).
        needs_old_log_probs: store log pi_old with the rollouts. Needed whenever the trainer's
            weights may have moved on from the maker's when it learns on a batch (several
            steps per sync, several passes, or stale batches allowed); without it the ratio is 1.
        environment: the `environment:` section; its episodes are the maker's rollouts (a group:
            the G episodes of one prompt).
        packing: the maker's forwards over rollouts run padding-free (`model.packing`).
    """

    def __init__(
        self, config: GroupExperienceConfig, needs_old_log_probs: bool = True, *, carry_engine_log_probs: bool = False,
        environment: SourceSection | None = None, packing: bool = True,
    ) -> None:
        self.config, self.needs_old_log_probs, self.environment, self.packing = config, needs_old_log_probs, environment, packing
        self.carry_engine_log_probs = carry_engine_log_probs  # truncated importance sampling in the trainer
        self.counts: dict[str, float] = {"sampled_groups": 0, "kept_groups": 0} if config.dynamic_sampling else {}

    def build(self, models: tuple, tokenizer: Any, generation: GenerationSettings, engine_fn: EngineFn | None) -> GroupExperienceMaker:
        actor, reward, reference = models[:3]
        teacher = models[3] if len(models) > 3 else None  # no fourth model: no distillation
        engine = engine_fn(actor, tokenizer) if engine_fn is not None else None
        maker = GroupExperienceMaker(
            actor.eval(), reward, reference, tokenizer, config=self.config, generation=generation, engine=engine,
            needs_old_log_probs=self.needs_old_log_probs, source=episode_source(self.environment, engine, actor, tokenizer, split_rows=self.packing),
            packing=self.packing, teacher=teacher,
        )
        maker.carry_engine_log_probs = self.carry_engine_log_probs
        return maker

    def make(self, maker: GroupExperienceMaker, batch: Collated, next_batch: Callable[[], Collated], policy_version: int) -> Experience:
        """Dynamic sampling runs for this maker alone: it has no ranks to agree with."""
        collected = maker.collect(draws(batch, next_batch), policy_version)
        if self.config.dynamic_sampling:
            self.counts["sampled_groups"] += collected.info["dynamic_sampling/sampled_groups"]
            self.counts["kept_groups"] += collected.info["dynamic_sampling/kept_groups"]
        collected.experience.info = collected.info
        return collected.experience

    def state_dict(self, maker: GroupExperienceMaker) -> dict[str, Any]:
        return {}  # no KL controller, no running reward statistics: nothing to resume

    def load_state_dict(self, maker: GroupExperienceMaker, state: dict[str, Any]) -> None:
        pass


def models_on(models: tuple, device: torch.device) -> None:
    """Every model `model_fn` returned onto the maker's device (None: a model not built)."""
    for model in models:
        if model is not None:
            model.to(device)
