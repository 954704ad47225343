"""A multi-turn GRPO run stopped in the middle of its episodes resumes to the uninterrupted result.

Killed: the environment raises `KeyboardInterrupt` from the first step of the third rollout,
once the episodes' first turns are sampled and while they are in flight; that stops the
process at once, as a second Ctrl-C does: those episodes are lost and nothing after the last
checkpoint (`step_4`) is kept. Resumed with `run.resume=last`, they start again from their rows
with the RNG state the checkpoint holds. Signalled: a step sends one SIGINT from its thread in
the second rollout; the rollout and its optimizer steps finish, `step_4` is written there, and
the run resumes from it. Both end with the same weights and metrics rows as a run never
stopped. As in tests/test_interrupt_exact.py, weights are compared with `torch.equal` and rows
with `==` (less wall-clock seconds): the runs are the same computation on the same machine and
code path, resumed from a checkpoint holding the exact RNG, optimizer and data-loader state, so
any difference is a resume bug, not rounding.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from olingo.cli.main import main
from olingo.rollout.environment import EnvStep
from olingo.rollout.retry import RetryArithmetic
from tests.conftest import read_jsonl

STOP = {"after_resets": None, "resets": 0, "stopped": False, "signal": False}  # set by the test; counted across episodes


class StoppingRetry(RetryArithmetic):
    """`arithmetic_retry` that stops the run at its first step after `STOP["after_resets"]`
    resets (16 per rollout here: 4 prompts x 4 generations): at once, or with `STOP["signal"]`
    by sending SIGINT, as one Ctrl-C, from the step's thread."""

    def reset(self, row: dict) -> None:
        STOP["resets"] += 1
        super().reset(row)

    def step(self, assistant: str) -> EnvStep:
        after = STOP["after_resets"]
        if after is not None and STOP["resets"] > after and not STOP["stopped"]:
            STOP["stopped"] = True
            if STOP["signal"]:
                os.kill(os.getpid(), signal.SIGINT)
                return super().step(assistant)
            raise KeyboardInterrupt  # leaves the step's thread and the event loop as Ctrl-C would
        return super().step(assistant)


def args(out, name: str, assets) -> list[str]:
    """3 rollouts of 16 episodes (up to 2 turns), 2 optimizer steps each; a checkpoint every 2 steps."""
    return [
        "grpo", "--config", "grpo_tiny.yaml", f"run.output_dir={out}", f"run.name={name}", "logging.progress=false",
        f"model.actor={assets.model_dir}", "loop.episodes=3", "loop.rollout_batch_size=4", "loop.train_batch_size=8",
        "loop.update_steps=1", "loop.save_interval=2", "loop.eval_interval=0", "data.eval_prompts=[]",
        "experience.num_generations=4", "generation.max_new_tokens=6", "actor_optim.lr=1e-3", "reward.functions={}",
        "environment.name=tests.test_agent_resume:StoppingRetry", "environment.max_turns=2", "environment.max_new_tokens=6",
    ]


def without_time(rows: list[dict]) -> list[dict]:
    """Metrics rows less wall-clock times and rates (`rollout/env_seconds`, ...), the only values allowed to differ."""
    return [{k: v for k, v in r.items() if not k.startswith(("time", "perf/")) and not k.endswith("_seconds")} for r in rows]


def assert_same_run(a, b) -> None:
    wa, wb = (load_file(d / "checkpoints" / "final" / "actor" / "model.safetensors") for d in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(value, wb[key]) for key, value in wa.items())
    assert without_time(read_jsonl(b / "metrics.jsonl")) == without_time(read_jsonl(a / "metrics.jsonl"))


@pytest.mark.slow
def test_a_multi_turn_run_stopped_mid_episode_resumes_exactly(tmp_path, assets):
    STOP.update(after_resets=None, resets=0, stopped=False, signal=False)
    assert main(args(tmp_path, "straight", assets)) == 0
    straight_turns = [r["rollout/turns_per_episode"] for r in read_jsonl(tmp_path / "straight" / "metrics.jsonl") if "rollout/turns_per_episode" in r]
    assert len(straight_turns) == 3 and straight_turns[2] > 1.0  # one value per rollout; the third's first turns get replies: its steps run

    STOP.update(after_resets=32, resets=0, stopped=False)  # at once, in the third rollout
    killed = args(tmp_path, "killed", assets)
    assert main(killed) == 130 and STOP["stopped"]
    assert [r["name"] for r in read_jsonl(tmp_path / "killed" / "checkpoints.jsonl")] == ["step_2", "step_4"]
    assert max(r["step"] for r in read_jsonl(tmp_path / "killed" / "metrics.jsonl")) == 4  # the third rollout was lost
    assert main([*killed, "run.resume=last"]) == 0
    assert_same_run(tmp_path / "straight", tmp_path / "killed")

    STOP.update(after_resets=16, resets=0, stopped=False, signal=True)  # one Ctrl-C in the second rollout
    signalled = args(tmp_path, "signalled", assets)
    assert main(signalled) == 130 and STOP["stopped"]
    assert [r["name"] for r in read_jsonl(tmp_path / "signalled" / "checkpoints.jsonl")] == ["step_2", "step_4"]  # its episode finished
    assert main([*signalled, "run.resume=last"]) == 0
    assert_same_run(tmp_path / "straight", tmp_path / "signalled")
