"""`GRPOTrainer`: critic-free RL with groups of responses (GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++).

One episode, as the algorithm reads (Shao et al. 2024; Yu et al. 2025):
    1. collect: `num_collect_steps` prompt batches; each prompt answered G times
       (`GroupExperienceMaker.sample`); with dynamic sampling, groups whose scores are all
       equal are dropped and more prompts drawn, up to `max_resample_rounds` extra batches;
       every rank then keeps as many groups as the poorest rank has (ranks must take the same
       number of optimizer steps); advantages of the final batch (`finish`) -> buffer
    2. learn: `num_update_steps` (mu) passes over the buffer in minibatches of
       `train_batch_size`; per optimizer step the loss is normalised by the units (tokens or
       responses) of all its minibatches on all ranks (`GRPOLearner`)
    3. clear the buffer (on-policy), checkpoint/evaluate when due
No critic exists anywhere; with kl_coef 0 no reference model either. When every batch is
learnt in a single optimizer step (mu = 1, one step per buffer), pi_old is the current policy:
its log-probs are never computed and the ratio is exactly 1.
Metrics per optimizer step: train/* (policy and KL loss, clip fractions, approx_kl, entropy,
ratio max, learning rate, gradient norm), rollout/* of the episode (rewards, per-term rewards,
group reward std, KL, length, dynamic-sampling counts), time/make_experience, time/learn,
perf/tokens_per_s.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from olingo.booster import Booster, OptimizerWrapper
from olingo.cluster import DistCoordinator
from olingo.dataset.sampler import CyclicLoader
from olingo.engines import GenerationSettings, RolloutEngine
from olingo.experience_buffer import Minibatches, NaiveExperienceBuffer
from olingo.experience_maker import Experience
from olingo.experience_maker.group import (
    GroupExperienceConfig,
    GroupExperienceMaker,
    collect_groups,
)
from olingo.trainer.callbacks import Callback, dispatch
from olingo.trainer.callbacks.builtin.samples import RolloutSamples
from olingo.trainer.grpo_learner import GRPOLearner, GRPOLossConfig
from olingo.trainer.loop import optimizer_step_groups
from olingo.trainer.loop_support import episode_rollout_metrics
from olingo.trainer.online import OLTrainer
from olingo.trainer.rl_support import (
    EngineSync,
    check_engine_correction,
    held_out_eval,
    load_policy_extras,
    loader_states,
    merge_keywords,
    open_loaders,
    save_policy_extras,
)

logger = logging.getLogger("olingo.trainer")

_UNSUPPORTED = {  # compatibility keywords olingo does not implement: set, they fail early
    "use_tp": "tensor parallelism is not available in olingo; use the DDP or FSDP2 plugin",
    "use_tts_inference": "test-time-scaling inference is not part of olingo's GRPO",
    "tts_config": "test-time-scaling inference is not part of olingo's GRPO",
    "temperature_annealing_config": "temperature annealing is not implemented; set generation.temperature",
}


def grpo_steps_per_episode(
    num_collect_steps: int, rollout_batch_size: int, num_generations: int, num_update_steps: int, train_batch_size: int,
    accumulation_steps: int, *, buffer_limit: int = 0, sample_buffer: bool = False,
) -> int:
    """Optimizer steps of one full episode (per process): each of the mu passes walks the
    buffer of rollout_batch_size x G rollouts per collect step in minibatches. Dynamic sampling
    can make an episode shorter (fewer groups kept); never longer."""
    if sample_buffer:
        return num_update_steps
    rollouts = num_collect_steps * rollout_batch_size * num_generations
    if buffer_limit:
        rollouts = min(rollouts, buffer_limit)
    return num_update_steps * math.ceil(math.ceil(rollouts / train_batch_size) / accumulation_steps)


class GRPOTrainer(OLTrainer):
    """The GRPO family: one policy, no critic, group-relative advantages (Shao et al. 2024).

    ColossalChat-compatible signature, with the keywords that fail early: see
    docs/coming-from-colossalchat.md. `num_generation` is G. `initial_model` may be None when
    kl_coef is 0 (it is then never used). `eps_clip` sets both clip bounds. `**generate_kwargs` are
    rollout settings (`GenerationSettings`). Keyword-only extras: `experience_config`
    (`GroupExperienceConfig`: estimator, KL placement, dynamic sampling, overlong punishment) and
    `loss_config` (`GRPOLossConfig`: aggregation, clip-higher, dual clip, ptx): given, they hold the
    settings, and a keyword (kl_coef, num_generation, inference_batch_size,
    logits_forward_batch_size; ptx_coef, eps_clip) left at its default defers to them, while one set
    to another value must agree (`merge_keywords`). `engine`, `eval_interval`,
    `eval_before_training`, `accuracy_fn`, `eval_generate_kwargs` as for `PPOTrainer`.
    """

    def __init__(
        self,
        actor_booster: Booster,
        actor: PreTrainedModel,
        reward_model: Any,
        initial_model: PreTrainedModel | None,
        actor_optim: OptimizerWrapper,
        actor_lr_scheduler: Any,
        tokenizer: PreTrainedTokenizerBase,
        kl_coef: float = 0.1,
        ptx_coef: float = 0.9,
        train_batch_size: int = 8,
        buffer_limit: int = 0,
        buffer_cpu_offload: bool = True,
        eps_clip: float = 0.2,
        vf_coef: float = 1.0,
        value_clip: float = 0.2,
        sample_buffer: bool = False,
        dataloader_pin_memory: bool = True,
        offload_inference_models: bool = True,
        apply_loss_mask: bool = True,
        accumulation_steps: int = 1,
        save_interval: int = 0,
        save_dir: str | None = None,
        use_tp: bool = False,
        num_generation: int = 8,
        inference_batch_size: int | None = None,
        logits_forward_batch_size: int | None = None,
        use_tts_inference: bool = False,
        temperature_annealing_config: dict | None = None,
        tts_config: dict | None = None,
        coordinator: DistCoordinator | None = None,
        callbacks: Sequence[Callback] = (),
        *,
        experience_config: GroupExperienceConfig | None = None,
        loss_config: GRPOLossConfig | None = None,
        engine: RolloutEngine | None = None,
        eval_interval: int = 0,
        eval_before_training: bool = True,
        accuracy_fn: Callable[..., Any] | None = None,
        eval_generate_kwargs: dict[str, Any] | None = None,
        **generate_kwargs: Any,
    ) -> None:
        given = {"use_tp": use_tp, "use_tts_inference": use_tts_inference, "tts_config": tts_config, "temperature_annealing_config": temperature_annealing_config}
        for name, value in given.items():
            if value:
                raise ValueError(f"{name}={value!r}: {_UNSUPPORTED[name]}")
        if vf_coef != 1.0 or value_clip != 0.2:
            raise ValueError("vf_coef and value_clip are critic settings and GRPO trains no critic; leave them at their defaults")
        if accumulation_steps < 1 or train_batch_size < 1:
            raise ValueError("accumulation_steps and train_batch_size must be >= 1")
        experience_config = merge_keywords(GroupExperienceConfig, experience_config, "experience_config", {
            "kl_coef": (kl_coef, 0.1), "num_generations": (num_generation, 8),
            "inference_batch_size": (inference_batch_size, None), "logits_forward_batch_size": (logits_forward_batch_size, None),
        })
        loss_config = merge_keywords(GRPOLossConfig, loss_config, "loss_config", {"ptx_coef": (ptx_coef, 0.9), "eps_low": (eps_clip, 0.2), "eps_high": (eps_clip, 0.2)})
        kl_coef = experience_config.kl_coef
        if kl_coef > 0 and initial_model is None:
            raise ValueError(f"kl_coef={kl_coef} needs the reference model (initial_model); pass it, or set kl_coef=0")
        buffer = NaiveExperienceBuffer(train_batch_size, buffer_limit, buffer_cpu_offload, pad_token_id=tokenizer.pad_token_id or 0)
        super().__init__(
            actor_booster, buffer, sample_buffer, dataloader_pin_memory, callbacks,
            coordinator=coordinator, save_interval=save_interval, save_dir=save_dir, eval_interval=eval_interval,
            eval_before_training=eval_before_training,
        )
        self.actor, self.reward_model = actor, reward_model
        self.initial_model = initial_model if kl_coef > 0 else None  # kl_coef 0: never run, never moved
        self.actor_optim, self.actor_scheduler, self.tokenizer = actor_optim, actor_lr_scheduler, tokenizer
        self.generation = GenerationSettings.from_kwargs(**generate_kwargs)
        self.eval_generation = GenerationSettings.from_kwargs(**{**vars(self.generation), **(eval_generate_kwargs or {})})
        self.learner = GRPOLearner(
            actor_booster, actor, actor_optim, actor_lr_scheduler, loss_config, kl_coef=kl_coef, kl_estimator=experience_config.estimator_name,
            kl_in_loss=experience_config.kl_penalty == "loss", max_length=self.generation.max_new_tokens, apply_loss_mask=apply_loss_mask,
        )
        self.experience_maker = GroupExperienceMaker(
            actor_booster.unwrap(actor), reward_model, self.initial_model, tokenizer, config=experience_config,
            generation=self.generation, engine=engine, all_reduce_sum=actor_booster.plugin.all_reduce_sum,
        )
        check_engine_correction(self.experience_maker.engine, loss_config.tis_cap, experience_config.old_logprobs)
        self.experience_maker.carry_engine_log_probs = loss_config.tis_cap is not None
        self.engine_sync = EngineSync(self.experience_maker.engine)
        self.train_batch_size, self.accumulation_steps = train_batch_size, accumulation_steps
        self.offload_inference_models = offload_inference_models
        self.accuracy_fn = accuracy_fn
        self.device = actor_booster.device
        self.prompts: CyclicLoader | None = None
        self.pretrain: CyclicLoader | None = None
        self.eval_dataloader: DataLoader | None = None
        self._episode_rollout: list[dict[str, float]] = []
        self._episode_timing = {"make_experience": 0.0, "tokens": 0.0}
        self._episode_sync: dict[str, float] = {}  # time/weight_sync, perf/weight_sync_GBps of the episode's sync
        self._pending_loader_states: dict[str, Any] = {}

    @property
    def ptx_coef(self) -> float:
        return self.learner.ptx_coef

    @property
    def config(self) -> GroupExperienceConfig:
        return self.experience_maker.config

    # ---- fit ----------------------------------------------------------------------------------
    def fit(
        self, num_episodes: int, num_collect_steps: int, num_update_steps: int, prompt_dataloader: DataLoader,
        pretrain_dataloader: DataLoader | None = None, log_dir: str | None = None, use_wandb: bool = False, *,
        eval_dataloader: DataLoader | None = None,
    ):
        """Train for `num_episodes` episodes; see the module docstring. Returns `LoopArtifacts`."""
        return super().fit(num_episodes, num_collect_steps, num_update_steps, prompt_dataloader, pretrain_dataloader, log_dir, use_wandb, eval_dataloader,
                           (num_collect_steps, num_update_steps))

    def _before_fit(self, prompt_dataloader, pretrain_dataloader, log_dir, use_wandb, eval_dataloader, episode_shape) -> None:  # noqa: ANN001
        self.prompts, self.pretrain = open_loaders(self.ptx_coef, prompt_dataloader, pretrain_dataloader, self._pending_loader_states, "GRPOTrainer")
        self.eval_dataloader = eval_dataloader
        # pi_old differs from the current policy only after an optimizer step within the batch.
        num_collect_steps, num_update_steps = episode_shape
        steps_per_pass = self._steps_per_episode(num_collect_steps, 1)
        self.experience_maker.needs_old_log_probs = num_update_steps > 1 or steps_per_pass > 1 or self.sample_buffer
        run_dir = Path(log_dir) if log_dir else self.save_dir
        self._prepare_callbacks(run_dir, use_wandb, [RolloutSamples()] if run_dir is not None else [])

    def _steps_per_episode(self, num_collect_steps: int, num_update_steps: int) -> int:
        return grpo_steps_per_episode(
            num_collect_steps, self.prompts.loader.batch_size, self.config.num_generations, num_update_steps, self.train_batch_size,
            self.accumulation_steps, buffer_limit=self.data_buffer.limit, sample_buffer=self.sample_buffer,
        )

    # ---- 1. collect ---------------------------------------------------------------------------
    def _make_experience(self, collect_step: int) -> Experience:
        if collect_step == 0:
            self._episode_rollout, self._episode_timing = [], {"make_experience": 0.0, "tokens": 0.0}
            self._episode_sync = {}
        self._place_inference_models(self.device)
        self._episode_sync.update(self.engine_sync.before_rollout(self.actor_booster.unwrap(self.actor), self.state.step))
        start = time.perf_counter()
        with self.actor_booster.gathered(self.actor):  # ranks generate different lengths; a sharded actor could not follow
            experience, info = self._collect_groups() if self.config.dynamic_sampling else self._sample_once()
            experience = self.experience_maker.finish(experience)
        self.engine_sync.after_rollout()
        self._episode_timing["make_experience"] += time.perf_counter() - start
        self._episode_timing["tokens"] += info.pop("_tokens")
        self._episode_rollout.append(info)
        self.state.extra["rollout_samples"] = self.experience_maker.last_samples
        return experience

    def _sample(self) -> Experience:
        batch = self.prompts.next()
        return self.experience_maker.sample(batch["input_ids"], batch["attention_mask"], batch.get("gt_answer"), policy_version=self.state.step, row_fields=batch.get("row_fields"))

    def _sample_once(self) -> tuple[Experience, dict[str, float]]:
        experience = self._sample()
        return experience, {**experience.info, "_tokens": float(experience.action_mask.sum())}

    def _collect_groups(self) -> tuple[Experience, dict[str, float]]:
        """DAPO's dynamic sampling (`collect_groups`) with the ranks in lockstep; then every
        rank keeps as many groups as the poorest rank has, so all take the same steps."""
        G, target, plugin = self.config.num_generations, self.prompts.loader.batch_size, self.actor_booster.plugin
        collection = collect_groups(self._sample, self.prompts.next, G, target, self.config.max_resample_rounds, lambda full: self._all_ranks_full(full, plugin))
        counts = torch.zeros(plugin.coordinator.world_size, device=self.device)
        counts[plugin.coordinator.rank] = min(collection.kept_groups, target)
        agreed = int(plugin.all_reduce_sum(counts).min())
        if agreed == 0:
            logger.warning("dynamic sampling: no group with differing rewards after %d rounds; training on the last batch (advantages 0)", collection.rounds)
        elif agreed < target:
            logger.info("dynamic sampling: %d of %d groups have differing rewards after %d rounds; training on those", agreed, target, collection.rounds)
        return collection.batch(agreed, self.data_buffer.pad_token_id), {**collection.info(agreed), "_tokens": collection.tokens}

    def _all_ranks_full(self, full: bool, plugin: Any) -> bool:
        return bool(plugin.all_reduce_sum(torch.tensor(float(not full), device=self.device)) == 0)

    def _place_inference_models(self, device: torch.device | str) -> None:
        """Reference and reward models go to `device`; during learning they wait on the CPU."""
        if self.offload_inference_models:
            for model in (self.initial_model, self.reward_model):
                if model is not None:
                    model.to(device)

    # ---- 2. learn -----------------------------------------------------------------------------
    def _learn(self, update_step: int) -> None:
        if update_step == 0:
            self._place_inference_models("cpu")
        buffer = self.data_buffer
        if self.sample_buffer:
            minibatches: list[Experience] | Minibatches = [buffer.sample() for _ in range(self.accumulation_steps)]
        else:  # may hold fewer rollouts than one batch after dynamic sampling: train on what there is
            pin = self.dataloader_pin_memory and torch.cuda.is_available()
            minibatches = buffer.minibatches(shuffle=True, pin_memory=pin)
        for _, group in optimizer_step_groups(minibatches, self.accumulation_steps, len(minibatches)):
            start = time.perf_counter()
            stats = self._train_group(group)
            metrics = self.learner.optimizer_step(stats)
            self.state.step += 1
            metrics.update(self._rollout_metrics())
            metrics["time/learn"] = time.perf_counter() - start
            self._after_step(group[-1], metrics)
            if self.state.stop_requested:
                return

    def _train_group(self, group: list[Experience]) -> list[dict[str, torch.Tensor]]:
        """Forward/backward the minibatches of one optimizer step, normalised by the whole step."""
        group = [experience.to_device(self.device) for experience in group]
        units = self.learner.step_units(group)
        stats = []
        for i, experience in enumerate(group):
            last = i == len(group) - 1
            with nullcontext() if last else self.learner.no_sync():  # gradients are averaged across ranks on the last minibatch only
                dispatch(self.callbacks, "on_learn_batch_start")
                ptx_batch = self.pretrain.next() if self.pretrain is not None else None
                stats.append(self.learner.training_step(experience, units, len(group), self.experience_maker.temperature, ptx_batch))
                dispatch(self.callbacks, "on_learn_batch_end", experience)
        return stats

    def _rollout_metrics(self) -> dict[str, float]:
        timing = self._episode_timing
        metrics = episode_rollout_metrics(self._episode_rollout, timing["make_experience"], timing["tokens"], self.actor_booster.plugin, self.device)
        metrics, self._episode_sync = {**metrics, **self._episode_sync}, {}  # a sync is logged once, with the step after it
        return metrics

    # ---- evaluation -----------------------------------------------------------------------------
    def _evaluate(self) -> dict[str, float] | None:
        return held_out_eval(self, self.experience_maker)

    # ---- checkpoints ----------------------------------------------------------------------------
    def _write_checkpoint(self, directory: Path) -> None:
        """actor/ (HF directory, optimizer, scheduler), RNG per rank, loop and loader state.
        Nothing of a critic or of the frozen reference is written."""
        self.learner.save(directory)
        save_policy_extras(directory, self.tokenizer, self.coordinator, {**self._loop_state(), "loaders": loader_states(self.prompts, self.pretrain)})

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore the actor, its optimizer and scheduler, RNG, prompt positions, counters and
        callbacks (the reference model is the frozen start model and is never restored into)."""
        directory = Path(directory)
        self.learner.load(directory)
        trainer_state = load_policy_extras(directory, self.coordinator)
        self._pending_loader_states = trainer_state.get("loaders", {})
        self._load_loop_state(trainer_state)
        logger.info("resumed from %s at step %d (next episode %d)", directory, self.state.step, self.start_episode)
