"""`GRPOTrainer`: the GRPO family with ColossalChat's constructor, as one configuration of
`OnlineTrainer` (GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++; docs/algorithms.md).

Critic-free RL with groups of responses (Shao et al. 2024; Yu et al. 2025) is the online loop of
`OnlineTrainer` with a `GRPOLearner` (the actor alone; the loss normalised over the whole
optimizer step) and a `GroupExperienceMaker` (G responses per prompt, group advantages, dynamic
sampling, the overlong penalty). No critic exists anywhere; with kl_coef 0 no reference model
either. When every batch is learnt in a single optimizer step, pi_old is the current policy: its
log-probs are never computed and the ratio is exactly 1. This class only converts its keyword
signature (docs/coming-from-colossalchat.md) into those typed parts, once
(`olingo.trainer.keywords`); `olingo grpo` builds the same parts from its config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from olingo.booster import Booster, OptimizerWrapper
from olingo.cluster import DistCoordinator
from olingo.engines import RolloutEngine
from olingo.experience_maker.group import GroupExperienceConfig, GroupExperienceMaker
from olingo.trainer.callbacks import Callback
from olingo.trainer.grpo_learner import GRPOLearner, GRPOLossConfig
from olingo.trainer.keywords import generation_settings, loop_section, merge_keywords
from olingo.trainer.online_trainer import OnlineTrainer

UNSUPPORTED = {  # compatibility keywords olingo does not implement: set, they fail early
    "use_tp": "tensor parallelism is not available in olingo; use the DDP or FSDP2 plugin",
    "use_tts_inference": "test-time-scaling inference is not part of olingo's GRPO",
    "tts_config": "test-time-scaling inference is not part of olingo's GRPO",
    "temperature_annealing_config": "temperature annealing is not implemented; set generation.temperature",
}


def refuse_unsupported(given: dict[str, Any], vf_coef: float, value_clip: float) -> None:
    """The keywords of ColossalChat's signature that olingo's GRPO does not take, when set."""
    for name, value in given.items():
        if value:
            raise ValueError(f"{name}={value!r}: {UNSUPPORTED[name]}")
    if vf_coef != 1.0 or value_clip != 0.2:
        raise ValueError("vf_coef and value_clip are critic settings and GRPO trains no critic; leave them at their defaults")


class GRPOTrainer(OnlineTrainer):
    """The GRPO family: one policy, no critic, group-relative advantages (Shao et al. 2024).

    ColossalChat-compatible signature, with the keywords that fail early: see
    docs/coming-from-colossalchat.md. `num_generation` is G (`num_generations` of the experience
    section). `initial_model` may be None when kl_coef is 0. `eps_clip` sets both clip bounds.
    `**generate_kwargs` are rollout settings (`GenerationSettings`). Keyword-only extras:
    `experience_config` (`GroupExperienceConfig`) and `loss_config` (`GRPOLossConfig`): a keyword
    left at its default defers to them, and one that disagrees with a field they set is an error.
    `engine`, `eval_interval`, `eval_before_training`, `accuracy_fn`, `eval_generate_kwargs`, `packing` as for
    `PPOTrainer`.
    """

    def __init__(
        self, actor_booster: Booster, actor: PreTrainedModel, reward_model: Any, initial_model: PreTrainedModel | None, actor_optim: OptimizerWrapper,
        actor_lr_scheduler: Any, tokenizer: PreTrainedTokenizerBase, kl_coef: float = 0.1, ptx_coef: float = 0.9, train_batch_size: int = 8,
        buffer_limit: int = 0, buffer_cpu_offload: bool = True, eps_clip: float = 0.2, vf_coef: float = 1.0, value_clip: float = 0.2,
        sample_buffer: bool = False, dataloader_pin_memory: bool = True, offload_inference_models: bool = True, apply_loss_mask: bool = True,
        accumulation_steps: int = 1, save_interval: int = 0, save_dir: str | None = None, use_tp: bool = False, num_generation: int = 8,
        inference_batch_size: int | None = None, logits_forward_batch_size: int | None = None, use_tts_inference: bool = False,
        temperature_annealing_config: dict | None = None, tts_config: dict | None = None, coordinator: DistCoordinator | None = None,
        callbacks: Sequence[Callback] = (), *, experience_config: GroupExperienceConfig | None = None, loss_config: GRPOLossConfig | None = None,
        engine: RolloutEngine | None = None, eval_interval: int = 0, eval_before_training: bool = True, accuracy_fn: Callable[..., Any] | None = None,
        eval_generate_kwargs: dict[str, Any] | None = None, packing: bool = True, **generate_kwargs: Any,
    ) -> None:
        refuse_unsupported({"use_tp": use_tp, "use_tts_inference": use_tts_inference, "tts_config": tts_config,
                            "temperature_annealing_config": temperature_annealing_config}, vf_coef, value_clip)
        loop = loop_section(train_batch_size, buffer_limit, buffer_cpu_offload, sample_buffer, dataloader_pin_memory, offload_inference_models,
                            accumulation_steps, save_interval, eval_interval, eval_before_training)
        experience = merge_keywords(GroupExperienceConfig, experience_config, "experience_config", {
            "kl_coef": (kl_coef, 0.1), "num_generations": (num_generation, 8), "inference_batch_size": (inference_batch_size, None),
            "logits_forward_batch_size": (logits_forward_batch_size, None),
        })
        loss = merge_keywords(
            GRPOLossConfig, loss_config, "loss_config", {"ptx_coef": (ptx_coef, 0.9), "eps_low": (eps_clip, 0.2), "eps_high": (eps_clip, 0.2)}
        )
        generation, eval_generation = generation_settings(generate_kwargs, eval_generate_kwargs)
        maker = GroupExperienceMaker(actor_booster.unwrap(actor), reward_model, initial_model, tokenizer, config=experience, generation=generation,
                                     engine=engine, all_reduce_sum=actor_booster.plugin.all_reduce_sum, packing=packing)
        learner = GRPOLearner.build(actor_booster, actor, actor_optim, actor_lr_scheduler, loss, experience, generation, apply_loss_mask=apply_loss_mask,
                                     packing=packing)
        super().__init__(actor_booster, learner, maker, tokenizer, loop, save_dir=save_dir, callbacks=callbacks, coordinator=coordinator,
                         inference_models=(maker.reference, reward_model), accuracy_fn=accuracy_fn, eval_generation=eval_generation)
        self.reward_model, self.initial_model = reward_model, maker.reference
        self.actor_optim, self.actor_scheduler = actor_optim, actor_lr_scheduler

    @property
    def config(self) -> GroupExperienceConfig:
        return self.experience_maker.config
