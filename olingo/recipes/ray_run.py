"""The run `olingo ppo` and `olingo grpo` share with `ray.enabled: true`, around the algorithm.

A Ray recipe (`run_ppo_ray`, `run_grpo_ray`) checks its config, calls `open_run`, builds its
`RayAlgorithm` (the makers' models and `making` strategy, the trainer actor's models, optimizers
and own arguments) and hands it to `run_on_ray`, which does the rest, top to bottom:
    2. join the Ray cluster named by `ray.address` / $RAY_ADDRESS, or start a local instance
    3. create `ray.num_makers` ExperienceMakerHolder actors, each with the algorithm's models and
       `making`, its own shuffle of the prompts (maker 0 also holds the eval prompts)
    4. create the algorithm's trainer actor (loggers and checkpoints in the run directory);
       resume it when asked; write the run directory
    5. evaluate the starting policy through maker 0 (fresh runs; logged as the step-0 row)
    6. fit: `loop.episodes` episodes of `RayAlgorithm.batches` buffer batches,
       `loop.update_steps` passes over each; the makers are stopped when fit ends
    7. evaluate the final policy through maker 0, remove every actor, shut Ray down when this
       process started it; append the final eval row to metrics.jsonl, write ray_summary.json
The factories (`TokenizerFn`, `PromptLoaderFn`, the recipes' model and optimizer factories) are
built on the driver, pickled, and called inside the actors. Paths are resolved on the driver: on
a multi-node cluster they must exist on every node. Everything that calls `ray` is in
`olingo.ray.launch`, imported only once a run starts; it gets the `ray:` section only.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olingo.booster import SingleProcessPlugin
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.models import load_tokenizer, stop_token_ids
from olingo.ray.making import GroupMaking, PPOMaking
from olingo.recipes.common import (
    build_callbacks,
    check_model_paths,
    check_run_dir,
    commit_run_dir,
    resolve_path,
    resume_checkpoint,
)
from olingo.recipes.grpo_config import GRPOConfig
from olingo.recipes.online_config import check_row_environments, check_template
from olingo.recipes.ppo_config import PPOConfig
from olingo.recipes.rewards import probe_user_functions
from olingo.rewards.rlvr import get_reward_function
from olingo.trainer.callbacks import Callback
from olingo.trainer.utils import seed_everything

RayRecipeConfig = PPOConfig | GRPOConfig


# ---- picklable factories: built on the driver, called inside the actors ---------------------------
@dataclass
class TokenizerFn:
    path: str
    chat_template: str | None = None  # model.chat_template

    def __call__(self) -> Any:
        return load_tokenizer(self.path, padding_side="left", chat_template=self.chat_template)


@dataclass
class PromptLoaderFn:
    """A prompt DataLoader (ResumableSampler, private shuffle seed) built inside a maker."""

    sources: list[str]
    tokenizer: str
    max_prompt_length: int
    batch_size: int
    seed: int = 0
    train: bool = True  # shuffled, short last batch dropped; eval: in order, every prompt
    skip_invalid: bool = False
    chat_template: str | None = None  # model.chat_template
    overlong: str = "error"  # data.overlong

    def __call__(self) -> Any:
        tokenizer = load_tokenizer(self.tokenizer, padding_side="left", chat_template=self.chat_template)
        dataset = build_prompt_dataset(
            self.sources, tokenizer, self.max_prompt_length,
            skip_invalid=self.skip_invalid, overlong=self.overlong, length_key="data.max_prompt_length",
        )
        return SingleProcessPlugin().prepare_dataloader(
            dataset, self.batch_size, shuffle=self.train, seed=self.seed, collate_fn=PromptCollator(tokenizer.pad_token_id),
            even=self.train, drop_last=self.train,
        )


@dataclass
class VLLMEngineFn:
    """A maker's vLLM engine (`generation.engine: vllm`), built inside the maker on its actor's
    device from the policy's directory; the maker streams every weight sync on into it."""

    model_path: str
    settings: Any  # VLLMSettings

    def __call__(self, actor: Any, tokenizer: Any) -> Any:
        from olingo.engines.vllm import VLLMEngine  # imports vllm: inside the maker only

        return VLLMEngine(self.model_path, tokenizer, self.settings, device=next(actor.parameters()).device)


