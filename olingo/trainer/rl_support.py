"""What the RL trainers (`PPOTrainer`, `GRPOTrainer`) do the same way around their algorithm:
the ptx check, the prompt/pretrain loaders that resume mid-epoch, held-out evaluation with its
record on disk, and the RNG/loader part of a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from olingo.dataset.sampler import CyclicLoader
from olingo.engines import sync_engine
from olingo.trainer.online_eval import evaluate_policy
from olingo.trainer.utils import rng_state, set_rng_state


def open_loaders(
    ptx_coef: float, prompt_dataloader: DataLoader, pretrain_dataloader: DataLoader | None, pending: dict[str, Any], origin: str,
) -> tuple[CyclicLoader, CyclicLoader | None]:
    """Endless prompt (and, with a ptx loss, pretrain) loaders, at the positions a checkpoint
    left (`pending`). A ptx loss without pretrain data is refused: `origin` names the trainer
    whose default set it (`PPOTrainer`, `GRPOTrainer`) so the message says where 0.9 came from."""
    if ptx_coef > 0 and pretrain_dataloader is None:
        raise ValueError(
            f"ptx_coef={ptx_coef} mixes in a pretraining (ptx) loss but fit() got no pretrain_dataloader: "
            f"pass one, or set ptx_coef=0.0 ({origin}'s default of 0.9 assumes a pretrain dataset)"
        )
    prompts = CyclicLoader(prompt_dataloader)
    pretrain = CyclicLoader(pretrain_dataloader) if pretrain_dataloader is not None and ptx_coef > 0 else None
    for name, loader in (("prompts", prompts), ("pretrain", pretrain)):
        if loader is not None and name in pending:
            loader.load_state_dict(pending[name])
    return prompts, pretrain


def loader_states(prompts: CyclicLoader | None, pretrain: CyclicLoader | None) -> dict[str, Any]:
    return {name: loader.state_dict() for name, loader in (("prompts", prompts), ("pretrain", pretrain)) if loader is not None}


def held_out_eval(trainer: Any, maker: Any) -> dict[str, float] | None:
    """`evaluate_policy` of `trainer`'s actor on its eval loader, summed over ranks (each rank
    evaluated its own shard), recorded as `eval/step_N.json` with 16 samples on rank 0."""
    if trainer.eval_dataloader is None:
        return None
    trainer._place_inference_models(trainer.device)
    trainer.engine_sync.before_rollout(trainer.actor_booster.unwrap(trainer.actor), trainer.state.step)
    plugin = trainer.actor_booster.plugin

    def all_reduce_sum(totals: torch.Tensor) -> torch.Tensor:
        return plugin.all_reduce_sum(totals.to(trainer.device)).cpu()

    with trainer.actor_booster.gathered(trainer.actor):  # ranks may hold different numbers of eval batches
        metrics, samples = evaluate_policy(
            maker, trainer.eval_dataloader, trainer.eval_generation, accuracy_fn=trainer.accuracy_fn, all_reduce_sum=all_reduce_sum
        )
    trainer.engine_sync.after_rollout()
    trainer.state.extra["eval_samples"] = samples  # this rank's scored samples, for callbacks' on_eval (reward_monitor)
    if trainer.state.output_dir is not None and trainer.coordinator.is_master:
        out = trainer.state.output_dir / "eval"
        out.mkdir(parents=True, exist_ok=True)
        record = {"step": trainer.state.step, "metrics": metrics, "samples": samples[:16]}
        (out / f"step_{trainer.state.step}.json").write_text(json.dumps(record, indent=2) + "\n")
    return metrics


def save_policy_extras(directory: Path, tokenizer: Any, coordinator: Any, state: dict[str, Any]) -> None:
    """The tokenizer beside the actor (when there is one), this rank's RNG, and (rank 0)
    `trainer_state.json`: what local training and Ray's trainer actors write beside the learner."""
    if coordinator.is_master and tokenizer is not None:
        tokenizer.save_pretrained(str(directory / "actor"))
    torch.save(rng_state(), directory / f"rng_rank{coordinator.rank}.pt")
    if coordinator.is_master:
        (directory / "trainer_state.json").write_text(json.dumps(state, indent=2))


def load_policy_extras(directory: Path, coordinator: Any) -> dict[str, Any]:
    """Restore this rank's RNG (rank 0's when the checkpoint had fewer ranks); the trainer state."""
    rng_file = directory / f"rng_rank{coordinator.rank}.pt"
    set_rng_state(torch.load(rng_file if rng_file.exists() else directory / "rng_rank0.pt", weights_only=False))
    return json.loads((directory / "trainer_state.json").read_text())


def check_engine_correction(engine: Any, tis_cap: float | None, old_logprobs: str) -> None:
    """Refuse corrections that have nothing to correct or would count the mismatch twice."""
    separate = not getattr(engine, "shares_weights", True)
    if tis_cap is not None and not separate:
        raise ValueError(
            f"tis_cap={tis_cap} corrects for a separate rollout engine (vllm) sampling with its own copy of the "
            "weights; this engine samples with the trained model itself, so there is nothing to correct: unset tis_cap"
        )
    if old_logprobs == "engine" and not separate:
        raise ValueError("old_logprobs='engine' takes log pi_old from a separate rollout engine (vllm); this engine has none: use 'trainer'")
    if tis_cap is not None and old_logprobs == "engine":
        raise ValueError(
            "tis_cap with old_logprobs='engine': the ratio then already divides by the engine's probabilities, and "
            "truncated importance sampling would correct the same mismatch twice; use old_logprobs='trainer' with tis_cap"
        )


class EngineSync:
    """Keeps a rollout engine with its own weights (vLLM) generating from the trained policy.

    Before each rollout whose policy changed since the last sync (an optimizer step, or a
    checkpoint loaded on resume), the policy's weights are streamed into the engine
    (`sync_engine`: one tensor at a time; LoRA merged out of place). An engine that samples
    with the trained module itself (`shares_weights`) needs none. With sleep mode the engine
    frees its accelerator memory between rollouts and wakes before the next.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.separate = not getattr(engine, "shares_weights", True)
        self.version: int | None = None  # policy step the engine's weights are from

    def before_rollout(self, policy: torch.nn.Module, step: int) -> dict[str, float]:
        """Wake the engine and sync it when `step` is newer than its weights; the sync's
        `time/weight_sync` and `perf/weight_sync_GBps` (empty when nothing was sent)."""
        if not self.separate:
            return {}
        self.engine.wake()
        if self.version == step:
            return {}
        sync = sync_engine(self.engine, policy)
        self.version = step
        return sync.metrics()

    def after_rollout(self) -> None:
        """Let the engine free its accelerator memory while the trainer learns (sleep mode)."""
        if self.separate:
            self.engine.sleep()
