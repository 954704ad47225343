"""`olingo.experiment` without training: config expansion, errors, aggregation, the registry."""

from __future__ import annotations

import importlib
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from olingo.cli.report_experiment import (
    _curves_by_arm,
    band_over_seeds,
    format_experiment_table,
    load_experiment_result,
    with_final_benchmarks,
    write_experiment_report,
)
from olingo.cli.report_series import Series
from olingo.config import ConfigError, load_config
from olingo.experiment import (
    ArmResult,
    EvalResult,
    Experiment,
    ExperimentConfig,
    ExperimentResult,
    MatrixSpec,
)
from olingo.experiment.config import deep_merge, expand_matrix, plan_runs, render_name
from olingo.experiment.results import (
    aggregate,
    arm_scores,
    conclusion_line,
    mean_std,
    pick_best,
    rank_arms,
)
from olingo.trainer.callbacks import (
    Callback,
    build_callback,
    register_callback,
    registered_callbacks,
)
from olingo.trainer.callbacks import registry as registry_module
from olingo.trainer.callbacks.builtin import PrintMetrics, TensorBoardLogger, WandbLogger


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---- matrix, names, plan ------------------------------------------------------------------------
def test_matrix_expands_the_cartesian_product_in_axis_order():
    matrix = MatrixSpec(base={"stage": "sft", "train": {"epochs": 1}}, axes={"train.lr": [0.1, 0.2], "train": {"batch_size": [4, 8, 16]}},
                        name="lr{train.lr}_b{train.batch_size}")
    arms = expand_matrix(matrix)
    assert list(arms) == ["lr0.1_b4", "lr0.1_b8", "lr0.1_b16", "lr0.2_b4", "lr0.2_b8", "lr0.2_b16"]
    assert arms["lr0.2_b8"] == {"stage": "sft", "train": {"epochs": 1, "lr": 0.2, "batch_size": 8}}
    assert matrix.base == {"stage": "sft", "train": {"epochs": 1}}  # the base is not modified
    assert render_name(None, {"train.lr": 0.1, "experience.kl_coef": 0.05}) == "lr=0.1_kl_coef=0.05"
    assert render_name("x/{a}", {"a": "b c"}) == "x_b_c"  # directory-safe


def test_matrix_name_errors():
    with pytest.raises(ConfigError, match=r"'\{train.l\}' is not an axis \(did you mean 'train.lr'\?\)"):
        expand_matrix(MatrixSpec(base={"stage": "sft"}, axes={"train.lr": [1, 2]}, name="lr{train.l}"))
    with pytest.raises(ConfigError, match="same arm name 'x'"):
        expand_matrix(MatrixSpec(base={"stage": "sft"}, axes={"train.lr": [1, 2]}, name="x"))
    with pytest.raises(ValueError, match="has no values"):
        MatrixSpec(base={"stage": "sft"}, axes={"train.lr": []})


def test_deep_merge_merges_sections_and_dotted_keys():
    base = {"train": {"lr": 1, "epochs": 2}, "data": {"train": ["a"]}}
    merged = deep_merge(base, {"train": {"lr": 3}, "data.train": ["b"], "run": {"seed": 5}})
    assert merged == {"train": {"lr": 3, "epochs": 2}, "data": {"train": ["b"]}, "run": {"seed": 5}}
    assert base["train"]["lr"] == 1


def test_an_empty_mapping_replaces_the_base_section_rather_than_merging_nothing():
    base = {"reward": {"functions": {"arithmetic_exact": 1.0}, "model": None}}
    merged = deep_merge(base, {"reward": {"functions": {}, "model": "rm"}})
    assert merged == {"reward": {"functions": {}, "model": "rm"}}  # the checker is no longer a term of the reward
    assert deep_merge(base, {"reward": {}}) == {"reward": {}}


