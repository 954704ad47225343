"""`DetachedTrainer`: a trainer Ray actor fed by remote experience-maker actors.

`fit(total_steps, update_steps, train_epochs)`, as the hooks see it (docs/callbacks.md):

    on_train_start(state); on_fit_start()
    resolve the makers by name; push the trainer's weights to them      on_update_start/end
    start every maker's working loop (they push into this actor's buffer)
    for episode in range(total_steps // update_steps):
        on_episode_start(episode)
        epoch 0: pop `update_steps` batches from the buffer and train on each as it arrives;
        epochs 1..train_epochs-1: the same batches again, shuffled       on_learn_epoch_start/end,
                                        per batch on_learn_batch_start/end, on_step_end(state, step, ...)
        push the new weights to every maker                             on_update_start/end
        on_episode_end(episode)                                         in a finally
        checkpoint when a multiple of save_interval steps was crossed   on_checkpoint
        a stop requested during the episode (`request_stop`): `step_<N>` checkpoint, end
    final checkpoint (not after a stop)
    stop the makers, wait for their loops, count what was left unused   (always, in a finally)
    on_fit_end(); on_train_end(state, artifacts)                        in finallys

Robustness: the makers are started and stopped by `fit` (no step counts to balance by hand); every
remote call waits with a timeout; a maker that raises fails `fit` with the maker's traceback; a
maker that dies (and is restarted by Ray) gets the current weights and its loop back; experience
carries the policy version that made it and batches more than `max_staleness` weight syncs old are
dropped and counted. The makers themselves (resolving them, their loops, restarts, stopping, the
timed remote calls, the object-store weight push) are a `MakerPool` (olingo/ray/maker_pool.py)
that the trainer holds as `maker_pool`.

A stop (Ctrl-C/SIGTERM at the driver, forwarded by `request_stop`) is honoured at the end of the
episode in flight, as local PPO/GRPO do: the episode trains on every batch it pulled, then a
`step_<N>` checkpoint is written at that boundary, like a scheduled one, and `fit` returns with
`summary["interrupted"]` (`raise_if_interrupted` turns that into `TrainingInterrupted` at the
driver). Mid-episode the batches already taken from the buffer exist nowhere else.

`state.step` counts `training_step` calls (for PPO and GRPO: optimizer steps); `policy_version`
is the step at which the makers' current weights were pushed.

What the learner-backed trainers (`DetachedPPOTrainer`, `DetachedGRPOTrainer`) share beyond the
loop is here too. They set `learner`, `tokenizer` and `temperature`; then `fit` checks that the
makers sample at that temperature, and checkpoints hold the learner's files, the tokenizer next
to the actor, the RNG and `trainer_state.json` (counters, the makers' states, the callbacks'
states), all restored by `load_checkpoint`. Their weight push goes through `_push_weights`
(the object store, with its `perf/weight_sync_*` metrics).
"""

from __future__ import annotations

import logging
import random
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
import torch
from ray.exceptions import RayActorError

from olingo.cluster import DistCoordinator
from olingo.experience_maker import BufferItem, Experience
from olingo.experience_maker.experience import experience_info, make_experience_batch, split_experience_batch
from olingo.ray.detached_replay_buffer import DetachedReplayBuffer
from olingo.ray.maker_pool import MakerError, MakerPool
from olingo.ray.worker import setup_worker_logging
from olingo.trainer.callbacks import Callback, LoopState, ManifestRow, dispatch
from olingo.trainer.checkpoint import CheckpointManager
from olingo.trainer.interrupt import TrainingInterrupted
from olingo.trainer.learner import learn_step
from olingo.trainer.loop import is_due, loop_scope
from olingo.trainer.loop_support import callback_states, default_callbacks, restore_callback_states
from olingo.trainer.rl_support import load_policy_extras, save_policy_extras

__all__ = ["TRAINER_CONCURRENCY", "DetachedTrainer", "MakerError", "micro_batches", "raise_if_interrupted"]  # MakerError: olingo.ray.maker_pool's, re-exported

logger = logging.getLogger("olingo.ray")
TRAINER_CONCURRENCY = {"buffer_length": 1, "buffer_append": 1, "buffer_sample": 1, "compute": 1}  # what a subclass's @ray.remote names


