"""Multi-turn episodes on every backend (docs/agents.md, "Backends"): the Ray makers of GRPO and
PPO build their own `MultiTurnSource` from the `environment:` section and the trainer logs what
they measured; torchrun ranks (DDP, FSDP2) stay in lockstep under DAPO's dynamic sampling while
their episodes take different numbers of turns; LoRA makers run episodes.

The untrained tiny model rarely ends a turn with its end-of-turn token within 8 tokens, and a
turn without a stop ends its episode; the stop strings below end most turns early, so episodes
do go on for a second turn.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess

import pytest
import torch

from olingo.engines import GenerationSettings
from olingo.experience_maker import ExperienceConfig
from olingo.experience_maker.group import GroupExperienceConfig
from olingo.models import load_causal_lm, load_tokenizer, stop_token_ids
from olingo.models.critic import Critic
from olingo.models.lora import trainable_state
from olingo.ray.detached_replay_buffer import DetachedReplayBuffer
from olingo.ray.making import GroupMaking, PPOMaking
from olingo.recipes.common import LoraSettings
from olingo.recipes.online_config import EnvironmentConfig
from olingo.rewards.functions import CompositeReward
from olingo.rollout import EnvStep, MultiTurnSource
from tests.conftest import olingo_cmd, read_jsonl
from tests.test_ppo import prompt_batch

STOP_CHARS = ["1", "2", "3", "a", "e", "o"]
STOPS = "generation.stop_strings=['1','2','3','a','e','o']"
ENV = EnvironmentConfig(name="arithmetic_retry", max_turns=2, max_new_tokens=8, max_episode_tokens=64)


class RankSkewedRetry:
    """Rank 0's episodes end after one turn with reward 0, so its groups never differ and DAPO's
    dynamic sampling keeps drawing there; rank 1's go on for up to three turns, rewarded by the
    length of each answer, so its groups differ and it fills at once. The ranks then make
    different numbers of generate calls and of draws per step, which they must survive in
    lockstep (a full rank advances its prompts without generating)."""

    def reset(self, row: dict) -> None:
        self.rank, self.turn = int(os.environ.get("RANK", "0")), 0

    def step(self, assistant: str) -> EnvStep:
        self.turn += 1
        if self.rank == 0:
            return EnvStep(done=True)
        return EnvStep([{"role": "user", "content": "Again."}], reward=len(assistant) % 3 / 2, done=self.turn >= 3)


def train_rows(run_dir) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] == "train"]


def rollout_rows(rows: list[dict]) -> list[dict]:
    """The rows that log a rollout: each episode's first optimizer step in a local or torchrun
    run (docs/runs.md), every step under Ray (the makers' latest measurements)."""
    return [r for r in rows if any(key.startswith("rollout/") for key in r)]


def assert_multi_turn(rows: list[dict]) -> None:
    """Every row that logs a rollout logs the episodes as a local run does; some went on for a second turn."""
    rows = rollout_rows(rows)
    assert rows and all({"rollout/turns_per_episode", "rollout/env_reward", "rollout/reward/environment", "rollout/env_errors"} <= r.keys() for r in rows)
    assert max(r["rollout/turns_per_episode"] for r in rows) > 1.0
    assert max(r["rollout/env_tokens_per_episode"] for r in rows) > 0.0
    assert all(r["rollout/env_errors"] == 0 for r in rows)


# ---- the makers (in this process: the code a Ray maker runs) -------------------------------------------
@pytest.mark.slow
def test_ray_makers_build_episodes_from_the_environment_section_and_the_buffer_keeps_their_metrics(assets):
    """Both makings, given the typed section (and pickled, as they travel to the actors), sample
    episodes whose environment tokens are attended but not actions; the trainer's buffer keeps
    each pushed batch's metrics apart from its re-batched rows and averages them per key."""
    model = str(assets.model_dir)
    tok = load_tokenizer(model, padding_side="left")
    generation = GenerationSettings(max_new_tokens=8, stop_token_ids=stop_token_ids(tok, model), stop_strings=STOP_CHARS)
    group = pickle.loads(pickle.dumps(GroupMaking(GroupExperienceConfig(num_generations=4, kl_coef=0.0), environment=ENV)))
    ppo = pickle.loads(pickle.dumps(PPOMaking(0.0, ExperienceConfig(), environment=ENV)))
    empty = CompositeReward((), allow_empty=True)  # the environment's reward is the only one
    torch.manual_seed(0)
    makers = [
        (group, group.build((load_causal_lm(model), empty, None), tok, generation, None)),
        (ppo, ppo.build((load_causal_lm(model), Critic.from_pretrained(model, pad_token_id=tok.pad_token_id), empty, load_causal_lm(model)),
                        tok, generation, None)),
    ]
    batches = [prompt_batch(tok, ["1+2=", "3+4=", "10+5=", "7+7="]), prompt_batch(tok, ["19+5=", "1+29=", "9+7=", "13+14="])]
    for making, maker in makers:
        assert isinstance(maker.source, MultiTurnSource) and maker.engine is maker.source.engine
        experience = making.make(maker, batches[0], lambda: pytest.fail("no resampling"), policy_version=0)
        info = experience.info
        assert info["turns_per_episode"] > 1.0 and info["env_tokens_per_episode"] > 0 and "reward/environment" in info
        environment_tokens = experience.attention_mask[:, experience.num_prompt_tokens :].bool() & ~experience.action_mask.bool()
        assert int(environment_tokens.sum()) == round(info["env_tokens_per_episode"] * experience.batch_size)

    made = [group.make(makers[0][1], b, lambda: pytest.fail("no resampling"), policy_version=0) for b in batches]
    buffer = DetachedReplayBuffer(sample_batch_size=8)
    assert all(buffer.append(e) == "accepted" for e in made)
    rows = buffer.sample(timeout=0)
    assert rows.info == {}  # re-batched rows carry no info of their own; their masks keep the environment's tokens out
    assert (rows.attention_mask[:, rows.num_prompt_tokens :].bool() & ~rows.action_mask.bool()).any()
    means = buffer.take_info()
    assert means.keys() == made[0].info.keys()
    for key, value in means.items():  # the mean of two numbers, computed the same way: 1e-12 covers summation order only
        assert value == pytest.approx((made[0].info[key] + made[1].info[key]) / 2, rel=1e-12, abs=1e-12), key
    assert buffer.take_info() == {}, "each batch's metrics are counted once"


# ---- Ray ----------------------------------------------------------------------------------------------
def ray_run(tmp_path, command: str, name: str, *args: str) -> list[dict]:
    """`olingo <command>` with ray.enabled on a local instance it starts (2 CPUs, every wait
    bounded); the run's training rows. No Ray process may outlive it."""
    pytest.importorskip("ray")
    from tests.test_ray_cli import ray_pids, wait_gone

    before = ray_pids()
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    cmd = olingo_cmd(
        command, *args, f"run.output_dir={tmp_path}", f"run.name={name}", "logging.progress=false", "loop.save_interval=0",
        "ray.enabled=true", "ray.num_cpus=2", "ray.call_timeout_s=120", "ray.experience_timeout_s=120", STOPS,
    )
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    assert not wait_gone(ray_pids() - before), "the CLI must shut down the Ray instance it started"
    assert json.loads((tmp_path / name / "ray_summary.json").read_text())["steps"] == len(train_rows(tmp_path / name))
    return train_rows(tmp_path / name)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_ray_grpo_runs_the_packaged_multi_turn_config(tmp_path, assets, lora):
    """With LoRA and a KL term, each maker's reference is its own actor with the adapters
    disabled, on rows with environment tokens, and a weight sync ships the adapters alone; a
    reward that differs inside groups (the untrained model earns no environment reward) makes
    the adapters move, so the second step's KL to the base is above 0."""
    extra = ["model.lora.r=4", "model.lora.alpha=8", "actor_optim.lr=1e-2", "experience.kl_coef=0.05", "reward.functions={tests.test_grpo:varied_reward: 1.0}"]
    rows = ray_run(
        tmp_path, "grpo", "ray-agent", "--config", "grpo_agent_tiny.yaml", f"model.actor={assets.model_dir}", "loop.episodes=2",
        "loop.rollout_batch_size=4", "experience.num_generations=4", "loop.train_batch_size=16", *(extra if lora else []),
    )
    assert [r["step"] for r in rows] == [1, 2]  # one buffer batch of 4 prompts x 4 episodes per episode
    assert_multi_turn(rows)
    assert all("train/policy_loss" in r and "ray/staleness" in r for r in rows)
    if lora:
        adapters = trainable_state(LoraSettings(r=4, alpha=8).apply(load_causal_lm(str(assets.model_dir))))
        assert all(r["perf/weight_sync_tensors"] == len(adapters) for r in rows)
        # Zero-initialised adapters: policy and reference differ by float rounding at most
        # (1e-7); after one step at lr 1e-2 the adapters moved (KL about 1e-5 at lr 5e-4).
        assert abs(rows[0]["train/kl_loss"]) < 1e-7 and rows[1]["train/kl_loss"] > 1e-5


@pytest.mark.slow
def test_ray_ppo_runs_multi_turn_episodes(tmp_path, assets):
    rows = ray_run(
        tmp_path, "ppo", "ray-agent-ppo", f"model.actor={assets.model_dir}", "reward.model=null", "reward.functions={}",
        "environment.name=arithmetic_retry", "environment.max_turns=2", "environment.max_new_tokens=8", "generation.max_new_tokens=8",
        "data.eval_prompts=[]", "loop.episodes=2", "loop.rollout_batch_size=8", "loop.train_batch_size=8", "loop.update_steps=1",
    )
    assert [r["step"] for r in rows] == [1, 2]
    assert_multi_turn(rows)
    assert all("train/value_loss" in r and "rollout/kl_coef" in r for r in rows)


# ---- torchrun --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("plugin", ["ddp", "fsdp"])
def test_torchrun_ranks_stay_in_lockstep_while_their_episodes_differ(tmp_path, assets, plugin):
    """2 gloo ranks, `RankSkewedRetry`: rank 0 never fills its batch, rank 1 does at once and
    then advances its prompts without generating; every step still completes on both."""
    from tests.test_fsdp import torchrun

    rounds = 3
    torchrun(
        "grpo", "--config", "grpo_agent_tiny.yaml", f"run.output_dir={tmp_path}", "run.name=ranks", "logging.progress=false",
        f"model.actor={assets.model_dir}", f"plugin.name={plugin}", "loop.episodes=2", "loop.rollout_batch_size=4", "loop.train_batch_size=16",
        "loop.save_interval=0", "experience.num_generations=4", "experience.dynamic_sampling=true", f"experience.max_resample_rounds={rounds - 1}",
        "environment.name=tests.test_agent_backends:RankSkewedRetry", "environment.max_turns=3", STOPS,
    )
    rows = train_rows(tmp_path / "ranks")
    assert [r["step"] for r in rows] == [1, 2]
    assert_multi_turn(rows)  # rank 0's episodes have one turn, so a mean above 1 is rank 1's going on
    # Means over the ranks: both drew in lockstep for every round (rank 0 is never full), but
    # rank 1 generated for fewer of them, once its groups were kept.
    assert all(r["rollout/dynamic_sampling/rounds"] == rounds for r in rows)
    assert min(r["rollout/dynamic_sampling/sampled_groups"] for r in rows) < rounds * 4
