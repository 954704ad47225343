"""Ctrl-C/SIGTERM in online RL resumes exactly, and the printed resume command is complete.

A PPO or GRPO run signalled in the middle of an episode finishes that episode, writes its
`step_<N>` checkpoint at the episode boundary (before the evaluations due there, which the
resumed run runs first) and exits 130; resumed, it ends with the same weights, metrics rows and
samples as a run never interrupted. The resume command printed with the stop is the run's own
command line (subcommand included) with `run.resume=last`, its working directory and the
`PYTHONPATH` of the user modules the config named; running that printed line through a shell,
with PYTHONPATH removed from the environment, resumes the run.

Weights are compared with `torch.equal` and metrics rows with `==`: the runs compared are the
same computation (same machine, same process kind, same thread count, same code path), resumed
from a checkpoint that stores the exact RNG, optimizer and data-loader state, so any difference
at all is a resume bug, not a kernel-dependent rounding difference.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file

from olingo.cli.main import main
from olingo.cli.resume_hint import (
    environment_path_entries,
    import_root,
    resume_command,
    torchrun_command,
    user_module_roots,
)
from olingo.trainer.callbacks import Callback
from olingo.trainer.callbacks.registry import register_callback
from tests.conftest import REPO, olingo_cmd, read_jsonl

SIGINT_WHEN = "OLINGO_TEST_SIGINT_WHEN"  # the subprocess case: "<metrics.jsonl>:<train rows>"
_sent: list[bool] = []


@register_callback("test_sigint_at_step")
class SigintAtStep(Callback):
    """Sends this process SIGINT after optimizer step `step` (0: never), as Ctrl-C would."""

    def __init__(self, step: int = 0) -> None:
        self.step = step

    def on_step_end(self, state, step_idx, batch, metrics) -> None:
        if self.step and step_idx == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def signalling_reward(prompt: str, response: str, gt_answer: str | None) -> float:
    """A varied reward (GRPO needs differing rewards in a group). With `$OLINGO_TEST_SIGINT_WHEN`
    set to `<metrics.jsonl>:<N>`, it sends SIGINT once, at its first call after N train rows
    were logged: during the next episode's rollouts (or an evaluation just before them)."""
    when = os.environ.get(SIGINT_WHEN)
    if when and not _sent:
        path, rows = when.rsplit(":", 1)
        logged = read_jsonl(Path(path)) if Path(path).exists() else []
        if sum(row["split"] == "train" for row in logged) >= int(rows):
            _sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
    return float(len(response) % 3) + (1.0 if gt_answer and gt_answer in response else 0.0)


@pytest.fixture(scope="module")
def eval_file(assets, tmp_path_factory) -> Path:
    """Eight held-out prompts: evaluations stay cheap but are real."""
    path = tmp_path_factory.mktemp("eval") / "eval8.jsonl"
    path.write_text("\n".join(assets.prompts_eval.read_text().splitlines()[:8]) + "\n")
    return path


def ppo_args(out: Path, name: str, assets, eval_file: Path, stop_step: int) -> list[str]:
    """6 episodes of 2 optimizer steps; checkpoints every 4 steps and evaluations every 4, so a
    stop at step 4 or 5 resumes with an evaluation pending and step 6 is not a scheduled save."""
    return [
        "ppo", f"run.output_dir={out}", f"run.name={name}", "logging.progress=false", f"model.actor={assets.model_dir}",
        "loop.episodes=6", "loop.rollout_batch_size=8", "loop.train_batch_size=4", "loop.update_steps=1",
        "loop.save_interval=4", "loop.eval_interval=4", "loop.eval_batch_size=8", f"data.eval_prompts=[{eval_file}]",
        "generation.max_new_tokens=4", "actor_optim.lr=1e-3", "critic_optim.lr=1e-3",
        f"callbacks=[{{kind: test_sigint_at_step, params: {{step: {stop_step}}}}}]",
    ]