def raise_if_interrupted(summary: dict[str, Any]) -> None:
    """At the driver, after `fit`: a run stopped by `request_stop` raises `TrainingInterrupted`
    (the CLI prints the resume command and exits 128 + signal)."""
    stop = summary.get("interrupted")
    if stop:
        raise TrainingInterrupted(stop["signum"], stop["step"], Path(stop["checkpoint"]) if stop["checkpoint"] else None)


def micro_batches(experience: Experience, size: int | None, pad_token_id: int) -> list[Experience]:
    """`experience` in consecutive micro-batches of `size` rows (None: the whole batch)."""
    if size is None or size >= experience.batch_size:
        return [experience]
    items = split_experience_batch(experience)
    return [make_experience_batch(items[i : i + size], pad_token_id) for i in range(0, len(items), size)]


class DetachedTrainer(ABC):
    """Base of Ray trainer actors; subclass, implement the two abstract methods, wrap with
    `@ray.remote(concurrency_groups={"buffer_length": 1, "buffer_append": 1, "buffer_sample": 1,
    "compute": 1})` and create it with `.options(name=...).remote(...)`.

    Args (ColossalChat's six, docs/coming-from-colossalchat.md, then keyword-only extras):
        experience_maker_holder_name_list: names of the `ExperienceMakerHolder` actors.
        train_batch_size: rollouts per training batch.
        buffer_limit: batches the buffer holds before makers must wait (0: no limit).
        dataloader_pin_memory: pin batches in page-locked memory before moving them to the GPU.
        callbacks: `Callback`s; the trainer fires the fit/episode/epoch/batch/update and loop hooks.
        debug: log every buffer and sync operation.
        max_staleness: drop batches made more than this many weight syncs ago (None: keep all).
        call_timeout_s: limit of every remote call (weight sync, stop, length queries).
        experience_timeout_s: longest wait for the next batch before `fit` fails.
        max_maker_restarts: maker deaths survived in one `fit` (Ray restarts the actor).
        pad_token_id: padding id used when batching rollouts.
        log_dir, use_wandb, show_progress: default loggers (metrics.jsonl, TensorBoard, W&B, bar).
        save_dir, save_interval: checkpoints under `save_dir/checkpoints` every N steps and at the end.
    """

    # set by the learner-backed trainers (PPO, GRPO); a bare subclass leaves them None
    learner: Any = None  # save(directory) / load(directory): its models, optimizers and schedulers
    tokenizer: Any = None  # saved next to the actor in checkpoints
    temperature: float | None = None  # log-probs are computed at it: every maker must sample at it
    micro_batch_size: int | None = None  # rows per forward/backward of a training step (None: the whole batch)

    def __init__(
        self,
        experience_maker_holder_name_list: list[str],
        train_batch_size: int = 8,
        buffer_limit: int = 0,
        dataloader_pin_memory: bool = True,
        callbacks: Sequence[Callback] = (),
        debug: bool = False,
        *,
        max_staleness: int | None = None,
        call_timeout_s: float = 300.0,
        experience_timeout_s: float = 600.0,
        max_maker_restarts: int = 3,
        pad_token_id: int = 0,
        log_dir: str | None = None,
        use_wandb: bool = False,
        show_progress: bool = False,
        save_dir: str | None = None,
        save_interval: int = 0,
    ) -> None:
        setup_worker_logging()
        if not experience_maker_holder_name_list:
            raise ValueError("experience_maker_holder_name_list is empty: name at least one ExperienceMakerHolder actor")
        self.maker_pool = MakerPool(experience_maker_holder_name_list, call_timeout_s, max_maker_restarts)
        self.detached_replay_buffer = DetachedReplayBuffer(train_batch_size, buffer_limit, pad_token_id)
        self.dataloader_pin_memory = dataloader_pin_memory
        self.callbacks: list[Callback] = list(callbacks)
        self._debug = debug
        self.max_staleness = max_staleness
        self.experience_timeout_s = experience_timeout_s  # call_timeout_s and max_maker_restarts: the pool's
        self.log_dir = Path(log_dir) if log_dir else None
        self.use_wandb, self.show_progress = use_wandb, show_progress
        self.save_dir = Path(save_dir) if save_dir else None
        self.save_interval = save_interval
        self.device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        self.state = LoopState()
        self.start_episode = 0
        self.policy_version = 0
        self._maker_info: dict[str, float] = {}  # what the makers measured of the batches received lately (`take_info`)
        self.sync_steps: list[int] = []  # the step of every full weight sync, oldest first
        self.run_config: dict[str, Any] | None = None
        self.summary: dict[str, Any] = {}
        self._sync_metrics: dict[str, float] = {}
        self._last_wait_s = 0.0
        self._saved_rows: list[ManifestRow] = []
        self._last_saved_step = 0
        self._defaults_installed = False
        self._pending_callback_states: dict[str, Any] = {}  # from a checkpoint, given back at fit
        self._maker_states: list[dict[str, Any]] = []  # from a checkpoint, restored into the makers at the first sync
        self._stop_signal: int | None = None  # set by `request_stop`, honoured at the next episode boundary

    @property
    def target_holder_name_list(self) -> list[str]:
        """The makers' actor names (ColossalChat's attribute; `maker_pool.names`)."""
        return self.maker_pool.names

    @property
    def target_holder_list(self) -> list[Any]:
        """The makers' handles in the order of their names, once `fit` connected (`maker_pool.handles`)."""
        return self.maker_pool.handles

    # ---- what a concrete trainer supplies ------------------------------------------------
    def training_step(self, experience: Experience) -> dict[str, Any]:
        """One optimizer step on one buffer batch: the learn step local training runs
        (`olingo.trainer.learner.learn_step`), the batch split into micro-batches of
        `micro_batch_size` rows whose losses are shares of the whole step. A trainer that is
        not learner-backed overrides this."""
        if self.learner is None:
            raise NotImplementedError(f"{type(self).__name__} has no learner: implement training_step")
        self.learner.train()
        group = [mb.to_device(self.device) for mb in micro_batches(experience, self.micro_batch_size, self.detached_replay_buffer.pad_token_id)]
        return learn_step(self.learner, group, self.temperature)

    @abstractmethod
    def _update_remote_makers(self, fully_update: bool = False, **kwargs: Any) -> None:
        """Push the current weights to the makers and wait until they loaded them.

        kwargs: `policy_version` (int) to hand to the makers with the weights, and optionally
        `makers` (a list of maker handles; default: all of `self.target_holder_list`).
        """

    def _write_checkpoint(self, directory: Path) -> None:
        """What local training writes (the learner's files, the tokenizer beside the actor, RNG,
        `trainer_state.json`), with this actor's counters and its makers' states."""
        if self.learner is None:
            raise NotImplementedError(f"{type(self).__name__} does not write checkpoints; implement _write_checkpoint or leave save_dir unset")
        self.learner.save(directory)
        makers = self.maker_pool.state_dicts()
        state = {
            "step": self.state.step, "episode": self.start_episode, "policy_version": self.policy_version, "sync_steps": self.sync_steps,
            "makers": makers,  # in the order of experience_maker_holder_name_list
            "callbacks": callback_states(self.callbacks),
        }
        save_policy_extras(directory, self.tokenizer, DistCoordinator(), state)

    # ---- public API --------------------------------------------------------------------------
    @ray.method(concurrency_group="compute")
    def fit(self, total_steps: int, update_steps: int, train_epochs: int = 1, *, initial_eval: dict[str, float] | None = None) -> dict[str, Any]:
        """Train `total_steps // update_steps` episodes; see the module docstring. Returns the
        run summary: steps, episodes, the makers' counts and what was left unused.

        `initial_eval`: metrics of the starting policy (`eval/...`), logged as the step-0
        evaluation right after `on_train_start`, so a run killed later keeps that row.
        """
        if update_steps < 1 or total_steps < update_steps or train_epochs < 1:
            raise ValueError(f"need total_steps >= update_steps >= 1 and train_epochs >= 1, got {total_steps}, {update_steps}, {train_epochs}")
        num_episodes = total_steps // update_steps
        if self.detached_replay_buffer.closed:  # a second fit on this actor starts with an open buffer
            old = self.detached_replay_buffer
            self.detached_replay_buffer = DetachedReplayBuffer(old.sample_batch_size, old.limit, old.pad_token_id)
        state = self.state
        state.num_steps = num_episodes * update_steps * train_epochs
        self._install_default_callbacks()
        try:
            with loop_scope(state, self.callbacks, self.save_dir, self._saved_rows, fit_hooks=True, stop_at="episode"):
                if initial_eval is not None:
                    dispatch(self.callbacks, "on_eval", state, state.step, "eval", initial_eval)
                try:
                    self._connect_makers()
                    self._sync(fully_update=True)
                    self.maker_pool.start_loops()
                    for episode in range(self.start_episode, num_episodes):
                        state.epoch = episode
                        self._run_episode(episode, update_steps, train_epochs)
                        self.start_episode = episode + 1
                        stopping = self._stop_at_boundary()
                        if stopping or is_due(self.save_interval, self._last_saved_step, state.step):
                            self._save_checkpoint(f"step_{state.step}")
                        if stopping or state.stop_requested:
                            break
                    if not state.extra.get("stop_signal"):  # a stop wrote its `step_<N>` checkpoint
                        self._save_checkpoint("final")
                finally:
                    self._stop_makers()
        except TrainingInterrupted as stop:  # an actor cannot exit 130: the driver raises it again
            checkpoint = str(stop.checkpoint) if stop.checkpoint else None
            self.summary["interrupted"] = {"signum": stop.signum, "step": stop.step, "checkpoint": checkpoint}
        return self.summary

    @ray.method(concurrency_group="buffer_length")
    def request_stop(self, signum: int = int(signal.SIGTERM)) -> None:
        """Stop at the end of the episode in flight with a `step_<N>` checkpoint (the driver
        forwards its Ctrl-C/SIGTERM here; see the module docstring)."""
        logger.warning("[trainer] %s: stopping at the end of the current episode and writing a checkpoint", signal.Signals(signum).name)
        self._stop_signal = signum

    def _stop_at_boundary(self) -> bool:
        """At an episode boundary: whether a stop was requested; it ends the loop (`step_<N>`)."""
        if self._stop_signal is None:
            return False
        self.state.extra["stop_signal"] = self._stop_signal
        self.state.request_stop()
        return True

    def sync_models_to_remote_makers(self, **kwargs: Any) -> None:
        """Push the full current weights to every maker (or to `makers=[...]`) now."""
        if not self.target_holder_list:
            self._connect_makers()
        self._sync(fully_update=True, **kwargs)

    def load_checkpoint(self, directory: str) -> int:
        """Restore a learner-backed trainer: the learner's models, optimizers and schedulers, RNG
        and counters; the makers get their own state (prompt position; PPO's KL controller and
        reward statistics) when `fit` connects to them. Returns the restored step."""
        if self.learner is None:
            raise NotImplementedError(f"{type(self).__name__} has no learner to restore; implement load_checkpoint")
        return self._load_trainer_state(Path(directory), self.learner.load)

    @ray.method(concurrency_group="buffer_length")
    def buffer_get_length(self) -> int:
        """Whole training batches waiting in the buffer (makers use it to pick a trainer)."""
        return self.detached_replay_buffer.get_length()

    @ray.method(concurrency_group="buffer_append")
    def buffer_append(self, experience: Experience) -> str:
        """A maker pushes a batch: "accepted", "full" (retry later) or "closed" (training ended)."""
        status = self.detached_replay_buffer.append(experience)  # keeps the batch's `info` apart (`take_info`)
        if self._debug:
            logger.info("[trainer] buffer_append of %d rollouts: %s", experience.batch_size, status)
        return status

    @ray.method(concurrency_group="buffer_append")
    def buffer_extend(self, items: list[BufferItem]) -> str:
        """A maker pushes unpadded rollouts; same answers as `buffer_append`."""
        return self.detached_replay_buffer.extend(items)

    @ray.method(concurrency_group="buffer_sample")
    def _buffer_sample(self) -> Experience:
        """The next training batch, waiting for the makers as long as `experience_timeout_s`."""
        return self._next_experience()

    # ---- the loop ---------------------------------------------------------------------------
    def _run_episode(self, episode: int, update_steps: int, train_epochs: int) -> None:
        dispatch(self.callbacks, "on_episode_start", episode)
        try:
            data: list[Experience] = []  # epoch 0 pulls from the buffer, later epochs reuse it
            for epoch in range(train_epochs):
                dispatch(self.callbacks, "on_learn_epoch_start", epoch)
                order = range(update_steps) if epoch == 0 else random.sample(range(len(data)), len(data))
                for index in order:
                    if epoch == 0:
                        data.append(self._next_experience())
                    self._train_batch(data[index])
                    if self.state.stop_requested:
                        break
                dispatch(self.callbacks, "on_learn_epoch_end", epoch)
                if self.state.stop_requested:
                    break
            self._sync()
        finally:
            dispatch(self.callbacks, "on_episode_end", episode)

    def _train_batch(self, experience: Experience) -> None:
        dispatch(self.callbacks, "on_learn_batch_start")
        start = time.perf_counter()
        if self.dataloader_pin_memory and self.device.type == "cuda":
            experience = experience.pin_memory()
        metrics = {k: float(v) for k, v in self.training_step(experience.to_device(self.device)).items()}
        metrics["time/learn"] = time.perf_counter() - start
        dispatch(self.callbacks, "on_learn_batch_end", experience)
        self.state.step += 1
        metrics.update(self._ray_metrics(experience))
        dispatch(self.callbacks, "on_step_end", self.state, self.state.step, experience, metrics)

    def _ray_metrics(self, experience: Experience) -> dict[str, float]:
        counts = self.detached_replay_buffer.counts
        # What the makers measured of the batches pushed since the last step (the latest such
        # mean when none came): episode metrics, reward terms, a vLLM maker's engine/trainer gap,
        # as a local run logs them; the statistics of the rows trained on replace the makers' own.
        self._maker_info = self.detached_replay_buffer.take_info() or self._maker_info
        metrics = {f"rollout/{k}": v for k, v in {**self._maker_info, **experience_info(experience)}.items()}
        metrics.update({
            "ray/staleness": float(sum(s > experience.policy_version for s in self.sync_steps)),
            "ray/buffer_batches": float(self.detached_replay_buffer.get_length()),
            "ray/dropped_stale": float(counts.dropped_stale),
            "ray/wait_s": self._last_wait_s,
            "ray/maker_restarts": float(self.maker_pool.restarts),
        })
        metrics.update(self._sync_metrics)
        return metrics

    def _min_version(self) -> int | None:
        """Oldest policy version still fresh enough: the sync `max_staleness` syncs ago."""
        if self.max_staleness is None or len(self.sync_steps) <= self.max_staleness:
            return None
        return self.sync_steps[-1 - self.max_staleness]

    def _next_experience(self) -> Experience:
        """The next fresh batch; meanwhile watch the makers (errors, deaths) and the deadline."""
        start = time.monotonic()
        while True:
            batch = self.detached_replay_buffer.sample(timeout=0.2, min_version=self._min_version())
            if batch is not None:
                self._last_wait_s = time.monotonic() - start
                return batch
            self._check_makers()
            if time.monotonic() - start > self.experience_timeout_s:
                raise TimeoutError(
                    f"no experience arrived for {self.experience_timeout_s:.0f}s from makers {self.target_holder_name_list} "
                    f"(buffer counts: {vars(self.detached_replay_buffer.counts)}); raise experience_timeout_s if generation is this slow"
                )

    # ---- makers: connect, sync, watch, restart, stop (the remote side is `self.maker_pool`) --------
    def _connect_makers(self) -> None:
        """Resolve the makers by name; a learner-backed trainer checks their sampling temperature."""
        self.maker_pool.connect()
        if self.temperature is not None:
            self.maker_pool.check_temperature(self.temperature, type(self).__name__)

    def _sync(self, fully_update: bool = False, **kwargs: Any) -> None:
        """Weights to the makers, between the update hooks; a sync to all makers is a new version.

        A maker that dies during the sync is restarted (by Ray) and synced on its own, so every
        live maker holds the new weights when this returns.
        """
        to_all = "makers" not in kwargs
        version = self.state.step if to_all else self.policy_version
        dispatch(self.callbacks, "on_update_start")
        try:
            self._update_remote_makers(fully_update=fully_update, policy_version=version, **kwargs)
        except RayActorError:  # a maker died: each maker on its own, a dead one restarted
            self.maker_pool.update_each(
                kwargs.get("makers") or self.target_holder_list,
                lambda makers: self._update_remote_makers(fully_update=True, policy_version=version, makers=makers),
                lambda name: self._restart_maker(name, version),
            )
        dispatch(self.callbacks, "on_update_end")
        if to_all:
            self.policy_version = version
            if not self.sync_steps or self.sync_steps[-1] != version:
                self.sync_steps.append(version)
        if self._debug:
            logger.info("[trainer] weights of step %d pushed to %s", version, "all makers" if to_all else len(kwargs["makers"]))
        if self._maker_states and to_all:  # the first sync after a resume: the makers' states from the checkpoint
            states, self._maker_states = self._maker_states, []
            self.maker_pool.load_state_dicts(states)

    def _check_makers(self) -> None:
        """React to working loops that ended: errors fail `fit`, deaths restart the maker."""
        self.maker_pool.check_loops(self._record_maker_summary, self._restart_maker)
        if not self.maker_pool.loops and self.detached_replay_buffer.get_length() == 0:
            raise RuntimeError(f"every experience maker has stopped before training ended: {self.summary.get('makers')}")

    def _record_maker_summary(self, name: str, summary: dict[str, Any]) -> None:
        """A maker whose loop finished its own step budget: its counts go into the run summary."""
        self.summary.setdefault("makers", {})[name] = summary

    def _restart_maker(self, name: str, version: int | None = None) -> None:
        """A dead maker: wait for Ray to restart it, give it the weights of `version` (default:
        the current policy) and, while training runs, its working loop back."""
        version = self.policy_version if version is None else version
        self.maker_pool.restart(name, lambda maker: self._update_remote_makers(fully_update=True, policy_version=version, makers=[maker]))

    def _stop_makers(self) -> None:
        """Close the buffer, tell every maker to stop, wait for the loops and count leftovers."""
        leftover = self.detached_replay_buffer.close()
        makers = self.summary.setdefault("makers", {})
        makers.update(self.maker_pool.stop())
        counts = self.detached_replay_buffer.counts
        self.summary.update({
            "steps": self.state.step,
            "episodes": self.start_episode,
            "policy_version": self.policy_version,
            "maker_restarts": self.maker_pool.restarts,
            "buffer": vars(counts),
            "leftover_rollouts": leftover,
        })
        discarded = sum(m.get("discarded", 0) for m in makers.values())
        logger.info(
            "ray run ended at step %d: %d rollouts received, %d trained on, %d dropped as stale, "
            "%d left in the buffer unused, %d made after training ended and discarded by the makers",
            self.state.step, counts.received, counts.sampled, counts.dropped_stale, leftover, discarded,
        )

    # ---- callbacks and checkpoints ------------------------------------------------------------
    def _install_default_callbacks(self) -> None:
        self.state.output_dir, self.state.config = self.log_dir, self.run_config
        if not self._defaults_installed:
            self._defaults_installed = True
            self.callbacks[:0] = default_callbacks(self.log_dir, self.use_wandb, self.show_progress)
        restore_callback_states(self.callbacks, self._pending_callback_states)
        self._pending_callback_states = {}

    def _save_checkpoint(self, name: str) -> None:
        self._last_saved_step = self.state.step
        if self.save_dir is None:
            return
        row = CheckpointManager(self.save_dir).save(name, self.state.step, self.start_episode, 0, self._write_checkpoint)
        self._saved_rows.append(row)
        dispatch(self.callbacks, "on_checkpoint", self.state, row)

    # ---- helpers of the learner-backed trainers (PPO, GRPO) -------------------------------------
    def _push_weights(self, makers: list[Any], actor: torch.nn.Module, critic: torch.nn.Module | None, policy_version: int) -> None:
        """The actor's (and critic's) weights to `makers` through the object store, once
        (`MakerPool.push_weights`); its `perf/weight_sync_*` metrics go into the next steps' rows."""
        self._sync_metrics = self.maker_pool.push_weights(makers, actor, critic, policy_version)

    def _load_trainer_state(self, directory: Path, load_models: Callable[[Path], None]) -> int:
        """Restore models (`load_models`), RNG and counters; the makers get their own state when
        `fit` connects to them, the callbacks theirs when it installs them. Returns the step."""
        load_models(directory)
        trainer_state = load_policy_extras(directory, DistCoordinator())
        self.state.step = self._last_saved_step = trainer_state["step"]
        self.start_episode = trainer_state["episode"]
        self.policy_version, self.sync_steps = trainer_state["policy_version"], trainer_state["sync_steps"]
        self._maker_states = trainer_state["makers"]
        self._pending_callback_states = trainer_state.get("callbacks", {})
        return self.state.step