def test_plan_names_seeds_groups_and_continual_chain(tmp_path, assets):
    cfg = load_config(ExperimentConfig, write_yaml(tmp_path / "e.yaml", """
name: plan
n_repeats: 2
base_seed: 7
runs:
  A: {stage: sft, train: {lr: 0.1}}
  B: {stage: ppo, config: packaged:ppo_tiny.yaml, experience: {kl_coef: 0.5}}
continual:
  - {name: more, overrides: {train.epochs: 2}}
"""))
    # The PPO arm cannot take train.epochs: the error names the arm and the stage.
    with pytest.raises(ConfigError, match=r"runs.B continual.more: unknown key 'train.epochs'"):
        plan_runs(cfg, tmp_path, tmp_path / "runs")
    cfg.continual = []
    plans = plan_runs(cfg, tmp_path, tmp_path / "runs")
    assert [(p.name, p.group, p.seed, p.kind) for p in plans] == [
        ("A__s7", "A", 7, "sft"), ("A__s8", "A", 8, "sft"), ("B__s7", "B", 7, "ppo"), ("B__s8", "B", 8, "ppo"),
    ]
    assert plans[1].config["run"] == {"name": "A__s8", "output_dir": str(tmp_path / "runs"), "seed": 8}
    assert plans[2].config["experience"]["kl_coef"] == 0.5 and plans[2].config["loop"]["episodes"] == 500  # packaged file + change

    single = load_config(ExperimentConfig, None, ["name=one", "run={stage: sft}", "continual=[{name: s2}, {name: s3}]"])
    chain = plan_runs(single, tmp_path, tmp_path / "runs")
    assert [(p.name, p.group, p.seed, p.stage, p.previous) for p in chain] == [
        ("one", "one", 42, None, None), ("one__s2", "one", 42, "s2", "one"), ("one__s3", "one", 42, "s3", "one__s2"),
    ]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["runs={A: {stage: sft}}", "run={stage: sft}"], "exactly one of run, runs or matrix"),
        (["run={stage: sft}", "n_repeat=2"], "unknown key 'n_repeat' (did you mean 'n_repeats'?)"),
        (["run={stage: sft, train: {lerning_rate: 1}}"], "run.train: unknown key 'lerning_rate'"),
        (["run={stage: stf}"], "run.stage: expected one of sft, rm, ppo, grpo, dpo, orpo, kto, got 'stf' (did you mean 'sft'?)"),
        (["run={stage: sft, config: nowhere.yaml}"], "run.config: file not found"),
        (["run={stage: sft, run: {resume: last}}"], "leave run.resume unset"),
        (["run={stage: rm}", "benchmarks=[{kind: arithmetic}]"], "benchmark 'arithmetic' scores generated answers, but run is a rm stage"),
        (["run={stage: sft}", "benchmarks=[{kind: arithmetc}]"], "unknown benchmark kind 'arithmetc' (did you mean 'arithmetic'?)"),
        (["run={stage: sft}", "benchmarks=[{params: {limt: 3}}]"], "limt"),
        (["run={stage: sft}", "callbacks=[{kind: local_loger}]"], "did you mean 'local_logger'"),
        (["run={stage: sft}", "callbacks=[{kind: early_stopping, params: {metric: x, patience: lots}}]"], "patience"),
    ],
)
def test_bad_experiment_configs_fail_before_training(tmp_path, assets, overrides, message):
    with pytest.raises((ConfigError, ValueError), match=re.escape(message)):
        path = write_yaml(tmp_path / "bad.yaml", f"name: bad\noutput_dir: {tmp_path}\n")
        Experiment.from_yaml(path, overrides)
    assert not (tmp_path / "bad").exists()


def test_existing_experiment_directory_is_refused_without_overwrite(tmp_path, assets):
    (tmp_path / "exp" / "runs").mkdir(parents=True)
    experiment = Experiment(load_config(ExperimentConfig, None, [f"output_dir={tmp_path}", "name=exp", "run={stage: sft}"]))
    with pytest.raises(ConfigError, match="already exists: pass overwrite=true"):
        experiment.run()


# ---- results -------------------------------------------------------------------------------------
def arm(name: str, arm_name: str, seed: int, status: str = "completed", stage: str | None = None, **metrics: float) -> ArmResult:
    return ArmResult(name=name, run_config={}, status=status, arm=arm_name, seed=seed, stage=stage, eval_metrics=dict(metrics))


