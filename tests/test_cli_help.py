"""`--help`: each command's examples are its own and valid, defaults are what a bare command
uses, every field sits under its section, and `olingo --help` does not import torch."""

import subprocess
import sys

import pytest

from olingo.cli.main import HELP_EXAMPLES, STAGE_SUMMARIES, config_class, main
from olingo.config import load_config, packaged_config
from olingo.config_help import yaml_text
from olingo.experiment.config import plan_runs
from olingo.trainer.callbacks import registered_callbacks

STAGES = list(STAGE_SUMMARIES)
PACKAGED = {stage: f"{stage}_tiny.yaml" for stage in STAGES} | {"experiment": "experiment_sft_lr.yaml"}
ARGV = {stage: [stage] for stage in STAGES} | {"experiment run": ["experiment", "run"], "plan": ["plan"]}


def help_text(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def leaf_values(data: dict, prefix: str = ""):
    """(dotted key, value) of every value of a dumped config, sections flattened."""
    for key, value in data.items():
        if isinstance(value, dict) and key not in ("functions", "params"):
            yield from leaf_values(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize("command", list(HELP_EXAMPLES))
def test_every_help_example_loads_against_the_packaged_config(command, tmp_path):
    for example in HELP_EXAMPLES[command]:
        cfg = load_config(config_class(example.stage), packaged_config(PACKAGED[example.stage]), list(example.overrides))
        if example.stage == "experiment":  # the arms are stage configs: check them too
            plan_runs(cfg, packaged_config(PACKAGED["experiment"]).parent, tmp_path)


@pytest.mark.parametrize("command", list(HELP_EXAMPLES))
def test_help_shows_only_the_commands_own_examples(command, capsys):
    text = help_text(ARGV[command], capsys)
    shown = [line.strip() for line in text.splitlines() if line.startswith("  olingo ")]
    assert shown == [example.text() for example in HELP_EXAMPLES[command]]


def test_ppo_help_has_no_sft_keys(capsys):
    text = help_text(["ppo"], capsys)
    example = next(line for line in text.splitlines() if line.startswith("  olingo ppo"))
    assert "train.lr" not in example and "data.train" not in example
    assert "actor_optim.lr=" in example and "data.prompts=" in example


@pytest.mark.parametrize("stage", STAGES)
def test_stage_help_shows_the_packaged_values_as_defaults(stage, capsys):
    text = help_text([stage], capsys)
    lines = text.splitlines()
    packaged = load_config(config_class(stage), packaged_config(PACKAGED[stage])).model_dump(mode="json")
    for key, value in leaf_values(packaged):
        line = next(line for line in lines if line.startswith(f"  {key} "))
        assert f"= {yaml_text(value)} " in f"{line} ", (key, line)
    if stage == "sft":  # the packaged file's 3e-3, not the class default 2e-5
        assert "= 0.003 " in next(line for line in lines if line.startswith("  train.lr "))


@pytest.mark.parametrize("stage", STAGES)
def test_fields_sit_under_their_section_heading(stage, capsys):
    heading = None
    for line in help_text([stage], capsys).split("Fields (", 1)[1].splitlines():
        if line and not line.startswith(" "):
            heading = line.split(":", 1)[0]
        elif line.startswith("  ") and not line.startswith("      "):
            key = line.split()[0]
            assert heading == (key.rsplit(".", 1)[0] if "." in key else "top level"), line


@pytest.mark.parametrize("argv", [["sft"], ["rm"], ["ppo"], ["experiment", "run"]])
def test_help_lists_the_registered_callback_kinds(argv, capsys):
    text = " ".join(help_text(argv, capsys).split())
    kinds = text.split("callbacks", 1)[1].split("kinds: ", 1)[1]
    for name in registered_callbacks():
        assert name in kinds


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"], ["report", "--help"], ["demo", "--help"]])
@pytest.mark.slow
def test_cheap_help_imports_neither_torch_nor_the_recipes(argv):
    code = (
        "import sys\nfrom olingo.cli.main import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'olingo.recipes.common') if m in sys.modules)\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "usage: olingo" in result.stdout
    assert "HEAVY []" in result.stderr, result.stderr


def test_a_stage_command_still_gets_its_config_model():
    from olingo.cli.main import build_parser

    args = build_parser().parse_args(["ppo", "loop.episodes=2"])
    assert args.config_model is config_class("ppo") and args.default_config == "ppo_tiny.yaml"
    assert args.overrides == ["loop.episodes=2"]
