"""`DetachedGRPOTrainer`: the GRPO family's learn phase as a Ray actor, fed by group makers.

The makers (`ExperienceMakerHolder` with `making=GroupMaking(...)`) send whole groups with their
advantages already computed, so the trainer needs no critic and no group structure: per batch
popped from the buffer it takes one optimizer step exactly as single-process `GRPOTrainer`
does, through the same `learn_step` (`DetachedTrainer.training_step`):
    1. split the batch into micro-batches of `micro_batch_size` rollouts (the single-process
       minibatches of one optimizer step; None: the whole batch at once)
    2. count the step's loss units over all of them (`GRPOLearner.step_share`)
    3. forward/backward each micro-batch's share of that step-global loss
    4. clip, optimizer and scheduler step
So `train_batch_size = loop.train_batch_size x loop.accumulation_steps` with
`micro_batch_size = loop.train_batch_size` gives the gradient single-process GRPO takes.
After every episode only the actor's weights go to the makers (under LoRA only its adapters).
Checkpoints hold the actor (HF directory, optimizer, scheduler), RNG and `trainer_state.json`:
nothing of a critic or a reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ray
import torch

from olingo.booster import Booster, SingleProcessPlugin
from olingo.experience_maker.group import GroupExperienceConfig
from olingo.ray.detached_trainer_base import TRAINER_CONCURRENCY, DetachedTrainer
from olingo.trainer.callbacks import Callback
from olingo.trainer.grpo_learner import GRPOLearner, GRPOLossConfig
from olingo.trainer.utils import adam_kernel


def default_grpo_optim_fn(actor_lr: float) -> Callable[[torch.nn.Module], tuple]:
    """AdamW (the fused kernel where it applies, as `implementation: auto`) at a constant learning
    rate over the actor's trainable tensors (no schedule)."""

    def build(actor: torch.nn.Module) -> tuple:
        params = [p for p in actor.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=actor_lr, **adam_kernel(params)), None

    return build


@ray.remote(concurrency_groups=TRAINER_CONCURRENCY)
class DetachedGRPOTrainer(DetachedTrainer):
    """GRPO / Dr. GRPO / DAPO / RLOO / REINFORCE++ trainer actor on `GRPOLearner` (no critic).

    Args (beyond `DetachedTrainer`'s, which pass through `**trainer_kwargs`):
        model_fn: () -> actor, built inside the actor: the architecture the makers build, since
            weights are synced by exact key.
        train_batch_size: rollouts per buffer batch, which is one optimizer step.
        micro_batch_size: rollouts per forward/backward within the step (None: all of them).
        experience_config: the makers' `GroupExperienceConfig`: the KL coefficient, estimator
            and placement the loss needs (the KL is a loss term only with kl_penalty "loss").
        loss_config: `GRPOLossConfig` (clipping, aggregation; ptx_coef must be 0: no pretrain data).
        max_new_tokens: the makers' generation limit (Dr. GRPO's constant normaliser).
        temperature: the makers' sampling temperature (log-probs are compared at it); `fit`
            checks that every maker samples at it.
        optim_fn: actor -> (optimizer, scheduler or None) with a raw torch optimizer; default
            AdamW at `actor_lr`.
        max_grad_norm: gradient clipping (None: off).
        tokenizer_fn: () -> tokenizer, saved next to the actor in checkpoints.
        packing: the learn forwards run padding-free (`model.packing`).
    """

    def __init__(
        self,
        experience_maker_holder_name_list: list[str],
        model_fn: Callable[[], torch.nn.Module],
        train_batch_size: int = 8,
        buffer_limit: int = 0,
        dataloader_pin_memory: bool = True,
        callbacks: Sequence[Callback] = (),
        debug: bool = False,
        *,
        micro_batch_size: int | None = None,
        experience_config: GroupExperienceConfig | None = None,
        loss_config: GRPOLossConfig | None = None,
        max_new_tokens: int | None = None,
        temperature: float = 1.0,
        optim_fn: Callable[[torch.nn.Module], tuple] | None = None,
        actor_lr: float = 1e-6,
        max_grad_norm: float | None = 1.0,
        tokenizer_fn: Callable[[], Any] | None = None,
        seed: int = 0,
        packing: bool = True,
        **trainer_kwargs: Any,
    ) -> None:
        super().__init__(experience_maker_holder_name_list, train_batch_size, buffer_limit, dataloader_pin_memory, callbacks, debug, **trainer_kwargs)
        loss_config, experience_config = loss_config or GRPOLossConfig(), experience_config or GroupExperienceConfig()
        if loss_config.ptx_coef > 0:
            raise ValueError("loss_config.ptx_coef must be 0: the trainer actor has no pretrain data")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or None, got {micro_batch_size}")
        torch.manual_seed(seed)
        actor = model_fn()
        optim, scheduler = (optim_fn or default_grpo_optim_fn(actor_lr))(actor)
        booster = Booster(SingleProcessPlugin(max_grad_norm))
        actor, optim, _, _, scheduler = booster.boost(actor, optim, lr_scheduler=scheduler)
        self.learner = GRPOLearner(
            booster, actor, optim, scheduler, loss_config, kl_coef=experience_config.kl_coef, kl_estimator=experience_config.estimator_name,
            kl_in_loss=experience_config.kl_penalty == "loss", max_length=max_new_tokens,
            packing=packing,
        )
        self.device = self.learner.device
        self.micro_batch_size, self.temperature = micro_batch_size, temperature
        self.tokenizer = tokenizer_fn() if tokenizer_fn is not None else None

    def _update_remote_makers(self, fully_update: bool = False, **kwargs: Any) -> None:
        """The actor's weights (no critic exists) into the object store once; every maker loads them."""
        self._push_weights(kwargs.get("makers") or self.target_holder_list, self.learner.booster.unwrap(self.learner.actor), None, kwargs["policy_version"])
