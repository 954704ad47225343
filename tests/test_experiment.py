"""Experiments end to end on the tiny model: hook order, loggers, report, failures, continual,
early stopping, W&B offline, PPO arms, and the experiment commands of docs/experiments.md."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from matplotlib.image import imread

from olingo.cli.main import main
from olingo.config import load_config
from olingo.experiment import Experiment, ExperimentConfig
from olingo.trainer.callbacks import Callback
from olingo.trainer.sft import SFTTrainer

README = Path(__file__).resolve().parents[1] / "README.md"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def small_sft(assets, tmp_path_factory) -> dict[str, Path]:
    """16 training and 8 held-out conversations: 2 optimizer steps per epoch at batch size 8."""
    root = tmp_path_factory.mktemp("sft_small")
    train, held_out = root / "train16.jsonl", root / "eval8.jsonl"
    train.write_text("\n".join(assets.sft_train.read_text().splitlines()[:16]) + "\n")
    held_out.write_text("\n".join(assets.sft_eval.read_text().splitlines()[:8]) + "\n")
    return {"train": train, "eval": held_out}


def sft_arm(small_sft: dict[str, Path], **train: float) -> str:
    """A tiny SFT arm as a YAML flow mapping."""
    settings = {"epochs": 1, "batch_size": 8, "lr": 1e-3, **train}
    return (
        "{stage: sft, config: 'packaged:sft_tiny.yaml', logging: {progress: false}, "
        f"data: {{train: ['{small_sft['train']}'], eval: ['{small_sft['eval']}']}}, train: {json.dumps(settings)}}}"
    )


def experiment(tmp_path: Path, *overrides: str, callbacks=()) -> Experiment:
    base = [f"output_dir={tmp_path}", "name=exp"]
    return Experiment(load_config(ExperimentConfig, None, [*base, *overrides]), callbacks=callbacks)


class Recorder(Callback):
    """(hook, run, detail) for every experiment and loop hook, in firing order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.run: str | None = None
        self.artifacts = {}

    def on_experiment_start(self, ctx):
        self.calls.append(("on_experiment_start", None, None))

    def on_group_start(self, ctx, group_name):
        self.calls.append(("on_group_start", None, group_name))

    def on_run_start(self, ctx):
        self.run = ctx.run_name
        assert ctx.run_config["stage"] in ("sft", "ppo") and ctx.run_config["run"]["name"] == ctx.run_name
        self.calls.append(("on_run_start", self.run, ctx.group_name))

    def on_train_start(self, state):
        assert state.ctx is not None and state.ctx.run_name == self.run
        self.calls.append(("on_train_start", self.run, state.step))

    def on_step_end(self, state, step_idx, batch, metrics):
        self.calls.append(("on_step_end", self.run, step_idx))

    def on_checkpoint(self, state, row):
        self.calls.append(("on_checkpoint", self.run, row.name))

    def on_eval(self, state, step_idx, eval_name, metrics):
        self.calls.append(("on_eval", self.run, (step_idx, eval_name)))

    def on_train_end(self, state, artifacts):
        self.artifacts[self.run] = artifacts
        self.calls.append(("on_train_end", self.run, artifacts.completed_steps))

    def on_benchmark_eval(self, ctx, eval_result, predictions, *, step=None):
        assert eval_result.step == step and len(predictions) == eval_result.metrics["n"]
        self.calls.append(("on_benchmark_eval", self.run, (eval_result.name, step)))

    def on_run_end(self, ctx, run_result, arm):
        assert arm.name == ctx.run_name == self.run
        self.calls.append(("on_run_end", self.run, arm.status))

    def on_experiment_end(self, ctx, result):
        self.calls.append(("on_experiment_end", None, result.status))


def expected_sft_run(run: str, group: str | None) -> list[tuple]:
    """The documented order for one run of 2 optimizer steps with an in-loop benchmark every 2."""
    return [
        ("on_run_start", run, group), ("on_train_start", run, 0),
        ("on_step_end", run, 1), ("on_step_end", run, 2),
        ("on_eval", run, (2, "arithmetic")), ("on_benchmark_eval", run, ("arithmetic", 2)),  # in the loop
        ("on_eval", run, (2, "eval")),  # end of the epoch
        ("on_checkpoint", run, "final"), ("on_train_end", run, 2),
        ("on_benchmark_eval", run, ("arithmetic", None)),  # after training
        ("on_run_end", run, "completed"),
    ]


