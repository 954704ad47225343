"""`olingo.experiment` without training: config expansion, errors, aggregation, the registry."""

from __future__ import annotations

import importlib
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

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
from olingo.experiment.results import aggregate, arm_scores, conclusion_line, mean_std, pick_best
from olingo.report import Series, band_over_seeds
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
    matrix = MatrixSpec(base={"stage": "sft", "train": {"epochs": 1}}, axes={"train.lr": [0.1, 0.2], "train": {"batch_size": [4, 8, 16]}}, name="lr{train.lr}_b{train.batch_size}")
    arms = expand_matrix(matrix)
    assert list(arms) == ["lr0.1_b4", "lr0.1_b8", "lr0.1_b16", "lr0.2_b4", "lr0.2_b8", "lr0.2_b16"]
    assert arms["lr0.2_b8"] == {"stage": "sft", "train": {"epochs": 1, "lr": 0.2, "batch_size": 8}}
    assert matrix.base == {"stage": "sft", "train": {"epochs": 1}}  # the base is not modified
    assert render_name(None, {"train.lr": 0.1, "ppo.kl_coef": 0.05}) == "lr=0.1_kl_coef=0.05"
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


def test_plan_names_seeds_groups_and_continual_chain(tmp_path, assets):
    cfg = load_config(ExperimentConfig, write_yaml(tmp_path / "e.yaml", """
name: plan
n_repeats: 2
base_seed: 7
runs:
  A: {stage: sft, train: {lr: 0.1}}
  B: {stage: ppo, config: packaged:ppo_tiny.yaml, ppo: {kl_coef: 0.5}}
continual:
  - {name: more, overrides: {train.epochs: 2}}
"""))
    # The PPO arm cannot take train.epochs: the error names the arm and the stage.
    with pytest.raises(ConfigError, match=r"runs.B continual.more: unknown key 'train'"):
        plan_runs(cfg, tmp_path, tmp_path / "runs")
    cfg.continual = []
    plans = plan_runs(cfg, tmp_path, tmp_path / "runs")
    assert [(p.name, p.group, p.seed, p.kind) for p in plans] == [
        ("A__s7", "A", 7, "sft"), ("A__s8", "A", 8, "sft"), ("B__s7", "B", 7, "ppo"), ("B__s8", "B", 8, "ppo"),
    ]
    assert plans[1].config["run"] == {"name": "A__s8", "output_dir": str(tmp_path / "runs"), "seed": 8}
    assert plans[2].config["ppo"]["kl_coef"] == 0.5 and plans[2].config["ppo"]["episodes"] == 500  # packaged file + change

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
        (["run={stage: stf}"], "run.stage: expected one of sft, rm, ppo, got 'stf' (did you mean 'sft'?)"),
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
    assert pick_best(scores, "max") == ("D", 0.95)
    assert pick_best(scores, "min") == ("A", pytest.approx(0.6))
    assert pick_best({"A": []}, "max") == (None, None)
    line = conclusion_line(scores, "acc", "max", "D")
    assert line.startswith("best arm by acc (max): D 0.95 +- 0 (n=1); vs A 0.6 +- 0.14 (n=2), B 0.9 +- 0 (n=1)")
    assert line.endswith("no score for C")
    assert "tied with B" in conclusion_line({"A": [1.0], "B": [1.0]}, "acc", "max", "A")
    assert conclusion_line({}, None, "max", None) == "no success_metric set: no arm was ranked"
    table = aggregate(arms)
    assert table["A"]["acc"] == (pytest.approx(0.6), pytest.approx(math.sqrt(0.02)), 2) and table["C"] == {}


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
    with pytest.raises(ValueError, match=r"fake_logger.*\nevery"):
        build_callback({"kind": "fake_logger", "params": {"every": "often"}})
    monkeypatch.delitem(sys.modules, "olingo_fake_plugin")