def grpo_args(out: Path, name: str, assets, eval_file: Path, stop_step: int | None = None) -> list[str]:
    """6 episodes of 2 optimizer steps (4 prompts x 4 generations, batches of 8); with
    `stop_step` (0: never) the signalling callback, which a subprocess does not know."""
    return [
        "grpo", f"run.output_dir={out}", f"run.name={name}", "logging.progress=false", f"model.actor={assets.model_dir}",
        "loop.episodes=6", "loop.rollout_batch_size=4", "loop.train_batch_size=8", "loop.update_steps=1",
        "loop.save_interval=4", "loop.eval_interval=4", "loop.eval_batch_size=8", f"data.eval_prompts=[{eval_file}]",
        "experience.num_generations=4", "experience.kl_coef=0.05", "generation.max_new_tokens=4", "actor_optim.lr=1e-3",
        "reward.functions={tests.test_interrupt_exact:signalling_reward: 1.0}",
        *([f"callbacks=[{{kind: test_sigint_at_step, params: {{step: {stop_step}}}}}]"] if stop_step is not None else []),
    ]


def without_time(rows: list[dict]) -> list[dict]:
    """Metrics rows less wall-clock times and rates, the only values allowed to differ."""
    return [{k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in rows]


def assert_same_run(a: Path, b: Path, models: tuple[str, ...]) -> None:
    for model in models:
        wa, wb = (load_file(d / "checkpoints" / "final" / model / "model.safetensors") for d in (a, b))
        assert wa.keys() == wb.keys()
        for key, value in wa.items():
            assert torch.equal(value, wb[key]), f"{model}.{key}"
    assert without_time(read_jsonl(b / "metrics.jsonl")) == without_time(read_jsonl(a / "metrics.jsonl"))
    samples = read_jsonl(a / "samples.jsonl")
    assert samples and read_jsonl(b / "samples.jsonl") == samples


def interrupt_and_resume(args, capsys) -> str:
    """Run `args` (its callback signals mid-episode), check the stop, resume in this process;
    returns the stop's message line."""
    capsys.readouterr()
    assert main(args) == 130
    line = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("olingo: "))
    assert main([*args, "run.resume=last"]) == 0
    return line


# ---- exact resume after a stop mid-episode ------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("stop_step", [3, 5])
def test_ppo_stopped_mid_episode_resumes_exactly(tmp_path, assets, eval_file, capsys, stop_step):
    assert main(ppo_args(tmp_path, "straight", assets, eval_file, 0)) == 0
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    args = ppo_args(tmp_path, "stopped", assets, eval_file, stop_step)
    capsys.readouterr()
    assert main(args) == 130
    line = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("olingo: "))
    boundary = stop_step + 1  # the signal came after the first of the episode's 2 optimizer steps
    rows = read_jsonl(stopped / "checkpoints.jsonl")
    assert rows[-1]["name"] == f"step_{boundary}" and rows[-1]["step"] == boundary
    assert f"stopped by SIGINT after optimizer step {boundary}; checkpoint {stopped / 'checkpoints' / f'step_{boundary}'} written" in line
    in_process = [sys.executable, "-m", "olingo.cli.main"]  # main() called from Python: this interpreter runs the module
    assert f"resume with: cd {shlex.quote(os.getcwd())} && " in line and line.endswith(shlex.join([*in_process, *args, "run.resume=last"]))
    assert max(r["step"] for r in read_jsonl(stopped / "metrics.jsonl")) == boundary  # the whole episode was trained
    assert main([*args, "run.resume=last"]) == 0
    assert_same_run(straight, stopped, ("actor", "critic"))
    evals = [r["step"] for r in read_jsonl(stopped / "metrics.jsonl") if r["split"] == "eval"]
    assert evals == [0, 4, 8, 12]  # step 4's, pending in the step_4 checkpoint, ran once on resume


