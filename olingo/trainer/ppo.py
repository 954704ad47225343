"""`PPOTrainer`: PPO with ColossalChat's constructor, as one configuration of `OnlineTrainer`.

PPO for RLHF (Ouyang et al. 2022; Schulman et al. 2017) is the online loop of `OnlineTrainer`
with a `PPOLearner` (actor and critic: clipped policy loss plus ptx, clipped value loss) and a
`PPOExperienceMaker` (critic values, the KL to the reference in the per-token reward, GAE). This
class only converts its keyword signature (docs/coming-from-colossalchat.md) into those typed
parts, once (`olingo.trainer.keywords`); `olingo ppo` builds the same parts from its config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from olingo.booster import Booster, OptimizerWrapper
from olingo.cluster import DistCoordinator
from olingo.engines import RolloutEngine
from olingo.experience_maker import ExperienceConfig, PPOExperienceMaker, RewardShaping
from olingo.trainer.callbacks import Callback
from olingo.trainer.keywords import generation_settings, loop_section, merge_keywords
from olingo.trainer.online_trainer import OnlineTrainer
from olingo.trainer.ppo_learner import PPOLearner, PPOLossConfig


class PPOTrainer(OnlineTrainer):
    """PPO: an actor and a critic learn from scored rollouts (Schulman et al. 2017).

    ColossalChat-compatible signature: see docs/coming-from-colossalchat.md. `**generate_kwargs` are
    rollout settings (`GenerationSettings`); unknown ones are errors. Keyword-only extras:
    `experience_config` (`ExperienceConfig`; the `kl_coef` keyword fills its coefficient and must
    agree with one it sets), `reward_shaping` (`RewardShaping`), `engine` (the `RolloutEngine`;
    default transformers `generate` on the actor), `tis_cap`, `eval_interval`,
    `eval_before_training`, `accuracy_fn` and `eval_generate_kwargs` (see `OnlineTrainer`), `packing`
    (every forward over rollouts, scoring and learning, padding-free: `olingo.models.packing`).
    `ptx_coef > 0` needs a `pretrain_dataloader` in `fit` (checked when fit starts).
    """

    def __init__(
        self, actor_booster: Booster, critic_booster: Booster, actor: PreTrainedModel, critic: torch.nn.Module, reward_model: Any,
        initial_model: PreTrainedModel, actor_optim: OptimizerWrapper, critic_optim: OptimizerWrapper, actor_lr_scheduler: Any,
        critic_lr_scheduler: Any, tokenizer: PreTrainedTokenizerBase, kl_coef: float = 0.1, ptx_coef: float = 0.9, train_batch_size: int = 8,
        buffer_limit: int = 0, buffer_cpu_offload: bool = True, eps_clip: float = 0.2, vf_coef: float = 1.0, value_clip: float = 0.2,
        sample_buffer: bool = False, dataloader_pin_memory: bool = True, offload_inference_models: bool = True, apply_loss_mask: bool = True,
        accumulation_steps: int = 1, save_interval: int = 0, save_dir: str | None = None, use_tp: bool = False,
        coordinator: DistCoordinator | None = None, callbacks: Sequence[Callback] = (), *, experience_config: ExperienceConfig | None = None,
        reward_shaping: RewardShaping | None = None, engine: RolloutEngine | None = None, tis_cap: float | None = None, eval_interval: int = 0,
        eval_before_training: bool = True, accuracy_fn: Callable[..., Any] | None = None, eval_generate_kwargs: dict[str, Any] | None = None,
        packing: bool = True, **generate_kwargs: Any,
    ) -> None:
        if use_tp:
            raise ValueError("use_tp=True: tensor parallelism is not available in olingo; use the DDP or FSDP2 plugin")
        loop = loop_section(train_batch_size, buffer_limit, buffer_cpu_offload, sample_buffer, dataloader_pin_memory, offload_inference_models,
                            accumulation_steps, save_interval, eval_interval, eval_before_training)
        loss = PPOLossConfig(eps_clip=eps_clip, value_clip=value_clip, vf_coef=vf_coef, ptx_coef=ptx_coef, tis_cap=tis_cap)
        experience = merge_keywords(ExperienceConfig, experience_config, "experience_config", {"kl_coef": (kl_coef, 0.1)})
        generation, eval_generation = generation_settings(generate_kwargs, eval_generate_kwargs)
        learner = PPOLearner.build(actor_booster, critic_booster, actor, critic, actor_optim, critic_optim, actor_lr_scheduler, critic_lr_scheduler,
                                   loss, apply_loss_mask=apply_loss_mask, packing=packing)
        # Unwrapped: rollouts are forward-only, so DDP's per-forward bookkeeping is not wanted;
        # the plugin's sum over ranks keeps KL, reward statistics and (optionally) whitening global.
        maker = PPOExperienceMaker(
            actor_booster.unwrap(actor), critic_booster.unwrap(critic) if critic is not None else None, reward_model, initial_model, tokenizer,
            config=experience, shaping=reward_shaping, engine=engine, generation=generation, all_reduce_sum=actor_booster.plugin.all_reduce_sum,
            packing=packing,
        )
        super().__init__(actor_booster, learner, maker, tokenizer, loop, save_dir=save_dir, callbacks=callbacks, coordinator=coordinator,
                         inference_models=(initial_model, reward_model), accuracy_fn=accuracy_fn, eval_generation=eval_generation)
        self.critic, self.reward_model, self.initial_model = critic, reward_model, initial_model
        self.actor_optim, self.critic_optim, self.actor_scheduler, self.critic_scheduler = actor_optim, critic_optim, actor_lr_scheduler, critic_lr_scheduler
