"""The native Python API (`from olingo import GRPOConfig, GRPOTrainer`, docs/python-api.md):
every exported name imports, `import olingo` stays cheap, the arguments land in the config, in-memory
rows are written where the config points, Python reward functions are registered (a clash with a
built-in is an error), and tiny GRPO and SFT runs train (each under a second: the tiny model
is 0.5 MB)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

import olingo
import olingo.trainer as compat
from olingo.api import Trainer
from olingo.config import ConfigError
from olingo.dataset.errors import DataError
from olingo.rewards import registry
from olingo.rewards.registry import RewardError
from tests.conftest import read_jsonl

EXPORTED = {
    "GRPOTrainer", "GRPOConfig", "PPOTrainer", "PPOConfig", "DPOTrainer", "DPOConfig", "ORPOTrainer", "ORPOConfig",
    "KTOTrainer", "KTOConfig", "SFTTrainer", "SFTConfig", "RewardModelTrainer", "RMConfig", "Callback", "load_config",
}
ROWS = [{"prompt": f"{a}+{b}=", "gt_answer": str(a + b)} for a in range(4) for b in range(4)]


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch):
    """Functions a test registers are forgotten after it."""
    monkeypatch.setattr(registry, "REWARD_FUNCTIONS", dict(registry.REWARD_FUNCTIONS))


def exact(prompt: str, response: str, gt_answer: str | None) -> float:
    return float(response.strip() == gt_answer)


def test_every_exported_name_imports_from_the_top_level():
    assert set(olingo.__all__) == EXPORTED and len(olingo.__all__) == len(EXPORTED)
    namespace: dict = {}
    exec("from olingo import *", namespace)
    assert EXPORTED <= namespace.keys()
    for name in EXPORTED - {"Callback", "load_config"}:
        if name.endswith("Trainer"):
            assert issubclass(namespace[name], Trainer), name
            assert namespace[name] is not getattr(compat, name, None), name  # not the ColossalChat class
        else:
            assert "run" in namespace[name].model_fields, name  # a stage's run config
    assert olingo.GRPOTrainer.config_class is olingo.GRPOConfig and olingo.RewardModelTrainer.config_class is olingo.RMConfig
    with pytest.raises(AttributeError, match="no attribute 'GRPOTrainr'"):
        olingo.GRPOTrainr  # noqa: B018


@pytest.mark.slow  # a fresh interpreter
def test_import_olingo_loads_no_torch():
    code = "import sys, olingo; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_arguments_replace_the_config_fields_and_leave_the_callers_config_alone(tmp_path):
    config = olingo.GRPOConfig(run={"output_dir": str(tmp_path), "name": "g"})
    trainer = olingo.GRPOTrainer(config, model="my/model", reward_funcs={exact: 2.0, "math_answer": 0.5}, train_dataset="a.jsonl", eval_dataset=[])
    assert trainer.config.model.actor == "my/model" and trainer.config.data.prompts == ["a.jsonl"] and trainer.config.data.eval_prompts == []
    assert trainer.config.reward.functions == {"exact": 2.0, "math_answer": 0.5}
    assert config.model.actor == "builtin:tiny-llama" and config.reward.functions == {"arithmetic_exact": 1.0}  # untouched
    assert registry.resolve_reward("exact") is exact
    dpo = olingo.DPOTrainer({"run": {"output_dir": str(tmp_path)}}, model="sft/model", train_dataset=["p1.jsonl", "p2.jsonl"])
    assert dpo.config.model.path == "sft/model" and dpo.config.data.train == ["p1.jsonl", "p2.jsonl"]
    assert dpo.config.data.eval == ["builtin:preference_eval"]  # None keeps the config's


def test_wrong_arguments_are_errors():
    with pytest.raises(TypeError, match="unexpected keyword argument 'reward_funcs'"):
        olingo.DPOTrainer(reward_funcs=[exact])  # the offline trainers take no reward
    with pytest.raises(TypeError, match="GRPOTrainer takes a GRPOConfig .* got DPOConfig"):
        olingo.GRPOTrainer(olingo.DPOConfig())
    with pytest.raises(TypeError, match="model: expected a model directory.*got object"):
        olingo.SFTTrainer(model=object())
    with pytest.raises(TypeError, match="train_dataset is a dict: pass rows"):
        olingo.SFTTrainer(train_dataset={"train": []})
    with pytest.raises(ValueError, match="unknown key 'episode'"):
        olingo.GRPOConfig(loop={"episode": 2})


def test_in_memory_rows_are_written_where_the_config_points(tmp_path):
    config = olingo.SFTConfig(run={"output_dir": str(tmp_path), "name": "s"})
    rows = [{"prompt": "1+1=", "completion": "2"}, {"messages": [{"role": "user", "content": "é"}, {"role": "assistant", "content": "x"}]}]
    trainer = olingo.SFTTrainer(config, train_dataset=rows, eval_dataset=[])
    path = tmp_path / "s.data" / "train.jsonl"
    assert trainer.config.data.train == [str(path)] and trainer.config.data.eval == []
    assert not path.exists()  # written by train(), not by the constructor
    trainer._write_data()
    assert read_jsonl(path) == rows


def test_a_datasets_dataset_is_rows_and_a_dataset_dict_is_refused(tmp_path):
    import datasets

    trainer = olingo.GRPOTrainer({"run": {"output_dir": str(tmp_path), "name": "g"}}, eval_dataset=datasets.Dataset.from_list(ROWS))
    trainer._write_data()
    assert read_jsonl(tmp_path / "g.data" / "eval.jsonl") == ROWS
    with pytest.raises(TypeError, match=r"eval_dataset is a DatasetDict: pass rows \(a list of dicts, one split such as dataset\['eval'\]\)"):
        olingo.GRPOTrainer(eval_dataset=datasets.DatasetDict({"eval": datasets.Dataset.from_list(ROWS)}))


def test_a_row_that_is_not_an_object_names_its_argument_and_row():
    with pytest.raises(DataError, match=r"^train_dataset, row 2: expected an object \(a dict of field -> value\), got string$"):
        olingo.GRPOTrainer(train_dataset=[ROWS[0], "3+4="])
    with pytest.raises(DataError, match=r"^eval_dataset, row 1: cannot be written as JSON"):
        olingo.GRPOTrainer(eval_dataset=[{"prompt": "1+1=", "gt_answer": object()}])
    with pytest.raises(DataError, match="^train_dataset: no rows$"):
        olingo.GRPOTrainer(train_dataset=[])


def test_a_resumed_run_is_given_the_rows_it_recorded(tmp_path):
    config = olingo.GRPOConfig(run={"output_dir": str(tmp_path), "name": "g", "resume": "last"})
    (tmp_path / "g").mkdir()
    recorded = tmp_path / "g.data" / "train.jsonl"
    recorded.parent.mkdir()
    recorded.write_text('{"prompt": "9+9=", "gt_answer": "18"}\n')
    with pytest.raises(ConfigError, match=r"run.resume=last: train_dataset holds other rows than the run recorded in .*g.data/train.jsonl"):
        olingo.GRPOTrainer(config, reward_funcs=[exact], train_dataset=ROWS).train()
    assert recorded.read_text() == '{"prompt": "9+9=", "gt_answer": "18"}\n'


def test_a_run_directory_in_use_keeps_its_data(tmp_path):
    """No resume, no overwrite: the recipe refuses the run directory, and the data of that run stays."""
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "config.yaml").write_text("{}\n")
    trainer = olingo.GRPOTrainer({"run": {"output_dir": str(tmp_path), "name": "g"}}, reward_funcs=[exact], train_dataset=ROWS)
    trainer._write_data()
    assert not (tmp_path / "g.data").exists()


def test_reward_function_names_clash_and_nameless_functions_are_errors():
    def math_answer(prompt: str, response: str, gt_answer: str | None) -> float:
        return 0.0

    with pytest.raises(RewardError, match=r"reward_funcs: reward function name 'math_answer' is taken by olingo\.rewards\.verifiers\.math_answer.*rename it"):
        olingo.GRPOTrainer(reward_funcs=[math_answer])
    with pytest.raises(RewardError, match="has no name to register it under"):
        olingo.PPOTrainer(reward_funcs=[lambda p, r, g: 0.0])
    with pytest.raises(RewardError, match="reward_funcs is empty"):
        olingo.GRPOTrainer(reward_funcs=[])
    with pytest.raises(RewardError, match="unknown reward function 'math_answr'.*did you mean 'math_answer'"):
        olingo.GRPOTrainer(reward_funcs=["math_answr"])


def test_python_reward_functions_and_ray_mode_are_refused_together():
    with pytest.raises(ConfigError, match="ray.enabled scores rewards in Ray actors; name it by its import path"):
        olingo.GRPOTrainer({"ray": {"enabled": True}}, reward_funcs=[exact])


def test_a_native_grpo_run_trains_with_a_python_reward_and_resumes(tmp_path, assets):
    """Two episodes of GRPO on the tiny model (under a second), then a third one resumed."""
    calls = []

    def counted(prompt: str, response: str, gt_answer: str | None) -> float:
        calls.append(prompt)
        return float(response.strip() == gt_answer)

    def config(episodes: int, resume: str | None = None) -> olingo.GRPOConfig:
        return olingo.GRPOConfig(
            run={"output_dir": str(tmp_path), "name": "g", "resume": resume}, logging={"progress": False},
            generation={"max_new_tokens": 4}, experience={"num_generations": 4, "kl_coef": 0.0},
            loop={"episodes": episodes, "rollout_batch_size": 4, "train_batch_size": 16, "save_interval": 1},
        )

    trainer = olingo.GRPOTrainer(config(2), model=str(assets.model_dir), reward_funcs=[counted], train_dataset=ROWS, eval_dataset=[])
    result = trainer.train()
    # Per episode 4 prompts x 4 responses = 16 rollouts = one minibatch of 16: one step each.
    assert result["steps"] == 2 and result["run_dir"] == str(tmp_path / "g")
    assert [r["step"] for r in read_jsonl(tmp_path / "g" / "metrics.jsonl") if r["split"] == "train"] == [1, 2]
    # Once at start-up on the first prompt row (the probe), then once per rollout (2 x 16).
    assert len(calls) == 1 + 32 and set(calls[1:]) <= {r["prompt"] for r in ROWS}
    assert (tmp_path / "g" / "checkpoints" / "final" / "actor" / "model.safetensors").exists()
    recorded = yaml.safe_load((tmp_path / "g" / "config.yaml").read_text())
    assert recorded["data"]["prompts"] == [str(tmp_path / "g.data" / "train.jsonl")] and recorded["reward"]["functions"] == {"counted": 1.0}
    assert read_jsonl(tmp_path / "g.data" / "train.jsonl") == ROWS

    resumed = olingo.GRPOTrainer(config(3, "last"), model=str(assets.model_dir), reward_funcs=[counted], train_dataset=ROWS, eval_dataset=[])
    assert resumed.train()["steps"] == 3
    assert [r["step"] for r in read_jsonl(tmp_path / "g" / "metrics.jsonl") if r["split"] == "train"] == [1, 2, 3]
    assert len(calls) == 33 + 1 + 16  # the probe again, then the third episode's rollouts


def test_a_row_missing_its_field_is_the_loaders_one_line_error(tmp_path, assets):
    rows = [ROWS[0], {"gt_answer": "4"}]
    trainer = olingo.GRPOTrainer(
        {"run": {"output_dir": str(tmp_path), "name": "g"}, "logging": {"progress": False}},
        model=str(assets.model_dir), reward_funcs=[exact], train_dataset=rows, eval_dataset=[],
    )
    with pytest.raises(DataError) as caught:
        trainer.train()
    source = tmp_path / "g.data" / "train.jsonl"
    assert str(caught.value) == f"{source}, row 2, field 'prompt': missing (present keys: gt_answer); expected 'prompt' or 'messages'"
    assert not (tmp_path / "g").exists()  # nothing of the run is written before its data is valid


def test_a_native_sft_run_trains_on_rows(tmp_path, assets):
    rows = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a in range(4) for b in range(4)]
    config = olingo.SFTConfig(run={"output_dir": str(tmp_path), "name": "s"}, logging={"progress": False}, train={"epochs": 1, "batch_size": 8})
    result = olingo.SFTTrainer(config, model=str(assets.model_dir), train_dataset=rows, eval_dataset=rows[:4]).train()
    assert result["steps"] == 2  # 16 rows, batch 8, one epoch
    assert (tmp_path / "s" / "checkpoints" / "final" / "model" / "model.safetensors").exists()
    assert read_jsonl(tmp_path / "s.data" / "eval.jsonl") == rows[:4]


@pytest.mark.parametrize(
    "stage, steps",
    [
        ("PPO", 1),  # 4 prompts x 1 response = one minibatch of 4
        ("ORPO", 2),  # 16 pairs, batch 8
        ("KTO", 4),  # 16 pairs split into 32 rows, batch 8
        ("RewardModel", 2),  # 16 pairs, batch 8
    ],
)
def test_every_other_trainer_runs_its_stage_on_rows(tmp_path, assets, stage, steps):
    pairs = read_jsonl(assets.preference_train)[:16]
    config_class = getattr(olingo, "RMConfig" if stage == "RewardModel" else f"{stage}Config")
    config = config_class(run={"output_dir": str(tmp_path), "name": "x"}, logging={"progress": False})
    if stage == "PPO":
        config.generation.max_new_tokens, config.loop.episodes, config.loop.rollout_batch_size, config.loop.train_batch_size = 4, 1, 4, 4
    else:
        config.train.epochs, config.train.batch_size = 1, 8
    data = ROWS if stage == "PPO" else pairs
    result = getattr(olingo, f"{stage}Trainer")(config, model=str(assets.model_dir), train_dataset=data, eval_dataset=data[:4]).train()
    assert result["steps"] == steps
    assert (tmp_path / "x" / "checkpoints" / "final" / ("actor" if stage == "PPO" else "model") / "model.safetensors").exists()
    assert read_jsonl(tmp_path / "x.data" / "train.jsonl") == data