# ---- 2 arms x 2 repeats ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_by_two(small_sft, tmp_path_factory):
    """Arms A (lr 1e-3) and B (lr 3e-3), seeds 42 and 43, every file logger on."""
    tmp = tmp_path_factory.mktemp("two_by_two")
    recorder = Recorder()
    exp = experiment(
        tmp, "n_repeats=2", "base_seed=42", "hypothesis=a larger lr learns faster", "success_metric=eval/loss", "success_mode=min",
        f"runs={{A: {sft_arm(small_sft, lr=1e-3)}, B: {sft_arm(small_sft, lr=3e-3)}}}",
        "benchmarks=[{kind: arithmetic, params: {limit: 4, max_new_tokens: 3}, run_every: 2}]",
        "callbacks=[{kind: local_logger}, {kind: csv_metrics}, {kind: tensorboard_logger}, {kind: print_progress}, {kind: debug_logger}]",
        callbacks=[recorder],
    )
    return exp, exp.run(), recorder


def test_hook_order_two_arms_two_repeats(two_by_two):
    exp, result, recorder = two_by_two
    expected = [("on_experiment_start", None, None), ("on_group_start", None, "A"), ("on_group_start", None, "B")]
    for run in ("A__s42", "A__s43", "B__s42", "B__s43"):
        expected += expected_sft_run(run, run[0])
    expected.append(("on_experiment_end", None, "completed"))
    assert recorder.calls == expected
    # debug_logger saw the same hooks in the same order (it records every hook, online ones too)
    hooks = [event["hook"] for event in read_jsonl(exp.dir / "hooks.jsonl")]
    assert hooks == [call[0] for call in recorder.calls]


def test_results_seeds_and_best_arm(two_by_two):
    exp, result, _ = two_by_two
    assert [(a.name, a.arm, a.group, a.seed, a.status, a.steps) for a in result.arms] == [
        ("A__s42", "A", "A", 42, "completed", 2), ("A__s43", "A", "A", 43, "completed", 2),
        ("B__s42", "B", "B", 42, "completed", 2), ("B__s43", "B", "B", 43, "completed", 2),
    ]
    assert result.arms[1].run_config["run"]["seed"] == 43 and result.arms[3].run_config["train"]["lr"] == 3e-3
    losses = {a.arm: [] for a in result.arms}
    for a in result.arms:
        losses[a.arm].append(a.metrics["eval/loss"])
        assert [(e.name, e.step) for e in a.evals] == [("arithmetic", 2), ("arithmetic", None)]
        assert a.eval_metrics["arithmetic/n"] == 4
    means = {arm: sum(v) / 2 for arm, v in losses.items()}
    best = min(means, key=means.get)
    assert result.best_arm == best and result.best_score == pytest.approx(means[best])
    assert result.conclusion.startswith(f"best arm by eval/loss (min): {best} ")
    saved = json.loads((exp.dir / "result.json").read_text())
    assert saved["best_arm"] == best and len(saved["arms"]) == 4


