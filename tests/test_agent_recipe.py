"""`olingo grpo` with an `environment:`: multi-turn episodes through the recipe, the CLI config
and the unchanged trainer; the environment's reward reaches the advantages."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from olingo.rollout.retry import RetryArithmetic
from tests.conftest import read_jsonl


def test_the_docs_show_the_builtin_environment_as_it_is():
    source = inspect.getsource(RetryArithmetic)
    assert source in (Path(__file__).resolve().parents[1] / "docs" / "agents.md").read_text()


def grpo_overrides(tmp_path, name: str, actor: str, episodes: int) -> list[str]:
    return [
        f"run.output_dir={tmp_path}", f"run.name={name}", f"model.actor={actor}", f"loop.episodes={episodes}", "loop.update_steps=1",
        "loop.save_interval=0", "loop.eval_interval=0", "data.eval_prompts=[]", "logging.progress=false",
        "environment.name=arithmetic_retry", "environment.max_turns=2", "environment.max_new_tokens=8",
        "reward.functions={}",
    ]


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_grpo_run_with_an_environment_trains_on_multi_turn_episodes(tmp_path, assets, lora):
    from olingo.config import load_config, packaged_config
    from olingo.recipes.grpo import GRPOConfig, run_grpo

    overrides = grpo_overrides(tmp_path, "agent", str(assets.model_dir), 2) + (["model.lora.r=4"] if lora else [])
    cfg = load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), overrides)
    result = run_grpo(cfg)
    if lora:  # the adapters (and heads) are checkpointed beside the merged model
        assert (tmp_path / "agent" / "checkpoints" / "final" / "actor" / "lora" / "trainable.safetensors").exists()
    rows = [r for r in read_jsonl(tmp_path / "agent" / "metrics.jsonl") if r["split"] == "train"]
    assert result["steps"] == len(rows) == 2
    for row in rows:
        assert 1.0 <= row["rollout/turns_per_episode"] <= 2.0
        assert row["rollout/env_tokens_per_episode"] >= 0.0 and "rollout/reward/environment" in row
        assert row["rollout/reward_mean"] == pytest.approx(row["rollout/reward/environment"])  # the environment is the only term


def test_a_ppo_run_with_an_environment_trains_on_multi_turn_episodes(tmp_path, assets):
    """PPO's critic and GAE on multi-turn rows: the run completes and logs the episodes."""
    from olingo.config import load_config, packaged_config
    from olingo.recipes.ppo import PPOConfig, run_ppo

    overrides = [o for o in grpo_overrides(tmp_path, "agent-ppo", str(assets.model_dir), 2) if not o.startswith("model.actor")]
    cfg = load_config(PPOConfig, packaged_config("ppo_tiny.yaml"), [*overrides, f"model.actor={assets.model_dir}", "reward.model=null"])
    result = run_ppo(cfg)
    rows = [r for r in read_jsonl(tmp_path / "agent-ppo" / "metrics.jsonl") if r["split"] == "train"]
    assert result["steps"] == len(rows) > 0 and all("train/value_loss" in r for r in rows)
    assert sum("rollout/turns_per_episode" in r for r in rows) == 2  # once per episode (docs/runs.md)


def test_a_run_needs_a_reward_or_an_environment():
    from olingo.recipes.grpo_config import GRPOConfig
    from olingo.recipes.ppo_config import PPOConfig

    for config in (GRPOConfig, PPOConfig):
        with pytest.raises(ValueError, match=r"set reward.model .* \(or name an environment"):
            config(reward={"functions": {}})
        assert config(reward={"functions": {}}, environment={"name": "arithmetic_retry"}).reward.functions == {}
