"""What a GRPO/PPO user sees of progress: the step-0 evaluation (without touching the training
RNG stream, and not repeated on resume), the progress bar's reward and last eval, samples from
the first step, and a short per-step summary line."""

from __future__ import annotations

import io
import logging
import shutil
import sys

import torch
from safetensors.torch import load_file

from olingo.trainer.callbacks import LoopState
from olingo.trainer.callbacks.builtin import PrintMetrics, ProgressBar, RolloutSamples
from olingo.trainer.callbacks.builtin.progress import pick_metrics
from tests.conftest import read_jsonl
from tests.test_callbacks_builtin import artifacts

# The metric names the RL trainers log (PPO and GRPO log no train/loss, train/lr or */reward).
GRPO_STEP = {
    "train/policy_loss": -0.0123, "train/kl_loss": 0.0012, "train/entropy": 4.6, "train/actor_lr": 9.5e-7,
    "train/actor_grad_norm": 0.3, "rollout/reward_mean": 0.375, "rollout/reward_std": 0.2, "rollout/group_reward_std": 0.1,
    "rollout/reward/arithmetic_exact": 0.375, "rollout/response_length": 3.0, "time/make_experience": 0.02, "perf/tokens_per_s": 1200.0,
}


def without_time(rows):
    return [{k: v for k, v in row.items() if not k.startswith(("time", "perf/"))} for row in rows]


def grpo_cfg(tmp_path, name, **loop):
    from olingo.recipes.grpo_config import GRPOConfig

    return GRPOConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": name},
        "loop": {"episodes": 2, "rollout_batch_size": 2, "train_batch_size": 8, "eval_batch_size": 16, "accuracy_function": "arithmetic_exact", **loop},
        "experience": {"num_generations": 4, "kl_coef": 0.05}, "generation": {"max_new_tokens": 3}, "actor_optim": {"lr": 1e-3},
        "reward": {"functions": {"tests.test_grpo:varied_reward": 1.0}}, "logging": {"progress": False},
        "callbacks": [{"kind": "print_progress"}],
    })


def ppo_cfg(tmp_path, name, **run):
    from olingo.recipes.ppo_config import PPOConfig

    return PPOConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": name, **run},
        "loop": {"episodes": 4, "rollout_batch_size": 4, "train_batch_size": 4, "eval_batch_size": 16, "save_interval": 2},
        "generation": {"max_new_tokens": 3}, "actor_optim": {"lr": 1e-3}, "critic_optim": {"lr": 1e-3}, "logging": {"progress": False},
    })


# ---- (a) evaluation before training ---------------------------------------------------------------
def test_grpo_evaluates_before_training_without_changing_the_training(tmp_path, assets, caplog):
    from olingo.recipes.grpo import run_grpo

    caplog.set_level(logging.INFO, logger="olingo.metrics")
    on = run_grpo(grpo_cfg(tmp_path, "on"))
    off = run_grpo(grpo_cfg(tmp_path, "off", eval_before_training=False))
    rows_on, rows_off = read_jsonl(tmp_path / "on" / "metrics.jsonl"), read_jsonl(tmp_path / "off" / "metrics.jsonl")
    assert [(r["step"], r["split"]) for r in rows_on] == [(0, "eval"), (1, "train"), (2, "train"), (2, "eval")]
    assert [(r["step"], r["split"]) for r in rows_off] == [(1, "train"), (2, "train"), (2, "eval")]
    first = rows_on[0]
    assert {"eval/reward", "eval/accuracy", "eval/kl"} <= set(first)
    assert on["eval_before"] == {k: v for k, v in first.items() if k.startswith("eval/")} and off["eval_before"] is None
    assert abs(first["eval/kl"]) < 1e-6  # the policy is its reference before any step (float noise only, if any)
    assert (tmp_path / "on" / "eval" / "step_0.json").is_file()
    # Evaluation samples in its own fork_rng: training draws the same noise with or without it, so
    # the same computation on the same machine gives bit-identical rows and weights.
    assert without_time(r for r in rows_on if r["split"] == "train") == without_time(r for r in rows_off if r["split"] == "train")
    final = {name: load_file(tmp_path / name / "checkpoints" / "final" / "actor" / "model.safetensors") for name in ("on", "off")}
    assert all(torch.equal(value, final["off"][key]) for key, value in final["on"].items())
    assert rows_on[-1] == {**rows_off[-1], "time": rows_on[-1]["time"]}  # the final evaluation, too

    # (c) samples from the first step, though the default interval (10) is longer than the run
    samples = read_jsonl(tmp_path / "on" / "samples.jsonl")
    assert {row["step"] for row in samples} == {1} and len(samples) == 4

    # (d) the per-step line is short and holds the key metrics; the rest is in metrics.jsonl
    lines = [r.getMessage() for r in caplog.records if r.name == "olingo.metrics"]
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) == 4 and all(len(line) < 100 for line in steps), steps
    assert all(word in steps[0] for word in ("step 1/2", "loss", "reward", "kl", "lr", "s/step")) and "rollout/" not in steps[0]
    assert any(line.startswith("eval @ step 0 | accuracy=") for line in lines)


