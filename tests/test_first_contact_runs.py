"""First-contact fixes around a run: config errors name a key once, the printed resume command
runs as printed, rollout metrics are logged once per rollout, and the docs say what
`train/clipfrac` counts."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from olingo.cli.resume_hint import resume_command
from olingo.config import ConfigError, load_config, packaged_config
from olingo.config_problems import format_problems
from tests.conftest import REPO, read_jsonl
from tests.test_grpo import build, loader, tok  # noqa: F401 - tok is a fixture

ROLLOUT_ONCE = ("time/make_experience", "perf/tokens_per_s")  # the generation's, logged with rollout/*


# ---- config errors: the key path once --------------------------------------------------------
def problem_lines(overrides: list[str]) -> list[str]:
    from olingo.recipes.grpo_config import GRPOConfig

    with pytest.raises(ConfigError) as info:
        load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), overrides)
    return [line.strip() for line in str(info.value).splitlines()[1:]]


def test_a_section_check_that_names_its_key_is_written_with_the_key_once():
    (line,) = problem_lines(["environment.name=nosuch"])
    assert line.startswith("environment.name: unknown environment 'nosuch'"), line
    (line,) = problem_lines(["plugin.mixed_precision=bf16"])
    assert line == "plugin.mixed_precision and plugin.cpu_offload need plugin.name=fsdp (got single)"
    (line,) = problem_lines(["train.lr=0"])  # a problem found in a section's key: the path, then the message
    assert line.startswith("(top level): unknown key 'train.lr'")


def test_format_problems_keeps_the_path_of_messages_that_do_not_name_it():
    problems = [(("environment",), "environment.params.tols: no such parameter"), (("loop", "episodes"), "Input should be greater than 0"),
                (("environment",), "environmental message")]
    assert format_problems(problems).splitlines() == [
        "  environment.params.tols: no such parameter", "  loop.episodes: Input should be greater than 0", "  environment: environmental message",
    ]
    assert format_problems(problems[:1], prefix="runs.A").strip() == "runs.A.environment.params.tols: no such parameter"


# ---- the resume command runs as printed ------------------------------------------------------------
def launcher(command: str, argv: list[str]) -> list[str]:
    """The program part of a printed resume command (what precedes the run's own arguments)."""
    words = shlex.split(command.split(" && ", 1)[1])
    return words[: len(words) - len(argv) - 1]


def test_the_resume_command_names_the_olingo_script_by_its_absolute_path(tmp_path, monkeypatch):
    script = tmp_path / "venv" / "bin" / "olingo"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["venv/bin/olingo", "grpo"])  # started by a relative path
    argv = ["grpo", "--config", "my config.yaml"]
    assert launcher(resume_command(argv, {}, {}), argv) == [str(script)]
    monkeypatch.setattr(sys, "argv", ["-c"])  # main() called from Python: this interpreter runs the module
    assert launcher(resume_command(argv, {}, {}), argv) == [sys.executable, "-m", "olingo.cli.main"]
    torchrun = launcher(resume_command(argv, {"WORLD_SIZE": "2"}, {}), argv)
    assert Path(torchrun[0]).is_absolute() and torchrun[-4:] == ["--nproc_per_node", "2", "-m", "olingo.cli.main"]


@pytest.mark.slow
def test_the_printed_launcher_runs_without_the_virtual_environment_on_the_path(monkeypatch):
    script = Path(sys.executable).parent / "olingo"
    if not script.is_file():
        pytest.skip("olingo is not installed as a script beside this interpreter")
    monkeypatch.setattr(sys, "argv", [str(script), "configs"])
    command = resume_command(["configs"], {}, {})
    program = shlex.join(launcher(command, ["configs"]))
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}  # the virtual environment is not active
    run = subprocess.run(["bash", "-c", f"{program} configs"], capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "grpo_tiny.yaml" in run.stdout


# ---- rollout metrics once per rollout ----------------------------------------------------------
@pytest.mark.slow
def test_rollout_metrics_are_on_the_first_row_of_each_episode_only(assets, tok, tmp_path):  # noqa: F811 - the fixture
    """2 episodes of 2 optimizer steps (8 rollouts, one minibatch, 2 passes): rollout/* and the
    generation's time and rate are on steps 1 and 3; each step has its own train/*; the report
    draws the rollout curves from those rows."""
    from olingo.cli.report import write_report
    from olingo.cli.report_series import summarize

    trainer = build(assets, tok, save_dir=str(tmp_path), train_batch_size=8, kl_coef=0.05)
    trainer.fit(2, 1, 2, loader(assets, tok, batch_size=2))
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    carrying = [r["step"] for r in rows if any(k.startswith("rollout/") or k in ROLLOUT_ONCE for k in r)]
    assert carrying == [1, 3]
    assert {"rollout/reward_mean", "rollout/kl", "rollout/response_length", *ROLLOUT_ONCE} <= rows[0].keys()
    assert all("train/policy_loss" in r and "time/learn" in r for r in rows)
    summary = summarize(tmp_path)
    assert summary["rollout/reward_mean"]["n"] == 2 and summary["train/policy_loss"]["n"] == 4
    written = {p.name for p in write_report(tmp_path)}
    assert {"reward.png", "rollout.png", "train.png"} <= written


def test_the_progress_line_keeps_the_latest_rollout_on_the_episodes_later_steps(caplog):
    from olingo.trainer.callbacks import LoopState
    from olingo.trainer.callbacks.builtin import PrintMetrics

    cb, state = PrintMetrics(), LoopState(step=0, num_steps=4)
    cb.on_train_start(state)
    with caplog.at_level("INFO", logger="olingo.metrics"):
        cb.on_step_end(state, 1, None, {"train/policy_loss": 0.5, "rollout/reward_mean": 0.375})
        cb.on_step_end(state, 2, None, {"train/policy_loss": 0.25})  # the same rollout, learnt again
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert len(lines) == 2 and all("reward" in line and "0.375" in line for line in lines), lines


# ---- docs: train/clipfrac is a share of tokens -----------------------------------------------------
def test_gspo_clipfrac_is_the_share_of_tokens_in_clipped_responses_as_the_docs_say():
    """A clipped response of 4 tokens and an unclipped one of 2: 4/6 of the tokens, not 1 of 2
    responses."""
    from olingo.rl.policy_loss import GroupPolicyLoss

    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    old = torch.zeros(2, 4)
    new = torch.tensor([[0.1] * 4, [0.0] * 4])  # the first response's ratio leaves GSPO's band
    _, stats = GroupPolicyLoss(objective="gspo")(new, old, torch.ones(2, 4), mask, 1.0)
    assert stats["clipfrac"].item() == pytest.approx(4 / 6)
    docs = " ".join((REPO / "docs" / "algorithms.md").read_text().split())
    assert "`train/clipfrac` is a share of response tokens" in docs and "counts clipped sequences" not in docs
