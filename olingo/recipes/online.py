"""What `olingo ppo` and `olingo grpo` do the same way: load the prompts, build the rollout
engine and its sampling, assemble the `OnlineTrainer` from the parts each recipe built, resume
and fit. The recipes differ only in their models, learner and experience maker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from olingo.dataset import SFTCollator, build_sft_dataset
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.engines import GenerationSettings, HFEngine, RolloutEngine
from olingo.recipes.common import (
    RunSetup,
    build_callbacks,
    build_rollout_engine,
    check_batch_fits,
    check_room_for_text,
    resolve_path,
)
from olingo.recipes.online_config import source_section
from olingo.rewards.functions import reward_function
from olingo.trainer.callbacks import Callback
from olingo.trainer.callbacks.builtin import PerformanceEvaluator
from olingo.trainer.online_trainer import OnlineTrainer


@dataclass
class PromptData:
    """Loaders over validated data: prompts (training and held out) and pretrain rows for ptx."""

    prompts: Any
    eval_prompts: Any | None
    pretrain: Any | None


@dataclass
class Rollouts:
    """How the policy samples: the engine, the rollout's and evaluation's settings."""

    engine: RolloutEngine | None  # None: transformers generate on the trained policy itself
    generation: GenerationSettings
    eval_generation: GenerationSettings


def rollouts(cfg: Any, setup: RunSetup, tokenizer: Any, stop_token_ids: list[int]) -> Rollouts:
    """The `generation:` section as an engine and `GenerationSettings` (evaluation at
    `loop.eval_temperature` when set), responses ending at the policy's stop ids."""
    gen, loop = cfg.generation, cfg.loop
    engine = build_rollout_engine(gen.engine, gen.vllm, cfg.model.actor, tokenizer, setup.plugin.device, cfg.model.gguf_file)
    settings = gen.settings(stop_token_ids)
    eval_settings = gen.settings(stop_token_ids, temperature=loop.eval_temperature) if loop.eval_temperature is not None else settings
    return Rollouts(engine, settings, eval_settings)


def environment_source(cfg: Any, engine: RolloutEngine | None, actor: Any, tokenizer: Any) -> Any:
    """With an `environment:` or an `agent:` named, its source sampling through `engine` (default:
    transformers `generate` on the policy); None for single-turn completions."""
    section = source_section(cfg)
    if section is None:
        return None
    return section.source(
        engine or HFEngine(actor, tokenizer, with_log_probs=getattr(section, "engine_log_probs", False)), tokenizer,
        [*cfg.data.prompts, *cfg.data.eval_prompts],
        split_rows=cfg.model.packing,  # a split's segments need packed forwards
    )


def online_trainer(
    cfg: Any, setup: RunSetup, learner: Any, maker: Any, tokenizer: Any, inference_models: Sequence[Any], eval_generation: GenerationSettings,
    callbacks: Sequence[Callback],
) -> OnlineTrainer:
    """The trainer from the recipe's learner and experience maker, with the `loop:` section, the
    run directory, the callbacks (throughput, the config's, the caller's) and evaluation."""
    loop = cfg.loop
    trainer = OnlineTrainer(
        setup.booster, learner, maker, tokenizer, loop, save_dir=str(setup.run_dir), coordinator=setup.coordinator,
        callbacks=[PerformanceEvaluator(), *build_callbacks(cfg.callbacks), *callbacks], inference_models=inference_models,
        accuracy_fn=reward_function(loop.accuracy_function) if loop.accuracy_function else None, eval_generation=eval_generation,
    )
    trainer.show_progress = cfg.logging.progress
    trainer.run_config = cfg.model_dump(mode="json")
    return trainer


def load_prompt_data(cfg: Any, tokenizer: Any, plugin: Any) -> PromptData:
    """Prompts and pretrain rows validated (errors name file, row, field), then sharded loaders."""
    loop, data = cfg.loop, cfg.data
    check_room_for_text(tokenizer, data.max_prompt_length, "data.max_prompt_length", with_response=False)
    prompts = build_prompt_dataset(
        [resolve_path(s) for s in data.prompts], tokenizer, data.max_prompt_length,
        skip_invalid=data.skip_invalid, overlong=data.overlong, length_key="data.max_prompt_length",
    )
    eval_prompts = build_prompt_dataset(
        [resolve_path(s) for s in data.eval_prompts], tokenizer, data.max_prompt_length,
        overlong=data.overlong, length_key="data.max_prompt_length",
    ) if data.eval_prompts else None
    pretrain = build_sft_dataset(
        [resolve_path(s) for s in data.pretrain], tokenizer, data.max_pretrain_length,
        skip_invalid=data.skip_invalid, overlong=data.overlong, length_key="data.max_pretrain_length",
    ) if data.pretrain else None
    world = plugin.coordinator.world_size
    check_batch_fits(len(prompts), loop.rollout_batch_size, world, "loop.rollout_batch_size", "data.prompts")
    if pretrain is not None:
        check_batch_fits(len(pretrain), loop.train_batch_size, world, "loop.train_batch_size", "data.pretrain")
    collate = PromptCollator(tokenizer.pad_token_id)
    return PromptData(
        prompts=plugin.prepare_dataloader(prompts, loop.rollout_batch_size, shuffle=True, seed=cfg.run.seed, collate_fn=collate, drop_last=True),
        eval_prompts=plugin.prepare_dataloader(eval_prompts, loop.eval_batch_size, shuffle=False, collate_fn=collate, even=False) if eval_prompts else None,
        pretrain=plugin.prepare_dataloader(
            pretrain, loop.train_batch_size, shuffle=True, seed=cfg.run.seed, collate_fn=SFTCollator(tokenizer.pad_token_id), drop_last=True,
        ) if pretrain else None,
    )


def resume_and_fit(trainer: Any, setup: RunSetup, cfg: Any, data: PromptData) -> dict:
    """The last step of an RL recipe (PPO, GRPO): restore the checkpoint to resume, write the
    run directory, fit; the run directory, final actor, held-out metrics and step count."""
    if setup.checkpoint is not None:
        trainer.load_checkpoint(setup.checkpoint)
    setup.commit()
    loop, engine = cfg.loop, trainer.experience_maker.engine
    try:
        artifacts = trainer.fit(
            loop.episodes, loop.collect_steps, loop.update_steps, data.prompts, data.pretrain,
            log_dir=str(setup.run_dir), use_wandb=cfg.logging.wandb, eval_dataloader=data.eval_prompts,
        )
    finally:
        if not getattr(engine, "shares_weights", True):
            engine.close()  # a separate engine (vLLM) holds memory and, on CUDA, a share of the GPU
    return {
        "run_dir": str(setup.run_dir),
        "final_model": str(setup.run_dir / "checkpoints" / "final" / "actor"),
        "eval_before": trainer.initial_eval_metrics,  # None when not evaluated (off, no eval prompts, resumed)
        "eval": trainer.last_eval_metrics,
        "steps": artifacts.completed_steps,
    }
