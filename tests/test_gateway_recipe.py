"""`olingo grpo` / `olingo ppo` with an `agent:`: an agent program trained through the gateway by
the unchanged trainer; failed episodes dropped with their groups; the config's checks; a run
that trains as its environment twin does; a run stopped by Ctrl-C that resumes exactly."""

from __future__ import annotations

import inspect
import os
import signal
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from olingo.gateway.examples import retry_arithmetic
from tests.conftest import read_jsonl
from tests.test_agent_resume import assert_same_run

STOP = {"after": None, "calls": 0, "sent": False}


def overrides(tmp_path, name: str, actor: str, episodes: int, agent: str = "olingo.gateway.examples:retry_arithmetic") -> list[str]:
    return [
        f"run.output_dir={tmp_path}", f"run.name={name}", f"model.actor={actor}", f"loop.episodes={episodes}", "loop.update_steps=1",
        "loop.save_interval=0", "loop.eval_interval=0", "data.eval_prompts=[]", "logging.progress=false", "reward.functions={}",
        f"agent.function={agent}", "agent.max_new_tokens=8",
    ]


async def failing_on_sevens(task, client):
    """retry_arithmetic, except that it raises on tasks whose answer ends in 7."""
    if str(task["gt_answer"]).endswith("7"):
        raise ConnectionError("the agent's own service is down")
    return await retry_arithmetic(task, client)


async def interrupting(task, client):
    """retry_arithmetic that sends one SIGINT (a Ctrl-C) at its `STOP["after"]`-th call."""
    STOP["calls"] += 1
    if STOP["after"] is not None and STOP["calls"] > STOP["after"] and not STOP["sent"]:
        STOP["sent"] = True
        os.kill(os.getpid(), signal.SIGINT)
    return await retry_arithmetic(task, client)


def test_the_docs_show_the_example_agent_as_it_is():
    source = inspect.getsource(retry_arithmetic)
    assert source in (Path(__file__).resolve().parents[1] / "docs" / "agents.md").read_text()


def test_a_grpo_run_trains_an_agent_program_through_the_gateway(tmp_path, assets):
    from olingo.config import load_config, packaged_config
    from olingo.recipes.grpo import GRPOConfig, run_grpo

    cfg = load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), overrides(tmp_path, "agent", str(assets.model_dir), 2))
    assert run_grpo(cfg)["steps"] == 2
    rows = [r for r in read_jsonl(tmp_path / "agent" / "metrics.jsonl") if r["split"] == "train"]
    for r in rows:
        assert 1.0 <= r["rollout/requests_per_episode"] <= 2.0 and r["rollout/failed_episodes"] == 0
        assert r["rollout/reward_mean"] == pytest.approx(r["rollout/reward/agent"])  # the agent's reward is the only term


def test_failed_episodes_leave_with_their_groups_and_the_run_goes_on(tmp_path, assets):
    from olingo.config import load_config, packaged_config
    from olingo.recipes.grpo import GRPOConfig, run_grpo

    args = [*overrides(tmp_path, "flaky", str(assets.model_dir), 2, "tests.test_gateway_recipe:failing_on_sevens"), "agent.max_failure_rate=1.0"]
    run_grpo(load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), args))
    rows = [r for r in read_jsonl(tmp_path / "flaky" / "metrics.jsonl") if r["split"] == "train"]
    failed = sum(r["rollout/agent_errors"] for r in rows)
    assert failed > 0 and failed % 4 == 0  # whole groups of 4 generations fail together (the same task)
    assert all(r["rollout/failed_episodes"] == r["rollout/agent_errors"] for r in rows)


def test_a_ppo_run_trains_an_agent_program_through_the_gateway(tmp_path, assets):
    from olingo.config import load_config, packaged_config
    from olingo.recipes.ppo import PPOConfig, run_ppo

    cfg = load_config(PPOConfig, packaged_config("ppo_tiny.yaml"), overrides(tmp_path, "ppo", str(assets.model_dir), 1))
    run_ppo(cfg)
    rows = [r for r in read_jsonl(tmp_path / "ppo" / "metrics.jsonl") if r["split"] == "train"]
    episodes = [r for r in rows if "rollout/requests_per_episode" in r]  # once per episode, on its first step's row (docs/runs.md)
    assert len(episodes) == 1 and episodes[0]["rollout/requests_per_episode"] >= 1.0


