"""What a new user meets first: overrides the shell split, `~` in paths, `builtin:` and GGUF
model names in the Python API, packaged configs by name (`olingo configs`), where the values in
`--help` come from, and `olingo --version`."""

from __future__ import annotations

import re
import shlex
import shutil
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from olingo.cli.main import config_class, main
from olingo.config import ConfigError, load_config, packaged_config

TRACEBACK = "Traceback (most recent call last)"


def run_cli(line: str, capsys) -> tuple[int, str, str]:
    """`olingo <line>`, split as a shell splits it: (exit status, stdout, stderr)."""
    try:
        code = main(shlex.split(line))
    except SystemExit as exit_:  # argparse: --help, --version, usage errors
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


# ---- overrides the shell split ------------------------------------------------------------------
def test_an_unquoted_override_with_a_space_is_one_line_that_shows_it_quoted(capsys):
    code, _, err = run_cli("grpo model.actor=x reward.functions={math_answer: 1.0} data.prompts=[p.jsonl] --check", capsys)
    assert code == 2
    assert TRACEBACK not in err and "yaml" not in err.lower()
    (line,) = err.strip().splitlines()
    assert line.startswith("olingo: ") and "quote the whole override: 'reward.functions={math_answer: 1.0}'" in line


def test_the_quoted_form_it_shows_is_accepted(capsys):
    code, out, err = run_cli("grpo model.actor=x 'reward.functions={math_answer: 1.0}' data.prompts=[p.jsonl] --check", capsys)
    assert code == 0, err
    assert yaml.safe_load(out)["reward"]["functions"] == {"math_answer": 1.0}


@pytest.mark.parametrize(("overrides", "quoted"), [
    (["reward.functions={a:", "1,", "b:", "2}", "run.seed=1"], "'reward.functions={a: 1, b: 2}'"),
    (["run.name=hello", "world"], "'run.name=hello world'"),
    (["data.train=[a.jsonl,", "b.jsonl]"], "'data.train=[a.jsonl, b.jsonl]'"),
])
def test_every_shape_of_split_value_names_the_whole_override(overrides, quoted):
    with pytest.raises(ConfigError, match=r"quote the whole override: " + re.escape(quoted)):
        load_config(config_class("sft"), packaged_config("sft_tiny.yaml"), overrides)


def test_a_config_file_given_as_an_override_says_to_use_config(capsys):
    code, _, err = run_cli("ppo my_run.yaml run.seed=1 --check", capsys)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line == "olingo: 'my_run.yaml' is a config file, not a KEY=VALUE override: olingo ppo --config my_run.yaml [KEY=VALUE ...]"


def test_a_value_that_is_not_yaml_is_a_config_error_not_a_traceback():
    with pytest.raises(ConfigError, match=r"override 'run.name=a: b: c': the value is not valid YAML"):
        load_config(config_class("sft"), packaged_config("sft_tiny.yaml"), ["run.name=a: b: c"])


# ---- ~ in paths ---------------------------------------------------------------------------------
@pytest.fixture
def home(tmp_path, monkeypatch, assets) -> Path:
    """$HOME in tmp_path, holding a copy of the tiny model at ~/models/tiny."""
    home = tmp_path / "home"
    shutil.copytree(assets.model_dir, home / "models" / "tiny")
    monkeypatch.setenv("HOME", str(home))
    return home


def test_home_is_expanded_in_run_and_model_fields(home):
    cfg = load_config(config_class("sft"), packaged_config("sft_tiny.yaml"),
                      ["model.path=~/models/tiny", "model.tokenizer=~/models/tiny", "run.output_dir=~/runs", "run.resume=~/runs/x"])
    assert cfg.model.path == cfg.model.tokenizer == str(home / "models" / "tiny")
    assert cfg.run.output_dir == str(home / "runs") and cfg.run.resume == str(home / "runs" / "x")
    ppo = load_config(config_class("ppo"), packaged_config("ppo_tiny.yaml"), ["model.actor=~/models/tiny"])
    from olingo.recipes.common import resolve_model_path

    assert resolve_model_path(ppo.model.actor) == str(home / "models" / "tiny")  # PPO's keys expand where they are resolved


def test_an_hf_directory_under_home_loads_in_the_python_api(home):
    from olingo.models import load_tokenizer

    assert load_tokenizer("~/models/tiny").name_or_path == str(home / "models" / "tiny")