def test_scores_best_arm_and_conclusion():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert mean_std([5.0]) == (5.0, 0.0) and all(math.isnan(v) for v in mean_std([]))
    arms = [
        arm("A__s1", "A", 1, acc=0.5), arm("A__s2", "A", 2, acc=0.7),
        arm("B__s1", "B", 1, acc=0.9), arm("B__s2", "B", 2, status="failed"),
        arm("C__s1", "C", 1, status="failed"),
        arm("D__s1", "D", 1, acc=0.1), arm("D__s1__ft", "D", 1, stage="ft", acc=0.95),  # continual: the last stage scores
    ]
    scores = arm_scores(arms, "acc")
    assert scores == {"A": [0.5, 0.7], "B": [0.9], "C": [], "D": [0.95]}
    # D leads B, but each has one seed: no spread to tell the gap from seed noise
    assert pick_best(scores, "max") == (None, None)
    line = conclusion_line(scores, "acc", "max", None)
    assert line.startswith("no clear winner by acc (max): D leads B by 0.05, but D and B have one seed")
    assert "D 0.95 +- 0 (n=1), B 0.9 +- 0 (n=1), A 0.6 +- 0.14 (n=2)" in line
    assert line.endswith("no score for C")
    assert pick_best({"A": []}, "max") == (None, None)
    assert conclusion_line({}, None, "max", None) == "no success_metric set: no arm was ranked"
    table = aggregate(arms)
    assert table["A"]["acc"] == (pytest.approx(0.6), pytest.approx(math.sqrt(0.02)), 2) and table["C"] == {}


def test_best_arm_is_claimed_only_when_the_gap_exceeds_the_seed_spread():
    clear = {"A": [0.5, 0.7], "B": [0.9, 0.92]}  # gap 0.31 > std 0.14 + 0.014
    assert pick_best(clear, "max") == ("B", pytest.approx(0.91))
    line = conclusion_line(clear, "acc", "max", "B")
    assert line.startswith("best arm by acc (max): B 0.91 +- 0.014 (n=2) (gap to A 0.31 > summed std 0.16); vs A 0.6 +- 0.14 (n=2)")
    assert pick_best(clear, "min") == ("A", pytest.approx(0.6))

    overlapping = {"A": [0.5, 0.9], "B": [0.75, 0.8]}  # gap 0.075 < std 0.28 + 0.035
    assert pick_best(overlapping, "max") == (None, None)
    line = conclusion_line(overlapping, "acc", "max", None)
    assert line.startswith("no clear winner by acc (max): the gap between B and A (0.075) is within their summed std (0.32)")
    assert line.endswith("B 0.775 +- 0.035 (n=2), A 0.7 +- 0.28 (n=2)")

    assert pick_best({"A": [1.0, 1.0], "B": [1.0, 1.0]}, "max") == (None, None)
    assert "A and B tie at 1" in conclusion_line({"A": [1.0], "B": [1.0]}, "acc", "max", None)
    alone = {"A": [0.5, 0.6], "B": []}
    assert pick_best(alone, "max") == (None, None)
    assert conclusion_line(alone, "acc", "max", None) == (
        "no clear winner by acc (max): only A has a score: nothing to compare it with; "
        "A 0.55 +- 0.071 (n=2); no score for B"
    )
    assert [a.arm for a in rank_arms({"A": [1.0], "B": [3.0], "C": [2.0], "D": []}, "min")] == ["A", "C", "B"]


def test_stage_label_fills_the_stage_of_every_run():
    first = ArmResult("A__s1", {"stage": "sft"}, arm="A", seed=1)
    more = ArmResult("A__s1__more", {"stage": "sft"}, arm="A", seed=1, stage="more")
    assert (first.stage_label, more.stage_label) == ("sft", "sft:more")
    assert ArmResult("x", {}, stage="more").stage_label == "more"  # an old result.json without the kind