@pytest.mark.slow
def test_grpo_stopped_mid_episode_resumes_exactly(tmp_path, assets, eval_file, capsys):
    assert main(grpo_args(tmp_path, "straight", assets, eval_file, stop_step=0)) == 0
    args = grpo_args(tmp_path, "stopped", assets, eval_file, stop_step=3)
    line = interrupt_and_resume(args, capsys)
    assert "after optimizer step 4;" in line and " -m olingo.cli.main grpo " in line
    assert_same_run(tmp_path / "straight", tmp_path / "stopped", ("actor",))


@pytest.mark.slow
def test_printed_resume_command_resumes_a_grpo_run_with_a_user_module(tmp_path, assets, eval_file):
    """The CLI in a subprocess, its reward function from a module found through PYTHONPATH;
    SIGINT arrives during the third episode's rollouts. The printed command, run by a shell
    from another directory without PYTHONPATH, resumes it to the uninterrupted result."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    straight = subprocess.run(olingo_cmd(*grpo_args(tmp_path, "straight", assets, eval_file)), capture_output=True, text=True, timeout=300, env=env)
    assert straight.returncode == 0, straight.stderr[-2000:]
    args = grpo_args(tmp_path, "stopped", assets, eval_file)
    when = f"{tmp_path / 'stopped' / 'metrics.jsonl'}:4"  # after step 4: in episode 3 (steps 5 and 6)
    stopped = subprocess.run(olingo_cmd(*args), capture_output=True, text=True, timeout=300, env={**env, SIGINT_WHEN: when}, cwd=REPO)
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    line = next(line for line in stopped.stderr.splitlines() if line.startswith("olingo: "))
    assert "stopped by SIGINT after optimizer step 6;" in line
    command = line.split("; resume with: ", 1)[1]
    assert command.startswith(f"cd {shlex.quote(str(REPO))} && PYTHONPATH={shlex.quote(str(REPO))} ")
    assert command.endswith(shlex.join([sys.executable, "-m", "olingo.cli.main", *args, "run.resume=last"]))  # started so
    clean = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    resumed = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300, env=clean, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_run(tmp_path / "straight", tmp_path / "stopped", ("actor",))


# ---- the resume command ------------------------------------------------------------------------
def fake_module(name: str, file: Path) -> ModuleType:
    module = ModuleType(name)
    module.__file__ = str(file)
    return module


def fake_olingo_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as if started by the `olingo` script at `<tmp_path>/venv/bin/olingo`."""
    script = tmp_path / "venv" / "bin" / "olingo"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "argv", [str(script)])
    return script


def test_resume_command_is_the_run_command_line_with_its_module_path(tmp_path, monkeypatch):
    user, lib = tmp_path / "my project", tmp_path / "site"
    script = fake_olingo_script(tmp_path, monkeypatch)
    modules = {
        "my_rewards": fake_module("my_rewards", user / "my_rewards.py"),
        "pkg.sub.mod": fake_module("pkg.sub.mod", user / "pkg" / "sub" / "mod.py"),
        "pkg": fake_module("pkg", user / "pkg" / "__init__.py"),
        "installed": fake_module("installed", lib / "installed.py"),  # not from PYTHONPATH: needs nothing
        "olingo.x": fake_module("olingo.x", user / "olingo" / "x.py"),  # olingo is installed with the command
        "builtin_like": ModuleType("builtin_like"),
    }
    environ = {"PYTHONPATH": os.pathsep.join([str(user), str(tmp_path / "unused")]), "OLINGO_HOME": str(tmp_path / "home")}
    monkeypatch.setattr(sys, "path", ["/venv/bin", str(user), str(lib)])
    assert import_root("pkg.sub.mod", modules["pkg.sub.mod"]) == import_root("pkg", modules["pkg"]) == os.path.realpath(user)
    assert user_module_roots(modules, environ) == {os.path.realpath(user): ["my_rewards", "pkg", "pkg.sub.mod"]}
    argv = ["grpo", "--config", "my config.yaml", "reward.functions={my_rewards:score: 1.0}", "run.resume=/old/ckpt"]
    command = resume_command(argv, environ, modules)
    assert command == (
        f"cd {shlex.quote(os.getcwd())} && PYTHONPATH={shlex.quote(os.path.realpath(user))} OLINGO_HOME={os.path.realpath(tmp_path / 'home')} "
        f"{shlex.quote(str(script))} grpo --config 'my config.yaml' 'reward.functions={{my_rewards:score: 1.0}}' run.resume=last"
    )
    assert shlex.split(command.split(" && ", 1)[1])[3:] == [*argv[:-1], "run.resume=last"]  # the shell splits it back as typed


