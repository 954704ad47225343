"""`olingo demo --pipeline overopt` (olingo/cli/demo_overopt.py): SFT, the under-trained reward
model, the packaged two-arm experiment watched by the reward monitor, and the verdict table,
shortened. That the monitor flags a hacked proxy and not its control is tested in
tests/test_reward_monitor.py; the full demo's numbers are in docs/monitor.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from olingo.config import load_config, packaged_config
from olingo.experiment.config import ExperimentConfig

SHORT = ["matrix.base.loop.episodes=2", "matrix.base.loop.eval_interval=1", "n_repeats=1"]


def test_the_packaged_experiment_pairs_kl_coefficients_on_the_reward_model_alone():
    cfg = load_config(ExperimentConfig, packaged_config("experiment_overopt.yaml"), [])
    base, axes = cfg.matrix.base, cfg.matrix.axes
    assert axes == {"experience.kl_coef": [0.001, 3.0]}
    assert base["reward"]["functions"] == {} and base["reward"]["model"]  # the proxy: the reward model alone
    (monitor,) = base["callbacks"]
    assert monitor["kind"] == "reward_monitor" and monitor["params"]["gold"] == ["arithmetic_exact"] and monitor["params"]["stop_on_flag"]


@pytest.mark.slow
def test_the_overopt_demo_runs_its_stages_and_prints_each_arms_verdict(tmp_path, assets, capsys):
    from olingo.cli.demo_overopt import run_overopt_demo

    quiet = ["train.epochs=1", "logging.progress=false"]
    result = run_overopt_demo(str(tmp_path), sft_overrides=quiet, rm_overrides=quiet, experiment_overrides=SHORT)
    assert set(result.arms) == {"kl0.001", "kl3.0"}
    assert [a.kl_coef for a in result.arms.values()] == [0.001, 3.0]
    exp_dir = Path(result.experiment_dir)
    for arm in result.arms.values():
        assert arm.seeds == 1 and 0 <= arm.gold[0] <= 1 and 0 <= arm.greedy <= 1
    runs = sorted((exp_dir / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        summary = json.loads((run / "monitor.json").read_text())
        assert summary["gold"] == ["arithmetic_exact"] and summary["evaluations"] == 3  # steps 0, 1, 2 (eval_interval 1)
        assert (run / "plots" / "overoptimisation.png").is_file()
        rm_dir = tmp_path / "demo-rm-weak" / "checkpoints" / "final" / "model"
        reward = yaml.safe_load((run / "config.yaml").read_text())["reward"]
        assert reward["model"] == str(rm_dir) and reward["functions"] == {}  # the proxy: the demo's reward model alone, never the gold
    assert "## Reward monitor" in (exp_dir / "experiment.md").read_text()
    printed = capsys.readouterr().out
    for label in ("olingo demo --pipeline overopt", "proxy first -> last", "gold first -> last", "kl0.001", "kl3.0"):
        assert label in printed