@pytest.mark.slow
def test_sft_from_an_hf_directory_under_home_trains(home, tmp_path, capsys, assets, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = assets.sft_train.read_text().splitlines()[:8]
    (home / "chats.jsonl").write_text("\n".join(rows) + "\n")
    code, out, err = run_cli(
        "sft model.path=~/models/tiny run.output_dir=~/runs data.train=[~/chats.jsonl] data.eval=[] train.epochs=1 train.batch_size=4 logging.progress=false",
        capsys,
    )
    assert code == 0, err
    assert (home / "runs" / "sft-tiny" / "checkpoints" / "final" / "model" / "model.safetensors").is_file()
    assert not (tmp_path / "~").exists()  # no directory literally named ~


# ---- builtin: and GGUF names in the Python API --------------------------------------------------
def test_python_loaders_accept_builtin_names():
    from olingo.models import RewardModel, load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer("builtin:tiny-llama")
    assert tokenizer.pad_token is not None
    assert load_causal_lm("builtin:tiny-llama").config.model_type == "llama"
    assert RewardModel.from_pretrained("builtin:tiny-llama", pad_token_id=tokenizer.pad_token_id).config.num_labels == 1


def test_python_loaders_accept_a_gguf_file(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    from olingo.models import load_causal_lm, load_tokenizer
    from tests.test_gguf import write_tiny_gguf

    monkeypatch.setenv("OLINGO_HOME", str(tmp_path / "home"))
    written = write_tiny_gguf(tmp_path / "tiny.gguf")
    model = load_causal_lm(str(tmp_path / "tiny.gguf"))
    assert model.config.hidden_size == written.config.hidden_size
    assert load_tokenizer(tmp_path / "tiny.gguf").chat_template is not None


def test_resolution_lives_in_the_models_layer_and_stays_importable_from_recipes():
    from olingo.models import sources
    from olingo.recipes import common

    assert common.resolve_model_path is sources.resolve_model_path and common.resolve_path is sources.resolve_path


# ---- packaged configs by name -------------------------------------------------------------------
@pytest.mark.parametrize("name", ["grpo_smollm2.yaml", "packaged:grpo_smollm2.yaml"])
def test_a_packaged_config_is_reachable_by_name(name, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(f"grpo --config {name} --check", capsys)
    assert code == 0, err
    assert yaml.safe_load(out)["run"]["name"] == yaml.safe_load(packaged_config("grpo_smollm2.yaml").read_text())["run"]["name"]


def test_a_local_file_wins_over_a_packaged_one_of_the_same_name(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grpo_smollm2.yaml").write_text("run:\n  name: mine\n")
    code, out, err = run_cli("grpo --config grpo_smollm2.yaml --check", capsys)
    assert code == 0, err
    assert yaml.safe_load(out)["run"]["name"] == "mine"
    code, out, _ = run_cli("grpo --config packaged:grpo_smollm2.yaml --check", capsys)
    assert yaml.safe_load(out)["run"]["name"] != "mine"


def test_a_misspelt_config_name_suggests_the_packaged_one(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("grpo --config grpo_smolm2.yaml", capsys)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "config file not found: grpo_smolm2.yaml" in line and "'grpo_smollm2.yaml'" in line and "olingo configs" in line


def test_olingo_configs_lists_every_packaged_config_with_its_true_stage(capsys):
    from olingo.config import packaged_configs

    code, out, _ = run_cli("configs", capsys)
    assert code == 0
    files = sorted(p.name for p in packaged_config("").glob("*.yaml"))
    listed = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.split() and line.split()[0].endswith(".yaml")}
    assert sorted(listed) == files
    for config in packaged_configs():
        assert listed[config.name] == config.stage and config.description
        load_config(config_class(config.stage), packaged_config(config.name))  # the stage it names accepts it


def test_help_says_where_its_values_come_from(capsys):
    _, top, _ = run_cli("--help", capsys)
    assert "olingo configs" in top and "<stage>_tiny.yaml" in top
    _, text, _ = run_cli("grpo --help", capsys)
    flat = " ".join(text.split())
    assert "Without --config, the packaged grpo_tiny.yaml is used" in flat and "olingo configs" in flat
    run_name = next(line for line in text.splitlines() if line.startswith("  run.name "))
    assert "= grpo-tiny " in run_name and "[without it in --config: run]" in run_name  # RunConfig's own default
    example = next(line for line in text.splitlines() if "reward.functions=" in line)
    assert "'reward.functions={math_answer: 1.0}'" in example  # shown quoted, as it must be typed


def test_version_prints_the_package_version(capsys):
    code, out, _ = run_cli("--version", capsys)
    assert code == 0 and out.strip() == f"olingo {version('olingo')}"


@pytest.mark.parametrize(("line", "expected"), [
    ("sft --config packaged:grpo_smol.yaml", "no packaged config 'grpo_smol.yaml' (did you mean 'grpo_smollm2.yaml'?)"),
    ("sft model.path=builtin:tiny", "unknown built-in 'builtin:tiny'; use builtin:tiny-llama"),
])
def test_a_bad_packaged_or_builtin_name_is_one_line(line, expected, capsys):
    code, _, err = run_cli(line, capsys)
    assert code == 2
    (message,) = err.strip().splitlines()
    assert expected in message


def test_the_python_loaders_refuse_an_unknown_builtin_like_a_config():
    from olingo.models import load_tokenizer

    with pytest.raises(ConfigError, match="unknown built-in 'builtin:tiny'"):
        load_tokenizer("builtin:tiny")


def test_an_experiment_takes_a_packaged_name_and_expands_home_in_its_output_dir(tmp_path, monkeypatch, assets):
    from olingo.experiment.runner import Experiment

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    experiment = Experiment.from_yaml("packaged:experiment_sft_lr.yaml", ["output_dir=~/exps"])
    assert experiment.dir == tmp_path / "home" / "exps" / "sft-lr"
    assert len(experiment.plans) == 4  # 2 learning rates x 2 seeds, as the file says
