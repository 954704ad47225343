"""`DetachedPPOTrainer`: PPO's learn phase as a Ray actor, fed by `ExperienceMakerHolder`s.

Per batch popped from the buffer it runs exactly the update of single-process PPO
(`PPOLearner`: clipped policy loss and clipped value loss, one optimizer step each); after every
episode the actor and critic weights go to the makers through the object store: one `ray.put`
per model, however many makers load it. `perf/weight_sync_s` and `perf/weight_sync_gbps`
(bytes of both models times makers, per second of the whole sync) are logged with every step.
Under LoRA only the adapters and the critic's value head are sent (`olingo.ray.weights`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ray
import torch

from olingo.booster import Booster, SingleProcessPlugin
from olingo.ray.detached_trainer_base import TRAINER_CONCURRENCY, DetachedTrainer
from olingo.trainer.callbacks import Callback
from olingo.trainer.ppo_learner import PPOLearner, PPOLossConfig
from olingo.trainer.utils import adam_kernel


def default_optim_fn(actor_lr: float, critic_lr: float) -> Callable[[torch.nn.Module, torch.nn.Module], tuple]:
    """AdamW (the fused kernel where it applies, as `implementation: auto`) at constant learning
    rates for both models (no schedules), over trainable tensors only (under LoRA the frozen base
    stays out of the optimizer)."""

    def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
        return [p for p in model.parameters() if p.requires_grad]

    def build(actor: torch.nn.Module, critic: torch.nn.Module) -> tuple:
        actor_params, critic_params = trainable(actor), trainable(critic)
        return (torch.optim.AdamW(actor_params, lr=actor_lr, **adam_kernel(actor_params)),
                torch.optim.AdamW(critic_params, lr=critic_lr, **adam_kernel(critic_params)), None, None)

    return build


@ray.remote(concurrency_groups=TRAINER_CONCURRENCY)
class DetachedPPOTrainer(DetachedTrainer):
    """PPO trainer actor: `DetachedTrainer` with `PPOLearner`'s learn step.

    Args (beyond `DetachedTrainer`'s, which pass through `**trainer_kwargs`):
        model_fn: () -> (actor, critic), built inside the actor: the same architectures the
            makers build, since weights are synced by exact key.
        eps_clip, value_clip, vf_coef: PPO loss settings; tis_cap: truncated importance sampling
            of a vLLM maker's rollouts (the makers must carry engine log-probs).
        temperature: the makers' sampling temperature (log-probs are compared at it); `fit`
            checks that every maker samples at this temperature.
        optim_fn: (actor, critic) -> (actor_optim, critic_optim, actor_scheduler, critic_scheduler)
            with raw torch optimizers; default AdamW at `actor_lr` / `critic_lr`.
        max_grad_norm: gradient clipping of each model (None: off).
        tokenizer_fn: () -> tokenizer, saved next to the actor in checkpoints.
        packing: the learn forwards of actor and critic run padding-free (`model.packing`).
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
        tis_cap: float | None = None,
        temperature: float = 1.0,
        optim_fn: Callable[[torch.nn.Module, torch.nn.Module], tuple] | None = None,
        actor_lr: float = 1e-6,
        critic_lr: float = 1e-5,
        max_grad_norm: float | None = 1.0,
        tokenizer_fn: Callable[[], Any] | None = None,
        seed: int = 0,
        packing: bool = True,
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
            PPOLossConfig(eps_clip=eps_clip, value_clip=value_clip, vf_coef=vf_coef, tis_cap=tis_cap), packing=packing,
        )
        self.device = self.learner.device
        self.temperature = temperature
        self.tokenizer = tokenizer_fn() if tokenizer_fn is not None else None

    def _update_remote_makers(self, fully_update: bool = False, **kwargs: Any) -> None:
        """Both models into the object store once; every maker loads them (strict keys)."""
        self._push_weights(
            kwargs.get("makers") or self.target_holder_list, self.learner.policy.booster.unwrap(self.learner.actor),
            self.learner.critic_learner.booster.unwrap(self.learner.critic), kwargs["policy_version"],
        )