def test_ppo_resumed_run_keeps_its_step_zero_evaluation_and_does_not_repeat_it(tmp_path, assets):
    from olingo.recipes.ppo import run_ppo

    straight = run_ppo(ppo_cfg(tmp_path, "straight"))
    rows = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    assert [r["step"] for r in rows if r["split"] == "eval"] == [0, 4]
    assert straight["eval_before"]["eval/reward"] == rows[0]["eval/reward"]
    # As if killed after step 3: the run directory as it was, resumed from the step-2 checkpoint
    # (metrics.jsonl drops the rows after step 2, then the resumed process writes them again).
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    resumed = run_ppo(ppo_cfg(tmp_path, "resumed", resume=str(tmp_path / "resumed" / "checkpoints" / "step_2")))
    assert resumed["eval_before"] is None  # not evaluated again
    again = read_jsonl(tmp_path / "resumed" / "metrics.jsonl")
    assert [r["step"] for r in again if r["split"] == "eval"] == [0, 4]
    assert without_time(again) == without_time(rows)
    assert read_jsonl(tmp_path / "resumed" / "samples.jsonl") == read_jsonl(tmp_path / "straight" / "samples.jsonl")


# ---- (b) the progress bar ------------------------------------------------------------------------
def test_progress_bar_shows_the_mean_reward_and_the_last_eval(tmp_path, monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    bar, state = ProgressBar(mininterval=0.0), LoopState(step=0, num_steps=3, output_dir=tmp_path)
    bar.on_train_start(state)
    bar.on_eval(state, 0, "eval", {"eval/reward": 0.25, "eval/reward_std": 0.4, "eval/accuracy": 0.125})
    for step in (1, 2):
        bar.on_step_end(state, step, None, GRPO_STEP)
    postfix = bar._bar.postfix
    assert "loss=-0.0123" in postfix and "reward=0.375" in postfix and "lr=9.50e-07" in postfix
    assert postfix.endswith("eval/accuracy=0.125")  # accuracy when the evaluation has one ...
    bar.on_eval(state, 2, "eval", {"eval/reward": 0.5, "eval/kl": 0.01})
    assert bar._bar.postfix.endswith("eval/reward=0.5")  # ... else the reward
    bar.on_train_end(state, artifacts(state))
    assert "eval/reward=0.5" in err.getvalue()


# ---- (c) samples ------------------------------------------------------------------------------------
def test_rollout_samples_are_written_at_the_first_step_then_every_n(tmp_path):
    cb, state = RolloutSamples(every=3, num_samples=1), LoopState(step=0, num_steps=7, output_dir=tmp_path)
    state.extra["rollout_samples"] = [{"prompt": "1+1=", "response": "2", "gt_answer": "2", "reward": 1.0, "truncated": False}]
    cb.on_train_start(state)
    for step in range(1, 8):
        cb.on_step_end(state, step, None, {})
    cb.on_train_end(state, artifacts(state))
    assert [row["step"] for row in read_jsonl(tmp_path / "samples.jsonl")] == [1, 3, 6]
    assert not RolloutSamples(every=0).is_due(1)  # 0 stays "never"


# ---- (d) the summary line -----------------------------------------------------------------------------
def test_summary_line_is_short_aligned_and_picks_the_rl_names(tmp_path, caplog):
    from olingo.trainer.callbacks.builtin.progress import summary_line

    assert pick_metrics(GRPO_STEP, ["loss", "reward", "kl", "lr"]) == {"loss": -0.0123, "reward": 0.375, "kl": 0.0012, "lr": 9.5e-7}
    assert pick_metrics({"train/loss": 0.5, "train/policy_loss": 9.0}, ["loss"]) == {"loss": 0.5}  # the plain name first
    caplog.set_level(logging.INFO, logger="olingo.metrics")
    cb, state = PrintMetrics(), LoopState(step=0, num_steps=12, output_dir=tmp_path)
    cb.on_train_start(state)
    for step, reward in ((1, 0.0), (10, 0.375), (12, -1.25e-4)):
        cb.on_step_end(state, step, None, {**GRPO_STEP, "rollout/reward_mean": reward})
    lines = [r.getMessage() for r in caplog.records if r.name == "olingo.metrics"]
    assert lines[0].startswith("step  1/12 | loss") and lines[1].startswith("step 10/12 | loss")
    assert len({line.index("reward") for line in lines}) == 1 and len({line.index(" lr ") for line in lines}) == 1  # columns stack
    assert all(line.endswith("s/step") and len(line) < 100 for line in lines)
    assert summary_line(3, 0, {}) == "step 3"