# ---- what an algorithm brings --------------------------------------------------------------------
@dataclass
class RayAlgorithm:
    """What differs between the Ray recipes; everything else about the run is `run_on_ray`'s."""

    name: str  # the trainer actor's class: a key of `olingo.ray.launch.TRAINERS`
    maker_models: Any  # () -> a maker's models; its `tokenizer` (a path) is every actor's tokenizer
    making: PPOMaking | GroupMaking  # what the makers make of a prompt batch
    trainer_models: Any  # () -> the trainer actor's models
    optim_fn: Callable[..., tuple]  # the trainer's models -> optimizers and schedulers
    batches: int  # buffer batches (training steps) per episode
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)  # the trainer's own: batch sizes, loss settings


def optimizer_steps(cfg: RayRecipeConfig, batches: int) -> int:
    """The run's optimizer steps, which the learning-rate schedules are sized in."""
    return cfg.loop.episodes * batches * cfg.loop.update_steps


# ---- the run ------------------------------------------------------------------------------------------
def open_run(cfg: RayRecipeConfig, model_paths: dict[str, str | None]) -> tuple[Path, Path | None]:
    """Step 1's shared part: every user function is called once on a prompt row
    (`probe_user_functions`), the environments prompt rows name exist, the configured model
    paths exist (`{config key: path}`), the RNG is seeded; returns the run directory (checked,
    written once the actors have loaded everything) and the checkpoint to resume (None: a fresh start)."""
    probe_user_functions(cfg.reward, cfg.loop.accuracy_function, cfg.data.prompts, cfg.data.eval_prompts)  # before any actor loads a model
    if cfg.environment.name is not None:  # once here, not in every maker: rows naming an unknown environment
        check_row_environments(cfg.environment.catalog(), [*cfg.data.prompts, *cfg.data.eval_prompts])
    check_model_paths(model_paths)
    seed_everything(cfg.run.seed)
    run_dir = check_run_dir(cfg.run)
    return run_dir, resume_checkpoint(cfg.run, run_dir)


def run_on_ray(cfg: RayRecipeConfig, algorithm: RayAlgorithm, run_dir: Path, checkpoint: Path | None, callbacks: Sequence[Callback] = ()) -> dict:
    """Steps 2-7 (module docstring); returns the run directory, evals and summary."""
    from olingo.ray import launch  # only now: it imports ray

    rc = cfg.ray
    # 2. Ray
    started_here = launch.start_ray(rc)
    actors: list[Any] = []
    try:
        launch.check_resources(rc)
        # 3. makers, each with its own models and its own prompt order
        suffix = uuid.uuid4().hex[:6]
        trainer_name = f"{cfg.run.name}-trainer-{suffix}"
        maker_names = [f"{cfg.run.name}-maker{i}-{suffix}" for i in range(rc.num_makers)]
        makers: list[Any] = []
        models = algorithm.maker_models
        tokenizer = load_tokenizer(models.tokenizer, chat_template=cfg.model.chat_template)
        check_template(cfg.environment, cfg.agent, cfg.generation, tokenizer)  # one line here, not one per maker
        stops = stop_token_ids(tokenizer, models.actor)  # the same for every maker
        for i, name in enumerate(maker_names):  # each recorded at once: a later failure still shuts it down
            makers.append(_spawn_maker(cfg, algorithm, launch, i, name, trainer_name, stops))
            actors.append(makers[-1])

        # 4. the trainer actor; resume; the run directory
        trainer = _spawn_trainer(cfg, algorithm, launch, trainer_name, maker_names, run_dir, callbacks)
        actors.append(trainer)
        if checkpoint is not None:
            launch.call(rc, trainer.load_checkpoint.remote(str(checkpoint)))
        commit_run_dir(cfg.run, cfg, run_dir)

        # 5-7. evaluate, fit (which logs the step-0 evaluation first), evaluate
        evaluate = _evaluator(cfg, makers[0], launch) if cfg.data.eval_prompts else None
        before = evaluate() if evaluate is not None and checkpoint is None and cfg.loop.eval_before_training else None
        total_steps = cfg.loop.episodes * algorithm.batches
        summary = launch.wait_for(
            trainer.fit.remote(total_steps, algorithm.batches, cfg.loop.update_steps, initial_eval=before),
            on_stop=lambda signum: trainer.request_stop.remote(signum),
        )
        launch.raise_if_interrupted(summary)  # Ctrl-C: the trainer checkpointed at the end of its episode
        after = evaluate() if evaluate is not None else None
    finally:
        launch.shut_down(actors, started_here)
    return _write_summary(run_dir, before, after, summary)