def test_local_csv_and_tensorboard_files(two_by_two):
    exp, result, _ = two_by_two
    text = (exp.dir / "experiment.md").read_text()
    assert "hypothesis: a larger lr learns faster" in text and result.conclusion in text
    assert "| A | " in text and "(n=2)" in text
    run_dir = exp.dir / "runs" / "B__s43"
    assert sorted(r["step"] is None for r in read_jsonl(run_dir / "evals.jsonl")) == [False, True]
    for name in ("step_2", "final"):
        rows = read_jsonl(run_dir / "predictions" / "arithmetic" / f"{name}.jsonl")
        assert len(rows) == 4 and set(rows[0]) >= {"prompt", "response", "gt_answer", "correct"}
    assert json.loads((run_dir / "result.json").read_text())["status"] == "completed"
    assert "- status: completed" in (run_dir / "summary.md").read_text()
    csv_lines = (exp.dir / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("run,arm,group,seed,stage,status,steps,train_seconds") and len(csv_lines) == 5
    assert sorted(p.name for p in (exp.dir / "tb").iterdir()) == ["A__s42", "A__s43", "B__s42", "B__s43"]
    assert list((exp.dir / "tb" / "A__s42").glob("events.out.tfevents.*"))


def test_report_table_and_band_pngs(two_by_two, capsys):
    exp, result, _ = two_by_two
    assert main(["report", str(exp.dir)]) == 0
    out = capsys.readouterr().out
    a_losses = [a.metrics["eval/loss"] for a in result.arms if a.arm == "A"]
    mean = sum(a_losses) / 2
    std = abs(a_losses[0] - a_losses[1]) / 2 ** 0.5
    line = next(line for line in out.splitlines() if line.startswith("eval/loss"))
    assert re.search(rf"{mean:.4g} \+- {std:.4g} \(2\)", line), line
    for name in ("train_loss", "eval_loss", "arithmetic_accuracy"):
        path = exp.dir / "plots" / f"{name}.png"
        assert path.read_bytes()[:8] == PNG_MAGIC and imread(path).shape[0] > 100


# ---- failures, continual, early stopping ---------------------------------------------------------------
def test_failed_run_is_recorded_and_the_others_continue(tmp_path, small_sft, monkeypatch):
    original = SFTTrainer._train_group

    def crash_at_step_2(self, group):  # a real error inside the loop, for the arm with lr 0.0123
        if self.run_config["train"]["lr"] == 0.0123 and self.state.step == 1:
            raise RuntimeError("boom at step 2")
        return original(self, group)

    monkeypatch.setattr(SFTTrainer, "_train_group", crash_at_step_2)
    recorder = Recorder()
    missing = sft_arm(small_sft).replace(str(small_sft["train"]), str(tmp_path / "missing.jsonl"))
    exp = experiment(
        tmp_path, f"runs={{crash: {sft_arm(small_sft, lr=0.0123)}, missing: {missing}, ok: {sft_arm(small_sft)}}}",
        "benchmarks=[{kind: arithmetic, params: {limit: 2, max_new_tokens: 2}}]", callbacks=[recorder],
    )
    result = exp.run()
    assert [(a.name, a.status) for a in result.arms] == [("crash", "failed"), ("missing", "failed"), ("ok", "completed")]
    crash, missing_arm, ok = result.arms
    assert "Traceback" in crash.error and "RuntimeError: boom at step 2" in crash.error and crash.steps == 1
    assert "missing.jsonl" in missing_arm.error and not crash.eval_metrics
    assert ok.eval_metrics["arithmetic/n"] == 2 and result.status == "partial"
    # on_train_end fired after the crash, with the error; the missing file failed before training
    assert recorder.artifacts["crash"].error.args == ("boom at step 2",)
    assert [c for c in recorder.calls if c[0] in ("on_train_start", "on_train_end", "on_run_end")] == [
        ("on_train_start", "crash", 0), ("on_train_end", "crash", 1), ("on_run_end", "crash", "failed"),
        ("on_run_end", "missing", "failed"),
        ("on_train_start", "ok", 0), ("on_train_end", "ok", 2), ("on_run_end", "ok", "completed"),
    ]
    assert recorder.calls[-1] == ("on_experiment_end", None, "partial")
    assert json.loads((exp.dir / "result.json").read_text())["arms"][0]["error"].startswith("Traceback")


def test_continual_stages_chain_final_weights_with_a_fresh_optimizer(tmp_path, small_sft):
    broken = sft_arm(small_sft).replace(str(small_sft["train"]), str(tmp_path / "missing.jsonl"))
    exp = experiment(
        tmp_path, f"runs={{base: {sft_arm(small_sft)}, broken: {broken}}}",
        f"continual=[{{name: more, overrides: {{train.lr: 2.0e-3, data.train: ['{small_sft['eval']}']}}}}]",
    )
    result = exp.run()
    assert [(a.name, a.group, a.stage, a.status) for a in result.arms] == [
        ("base", "base", None, "completed"), ("base__more", "base", "more", "completed"),
        ("broken", "broken", None, "failed"), ("broken__more", "broken", "more", "skipped"),
    ]
    first, second = result.arms[:2]
    first_model = Path(first.run_dir) / "checkpoints" / "final" / "model"
    assert second.run_config["model"]["path"] == str(first_model) and second.run_config["train"]["lr"] == 2e-3
    assert "previous stage broken did not complete" in result.arms[3].error
    # 8 held-out rows at batch 8 = 1 optimizer step: a fresh AdamW has counted exactly that one
    optimizer = torch.load(Path(second.run_dir) / "checkpoints" / "final" / "optimizer.pt", weights_only=False)
    assert second.steps == 1 and all(int(s["step"]) == 1 for s in optimizer["state"].values())


def test_early_stopping_through_request_stop_in_every_arm(tmp_path, small_sft):
    arm = sft_arm(small_sft, batch_size=2, warmup_ratio=0.0)  # 8 steps, lr falling from step 1 on
    exp = experiment(
        tmp_path, f"runs={{A: {arm}, B: {arm}}}",
        "callbacks=[{kind: early_stopping, params: {metric: train/lr, mode: max, patience: 1}}]",
    )
    result = exp.run()
    for a in result.arms:  # the second arm stops too: the watch restarts with each run
        assert (a.status, a.steps, a.requested_steps, a.stopped_early) == ("completed", 2, 8, True)
        rows = read_jsonl(Path(a.run_dir) / "metrics.jsonl")
        assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2]


# ---- W&B offline: one run per experiment run ----------------------------------------------------------
@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    for var in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    env = {
        "HOME": home, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": home / "cfg",
        "WANDB_CACHE_DIR": home / "cache", "WANDB_DATA_DIR": home / "data", "WANDB_BASE_URL": "http://127.0.0.1:9",
        "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_ERROR_REPORTING": "false",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))