def test_the_config_names_one_source_and_an_agent_that_imports():
    from olingo.config import ConfigError, load_config, packaged_config
    from olingo.recipes.grpo import GRPOConfig

    base = packaged_config("grpo_tiny.yaml")
    with pytest.raises(ConfigError, match="environment.name and agent.function both set"):
        load_config(GRPOConfig, base, ["agent.function=olingo.gateway.examples:calculator", "environment.name=arithmetic_retry"])
    with pytest.raises(ConfigError, match=r"agent.function 'olingo.gateway.examples:nothing': .*not a function"):
        load_config(GRPOConfig, base, ["agent.function=olingo.gateway.examples:nothing"])
    with pytest.raises(ConfigError, match="expected package.module:function"):
        load_config(GRPOConfig, base, ["agent.function=retry_arithmetic"])


@pytest.mark.slow
def test_a_grpo_run_through_the_gateway_trains_as_the_environment_run_does(tmp_path, assets):
    """12 GRPO steps of the agent program `retry_arithmetic` through the gateway, and of the
    environment `arithmetic_retry` it mirrors, are one computation: the agent ends an episode at a
    turn cut at 8 tokens as the environment does, so the rows are the same token for token, and
    every metric both log (timings aside) and every final weight are equal (== and torch.equal:
    the same code path on the same machine). So the environment recipe's learning curve
    (bench/learning.py, over seeds and CPU kernel paths) is the gateway's too."""
    from olingo.config import load_config, packaged_config
    from olingo.recipes.grpo import GRPOConfig, run_grpo

    args = [*overrides(tmp_path, "agent", str(assets.model_dir), 12), "actor_optim.lr=5e-4"]
    run_grpo(load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), args))
    environment = [a for a in args if not a.startswith(("agent.", "run.name"))]
    environment += ["run.name=environment", "environment.name=arithmetic_retry", "environment.max_turns=2", "environment.max_new_tokens=8"]
    run_grpo(load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), environment))
    rows, twins = ([r for r in read_jsonl(tmp_path / name / "metrics.jsonl") if r["split"] == "train"] for name in ("agent", "environment"))
    timing = lambda key: key.startswith(("time", "perf/")) or key.endswith("_seconds")  # noqa: E731
    shared = [k for k in rows[0].keys() & twins[0].keys() if not timing(k)]
    assert len(rows) == len(twins) == 12 and "rollout/reward_mean" in shared and "train/policy_loss" in shared
    assert sum(r["rollout/truncated_episodes"] for r in rows) > 0  # cut turns happen, and the twins agree on them
    assert [{k: r[k] for k in shared} for r in rows] == [{k: r[k] for k in shared} for r in twins]
    weights = [load_file(tmp_path / name / "checkpoints" / "final" / "actor" / "model.safetensors") for name in ("agent", "environment")]
    assert all(torch.equal(value, weights[1][key]) for key, value in weights[0].items())


@pytest.mark.slow
def test_a_gateway_run_stopped_by_ctrl_c_resumes_exactly(tmp_path, assets):
    """One SIGINT from an agent in the second rollout: that rollout and its steps finish, `step_4`
    is written, the run stops (130) and resumes from it to the uninterrupted run's weights and
    metrics (torch.equal and ==, as in tests/test_agent_resume.py: the same computation)."""
    from olingo.cli.main import main

    def args(name: str) -> list[str]:
        return [
            "grpo", "--config", "grpo_tiny.yaml", f"run.output_dir={tmp_path}", f"run.name={name}", "logging.progress=false",
            f"model.actor={assets.model_dir}", "loop.episodes=3", "loop.rollout_batch_size=4", "loop.train_batch_size=8",
            "loop.update_steps=1", "loop.save_interval=2", "loop.eval_interval=0", "data.eval_prompts=[]", "experience.num_generations=4",
            "generation.max_new_tokens=6", "actor_optim.lr=1e-3", "reward.functions={}", "agent.function=tests.test_gateway_recipe:interrupting",
        ]

    STOP.update(after=None, calls=0, sent=False)
    assert main(args("straight")) == 0
    STOP.update(after=16, calls=0, sent=False)  # 16 episodes per rollout: in the second
    assert main(args("signalled")) == 130 and STOP["sent"]
    assert not [t for t in threading.enumerate() if t.name.startswith(("olingo-gateway", "olingo-agent"))]  # nothing left serving
    assert [r["name"] for r in read_jsonl(tmp_path / "signalled" / "checkpoints.jsonl")] == ["step_2", "step_4"]
    assert main([*args("signalled"), "run.resume=last"]) == 0
    assert_same_run(tmp_path / "straight", tmp_path / "signalled")
