"""`DetachedPPOTrainer`: PPO's learn phase as a Ray actor, fed by `ExperienceMakerHolder`s.

Per batch popped from the buffer it runs exactly the update of single-process PPO
(`PPOLearner`: clipped policy loss and clipped value loss, one optimizer step each); after every
episode the actor and critic weights go to the makers through the object store: one `ray.put`
per model, however many makers load it. `perf/weight_sync_s` and `perf/weight_sync_gbps`
(bytes of both models times makers, per second of the whole sync) are logged with every step.
Under LoRA only the adapters and the critic's value head are sent (`olingo.ray.weights`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
import torch

from olingo.booster import Booster, SingleProcessPlugin
from olingo.experience_maker import Experience
from olingo.ray.detached_trainer_base import DetachedTrainer
from olingo.ray.weights import state_dict_for_sync, state_dict_nbytes
from olingo.trainer._support import callback_states, restore_callback_states
from olingo.trainer.callbacks import Callback
from olingo.trainer.ppo_learner import PPOLearner, PPOLossConfig
from olingo.trainer.utils import rng_state, set_rng_state

logger = logging.getLogger("olingo.ray")
TRAINER_CONCURRENCY = {"buffer_length": 1, "buffer_append": 1, "buffer_sample": 1, "compute": 1}


def default_optim_fn(actor_lr: float, critic_lr: float) -> Callable[[torch.nn.Module, torch.nn.Module], tuple]:
    """AdamW at constant learning rates for both models (no schedules), over trainable tensors
    only (under LoRA the frozen base stays out of the optimizer)."""

    def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
        return [p for p in model.parameters() if p.requires_grad]

    def build(actor: torch.nn.Module, critic: torch.nn.Module) -> tuple:
        return torch.optim.AdamW(trainable(actor), lr=actor_lr), torch.optim.AdamW(trainable(critic), lr=critic_lr), None, None

    return build


@ray.remote(concurrency_groups=TRAINER_CONCURRENCY)
class DetachedPPOTrainer(DetachedTrainer):
    """PPO trainer actor (coati's `DetachedPPOTrainer`, rebuilt on `PPOLearner`).

    Args (beyond `DetachedTrainer`'s, which pass through `**trainer_kwargs`):
        model_fn: () -> (actor, critic), built inside the actor: the same architectures the
            makers build, since weights are synced by exact key.
        eps_clip, value_clip, vf_coef: PPO loss settings.
        temperature: the makers' sampling temperature (log-probs are compared at it); `fit`
            checks that every maker samples at this temperature.
        optim_fn: (actor, critic) -> (actor_optim, critic_optim, actor_scheduler, critic_scheduler)
            with raw torch optimizers; default AdamW at `actor_lr` / `critic_lr`.
        max_grad_norm: gradient clipping of each model (None: off).
        tokenizer_fn: () -> tokenizer, saved next to the actor in checkpoints.
    """

    def __init__(
        self,
        experience_maker_holder_name_list: list[str],
        model_fn: Callable[[], tuple[torch.nn.Module, torch.nn.Module]],
        train_batch_size: int = 8,
        buffer_limit: int = 0,
        eps_clip: float = 0.2,
        value_clip: float = 0.2,
        dataloader_pin_memory: bool = True,
        callbacks: Sequence[Callback] = (),
        debug: bool = False,
        *,
        vf_coef: float = 1.0,
        temperature: float = 1.0,
        optim_fn: Callable[[torch.nn.Module, torch.nn.Module], tuple] | None = None,
        actor_lr: float = 1e-6,
        critic_lr: float = 1e-5,
        max_grad_norm: float | None = 1.0,
        tokenizer_fn: Callable[[], Any] | None = None,
        seed: int = 0,
        **trainer_kwargs: Any,
    ) -> None:
        super().__init__(experience_maker_holder_name_list, train_batch_size, buffer_limit, dataloader_pin_memory, callbacks, debug, **trainer_kwargs)
        torch.manual_seed(seed)
        actor, critic = model_fn()
        actor_optim, critic_optim, actor_scheduler, critic_scheduler = (optim_fn or default_optim_fn(actor_lr, critic_lr))(actor, critic)
        actor_booster, critic_booster = Booster(SingleProcessPlugin(max_grad_norm)), Booster(SingleProcessPlugin(max_grad_norm))
        actor, actor_optim, _, _, actor_scheduler = actor_booster.boost(actor, actor_optim, lr_scheduler=actor_scheduler)
        critic, critic_optim, _, _, critic_scheduler = critic_booster.boost(critic, critic_optim, lr_scheduler=critic_scheduler)
        self.learner = PPOLearner.build(
            actor_booster, critic_booster, actor, critic, actor_optim, critic_optim, actor_scheduler, critic_scheduler,
            PPOLossConfig(eps_clip=eps_clip, value_clip=value_clip, vf_coef=vf_coef),
        )
        self.device = self.learner.device
        self.temperature = temperature
        self.tokenizer = tokenizer_fn() if tokenizer_fn is not None else None
        self._pending_callback_states: dict[str, Any] = {}
        self._maker_states: list[dict[str, Any]] = []  # restored into the makers at the first sync

    def training_step(self, experience: Experience) -> dict[str, Any]:
        """One PPO update (policy and value losses, one optimizer step) on one batch."""
        self.learner.train()
        stats = self.learner.training_step(experience, 1.0, self.temperature)
        return self.learner.optimizer_step(stats)

    def _update_remote_makers(self, fully_update: bool = False, **kwargs: Any) -> None:
        """Both models into the object store once; every maker loads them (strict keys)."""
        makers = kwargs.get("makers") or self.target_holder_list
        start = time.perf_counter()
        actor = state_dict_for_sync(self.learner.policy.booster.unwrap(self.learner.actor))
        critic = state_dict_for_sync(self.learner.critic_learner.booster.unwrap(self.learner.critic))
        nbytes = state_dict_nbytes(actor) + state_dict_nbytes(critic)
        actor_ref, critic_ref = ray.put(actor), ray.put(critic)
        calls = [m.update_experience_maker.remote(actor_ref, critic_ref, policy_version=kwargs["policy_version"], fully_update=True) for m in makers]
        self._get(calls, "weight sync")
        seconds = time.perf_counter() - start
        logger.info("[trainer] weight sync: %.3f MB (%d actor + %d critic tensors) to %d makers in %.2fs", nbytes / 1e6, len(actor), len(critic), len(makers), seconds)
        self._sync_metrics = {
            "perf/weight_sync_s": seconds,
            "perf/weight_sync_gbps": nbytes * len(makers) / max(seconds, 1e-9) / 1e9,
            "perf/weight_sync_mb": nbytes / 1e6,
            "perf/weight_sync_tensors": float(len(actor) + len(critic)),
        }

    def _connect_makers(self) -> None:
        super()._connect_makers()
        settings = self._get([m.generation_settings.remote() for m in self.target_holder_list], "reading the makers' sampling settings")
        for name, got in zip(self.target_holder_name_list, settings, strict=True):
            if abs(got["temperature_for_log_probs"] - self.temperature) > 1e-9:
                raise ValueError(
                    f"maker '{name}' samples at temperature {got['temperature_for_log_probs']} but the trainer computes "
                    f"log-probs at {self.temperature}: pass the makers' temperature to DetachedPPOTrainer(temperature=...)"
                )

    # ---- checkpoints ------------------------------------------------------------------------------
    def _write_checkpoint(self, directory: Path) -> None:
        self.learner.save(directory)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(directory / "actor"))
        torch.save(rng_state(), directory / "rng_rank0.pt")
        makers = self._get([m.state_dict.remote() for m in self.target_holder_list], "reading the makers' state")
        state = {
            "step": self.state.step,
            "episode": self.start_episode,
            "policy_version": self.policy_version,
            "sync_steps": self.sync_steps,
            "makers": makers,  # in the order of experience_maker_holder_name_list
            "callbacks": callback_states(self.callbacks),
        }
        (directory / "trainer_state.json").write_text(json.dumps(state, indent=2))

    def load_checkpoint(self, directory: str) -> int:
        """Restore models, optimizers, schedulers, RNG and counters; the makers get their own
        state (KL controller, reward statistics, prompt position) when `fit` connects to them.
        Returns the restored step."""
        directory = Path(directory)
        trainer_state = json.loads((directory / "trainer_state.json").read_text())
        self.learner.load(directory)
        set_rng_state(torch.load(directory / "rng_rank0.pt", weights_only=False))
        self.state.step = self._last_saved_step = trainer_state["step"]
        self.start_episode = trainer_state["episode"]
        self.policy_version, self.sync_steps = trainer_state["policy_version"], trainer_state["sync_steps"]
        self._maker_states = trainer_state["makers"]
        self._pending_callback_states = trainer_state.get("callbacks", {})
        return self.state.step

    def _install_default_callbacks(self) -> None:
        super()._install_default_callbacks()
        restore_callback_states(self.callbacks, self._pending_callback_states)
        self._pending_callback_states = {}

    def _sync(self, fully_update: bool = False, **kwargs: Any) -> None:
        super()._sync(fully_update, **kwargs)
        if self._maker_states and "makers" not in kwargs:  # the first sync after a resume
            states, self._maker_states = self._maker_states, []
            if len(states) != len(self.target_holder_list):
                logger.warning("checkpoint holds %d makers' states, this run has %d makers: makers start fresh", len(states), len(self.target_holder_list))
                return
            self._get([m.load_state_dict.remote(s) for m, s in zip(self.target_holder_list, states, strict=True)], "restoring the makers' state")