def _spawn_maker(cfg: RayRecipeConfig, algorithm: RayAlgorithm, launch: Any, i: int, name: str, trainer_name: str, stops: list[int]) -> Any:
    """Maker `i`: the algorithm's models and `making`, its own prompt order, responses ending at
    `stops`; maker 0 evaluates."""
    loop, data, models, template = cfg.loop, cfg.data, algorithm.maker_models, cfg.model.chat_template
    return launch.spawn_maker(
        cfg.ray, name, [trainer_name], models, TokenizerFn(models.tokenizer, template),
        PromptLoaderFn(
            [resolve_path(s) for s in data.prompts], models.tokenizer, data.max_prompt_length, loop.rollout_batch_size,
            seed=cfg.run.seed + 1000 * i, skip_invalid=data.skip_invalid, chat_template=template, overlong=data.overlong,
        ),
        making=algorithm.making,
        engine_fn=VLLMEngineFn(models.actor, cfg.generation.vllm) if cfg.generation.engine == "vllm" else None,
        eval_dataloader_fn=PromptLoaderFn(
            [resolve_path(s) for s in data.eval_prompts], models.tokenizer, data.max_prompt_length, loop.eval_batch_size,
            train=False, chat_template=template, overlong=data.overlong,
        ) if data.eval_prompts and i == 0 else None,
        accuracy_fn=get_reward_function(loop.accuracy_function) if loop.accuracy_function else None,
        seed=cfg.run.seed + i, call_timeout_s=cfg.ray.call_timeout_s,
        **dataclasses.asdict(cfg.generation.settings(stops)),  # the holder takes its settings as keywords
    )


def _spawn_trainer(
    cfg: RayRecipeConfig, algorithm: RayAlgorithm, launch: Any, name: str, maker_names: list[str], run_dir: Path, callbacks: Sequence[Callback],
) -> Any:
    """The algorithm's trainer actor, fed by `maker_names`, logging and checkpointing in `run_dir`."""
    rc = cfg.ray
    return launch.spawn_trainer(
        rc, name, maker_names, algorithm.trainer_models, algorithm=algorithm.name,
        buffer_limit=rc.buffer_limit or algorithm.batches, callbacks=build_callbacks(cfg.callbacks) + list(callbacks),
        temperature=cfg.generation.temperature if cfg.generation.do_sample else 1.0,
        optim_fn=algorithm.optim_fn, max_grad_norm=cfg.actor_optim.max_grad_norm,
        tokenizer_fn=TokenizerFn(algorithm.maker_models.tokenizer, cfg.model.chat_template),
        seed=cfg.run.seed, max_staleness=rc.max_staleness, call_timeout_s=rc.call_timeout_s, experience_timeout_s=rc.experience_timeout_s,
        max_maker_restarts=rc.max_restarts * rc.num_makers, log_dir=str(run_dir), use_wandb=cfg.logging.wandb,
        show_progress=cfg.logging.progress, save_dir=str(run_dir), save_interval=cfg.loop.save_interval,
        **algorithm.trainer_kwargs,
    )


def _evaluator(cfg: RayRecipeConfig, maker: Any, launch: Any) -> Callable[[], dict[str, float]]:
    overrides = {"temperature": cfg.loop.eval_temperature} if cfg.loop.eval_temperature is not None else {}

    def evaluate() -> dict[str, float]:
        metrics, _ = launch.call(cfg.ray, maker.evaluate.remote(seed=cfg.run.seed, **overrides))
        return {f"eval/{k}": v for k, v in metrics.items()}

    return evaluate


def _write_summary(run_dir: Path, before: dict | None, after: dict | None, summary: dict) -> dict:
    """The final eval row (the one single-process PPO and GRPO write, for `olingo report`) and
    ray_summary.json; returns that summary."""
    if after is not None:
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": summary["steps"], "split": "eval", "time": time.time(), "eval_name": "eval", **after}) + "\n")
    result = {
        "run_dir": str(run_dir), "final_model": str(run_dir / "checkpoints" / "final" / "actor"),
        "eval_before": before, "eval": after, "steps": summary["steps"], "ray": summary,
    }
    (run_dir / "ray_summary.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result
