"""`PPOTrainer`: PPO for RLHF with an actor, a critic, a reward model and a reference model.

One episode, as the algorithm reads (Ouyang et al. 2022; Schulman et al. 2017):
    1. collect: `num_collect_steps` prompt batches -> `PPOExperienceMaker` -> buffer
       (reference and reward models on the accelerator only for this phase when offloading)
    2. learn: `num_update_steps` PPO epochs over the buffer in minibatches of
       `train_batch_size`; per minibatch
         actor:  clipped policy loss (+ ptx LM loss on a pretrain batch), backward / accumulation
         critic: clipped value loss * vf_coef, backward / accumulation
       every `accumulation_steps` minibatches: clip, step both optimizers and schedulers
    3. clear the buffer (on-policy), checkpoint/evaluate when due
The learn-phase maths (losses, backward, optimizer steps) lives in `PPOLearner`, shared with
Ray's `DetachedPPOTrainer`; this class adds the loop, the experience maker and the checkpoints.
Metrics per optimizer step: train/* (losses, clipfrac, approx_kl, entropy, explained variance,
ratio max, skip ratio, learning rates, gradient norms), rollout/* of the episode's experience,
time/make_experience, time/learn, perf/tokens_per_s.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from olingo.booster import Booster, OptimizerWrapper
from olingo.cluster import DistCoordinator
from olingo.dataset.sampler import CyclicLoader
from olingo.engines import RolloutEngine
from olingo.experience_buffer import Minibatches, NaiveExperienceBuffer
from olingo.experience_maker import (
    Experience,
    ExperienceConfig,
    GenerationSettings,
    PPOExperienceMaker,
    RewardShaping,
)
from olingo.trainer.callbacks import Callback, dispatch
from olingo.trainer.callbacks.builtin.samples import RolloutSamples
from olingo.trainer.loop import optimizer_step_groups
from olingo.trainer.loop_support import episode_rollout_metrics
from olingo.trainer.online import OLTrainer
from olingo.trainer.ppo_learner import PPOLearner, PPOLossConfig
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

def ppo_steps_per_episode(
    num_collect_steps: int, rollout_batch_size: int, num_update_steps: int, train_batch_size: int,
    accumulation_steps: int, *, buffer_limit: int = 0, sample_buffer: bool = False,
) -> int:
    """Optimizer steps of one episode (per process), the unit schedules are sized in.

    Each PPO epoch walks the buffer in minibatches of `train_batch_size`, stepping after every
    `accumulation_steps` of them and after the epoch's last; with `sample_buffer` each update
    step is one optimizer step on `accumulation_steps` randomly sampled minibatches.
    """
    if sample_buffer:
        return num_update_steps
    rollouts = num_collect_steps * rollout_batch_size
    if buffer_limit:
        rollouts = min(rollouts, buffer_limit)
    minibatches = math.ceil(rollouts / train_batch_size)
    return num_update_steps * math.ceil(minibatches / accumulation_steps)


class PPOTrainer(OLTrainer):
    """PPO: an actor and a critic learn from scored rollouts (Schulman et al. 2017).

    ColossalChat-compatible signature: see docs/coming-from-colossalchat.md.
    `**generate_kwargs` are rollout settings (`GenerationSettings`: max_new_tokens, do_sample,
    temperature, top_k, top_p, stop_token_ids, stop_strings); unknown ones are errors. Keyword-only
    extras: `experience_config` (`ExperienceConfig`: KL estimator and adaptive target, GAE,
    whitening, shortcuts; the `kl_coef` keyword sets its coefficient), `reward_shaping`
    (`RewardShaping`: normalisation, clipping, placement, truncation penalty), `engine` (the
    `RolloutEngine` to generate with; default transformers `generate` on the actor), `eval_interval`
    (optimizer steps), `eval_before_training` (evaluate the starting policy at step 0; default on,
    acts only when `fit` gets an `eval_dataloader`), `accuracy_fn` (a reward function, called as
    training calls reward functions, row fields included; correct when > 0) and `eval_generate_kwargs` for held-out evaluation. `ptx_coef >
    0` needs a `pretrain_dataloader` in `fit` (checked when fit starts).
    """

    def __init__(
        self,
        actor_booster: Booster,
        critic_booster: Booster,
        actor: PreTrainedModel,
        critic: torch.nn.Module,
        reward_model: Any,
        initial_model: PreTrainedModel,
        actor_optim: OptimizerWrapper,
        critic_optim: OptimizerWrapper,
        actor_lr_scheduler: Any,
        critic_lr_scheduler: Any,
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
        coordinator: DistCoordinator | None = None,
        callbacks: Sequence[Callback] = (),
        *,
        experience_config: ExperienceConfig | None = None,
        reward_shaping: RewardShaping | None = None,
        engine: RolloutEngine | None = None,
        tis_cap: float | None = None,
        eval_interval: int = 0,
        eval_before_training: bool = True,
        accuracy_fn: Callable[..., Any] | None = None,
        eval_generate_kwargs: dict[str, Any] | None = None,
        **generate_kwargs: Any,
    ) -> None:
        if use_tp:
            raise ValueError("use_tp=True: tensor parallelism is not available in olingo; use the DDP or FSDP2 plugin")
        if accumulation_steps < 1 or train_batch_size < 1:
            raise ValueError("accumulation_steps and train_batch_size must be >= 1")
        loss = PPOLossConfig(eps_clip=eps_clip, value_clip=value_clip, vf_coef=vf_coef, ptx_coef=ptx_coef, tis_cap=tis_cap)
        learner = PPOLearner.build(
            actor_booster, critic_booster, actor, critic, actor_optim, critic_optim, actor_lr_scheduler, critic_lr_scheduler,
            loss, apply_loss_mask=apply_loss_mask,
        )
        buffer = NaiveExperienceBuffer(train_batch_size, buffer_limit, buffer_cpu_offload, pad_token_id=tokenizer.pad_token_id or 0)
        super().__init__(
            actor_booster, buffer, sample_buffer, dataloader_pin_memory, callbacks,
            coordinator=coordinator, save_interval=save_interval, save_dir=save_dir, eval_interval=eval_interval,
            eval_before_training=eval_before_training,
        )
        self.learner = learner
        self.actor, self.critic, self.reward_model, self.initial_model = actor, critic, reward_model, initial_model
        self.actor_optim, self.critic_optim = actor_optim, critic_optim
        self.actor_scheduler, self.critic_scheduler = actor_lr_scheduler, critic_lr_scheduler
        self.tokenizer = tokenizer
        self.generation = GenerationSettings.from_kwargs(**generate_kwargs)
        self.eval_generation = GenerationSettings.from_kwargs(**{**vars(self.generation), **(eval_generate_kwargs or {})})
        # Unwrapped: rollouts are forward-only, so DDP's per-forward bookkeeping is not wanted;
        # the plugin's sum over ranks keeps KL, reward statistics and (optionally) whitening global.
        # One KL coefficient: the keyword defers to `experience_config` at its default, and two
        # different values are an error (`merge_keywords`), never a silent choice.
        experience_config = merge_keywords(ExperienceConfig, experience_config, "experience_config", {"kl_coef": (kl_coef, 0.1)})
        self.experience_maker = PPOExperienceMaker(
            actor_booster.unwrap(actor), critic_booster.unwrap(critic) if critic is not None else None, reward_model, initial_model, tokenizer, None,
            config=experience_config, shaping=reward_shaping, engine=engine, generation=self.generation,
            all_reduce_sum=actor_booster.plugin.all_reduce_sum,
        )
        check_engine_correction(self.experience_maker.engine, tis_cap, self.experience_maker.config.old_logprobs)
        self.experience_maker.carry_engine_log_probs = tis_cap is not None
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
        return self.learner.policy.ptx_coef

    @ptx_coef.setter
    def ptx_coef(self, value: float) -> None:
        self.learner.policy.ptx_coef = value

    # ---- fit ----------------------------------------------------------------------------------
    def fit(
        self,
        num_episodes: int,
        num_collect_steps: int,
        num_update_steps: int,
        prompt_dataloader: DataLoader,
        pretrain_dataloader: DataLoader | None = None,
        log_dir: str | None = None,
        use_wandb: bool = False,
        *,
        eval_dataloader: DataLoader | None = None,
    ):
        """Train for `num_episodes` episodes; see the module docstring. Returns `LoopArtifacts`."""
        return super().fit(num_episodes, num_collect_steps, num_update_steps, prompt_dataloader, pretrain_dataloader, log_dir, use_wandb, eval_dataloader)

    def _before_fit(self, prompt_dataloader, pretrain_dataloader, log_dir, use_wandb, eval_dataloader) -> None:  # noqa: ANN001
        self.prompts, self.pretrain = open_loaders(self.ptx_coef, prompt_dataloader, pretrain_dataloader, self._pending_loader_states, "PPOTrainer")
        self.eval_dataloader = eval_dataloader
        run_dir = Path(log_dir) if log_dir else self.save_dir
        samples = [RolloutSamples()] if run_dir is not None else []
        self._prepare_callbacks(run_dir, use_wandb, samples)

    def _steps_per_episode(self, num_collect_steps: int, num_update_steps: int) -> int:
        return ppo_steps_per_episode(
            num_collect_steps, self.prompts.loader.batch_size, num_update_steps, self.train_batch_size,
            self.accumulation_steps, buffer_limit=self.data_buffer.limit, sample_buffer=self.sample_buffer,
        )

    # ---- 1. collect ---------------------------------------------------------------------------
    def _make_experience(self, collect_step: int) -> Experience:
        if collect_step == 0:
            self._episode_rollout, self._episode_timing = [], {"make_experience": 0.0, "tokens": 0.0}
            self._episode_sync = {}
        self._place_inference_models(self.device)
        self._episode_sync.update(self.engine_sync.before_rollout(self.actor_booster.unwrap(self.actor), self.state.step))
        batch = self.prompts.next()
        start = time.perf_counter()
        # Gathered: each rank's responses stop at their own length, so ranks run different
        # numbers of generation steps, which a sharded actor cannot serve layer by layer.
        with self.actor_booster.gathered(self.actor):
            experience = self.experience_maker.make_experience(
                batch["input_ids"], batch["attention_mask"], batch.get("gt_answer"), policy_version=self.state.step, row_fields=batch.get("row_fields"),
            )
        self.engine_sync.after_rollout()
        self._episode_timing["make_experience"] += time.perf_counter() - start
        self._episode_timing["tokens"] += float(experience.action_mask.sum())
        self._episode_rollout.append(experience.info)
        self.state.extra["rollout_samples"] = self.experience_maker.last_samples
        return experience

    def _place_inference_models(self, device: torch.device | str) -> None:
        """Reference and reward models go to `device`; during learning they wait on the CPU."""
        if self.offload_inference_models:
            self.initial_model.to(device)
            self.reward_model.to(device)

    # ---- 2. learn -----------------------------------------------------------------------------
    def _learn(self, update_step: int) -> None:
        if update_step == 0:
            self._place_inference_models("cpu")
        if self.sample_buffer:
            minibatches: list[Experience] | Minibatches = [self.data_buffer.sample() for _ in range(self.accumulation_steps)]
        else:
            pin = self.dataloader_pin_memory and torch.cuda.is_available()
            minibatches = self.data_buffer.dataloader(shuffle=True, pin_memory=pin)
        for _, group in optimizer_step_groups(minibatches, self.accumulation_steps, len(minibatches)):
            start = time.perf_counter()
            stats = self._train_group(group)
            metrics = self._optimizer_step(stats)
            metrics["time/learn"] = time.perf_counter() - start
            self._after_step(group[-1], metrics)
            if self.state.stop_requested:
                return

    def _train_group(self, group: list[Experience]) -> dict[str, torch.Tensor]:
        """Forward/backward the minibatches of one optimizer step; the mean of their stats."""
        stats = []
        for i, experience in enumerate(group):
            last = i == len(group) - 1
            with ExitStack() as no_sync:
                if not last:  # gradients are averaged across ranks on the last minibatch only
                    no_sync.enter_context(self.learner.no_sync())
                dispatch(self.callbacks, "on_learn_batch_start")
                experience = experience.to_device(self.device)
                stats.append(self._training_step(experience, 1.0 / len(group)))
                dispatch(self.callbacks, "on_learn_batch_end", experience)
        return {name: torch.stack([s[name] for s in stats]).mean() for name in stats[0]}

    def _training_step(self, experience: Experience, loss_scale: float) -> dict[str, torch.Tensor]:
        """Policy (+ptx) and value losses of one minibatch (see `PPOLearner.training_step`)."""
        ptx_batch = self.pretrain.next() if self.pretrain is not None else None
        return self.learner.training_step(experience, loss_scale, self.experience_maker.temperature, ptx_batch)

    def _optimizer_step(self, stats: dict[str, torch.Tensor]) -> dict[str, float]:
        """Step both optimizers and schedulers; metrics of the step averaged over ranks."""
        metrics = self.learner.optimizer_step(stats)
        self.state.step += 1
        metrics.update(self._rollout_metrics())
        return metrics

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
        self.learner.save(directory)
        state = {**self._loop_state(), "loaders": loader_states(self.prompts, self.pretrain), "experience_maker": self.experience_maker.state_dict()}
        save_policy_extras(directory, self.tokenizer, self.coordinator, state)

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore each piece to its own owner: actor weights into the actor (never the frozen
        reference), each optimizer and scheduler into its model's, plus RNG, the prompt and
        pretrain positions, the KL controller and reward statistics, counters and callbacks."""
        directory = Path(directory)
        self.learner.load(directory)
        trainer_state = load_policy_extras(directory, self.coordinator)
        self.experience_maker.load_state_dict(trainer_state["experience_maker"])
        self._pending_loader_states = trainer_state.get("loaders", {})
        self._load_loop_state(trainer_state)
        logger.info("resumed from %s at step %d (next episode %d)", directory, self.state.step, self.start_episode)
