"""The gateway on every backend (docs/agents.md, "Train an existing agent"): each Ray experience
maker (with LoRA), each torchrun rank and a vLLM engine serves its own endpoint to its own
agents, and the trainer logs what they measured under the names a local run logs."""

from __future__ import annotations

import importlib.util
import os
import subprocess

import pytest

from tests.conftest import olingo_cmd, read_jsonl
from tests.test_agent_backends import ray_run, rollout_rows, train_rows

AGENT = ["agent.function=olingo.gateway.examples:retry_arithmetic", "agent.max_new_tokens=8", "reward.functions={}", "generation.max_new_tokens=8"]


def assert_agent_rows(rows: list[dict]) -> None:
    """Every row that logs a rollout logs the agents' episodes; the untrained model's first answers are wrong, so they ask twice."""
    rows = rollout_rows(rows)
    assert rows and all({"rollout/requests_per_episode", "rollout/reward/agent", "rollout/failed_episodes"} <= r.keys() for r in rows)
    assert max(r["rollout/requests_per_episode"] for r in rows) > 1.0
    assert all(r["rollout/failed_episodes"] == 0 and r["rollout/history_rewrites"] == 0 for r in rows)


@pytest.mark.slow
def test_ray_makers_with_lora_each_serve_their_agents(tmp_path, assets):
    rows = ray_run(
        tmp_path, "grpo", "ray-gateway", f"model.actor={assets.model_dir}", *AGENT, "model.lora.r=4", "model.lora.alpha=8",
        "data.eval_prompts=[]", "loop.episodes=2", "loop.rollout_batch_size=4", "experience.num_generations=4", "loop.train_batch_size=16",
    )
    assert rows and [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert_agent_rows(rows)


@pytest.mark.slow
def test_torchrun_ranks_each_serve_their_agents(tmp_path, assets):
    from tests.test_fsdp import torchrun

    torchrun(
        "grpo", "--config", "grpo_tiny.yaml", f"run.output_dir={tmp_path}", "run.name=ranks", "logging.progress=false", *AGENT,
        f"model.actor={assets.model_dir}", "plugin.name=ddp", "loop.episodes=2", "loop.rollout_batch_size=4", "loop.train_batch_size=16",
        "loop.save_interval=0", "loop.eval_interval=0", "data.eval_prompts=[]", "experience.num_generations=4",
    )
    rows = train_rows(tmp_path / "ranks")
    assert rows and [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert_agent_rows(rows)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_a_grpo_run_through_the_gateway_on_vllm(tmp_path, assets):
    args = [
        "grpo", "--config", "grpo_tiny.yaml", f"run.output_dir={tmp_path}", "run.name=gateway-vllm", "logging.progress=false", *AGENT,
        f"model.actor={assets.model_dir}", "loop.episodes=2", "loop.rollout_batch_size=4", "experience.num_generations=4",
        "loop.train_batch_size=16", "loop.save_interval=0", "loop.eval_interval=0", "data.eval_prompts=[]",
        "generation.engine=vllm", "generation.vllm.max_model_len=128",
    ]
    out = subprocess.run(olingo_cmd(*args), capture_output=True, text=True, timeout=400, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [r for r in read_jsonl(tmp_path / "gateway-vllm" / "metrics.jsonl") if r["split"] == "train"]
    assert rows and [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert_agent_rows(rows)
    assert all(r["rollout/engine_logprob_abs_diff"] < 1e-3 for r in rollout_rows(rows))  # fp32 on both sides, context tokens excluded


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("ray") is None, reason="needs vllm and ray")
@pytest.mark.parametrize("source", ["environment", "gateway"])
def test_ray_makers_with_vllm_engines_run_episodes(tmp_path, assets, source):
    """Each Ray maker builds its own vLLM engine and its own episode source on it: the
    `arithmetic_retry` environment, or the gateway serving the example agent."""
    from tests.test_ray_cli import ray_pids, wait_gone

    episodes = AGENT if source == "gateway" else ["environment.name=arithmetic_retry", "environment.max_turns=2", "environment.max_new_tokens=8",
                                                  "reward.functions={}", "generation.max_new_tokens=8", "generation.stop_strings=['1','2','3','a','e','o']"]
    before = ray_pids()
    args = [
        "grpo", f"run.output_dir={tmp_path}", "run.name=ray-vllm", "logging.progress=false", f"model.actor={assets.model_dir}", *episodes,
        "ray.enabled=true", "ray.num_cpus=2", "loop.episodes=2", "loop.update_steps=1", "loop.rollout_batch_size=4", "loop.train_batch_size=16",
        "experience.num_generations=4", "data.eval_prompts=[]", "loop.save_interval=0", "ray.call_timeout_s=180", "ray.experience_timeout_s=180",
        "generation.engine=vllm", "generation.vllm.max_model_len=128",
    ]
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(olingo_cmd(*args), capture_output=True, text=True, timeout=400, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    assert not wait_gone(ray_pids() - before), "the CLI must shut down the Ray instance it started"
    rows = train_rows(tmp_path / "ray-vllm")
    assert rows and all(r["rollout/engine_logprob_abs_diff"] < 1e-3 for r in rows)
    if source == "gateway":
        assert_agent_rows(rows)
    else:
        assert max(r["rollout/turns_per_episode"] for r in rows) > 1.0 and all(r["rollout/env_errors"] == 0 for r in rows)