def wandb_records(path: Path) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)], capture_output=True, text=True, timeout=60, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.slow
def test_wandb_offline_one_run_per_arm_grouped(tmp_path, small_sft, offline_wandb):
    wandb = pytest.importorskip("wandb")
    exp = experiment(
        tmp_path, f"runs={{A: {sft_arm(small_sft)}, B: {sft_arm(small_sft, lr=3e-3)}}}", "n_repeats=2",
        "benchmarks=[{kind: arithmetic, params: {limit: 2, max_new_tokens: 2}}]",
        "callbacks=[{kind: wandb_logger, params: {project: olingo-exp}}]",
    )
    try:
        result = exp.run()
    finally:
        wandb.teardown()
    assert result.status == "completed"
    ids = {}
    for a in result.arms:
        run_id = (exp.dir / "wandb" / a.name / "wandb_id.txt").read_text().strip()
        (log_file,) = (exp.dir / "wandb" / a.name).glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
        ids[a.name] = (run_id, log_file)
    assert len({run_id for run_id, _ in ids.values()}) == 4
    records = wandb_records(ids["B__s43"][1])
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    assert (run["display_name"], run["run_group"], run["project"]) == ("B__s43", "B", "olingo-exp")
    history = [r["history"] for r in records if r["type"] == "history"]
    assert any("arithmetic/accuracy" in h["item"] for h in history)


# ---- PPO arms --------------------------------------------------------------------------------------------
def test_ppo_matrix_with_in_loop_benchmark(tmp_path, assets):
    recorder = Recorder()
    base = (
        "{stage: ppo, config: 'packaged:ppo_tiny.yaml', logging: {progress: false}, data: {eval_prompts: []}, "
        "generation: {max_new_tokens: 3}, loop: {episodes: 2, update_steps: 1, rollout_batch_size: 8, train_batch_size: 8, eval_interval: 0, save_interval: 0}}"
    )
    exp = experiment(
        tmp_path, f"matrix={{base: {base}, axes: {{experience.kl_coef: [0.0, 0.2]}}, name: 'kl{{experience.kl_coef}}'}}",
        "benchmarks=[{kind: arithmetic, params: {limit: 3, max_new_tokens: 3}, run_every: 1}]",
        "success_metric=arithmetic/accuracy", callbacks=[recorder],
    )
    result = exp.run()
    assert [(a.name, a.status, a.steps, a.run_config["experience"]["kl_coef"]) for a in result.arms] == [
        ("kl0.0", "completed", 2, 0.0), ("kl0.2", "completed", 2, 0.2),
    ]
    assert [(e.step, e.metrics["n"]) for e in result.arms[1].evals] == [(1, 3), (2, 3), (None, 3)]
    run_calls = [c for c in recorder.calls if c[1] == "kl0.2" and c[0] != "on_step_end"]
    assert run_calls[:2] == [("on_run_start", "kl0.2", None), ("on_train_start", "kl0.2", 0)]
    assert run_calls[-3:] == [("on_train_end", "kl0.2", 2), ("on_benchmark_eval", "kl0.2", ("arithmetic", None)), ("on_run_end", "kl0.2", "completed")]
    assert ("on_benchmark_eval", "kl0.2", ("arithmetic", 1)) in run_calls and result.best_arm is None and result.conclusion.startswith("no clear winner")


# ---- docs/experiments.md's experiment commands ---------------------------------------------------------------------
def test_readme_experiment_commands_run(tmp_path, small_sft, capsys, monkeypatch):
    section = (README.parent / "docs" / "experiments.md").read_text().split("\n## ", 1)[0]  # the page's opening
    commands = [line.split("#")[0].split() for line in re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0].splitlines() if line.startswith("olingo ")]
    run_cmd = next(c for c in commands if c[:3] == ["olingo", "experiment", "run"])
    report_cmd = next(c for c in commands if c[:2] == ["olingo", "report"])
    monkeypatch.chdir(README.parent)  # the page's paths are relative to the repository
    shorten = [
        f"output_dir={tmp_path}", "matrix.base.train.epochs=1", "matrix.base.train.batch_size=8",
        f"matrix.base.data.train=[{small_sft['train']}]", f"matrix.base.data.eval=[{small_sft['eval']}]",
        "benchmarks=[{kind: arithmetic, params: {limit: 4, max_new_tokens: 3}, run_every: 1}]",
    ]
    assert main([*run_cmd[1:], *shorten]) == 0
    out = capsys.readouterr().out
    config = load_config(ExperimentConfig, README.parent / run_cmd[3])
    exp_dir = tmp_path / config.name
    assert f"experiment directory: {exp_dir}" in out and "by arithmetic/accuracy (max)" in out
    result = json.loads((exp_dir / "result.json").read_text())
    assert len(result["arms"]) == len(config.matrix.axes["train.lr"]) * config.n_repeats
    assert main(["report", str(exp_dir)]) == 0
    assert report_cmd[2].endswith(config.name) and (exp_dir / "plots" / "arithmetic_accuracy.png").is_file()
