"""`OnlineTrainer`: the one online RL trainer. PPO and the GRPO family are configurations of it.

One episode, as the algorithm reads (the hooks around it: `OLTrainer`, docs/callbacks.md):
    1. collect: `num_collect_steps` times, the experience maker draws a prompt batch, samples
       responses from its rollout source, scores them and estimates advantages -> buffer
       (reference and reward models on the accelerator only for this phase when offloading)
    2. learn: `num_update_steps` passes over the buffer in minibatches of `train_batch_size`;
       every `accumulation_steps` minibatches are one optimizer step (`learn_step`)
    3. clear the buffer (on-policy); sync the rollout engine before the next collection;
       evaluate and checkpoint when due
What differs between algorithms is in the parts it is built from: the learner (PPO: actor and
critic, clipped policy and value losses; the GRPO family: the actor alone, a token- or
response-normalised loss) and the experience maker (PPO: critic values and GAE with the KL in
the reward; the GRPO family: groups of G responses, group advantages, dynamic sampling). A new
rollout source (an environment, an agent) plugs into the maker; this loop does not change.
Metrics per optimizer step: train/* from the learner, time/learn, the learn forwards'
perf/padding_fraction and perf/learn_tokens_per_s (`learn_step`). What describes the episode's
rollouts (rollout/*, time/make_experience, perf/tokens_per_s) and the engine sync before them
(time/weight_sync) is logged once per episode, on the row of its first optimizer step, so
summing a column over rows counts each rollout once (docs/runs.md).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from olingo.booster import Booster
from olingo.cluster import DistCoordinator
from olingo.dataset.sampler import CyclicLoader
from olingo.engines import GenerationSettings
from olingo.experience_buffer import NaiveExperienceBuffer
from olingo.experience_maker import Experience
from olingo.experience_maker.maker import ExperienceMaker
from olingo.rollout import PromptBatch
from olingo.trainer.callbacks import Callback, dispatch
from olingo.trainer.callbacks.builtin.samples import RolloutSamples
from olingo.trainer.learner import Learner, learn_step
from olingo.trainer.loop import optimizer_step_groups
from olingo.trainer.loop_support import episode_rollout_metrics
from olingo.trainer.online import OLTrainer
from olingo.trainer.online_config import OnlineLoopConfig, steps_per_episode
from olingo.trainer.rl_support import (
    EngineSync,
    check_engine_correction,
    held_out_eval,
    load_policy_extras,
    loader_states,
    open_loaders,
    save_policy_extras,
)

logger = logging.getLogger("olingo.trainer")


class OnlineTrainer(OLTrainer):
    """Online RL from a learner and an experience maker (see the module docstring).

    Args:
        booster: the actor's booster (its plugin is the data-parallel group).
        learner: the learn half (`olingo.trainer.learner.Learner`): `PPOLearner`, `GRPOLearner`.
        experience_maker: the experience half (`olingo.experience_maker.maker.ExperienceMaker`).
        tokenizer: saved beside the actor in checkpoints; its pad id pads the buffer's batches.
        loop: the `loop:` section (`OnlineLoopConfig`).
        save_dir: checkpoints under `save_dir/checkpoints` (None: none).
        callbacks: `Callback`s (the defaults, loggers and a progress bar, are added in `fit`).
        inference_models: the frozen models the maker runs (reference, reward), moved to the CPU
            while the learner trains when `loop.offload_inference_models`.
        accuracy_fn: a reward function counted as accuracy in held-out evaluation (correct when > 0).
        eval_generation: sampling for held-out evaluation (default: the rollout's, at
            `loop.eval_temperature` when set).
    """

    def __init__(
        self, booster: Booster, learner: Learner, experience_maker: ExperienceMaker, tokenizer: Any, loop: OnlineLoopConfig | None = None, *,
        save_dir: str | None = None, callbacks: Sequence[Callback] = (), coordinator: DistCoordinator | None = None,
        inference_models: Sequence[torch.nn.Module | None] = (), accuracy_fn: Callable[..., Any] | None = None,
        eval_generation: GenerationSettings | None = None,
    ) -> None:
        loop = loop or OnlineLoopConfig()
        buffer = NaiveExperienceBuffer(loop.train_batch_size, loop.buffer_limit, loop.buffer_cpu_offload, pad_token_id=tokenizer.pad_token_id or 0)
        super().__init__(
            booster, buffer, loop.sample_buffer, loop.pin_memory, callbacks, coordinator=coordinator, save_interval=loop.save_interval,
            save_dir=save_dir, eval_interval=loop.eval_interval, eval_before_training=loop.eval_before_training,
        )
        self.learner, self.experience_maker, self.tokenizer, self.loop = learner, experience_maker, tokenizer, loop
        self.actor = learner.actor
        self.inference_models = [model for model in inference_models if model is not None]
        check_engine_correction(experience_maker.engine, learner.tis_cap, experience_maker.old_logprobs)
        experience_maker.carry_engine_log_probs = learner.tis_cap is not None
        self.engine_sync = EngineSync(experience_maker.engine)
        self.generation = experience_maker.generation
        self.eval_generation = eval_generation or self.generation
        if eval_generation is None and loop.eval_temperature is not None:
            self.eval_generation = dataclasses.replace(self.generation, temperature=loop.eval_temperature)
        self.accuracy_fn, self.device = accuracy_fn, booster.device
        self.prompts: CyclicLoader | None = None
        self.pretrain: CyclicLoader | None = None
        self.eval_dataloader: DataLoader | None = None
        self._episode_rollout: list[dict[str, float]] = []
        self._episode_timing = {"make_experience": 0.0, "tokens": 0.0}
        self._rollout_logged = False  # the episode's rollout metrics are on a row already
        self._episode_sync: dict[str, float] = {}  # time/weight_sync, perf/weight_sync_GBps of the episode's sync
        self._pending_loader_states: dict[str, Any] = {}

    @property
    def ptx_coef(self) -> float:
        return self.learner.ptx_coef

    @ptx_coef.setter
    def ptx_coef(self, value: float) -> None:
        self.learner.ptx_coef = value

    @property
    def accumulation_steps(self) -> int:
        return self.loop.accumulation_steps

    # ---- fit ----------------------------------------------------------------------------------
    def fit(
        self, num_episodes: int, num_collect_steps: int, num_update_steps: int, prompt_dataloader: DataLoader,
        pretrain_dataloader: DataLoader | None = None, log_dir: str | None = None, use_wandb: bool = False, *,
        eval_dataloader: DataLoader | None = None,
    ):
        """Train for `num_episodes` episodes; see the module docstring. Returns `LoopArtifacts`."""
        return super().fit(num_episodes, num_collect_steps, num_update_steps, prompt_dataloader, pretrain_dataloader, log_dir, use_wandb, eval_dataloader,
                           (num_collect_steps, num_update_steps))

    def _before_fit(
        self, prompt_dataloader: DataLoader, pretrain_dataloader: DataLoader | None, log_dir: str | None, use_wandb: bool,
        eval_dataloader: DataLoader | None, episode_shape: tuple[int, int],
    ) -> None:
        self.prompts, self.pretrain = open_loaders(self.ptx_coef, prompt_dataloader, pretrain_dataloader, self._pending_loader_states, type(self).__name__)
        self.eval_dataloader = eval_dataloader
        num_collect_steps, num_update_steps = episode_shape
        self._check_episode_fills_a_batch(num_collect_steps)
        # pi_old differs from the sampling policy only after an optimizer step within the batch.
        steps_per_pass = self._steps_per_episode(num_collect_steps, 1)
        self.experience_maker.plan(num_update_steps > 1 or steps_per_pass > 1 or self.sample_buffer)
        run_dir = Path(log_dir) if log_dir else self.save_dir
        self._prepare_callbacks(run_dir, use_wandb, [RolloutSamples()] if run_dir is not None else [])

    def _rollouts_per_collect(self) -> int:
        return self.prompts.loader.batch_size * self.experience_maker.num_generations

    def _check_episode_fills_a_batch(self, num_collect_steps: int) -> None:
        """Say so when one pass over an episode's rollouts is less than one minibatch."""
        rollouts = num_collect_steps * self._rollouts_per_collect()
        if self.data_buffer.limit:
            rollouts = min(rollouts, self.data_buffer.limit)
        if rollouts < self.data_buffer.sample_batch_size and not self.sample_buffer:  # sampling from it fails with its own message
            logger.warning(
                "an episode collects %d rollouts, fewer than one training batch (%d): each pass trains on %d; collect more per episode "
                "(collect steps x rollout batch size) or lower train_batch_size", rollouts, self.data_buffer.sample_batch_size, rollouts,
            )

    def _steps_per_episode(self, num_collect_steps: int, num_update_steps: int) -> int:
        return steps_per_episode(
            self._rollouts_per_collect(), num_collect_steps, num_update_steps, self.data_buffer.sample_batch_size, self.loop.accumulation_steps,
            buffer_limit=self.data_buffer.limit, sample_buffer=self.sample_buffer,
        )

    # ---- 1. collect ---------------------------------------------------------------------------
    def _make_experience(self, collect_step: int) -> Experience:
        if collect_step == 0:
            self._episode_rollout, self._episode_timing, self._episode_sync = [], {"make_experience": 0.0, "tokens": 0.0}, {}
            self._rollout_logged = False
        self._place_inference_models(self.device)
        self._episode_sync.update(self.engine_sync.before_rollout(self.actor_booster.unwrap(self.actor), self.state.step))
        start = time.perf_counter()
        # Gathered: each rank's responses stop at their own length, so ranks run different
        # numbers of generation steps, which a sharded actor cannot serve layer by layer.
        with self.actor_booster.gathered(self.actor):
            collected = self.experience_maker.collect(lambda: PromptBatch.from_collated(self.prompts.next()), self.state.step)
        self.engine_sync.after_rollout()
        self._episode_timing["make_experience"] += time.perf_counter() - start
        self._episode_timing["tokens"] += collected.tokens
        self._episode_rollout.append(collected.info)
        self.state.extra["rollout_samples"] = self.experience_maker.last_samples
        return collected.experience

    def _place_inference_models(self, device: torch.device | str) -> None:
        """Reference and reward models go to `device`; during learning they wait on the CPU."""
        if self.loop.offload_inference_models:
            for model in self.inference_models:
                model.to(device)

    # ---- 2. learn -----------------------------------------------------------------------------
    def _learn(self, update_step: int) -> None:
        """One pass over the buffer (or, with `sample_buffer`, one step on sampled minibatches)."""
        if update_step == 0:
            self._place_inference_models("cpu")
        if self.sample_buffer:
            minibatches: Any = [self.data_buffer.sample() for _ in range(self.loop.accumulation_steps)]
        else:  # may hold fewer rollouts than one batch after dynamic sampling: train on what there is
            minibatches = self.data_buffer.minibatches(shuffle=True, pin_memory=self.dataloader_pin_memory and torch.cuda.is_available())
        for _, group in optimizer_step_groups(minibatches, self.loop.accumulation_steps, len(minibatches)):
            start = time.perf_counter()
            group = [experience.to_device(self.device) for experience in group]
            next_ptx = self.pretrain.next if self.pretrain is not None else None
            metrics = learn_step(self.learner, group, self.experience_maker.temperature, next_ptx, self._learn_batch_hooks)
            self.state.step += 1
            metrics.update(self._rollout_metrics())
            metrics["time/learn"] = time.perf_counter() - start
            self._after_step(group[-1], metrics)
            if self.state.stop_requested:
                return

    @contextmanager
    def _learn_batch_hooks(self, experience: Experience) -> Any:
        dispatch(self.callbacks, "on_learn_batch_start")
        yield
        dispatch(self.callbacks, "on_learn_batch_end", experience)

    def _rollout_metrics(self) -> dict[str, float]:
        """The episode's rollout metrics and its engine sync for the row of its first optimizer
        step; {} for the others: several steps learn on one rollout, whose values repeated on
        each row would count it several times in a sum over rows. Every rank takes the same
        steps, so each reaches the all-reduce inside at the same step."""
        if self._rollout_logged:
            return {}
        self._rollout_logged = True
        timing = self._episode_timing
        metrics = episode_rollout_metrics(self._episode_rollout, timing["make_experience"], timing["tokens"], self.actor_booster.plugin, self.device)
        metrics, self._episode_sync = {**metrics, **self._episode_sync}, {}
        return metrics

    # ---- evaluation -----------------------------------------------------------------------------
    def _evaluate(self) -> dict[str, float] | None:
        return held_out_eval(self, self.experience_maker)

    # ---- checkpoints ----------------------------------------------------------------------------
    def _write_checkpoint(self, directory: Path) -> None:
        """The learner's models, optimizers and schedulers (never a frozen model), RNG per rank,
        the loop's and loaders' state and the maker's (KL controller, reward statistics)."""
        self.learner.save(directory)
        state = {**self._loop_state(), "loaders": loader_states(self.prompts, self.pretrain), "experience_maker": self.experience_maker.state_dict()}
        save_policy_extras(directory, self.tokenizer, self.coordinator, state)

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore each piece to its own owner: the learner's models, optimizers and schedulers,
        RNG, the prompt and pretrain positions, the maker's state, counters and callbacks (the
        frozen reference is the start model and is never restored into)."""
        directory = Path(directory)
        self.learner.load(directory)
        trainer_state = load_policy_extras(directory, self.coordinator)
        self.experience_maker.load_state_dict(trainer_state.get("experience_maker", {}))
        self._pending_loader_states = trainer_state.get("loaders", {})
        self._load_loop_state(trainer_state)
        logger.info("resumed from %s at step %d (next episode %d)", directory, self.state.step, self.start_episode)
