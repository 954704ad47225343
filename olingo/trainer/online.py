"""`OLTrainer`: the online (RL) loop skeleton with its ten online hooks and the loop hooks;
`OnlineTrainer` (olingo/trainer/online_trainer.py) is its one concrete trainer.

The loop, as the hooks see it (docs/callbacks.md, "Order in a PPO run", has the full order):

    _before_fit(...)                                   dataloaders, default loggers
    on_train_start(state)
    on_fit_start()
    evaluation of the starting policy (step 0; fresh runs only)   -> on_eval
    resumed: the evaluations due at the checkpoint's step         -> on_eval, on_benchmark_eval
    for episode in start_episode .. num_episodes-1:
        on_episode_start(episode)
        for collect_step in range(num_collect_steps):
            on_make_experience_start(); exp = _make_experience(collect_step); on_make_experience_end(exp)
            buffer.append(exp)
        for update_step in range(num_update_steps):      passes over the buffer (PPO epochs, mu)
            on_learn_epoch_start(update_step)
            per minibatch: on_learn_batch_start(); train; on_learn_batch_end(exp)
            after every `accumulation_steps` minibatches: optimizer step -> on_step_end(state, step, ...)
            on_learn_epoch_end(update_step)
        buffer.clear()
        on_episode_end(episode)                          in a finally
        checkpoint if a multiple of save_interval was crossed -> on_checkpoint
        evaluation if a multiple of eval_interval was crossed -> on_eval
        in-loop evaluators whose `every` was crossed     -> on_eval, on_benchmark_eval
        SIGINT/SIGTERM received during the episode: `step_<N>` checkpoint, stop (no evaluation)
    evaluation of the final policy (unless it just ran)           -> on_eval   (not after a stop)
    final checkpoint                                                          (not after a stop)
    on_fit_end()                                         in a finally
    on_train_end(state, artifacts)                       in a finally

Checkpoints are taken at episode boundaries, where the on-policy buffer is empty: a checkpoint
then needs no experience, and resuming from it is exact. `save_interval` still counts
optimizer steps: a checkpoint is due at the end of the episode in which a multiple was reached.
For the same reason Ctrl-C/SIGTERM is honoured at the end of the episode in flight, never in
its middle (`_stop_at_boundary`). A boundary's checkpoint is taken before its evaluations and
says so; a run resumed from it runs them first (`_run_pending_evaluations`).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from olingo.booster import Booster
from olingo.cluster import DistCoordinator
from olingo.experience_buffer import NaiveExperienceBuffer
from olingo.experience_maker import Experience
from olingo.trainer.callbacks import Callback, LoopArtifacts, LoopState, ManifestRow, dispatch
from olingo.trainer.checkpoint import CheckpointManager
from olingo.trainer.loop import is_due, loop_scope
from olingo.trainer.loop_support import (
    Evaluator,
    callback_states,
    check_stop_signal,
    default_callbacks,
    due_evaluators,
    restore_callback_states,
    run_evaluator,
)

logger = logging.getLogger("olingo.trainer")


class OLTrainer(ABC):
    """Online trainer base: episodes of experience collection then learning, with hooks.

    Arguments: the actor's booster, the experience buffer, whether to sample from it instead of
    walking it, pinning, callbacks (ColossalChat-compatible signature: see
    docs/coming-from-colossalchat.md), plus `coordinator`, `save_interval`, `save_dir`,
    `eval_interval` (both intervals count optimizer steps; 0 = off) and `eval_before_training`
    (evaluate the starting policy at step 0, so the gain of training is in the run's own log).
    """

    def __init__(
        self,
        actor_booster: Booster,
        data_buffer: NaiveExperienceBuffer,
        sample_buffer: bool,
        dataloader_pin_memory: bool,
        callbacks: Sequence[Callback] = (),
        *,
        coordinator: DistCoordinator | None = None,
        save_interval: int = 0,
        save_dir: str | None = None,
        eval_interval: int = 0,
        eval_before_training: bool = True,
    ) -> None:
        self.actor_booster = actor_booster
        self.data_buffer = data_buffer
        self.sample_buffer = sample_buffer
        self.dataloader_pin_memory = dataloader_pin_memory
        self.callbacks: list[Callback] = list(callbacks)
        self.coordinator = coordinator or actor_booster.plugin.coordinator
        self.save_interval = save_interval
        self.save_dir = Path(save_dir) if save_dir else None
        self.eval_interval = eval_interval
        self.eval_before_training = eval_before_training
        self.initial_eval_metrics: dict[str, float] | None = None  # eval/* of the starting policy
        self.show_progress = True
        self.run_config: dict[str, Any] | None = None
        self.state = LoopState(is_master=self.coordinator.is_master)
        self.start_episode = 0
        self.last_eval_metrics: dict[str, float] | None = None
        self._pending_callback_states: dict[str, Any] = {}
        self._saved_rows: list[ManifestRow] = []
        self._defaults_installed = False
        self._last_saved_step = 0  # optimizer step of the last checkpoint (due checks)
        self._last_eval_step = 0
        self._episode_start_step = 0  # optimizer step before the current episode (evaluators)
        self._pending_since: int | None = None  # a resumed checkpoint's evaluations still to run
        self.evaluators: list[Evaluator] = []  # scored on the live policy every `every` steps

    # ---- what a concrete trainer supplies ------------------------------------------------
    @abstractmethod
    def _before_fit(self, *args: Any, **kwargs: Any) -> None:
        """Set up dataloaders and anything else `fit`'s extra arguments carry."""

    @abstractmethod
    def _make_experience(self, collect_step: int) -> Experience:
        """Generate and score one batch of rollouts."""

    @abstractmethod
    def _learn(self, update_step: int) -> None:
        """One pass over the buffer (fires the learn-batch hooks and `_after_step`)."""

    @abstractmethod
    def _write_checkpoint(self, directory: Path) -> None:
        """Write models, optimizers, schedulers, RNG and trainer state into `directory`."""

    def _evaluate(self) -> dict[str, float] | None:
        """Held-out evaluation, metrics without the `eval/` prefix; None when there is none."""
        return None

    def add_callback(self, callback: Callback) -> None:
        self.callbacks.append(callback)

    def _policy(self) -> tuple[Any, Any]:
        """The policy being trained (unwrapped) and its tokenizer, for in-loop evaluators.

        By default the `actor` and `tokenizer` attributes; a trainer
        that names its policy otherwise overrides this.
        """
        actor = getattr(self, "actor", None)
        return (self.actor_booster.unwrap(actor) if actor is not None else None), getattr(self, "tokenizer", None)

    # ---- the loop -------------------------------------------------------------------------
    def fit(self, num_episodes: int, num_collect_steps: int, num_update_steps: int, *args: Any, **kwargs: Any) -> LoopArtifacts:
        """Run episodes `start_episode .. num_episodes-1`; see the module docstring."""
        self._before_fit(*args, **kwargs)
        self.num_episodes = num_episodes
        state = self.state
        state.num_steps = num_episodes * self._steps_per_episode(num_collect_steps, num_update_steps)
        state.policy, state.tokenizer = self._policy()
        with loop_scope(state, self.callbacks, self.save_dir, self._saved_rows, fit_hooks=True, stop_at="episode") as run:
            self._eval_before_training()
            self._run_pending_evaluations()
            for episode in range(self.start_episode, num_episodes):
                state.epoch, self._episode_start_step = episode, state.step
                self._run_episode(episode, num_collect_steps, num_update_steps)
                self.start_episode = episode + 1
                stopping = self._stop_at_boundary()  # a signal is honoured here only, between episodes
                self._after_episode(stopping)
                if stopping or state.stop_requested:
                    break
            if not state.extra.get("stop_signal"):  # a stop wrote its `step_<N>` checkpoint already
                if self.last_eval_metrics is None or self._last_eval_step != state.step:
                    self._run_eval()  # the final policy is always evaluated
                self._save_checkpoint("final")
        return run.artifacts

    def _run_episode(self, episode: int, num_collect_steps: int, num_update_steps: int) -> None:
        dispatch(self.callbacks, "on_episode_start", episode)
        try:
            self.learner.eval()  # rollouts and their log-probs without dropout (HF models load in eval mode anyway)
            for collect_step in range(num_collect_steps):
                dispatch(self.callbacks, "on_make_experience_start")
                experience = self._make_experience(collect_step)
                dispatch(self.callbacks, "on_make_experience_end", experience)
                self.data_buffer.append(experience)
            self.learner.train()  # dropout and gradient checkpointing act in train mode only
            for update_step in range(num_update_steps):
                dispatch(self.callbacks, "on_learn_epoch_start", update_step)
                self._learn(update_step)
                dispatch(self.callbacks, "on_learn_epoch_end", update_step)
                if self.state.stop_requested:
                    break
            self.data_buffer.clear()  # on-policy: this experience is stale after learning on it
        finally:
            dispatch(self.callbacks, "on_episode_end", episode)

    def _after_episode(self, stopping: bool = False) -> None:
        """Checkpoint and evaluate when a multiple of their interval was reached this episode.

        The checkpoint comes first and records that the evaluations of its step are still to run
        (`pending_evaluations_since`), so a run resumed from it runs them before its next episode,
        exactly as the uninterrupted run did. A stop (`stopping`) writes that checkpoint whether
        or not one is due, and leaves the evaluations to the resumed run.
        """
        step = self.state.step
        if stopping or is_due(self.save_interval, self._last_saved_step, step):
            self._save_checkpoint(f"step_{step}", pending_since=self._episode_start_step)
        if not stopping:
            self._evaluate_boundary(self._episode_start_step)

    def _evaluate_boundary(self, since: int) -> None:
        """The evaluations and in-loop evaluators due in the optimizer steps (since, step]."""
        step = self.state.step
        if is_due(self.eval_interval, self._last_eval_step, step):
            self._run_eval()
        due = due_evaluators(self.evaluators, since, step) if self.state.policy is not None else []
        if due:  # every rank gathers a sharded policy; rank 0 alone evaluates it
            with self.actor_booster.gathered(self.state.policy):
                for evaluator in due if self.coordinator.is_master else ():
                    run_evaluator(self.callbacks, self.state, evaluator)

    def _eval_before_training(self) -> None:
        """Evaluate the starting policy at step 0, so `eval/*` has a baseline to compare with.

        Only at step 0: a run resumed later keeps the step-0 row its first process logged
        (metrics.jsonl keeps rows before the resumed step), so it is not repeated. A run resumed
        from a step-0 checkpoint evaluates again, and the logs drop the eval rows of the resumed
        step first, so the row is replaced by an identical one (evaluation is seeded). The
        training RNG stream is untouched: evaluation samples inside its own `fork_rng`.
        """
        if self.eval_before_training and self.state.step == 0:
            self.initial_eval_metrics = self._run_eval()

    def _after_step(self, batch: Any, metrics: dict[str, float]) -> None:
        dispatch(self.callbacks, "on_step_end", self.state, self.state.step, batch, metrics)

    def _stop_at_boundary(self) -> bool:
        """At the end of an episode: whether SIGINT/SIGTERM arrived (on any rank) during it, which
        ends the loop with a `step_<N>` checkpoint (one collective per episode under DDP/FSDP).

        A signal is not honoured mid-episode: the rest of the episode's optimizer steps learn on
        experience that lives only in memory, so a checkpoint there could not resume exactly.
        The episode finishes first (a second signal stops at once; the last complete checkpoint
        stays), and the checkpoint is the state an uninterrupted run has at that boundary.
        """
        return check_stop_signal(self.state, self.actor_booster.plugin)

    def _run_pending_evaluations(self) -> None:
        """A run resumed from an episode-boundary checkpoint first runs the evaluations that were
        due at that boundary: the checkpoint was taken before them, and the loggers dropped any
        eval rows of that step on resume (`kept_on_resume`)."""
        since, self._pending_since = self._pending_since, None
        if since is not None and self.state.step > 0:
            self._evaluate_boundary(since)

    def _run_eval(self) -> dict[str, float] | None:
        self._last_eval_step = self.state.step
        result = self._evaluate()
        if result is None:
            return None
        metrics = {f"eval/{k}": v for k, v in result.items()}
        self.last_eval_metrics = metrics
        dispatch(self.callbacks, "on_eval", self.state, self.state.step, "eval", metrics)
        return metrics

    def _steps_per_episode(self, num_collect_steps: int, num_update_steps: int) -> int:
        """Optimizer steps one episode takes; subclasses that know their batch sizes say."""
        return num_update_steps

    # ---- checkpoints --------------------------------------------------------------------------
    def _checkpoints(self) -> CheckpointManager:
        return CheckpointManager(self.save_dir, self.coordinator)

    def _save_checkpoint(self, name: str, pending_since: int | None = None) -> None:
        """`pending_since`: taken before the evaluations due in the steps (pending_since, step]."""
        self._last_saved_step = self.state.step
        if self.save_dir is None:
            return
        self._pending_since = pending_since  # read by `_loop_state` while the checkpoint is written
        try:
            row = self._checkpoints().save(name, self.state.step, self.start_episode, 0, self._write_checkpoint)
        finally:
            self._pending_since = None
        self._saved_rows.append(row)
        dispatch(self.callbacks, "on_checkpoint", self.state, row)

    def _loop_state(self) -> dict[str, Any]:
        """Counters and callback states for trainer_state.json."""
        return {
            "step": self.state.step,
            "episode": self.start_episode,  # the next episode to run
            "num_steps": self.state.num_steps,
            "last_eval_step": self._last_eval_step,
            "pending_evaluations_since": self._pending_since,  # see `_run_pending_evaluations`
            "callbacks": callback_states(self.callbacks),
        }

    def _load_loop_state(self, trainer_state: dict[str, Any]) -> None:
        self.state.step = trainer_state["step"]
        self.start_episode = trainer_state["episode"]
        self._last_saved_step = trainer_state["step"]
        self._last_eval_step = trainer_state.get("last_eval_step", 0)
        self._pending_since = trainer_state.get("pending_evaluations_since")
        self._pending_callback_states = trainer_state.get("callbacks", {})

    # ---- callbacks ------------------------------------------------------------------------------
    def _prepare_callbacks(self, run_dir: Path | None, use_wandb: bool, extra: Sequence[Callback] = ()) -> None:
        """Default loggers in front of the user's callbacks (rank 0), then restore their states."""
        self.state.output_dir, self.state.config = run_dir, self.run_config
        if not self._defaults_installed and self.coordinator.is_master:
            self._defaults_installed = True
            self.callbacks[:0] = [*default_callbacks(run_dir, use_wandb, self.show_progress), *extra]
        restore_callback_states(self.callbacks, self._pending_callback_states)
        self._pending_callback_states = {}
