"""Strict configs: unknown keys with did-you-mean, dotted overrides, --help lists every field."""

import pytest

from olingo.cli.main import main, packaged_config
from olingo.config import ConfigError, load_config, parse_override
from olingo.config_help import config_help
from olingo.recipes.rm import RMConfig


def test_override_values_parse_as_yaml():
    assert parse_override("train.lr=1e-4") == (["train", "lr"], 1e-4)
    assert parse_override("data.train=[a.jsonl, b.jsonl]") == (["data", "train"], ["a.jsonl", "b.jsonl"])
    assert parse_override("run.resume=last") == (["run", "resume"], "last")


def test_unknown_key_is_an_error_with_did_you_mean(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lerning_rate: 0.1\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"train: unknown key 'lerning_rate'"):
        load_config(RMConfig, path)
    with pytest.raises(ConfigError, match=r"did you mean 'epochs'"):
        load_config(RMConfig, None, ["train.epochss=2"])
    with pytest.raises(ConfigError, match=r"unknown key 'trian.lr' \(did you mean 'train.lr'\?\)"):
        load_config(RMConfig, None, ["trian.lr=2"])


def test_wrong_type_names_the_field():
    with pytest.raises(ConfigError, match=r"train.batch_size"):
        load_config(RMConfig, None, ["train.batch_size=many"])


def test_packaged_configs_are_valid():
    for name in ("rm_tiny.yaml", "rm_hf_example.yaml"):
        load_config(RMConfig, packaged_config(name))


def test_overrides_apply_on_top_of_the_file():
    cfg = load_config(RMConfig, packaged_config("rm_tiny.yaml"), ["train.lr=0.5", "run.name=x"])
    assert cfg.train.lr == 0.5 and cfg.run.name == "x" and cfg.train.batch_size == 32


def test_help_lists_every_field_with_default_and_doc(capsys):
    text = config_help(RMConfig)
    for section in ("run", "model", "data", "train", "plugin", "logging"):
        for name, field in RMConfig.model_fields[section].annotation.model_fields.items():
            assert f"{section}.{name}" in text
            assert field.description in text
    with pytest.raises(SystemExit) as exit_info:
        main(["rm", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "train.accumulation_steps" in out and "micro-batches per optimizer step" in out


def test_cli_reports_config_errors_without_a_traceback(capsys):
    assert main(["rm", "train.lrr=1"]) == 2
    assert "did you mean 'lr'" in capsys.readouterr().err


def test_a_section_given_in_part_keeps_the_stage_defaults_of_its_other_fields():
    """`train: {batch_size: 8}` changes batch_size only: DPO's learning rate (5e-7, set by the
    stage, not the section class's 5e-6) and GRPO's run name stay, in Python, YAML and overrides."""
    from olingo.config import load_config
    from olingo.recipes.dpo import DPOConfig
    from olingo.recipes.grpo_config import GRPOConfig

    assert DPOConfig().train.lr == 5e-7
    assert DPOConfig(train={"batch_size": 8}).train.lr == 5e-7
    assert load_config(DPOConfig, None, ["train.batch_size=8"]).train.lr == 5e-7
    assert GRPOConfig(run={"seed": 3}).run.name == "grpo"
    assert load_config(GRPOConfig, None, ["reward.model=x"]).reward.functions == {"arithmetic_exact": 1.0}  # one term added
    assert GRPOConfig(reward={"functions": {"math_answer": 1.0}}).reward.functions == {"math_answer": 1.0}  # a field named is replaced