def test_experiment_table_names_the_stage_of_each_arm():
    runs = [
        ArmResult("A", {"stage": "ppo"}, "completed", metrics={"eval/reward": 0.5}, arm="A"),
        ArmResult("B", {"stage": "sft"}, "completed", metrics={"eval/reward": 0.2}, arm="B"),
        ArmResult("B__more", {"stage": "sft"}, "completed", metrics={"eval/reward": 0.3}, arm="B", stage="more"),
    ]
    table = format_experiment_table(ExperimentResult(name="e", arms=runs, success_metric="eval/reward"))
    header, stage_row, reward_row = table.splitlines()
    assert header.split() == ["metric", "A", "B"]
    assert stage_row.split() == ["stage", "ppo", "sft:more"]  # B is scored by its last stage
    assert reward_row.split()[0] == "eval/reward"


def write_experiment(exp_dir: Path, runs: list[ArmResult], rows: dict[str, list[dict]]) -> Path:
    """An experiment directory as `olingo experiment run` leaves it, with hand-written logs."""
    exp_dir.mkdir(parents=True)
    (exp_dir / "experiment.yaml").write_text("name: e\n")
    for run in runs:
        run.run_dir = str(exp_dir / "runs" / run.name)
        Path(run.run_dir).mkdir(parents=True)
        lines = [json.dumps(row) for row in rows[run.name]]
        (Path(run.run_dir) / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    result = ExperimentResult(name="e", arms=runs, success_metric="arithmetic/accuracy")
    (exp_dir / "result.json").write_text(json.dumps(result.to_json()))
    return exp_dir


def benchmark_run(name: str, seed: int, in_loop: dict[int, float], final: float, steps: int = 12) -> tuple[ArmResult, list[dict]]:
    """A run with a train loss every step, the stage's own eval at the end, `arithmetic` scored
    in the loop at `in_loop` steps and after training (`final`)."""
    rows = [{"step": s, "split": "train", "train/loss": 1.0 / s} for s in range(1, steps + 1)]
    rows += [{"step": s, "split": "eval", "eval_name": "arithmetic", "arithmetic/accuracy": v} for s, v in in_loop.items()]
    rows += [{"step": steps, "split": "eval", "eval_name": "eval", "eval/loss": 0.5}]
    evals = [EvalResult("arithmetic", {"accuracy": v, "n": 4}, step=s) for s, v in in_loop.items()]
    evals.append(EvalResult("arithmetic", {"accuracy": final, "n": 4}))
    run = ArmResult(name, {"stage": "sft"}, "completed", arm="A", seed=seed, steps=steps, evals=evals,
                    eval_metrics={"arithmetic/accuracy": final, "arithmetic/n": 4})
    return run, rows


def test_experiment_curves_end_with_the_post_training_score(tmp_path):
    # run_every 5 over 12 steps: in-loop scores at 5 and 10; the final model is scored at 12
    a1, rows1 = benchmark_run("A__s1", 1, {5: 0.25, 10: 0.5}, final=0.75)
    a2, rows2 = benchmark_run("A__s2", 2, {5: 0.25, 10: 0.25}, final=0.5)
    exp_dir = write_experiment(tmp_path / "e", [a1, a2], {"A__s1": rows1, "A__s2": rows2})
    curves = _curves_by_arm(exp_dir, load_experiment_result(exp_dir).arms)
    steps, mean, _, n = band_over_seeds(curves["arithmetic/accuracy"]["A"])
    assert steps.tolist() == [5, 10, 12] and mean.tolist() == [0.25, 0.375, 0.625] and n.tolist() == [2, 2, 2]
    assert set(curves) == {"train/loss", "eval/loss", "arithmetic/accuracy", "arithmetic/n"}
    names = sorted(p.name for p in write_experiment_report(exp_dir))
    assert names == ["arithmetic_accuracy.png", "arithmetic_n.png", "eval_loss.png", "train_loss.png"]


def test_final_benchmark_replaces_an_in_loop_score_at_the_last_step_and_needs_no_in_loop_curve():
    run, _ = benchmark_run("A", 1, {6: 0.25, 12: 0.5}, final=0.75)
    series = {"arithmetic/accuracy": Series("arithmetic/accuracy", "arithmetic/accuracy", [6, 12], [0.25, 0.5])}
    out = with_final_benchmarks(series, run)
    assert (out["arithmetic/accuracy"].steps, out["arithmetic/accuracy"].values) == ([6, 12], [0.25, 0.75])
    assert series["arithmetic/accuracy"].values == [0.25, 0.5]  # the input is left alone
    only_final, _ = benchmark_run("B", 1, {}, final=0.5)  # run_every 0: no in-loop rows at all
    out = with_final_benchmarks({}, only_final)
    assert (out["arithmetic/accuracy"].steps, out["arithmetic/accuracy"].values) == ([12], [0.5])


def test_experiment_result_round_trips_through_json():
    evals = [EvalResult("arithmetic", {"accuracy": 0.5}, {"op": {"+": 1.0}}, 0.1, 3, {"run": "A"})]
    result = ExperimentResult(name="e", status="partial", arms=[ArmResult("A", {"stage": "sft"}, "failed", evals=evals, error="Traceback ...")], best_arm=None)
    assert ExperimentResult.from_json(result.to_json()) == result


def test_band_over_seeds_hand_values():
    a = Series("m", "m", [1, 2, 3], [1.0, 2.0, 3.0])
    b = Series("m", "m", [1, 2], [3.0, 4.0])
    steps, mean, std, n = band_over_seeds([a, b])
    assert steps.tolist() == [1, 2, 3] and mean.tolist() == [2.0, 3.0, 3.0] and n.tolist() == [2, 2, 1]
    assert np.allclose(std, [math.sqrt(2), math.sqrt(2), 0.0])


# ---- registry: names, aliases, entry points --------------------------------------------------------
def test_registry_names_and_aliases():
    known = registered_callbacks()
    for name in ("local_logger", "tensorboard_logger", "wandb_logger", "csv_metrics", "print_progress", "early_stopping", "debug_logger"):
        assert issubclass(known[name], Callback)
    assert known["tensorboard"] is known["tensorboard_logger"] is TensorBoardLogger
    assert known["wandb"] is known["wandb_logger"] is WandbLogger
    assert known["print_metrics"] is known["print_progress"] is PrintMetrics

    class Other(Callback):
        pass

    with pytest.raises(ValueError, match="'tensorboard' is already registered"):
        register_callback("brand_new", "tensorboard")(Other)
    assert "brand_new" not in registered_callbacks()  # nothing half-registered


def test_third_party_callback_registers_through_an_entry_point(tmp_path, monkeypatch):
    package = tmp_path / "olingo_fake_plugin"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from olingo.trainer.callbacks import Callback\n"
        "class FakeLogger(Callback):\n"
        "    def __init__(self, prefix: str = 'x', every: int = 1):\n"
        "        self.prefix, self.every = prefix, every\n"
    )
    dist = tmp_path / "olingo_fake_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: olingo-fake-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[olingo.callbacks]\nfake_logger = olingo_fake_plugin:FakeLogger\n"
        "tensorboard = olingo_fake_plugin:FakeLogger\n"  # a taken name: refused, the built-in stays
        "broken = olingo_fake_plugin:Missing\n"  # fails to load: skipped, the others still work
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    monkeypatch.setattr(registry_module, "_entry_points_loaded", False)
    callback = build_callback({"kind": "fake_logger", "params": {"prefix": "p", "every": 3}})
    assert type(callback).__module__ == "olingo_fake_plugin" and (callback.prefix, callback.every) == ("p", 3)
    assert registered_callbacks()["tensorboard"] is TensorBoardLogger and "broken" not in registered_callbacks()
    with pytest.raises(ValueError, match=r"callback 'fake_logger': parameter 'every': Input should be a valid integer"):
        build_callback({"kind": "fake_logger", "params": {"every": "often"}})
    monkeypatch.delitem(sys.modules, "olingo_fake_plugin")