def test_resume_command_needs_nothing_for_installed_modules_and_names_torchrun(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", ["/venv/bin", str(tmp_path)])
    modules = {"elsewhere": fake_module("elsewhere", tmp_path / "elsewhere.py")}
    assert environment_path_entries({}) == [] and user_module_roots(modules, {}) == {}
    script = fake_olingo_script(tmp_path, monkeypatch)  # by its absolute path: it runs without the virtual environment active
    assert resume_command(["ppo", "loop.episodes=2"], {}, modules).endswith(f"&& {shlex.quote(str(script))} ppo loop.episodes=2 run.resume=last")
    monkeypatch.setattr(sys, "argv", [str(REPO / "olingo" / "cli" / "main.py"), "ppo"])  # python -m olingo.cli.main ppo
    assert resume_command(["ppo"], {}, modules).endswith(f"&& {shlex.quote(sys.executable)} -m olingo.cli.main ppo run.resume=last")
    ranks = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}
    assert resume_command(["sft"], ranks, {}).endswith(f"&& {shlex.join(torchrun_command())} --nproc_per_node 4 -m olingo.cli.main sft run.resume=last")


def test_a_resume_error_prints_the_resume_command(tmp_path, capsys):
    args = ["rm", f"run.output_dir={tmp_path}", "run.name=r", f"run.resume={tmp_path / 'nope'}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "run.resume=" in err and err.rstrip().endswith(shlex.join([sys.executable, "-m", "olingo.cli.main", *args[:-1], "run.resume=last"]))


# ---- Ray: the trainer actor stops at an episode boundary too ------------------------------------
@pytest.mark.slow
def test_ray_trainer_asked_to_stop_mid_episode_checkpoints_at_the_episode_end(assets, tmp_path):
    """The driver forwards Ctrl-C as `request_stop`; the trainer finishes the episode in flight
    (4 steps), writes `step_<N>` there instead of `final`, and the driver raises the stop."""
    ray = pytest.importorskip("ray")
    helpers = pytest.importorskip("tests.test_ray")  # its makers and trainers, and their pickling
    from olingo.ray.detached_trainer_base import raise_if_interrupted
    from olingo.trainer.interrupt import TrainingInterrupted

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="olingo-interrupt-tests")
    try:
        maker = helpers.make_maker(assets, "stop-maker", ["stop-trainer"])
        trainer = helpers.make_trainer(assets, "stop-trainer", ["stop-maker"], tmp_path, save_interval=0)
        fit = trainer.fit.remote(total_steps=40, update_steps=4)
        metrics = tmp_path / "metrics.jsonl"
        while not (metrics.exists() and read_jsonl(metrics)):  # the first step of the first episode is done
            done, _ = ray.wait([fit], timeout=0.05)
            assert not done, "fit ended before the stop request"
        ray.get(trainer.request_stop.remote(int(signal.SIGINT)), timeout=60)
        summary = ray.get(fit, timeout=240)
        for actor in (trainer, maker):
            ray.kill(actor)
    finally:
        ray.shutdown()
    stop = summary["interrupted"]
    assert stop["signum"] == signal.SIGINT and stop["step"] % 4 == 0 and 4 <= stop["step"] < 40
    rows = read_jsonl(tmp_path / "checkpoints.jsonl")
    assert [r["name"] for r in rows] == [f"step_{stop['step']}"]  # no `final`: the run is not over
    assert max(r["step"] for r in read_jsonl(metrics)) == stop["step"] == summary["steps"]
    with pytest.raises(TrainingInterrupted, match=f"stopped by SIGINT after optimizer step {stop['step']}"):
        raise_if_interrupted(summary)
