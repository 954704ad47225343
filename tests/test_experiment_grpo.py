"""Experiments with GRPO stages and chains across stage kinds (SFT -> GRPO, SFT -> PPO, SFT -> RM):
plan expansion and validation without training, and one short real SFT -> GRPO chain."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from olingo.config import ConfigError, load_config
from olingo.experiment import Experiment, ExperimentConfig
from olingo.experiment.config import plan_runs
from olingo.experiment.results import RunResult
from olingo.models import load_causal_lm
from olingo.recipes.common import packaged_config
from olingo.trainer.callbacks import Callback

EXAMPLE = packaged_config("experiment_sft_grpo.yaml")
SFT_ARM = "{stage: sft, config: 'packaged:sft_tiny.yaml'}"
GRPO_STAGE = "{name: rl, stage: grpo, config: 'packaged:grpo_tiny.yaml', overrides: {loop.episodes: 3}}"


def config(*overrides: str) -> ExperimentConfig:
    return load_config(ExperimentConfig, None, ["name=chain", *overrides])


def plans_of(tmp_path: Path, *overrides: str):
    return plan_runs(config(*overrides), tmp_path, tmp_path / "runs")


# ---- plans, without training ----------------------------------------------------------------------
def test_sft_grpo_chain_plan_names_kinds_and_model_handover(tmp_path, assets):
    plans = plans_of(
        tmp_path, f"runs={{short: {SFT_ARM}}}", "n_repeats=2", "base_seed=5",
        f"continual=[{{name: more, overrides: {{train.lr: 1.0e-4}}}}, {GRPO_STAGE}, {{name: rl2, overrides: {{loop.update_steps: 2}}}}]",
    )
    assert [(p.name, p.kind, p.stage, p.previous, p.model_path, p.group, p.seed) for p in plans[:4]] == [
        ("short__s5", "sft", None, None, None, "short", 5),
        ("short__s5__more", "sft", "more", "short__s5", "model.path", "short", 5),
        ("short__s5__rl", "grpo", "rl", "short__s5__more", "model.actor", "short", 5),
        ("short__s5__rl2", "grpo", "rl2", "short__s5__rl", "model.actor", "short", 5),
    ]
    assert [p.name for p in plans[4:]] == ["short__s6", "short__s6__more", "short__s6__rl", "short__s6__rl2"]
    more, rl, rl2 = plans[1:4]
    packaged = yaml.safe_load(packaged_config("grpo_tiny.yaml").read_text())
    assert more.config["train"]["lr"] == 1e-4 and more.config["data"]["train"] == ["builtin:sft_train"]  # the arm's config + overrides
    # the GRPO stage starts from grpo_tiny.yaml, not from the SFT arm's fields
    assert "train" not in rl.config and rl.config["loop"]["episodes"] == 3 and rl.config["reward"] == packaged["reward"]
    assert rl.config["run"] == {"name": "short__s5__rl", "output_dir": str(tmp_path / "runs"), "seed": 5}
    assert rl.where == "runs.short continual.rl"
    # a stage without `stage` repeats the kind before it on that stage's base config, not its overrides
    assert rl2.config["loop"]["episodes"] == packaged["loop"]["episodes"] != 3 and rl2.config["loop"]["update_steps"] == 2


def test_the_runner_hands_the_previous_final_model_to_the_next_stage(tmp_path, assets):
    exp = Experiment(config(
        f"output_dir={tmp_path}", f"run={SFT_ARM}",
        f"continual=[{GRPO_STAGE}, {{name: ppo, stage: ppo, config: 'packaged:ppo_tiny.yaml'}}, "
        "{name: rm, stage: rm, config: 'packaged:rm_tiny.yaml'}]",
    ))
    (sft, grpo, ppo, rm), stage_config = exp.plans, exp._stage_config
    assert [(p.kind, p.model_path) for p in exp.plans] == [("sft", None), ("grpo", "model.actor"), ("ppo", "model.actor"), ("rm", "model.path")]
    assert stage_config(grpo, RunResult(final_model="/x/sft/final")).model.actor == "/x/sft/final"
    ppo_config = stage_config(ppo, RunResult(final_model="/x/grpo/actor"))
    assert ppo_config.model.actor == "/x/grpo/actor" and ppo_config.model.critic is None  # the critic default stays
    assert stage_config(rm, RunResult(final_model="/x/ppo/actor")).model.path == "/x/ppo/actor"
    assert stage_config(sft, None).model.path == "builtin:tiny-llama"


def test_grpo_arms_and_chains_accept_generation_benchmarks(tmp_path, assets):
    exp = Experiment(config(
        f"output_dir={tmp_path}", "runs={g: {stage: grpo, config: 'packaged:grpo_tiny.yaml'}, s: {stage: sft}}",
        f"continual=[{GRPO_STAGE}]", "benchmarks=[{kind: arithmetic, params: {limit: 2}}]",
    ))
    assert [(p.name, p.kind) for p in exp.plans] == [("g", "grpo"), ("g__rl", "grpo"), ("s", "sft"), ("s__rl", "grpo")]
    # SFT -> RM is a chain too (the reward model starts from the SFT weights); a benchmark that decodes refuses it
    with pytest.raises(ConfigError, match=re.escape("benchmark 'arithmetic' scores generated answers, but run continual.rm is a rm stage")):
        Experiment(config(f"output_dir={tmp_path}", "run={stage: sft}", "continual=[{name: rm, stage: rm}]", "benchmarks=[{kind: arithmetic}]"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["run={stage: sft}", "continual=[{name: rl, stage: grp}]"],
         "continual.rl.stage: expected one of sft, rm, ppo, grpo, dpo, orpo, kto, got 'grp' (did you mean 'grpo'?)"),
        (["runs={R: {stage: rm}}", "continual=[{name: rl, stage: grpo}]"],
         "runs.R continual.rl.stage: grpo trains a policy and starts from one, but the stage before it (runs.R, rm) trains a reward model"),
        (["run={stage: sft}", "continual=[{name: r, stage: rm}, {name: p, stage: ppo}]"], "run continual.p.stage: ppo trains a policy"),
        (["run={stage: sft}", "continual=[{name: rl, stage: grpo, overrides: {model: {actor: elsewhere}}}]"],
         "run continual.rl.overrides.model.actor: a continual stage starts from the final weights of the stage before it (run); leave model.actor unset"),
        (["run={stage: sft}", "continual=[{name: rl, stage: grpo, overrides: {loop.episodes: 3, train.lr: 1}}]"], "run continual.rl: unknown key 'train.lr'"),
        (["run={stage: sft}", "continual=[{name: rl, stage: grpo, config: nowhere.yaml}]"], "continual.rl.config: file not found"),
        (["run={stage: sft}", "continual=[{name: rl, stage: grpo, overrides: {ray.enabled: true}}]"],
         "run continual.rl.ray.enabled: not available inside an experiment"),
        (["run={stage: sft}", "continual=[{name: rl, stage: grpo, overrides: {experience.overlong_buffer: 100}}]"],
         "run continual.rl: experience.overlong_buffer (100) is longer than generation.max_new_tokens"),
        (["run={stage: sft}", "continual=[{name: rl, stag: grpo}]"], "unknown key 'stag' (did you mean 'stage'?)"),
    ],
)
def test_bad_chains_fail_before_training(tmp_path, assets, overrides, message):
    with pytest.raises((ConfigError, ValueError), match=re.escape(message)):
        Experiment(config(f"output_dir={tmp_path}", *overrides))
    assert not (tmp_path / "chain").exists()


def test_packaged_sft_grpo_example_validates(tmp_path, assets):
    exp = Experiment.from_yaml(EXAMPLE, [f"output_dir={tmp_path}"])
    cfg = exp.config
    assert [c.stage for c in cfg.continual] == ["grpo"] and cfg.success_metric == "arithmetic/accuracy"
    kinds = {p.name: (p.kind, p.previous, p.model_path) for p in exp.plans}
    assert len(exp.plans) == 2 * len(exp.config.matrix.axes["train.epochs"]) * cfg.n_repeats
    first = exp.plans[0]
    assert kinds[f"{first.name}__grpo"] == ("grpo", first.name, "model.actor")
    assert not (tmp_path / cfg.name).exists()


# ---- one short real chain --------------------------------------------------------------------------
class WeightsAtStart(Callback):
    """The policy's parameters when each run's loop starts, by run name."""

    def __init__(self) -> None:
        self.weights: dict[str, dict[str, torch.Tensor]] = {}

    def on_train_start(self, state):
        self.weights[state.ctx.run_name] = {k: v.detach().clone() for k, v in state.policy.state_dict().items()}


@pytest.fixture(scope="module")
def sft_then_grpo(assets, tmp_path_factory):
    root = tmp_path_factory.mktemp("sft_grpo")
    train, held_out = root / "train16.jsonl", root / "eval8.jsonl"
    train.write_text("\n".join(assets.sft_train.read_text().splitlines()[:16]) + "\n")
    held_out.write_text("\n".join(assets.sft_eval.read_text().splitlines()[:8]) + "\n")
    sft = (
        "{stage: sft, config: 'packaged:sft_tiny.yaml', logging: {progress: false}, "
        f"data: {{train: ['{train}'], eval: ['{held_out}']}}, train: {{epochs: 1, batch_size: 8, lr: 1.0e-3}}}}"
    )
    grpo = (
        "{name: rl, stage: grpo, config: 'packaged:grpo_tiny.yaml', overrides: {logging.progress: false, data.eval_prompts: [], "
        "generation.max_new_tokens: 3, experience.num_generations: 2, "
        "loop: {episodes: 3, update_steps: 1, rollout_batch_size: 2, train_batch_size: 4, eval_interval: 0, save_interval: 0}}}"
    )
    weights = WeightsAtStart()
    exp = Experiment(config(
        f"output_dir={root}", f"run={sft}", f"continual=[{grpo}]", "success_metric=arithmetic/accuracy",
        "benchmarks=[{kind: arithmetic, params: {limit: 2, max_new_tokens: 3}}]",
        "callbacks=[{kind: local_logger}, {kind: csv_metrics}]",
    ), callbacks=[weights])
    return exp, exp.run(), weights


def test_sft_grpo_chain_runs_grpo_from_the_sft_final_weights(sft_then_grpo):
    exp, result, weights = sft_then_grpo
    assert result.status == "completed"
    assert [(a.name, a.stage_label, a.status, a.steps) for a in result.arms] == [
        ("chain", "sft", "completed", 2), ("chain__rl", "grpo:rl", "completed", 3),
    ]
    sft, grpo = result.arms
    sft_final = Path(sft.run_dir) / "checkpoints" / "final" / "model"
    assert grpo.run_config["stage"] == "grpo" and grpo.run_config["model"]["actor"] == str(sft_final)
    saved = load_causal_lm(str(sft_final)).state_dict()
    started = weights.weights["chain__rl"]
    assert started.keys() == saved.keys() and all(torch.equal(started[k], saved[k]) for k in saved)
    assert any(not torch.equal(weights.weights["chain"][k], saved[k]) for k in saved)  # SFT did move them
    assert (Path(grpo.run_dir) / "checkpoints" / "final" / "actor").is_dir()
    assert grpo.eval_metrics["arithmetic/n"] == 2 and result.conclusion.startswith("no clear winner")


def test_sft_grpo_chain_results_list_both_stages(sft_then_grpo):
    exp, result, _ = sft_then_grpo
    stored = json.loads((exp.dir / "result.json").read_text())
    assert [(a["name"], a["run_config"]["stage"], a["stage"]) for a in stored["arms"]] == [("chain", "sft", None), ("chain__rl", "grpo", "rl")]
    with (exp.dir / "results.csv").open() as fh:
        assert [(row["run"], row["stage"], row["status"]) for row in csv.DictReader(fh)] == [
            ("chain", "sft", "completed"), ("chain__rl", "grpo:rl", "completed"),
        ]
    table = (exp.dir / "experiment.md").read_text()
    assert "| chain | chain | 42 | sft | completed | 2 |" in table and "| chain__rl | chain | 42 | grpo:rl | completed | 3 |" in table
