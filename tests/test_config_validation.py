"""Typed configs check ranges and suggest the key a typo or another library's name meant.

Ranges: every numeric field of the stage and experiment configs has bounds, and a value out
of them is an error naming the key, the value and where it came from. Unknown keys: the
did-you-mean works on the whole dotted path (a key in the wrong section), knows other
trainers' names (`gradient_accumulation_steps`), and says whether the key came from the file
or the command line. Every problem is reported at once, one line each.
"""

import re
import types
import typing

import pytest

from olingo.config import ConfigError, load_config, packaged_config
from olingo.config_errors import similarity, unknown_key_hint
from olingo.config_help import range_text
from olingo.experiment.config import ExperimentConfig
from olingo.recipes.ppo import PPOConfig
from olingo.recipes.rm import RMConfig
from olingo.recipes.sft import SFTConfig

PACKAGED = {SFTConfig: "sft_tiny.yaml", RMConfig: "rm_tiny.yaml", PPOConfig: "ppo_tiny.yaml", ExperimentConfig: "experiment_sft_lr.yaml"}


def problems(model: type, overrides: list[str], path=None) -> list[str]:
    """The lines of the ConfigError that loading raises (it must raise)."""
    with pytest.raises(ConfigError) as info:
        load_config(model, path if path is not None else packaged_config(PACKAGED[model]), overrides)
    return [line.strip() for line in str(info.value).splitlines()[1:]]


# ---- ranges -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "model, override, message",
    [
        (SFTConfig, "train.lr=0", "Input should be greater than 0"),
        (SFTConfig, "train.lr=-0.5", "Input should be greater than 0"),
        (SFTConfig, "train.epochs=0", "Input should be greater than or equal to 1"),
        (SFTConfig, "train.batch_size=0", "Input should be greater than or equal to 1"),
        (SFTConfig, "train.eval_batch_size=0", "Input should be greater than or equal to 1"),
        (SFTConfig, "train.accumulation_steps=0", "Input should be greater than or equal to 1"),
        (SFTConfig, "train.warmup_ratio=1.5", "Input should be less than or equal to 1"),
        (SFTConfig, "train.min_lr_ratio=-0.1", "Input should be greater than or equal to 0"),
        (SFTConfig, "train.weight_decay=-0.1", "Input should be greater than or equal to 0"),
        (SFTConfig, "train.max_grad_norm=0", "Input should be greater than 0"),
        (SFTConfig, "train.save_interval=-1", "Input should be greater than or equal to 0"),
        (SFTConfig, "train.eval_interval=-1", "Input should be greater than or equal to 0"),
        (SFTConfig, "data.max_length=0", "Input should be greater than 0"),
        (SFTConfig, "model.lora.dropout=1.0", "Input should be less than 1"),
        (SFTConfig, "run.seed=-1", "Input should be greater than or equal to 0"),
        (RMConfig, "train.beta=0", "Input should be greater than 0"),
        (RMConfig, "data.max_length=-5", "Input should be greater than 0"),
        (PPOConfig, "actor_optim.lr=0", "Input should be greater than 0"),
        (PPOConfig, "loop.episodes=0", "Input should be greater than or equal to 1"),
        (PPOConfig, "loop.rollout_batch_size=0", "Input should be greater than or equal to 1"),
        (PPOConfig, "loop.train_batch_size=0", "Input should be greater than or equal to 1"),
        (PPOConfig, "loop.accumulation_steps=0", "Input should be greater than or equal to 1"),
        (PPOConfig, "experience.kl_coef=-0.1", "Input should be greater than or equal to 0"),
        (PPOConfig, "loss.vf_coef=-1", "Input should be greater than or equal to 0"),
        (PPOConfig, "loss.ptx_coef=-1", "Input should be greater than or equal to 0"),
        (PPOConfig, "loss.eps_clip=0", "Input should be greater than 0"),
        (PPOConfig, "experience.gamma=1.01", "Input should be less than or equal to 1"),
        (PPOConfig, "experience.lam=-0.5", "Input should be greater than or equal to 0"),
        (PPOConfig, "loop.save_interval=-1", "Input should be greater than or equal to 0"),
        (PPOConfig, "generation.max_new_tokens=0", "Input should be greater than or equal to 1"),
        (PPOConfig, "generation.temperature=0", "Input should be greater than 0"),
        (PPOConfig, "generation.top_p=0", "Input should be greater than 0"),
        (PPOConfig, "generation.top_p=1.5", "Input should be less than or equal to 1"),
        (PPOConfig, "data.max_prompt_length=0", "Input should be greater than 0"),
        (PPOConfig, "reward.clip=0", "Input should be greater than 0"),
        (ExperimentConfig, "base_seed=-1", "Input should be greater than or equal to 0"),
    ],
)
def test_a_value_out_of_range_names_key_value_and_origin(model, override, message):
    key, value = override.split("=", 1)
    assert problems(model, [override]) == [f"{key}: {message} (got {value}) from the command line '{override}'"]


def test_adam_betas_are_each_checked():
    assert problems(SFTConfig, ["train.adam_betas=[0.9, 1.0]"]) == [
        "train.adam_betas.1: Input should be less than 1 (got 1.0) from the command line 'train.adam_betas=[0.9, 1.0]'"
    ]


def test_boundary_values_are_accepted():
    load_config(SFTConfig, None, ["train.warmup_ratio=0", "train.min_lr_ratio=1", "train.weight_decay=0", "model.lora.dropout=0", "run.seed=0"])
    load_config(PPOConfig, None, ["generation.top_p=1", "experience.kl_coef=0", "experience.gamma=1", "experience.lam=0", "loss.ptx_coef=0",
                                  "generation.max_new_tokens=1"])


def test_a_bad_value_in_the_file_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  lr: -1\n  warmup_ratio: 2\n")
    assert problems(RMConfig, ["train.beta=0"], path) == [
        f"train.lr: Input should be greater than 0 (got -1) in the config file {path}",
        f"train.warmup_ratio: Input should be less than or equal to 1 (got 2) in the config file {path}",
        "train.beta: Input should be greater than 0 (got 0) from the command line 'train.beta=0'",
    ]


def _numeric(annotation) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_numeric(a) for a in typing.get_args(annotation) if a is not type(None))
    return annotation in (int, float)


def _numeric_fields(model, prefix=""):
    for name, field in model.model_fields.items():
        sub = field.annotation if isinstance(field.annotation, type) and hasattr(field.annotation, "model_fields") else None
        if sub is not None:
            yield from _numeric_fields(sub, f"{prefix}{name}.")
        elif _numeric(field.annotation):
            yield f"{prefix}{name}", field


@pytest.mark.parametrize("model", [SFTConfig, RMConfig, PPOConfig, ExperimentConfig])
def test_every_numeric_field_has_a_range(model):
    unbounded = [key for key, field in _numeric_fields(model) if not range_text(field)]
    assert unbounded == []


@pytest.mark.parametrize("model", list(PACKAGED))
def test_packaged_configs_are_in_range(model):
    load_config(model, packaged_config(PACKAGED[model]))
    if model is RMConfig:
        load_config(model, packaged_config("rm_hf_example.yaml"))


# ---- unknown keys ------------------------------------------------------------------------------------
def test_the_readme_typo_suggests_lr_from_the_command_line():
    assert problems(RMConfig, ["train.lerning_rate=1e-4"]) == [
        "train: unknown key 'lerning_rate' (did you mean 'lr'?) from the command line 'train.lerning_rate=1e-4'"
    ]


def test_an_unknown_key_in_the_file_names_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lerning_rate: 0.1\n")
    assert problems(SFTConfig, [], path) == [f"train: unknown key 'lerning_rate' (did you mean 'lr'?) in the config file {path}"]


@pytest.mark.parametrize(
    "model, override, line",
    [
        (SFTConfig, "lr=1e-4", "(top level): unknown key 'lr' (did you mean 'train.lr'?)"),
        (SFTConfig, "seed=1", "(top level): unknown key 'seed' (did you mean 'run.seed'?)"),
        (RMConfig, "trian.lr=2", "(top level): unknown key 'trian.lr' (did you mean 'train.lr'?)"),
        (PPOConfig, "train.kl_coef=0.1", "(top level): unknown key 'train.kl_coef' (did you mean 'experience.kl_coef'?)"),
        (PPOConfig, "ppo.lr=1e-6", "(top level): unknown key 'ppo.lr' (did you mean 'actor_optim.lr' or 'critic_optim.lr'?)"),
        # The flat `ppo:` section of earlier versions: each old key points to its new section.
        (PPOConfig, "ppo.kl_coef=0.1", "(top level): unknown key 'ppo.kl_coef' (did you mean 'experience.kl_coef'?)"),
        (PPOConfig, "ppo.eps_clip=0.1", "(top level): unknown key 'ppo.eps_clip' (did you mean 'loss.eps_clip'?)"),
        (PPOConfig, "ppo.episodes=3", "(top level): unknown key 'ppo.episodes' (did you mean 'loop.episodes'?)"),
        (SFTConfig, "model.lora_r=8", "(top level): unknown key 'model.lora_r' (did you mean 'model.lora.r'?)"),
    ],
)
def test_a_key_in_the_wrong_section_suggests_its_full_path(model, override, line):
    assert problems(model, [override]) == [f"{line} from the command line '{override}'"]


@pytest.mark.parametrize(
    "model, override, section, suggestion",
    [
        (SFTConfig, "train.learning_rate=1e-4", "train", "lr"),
        (SFTConfig, "train.lr_rate=1e-4", "train", "lr"),
        (SFTConfig, "train.num_epochs=2", "train", "epochs"),
        (SFTConfig, "train.n_epochs=2", "train", "epochs"),
        (SFTConfig, "train.epochss=2", "train", "epochs"),
        (SFTConfig, "train.batchsize=4", "train", "batch_size"),
        (SFTConfig, "train.per_device_train_batch_size=4", "train", "batch_size"),
        (PPOConfig, "loop.per_device_train_batch_size=4", "loop", "train_batch_size"),
        (SFTConfig, "train.grad_accum=4", "train", "accumulation_steps"),
        (RMConfig, "train.gradient_accumulation_steps=4", "train", "accumulation_steps"),
        (SFTConfig, "data.max_seq_len=256", "data", "max_length"),
        (RMConfig, "data.max_seq_length=256", "data", "max_length"),
        (PPOConfig, "experience.beta=0.1", "experience", "kl_coef"),
        (PPOConfig, "experience.kl_beta=0.1", "experience", "kl_coef"),
        (PPOConfig, "data.train=[p.jsonl]", "data", "prompts"),
        (SFTConfig, "model.lora.alpah=8", "model.lora", "alpha"),
    ],
)
def test_synonyms_and_typos_suggest_the_sibling(model, override, section, suggestion):
    key = override.split("=")[0].rsplit(".", 1)[1]
    assert problems(model, [override]) == [f"{section}: unknown key '{key}' (did you mean '{suggestion}'?) from the command line '{override}'"]


def test_no_close_key_lists_the_valid_ones():
    (line,) = problems(RMConfig, ["data.colour=red"])
    assert line == "data: unknown key 'colour' from the command line 'data.colour=red'; valid keys: eval, max_length, overlong, skip_invalid, train"


def test_a_misplaced_section_in_the_file_is_split_into_its_keys(tmp_path):
    path = tmp_path / "ppo.yaml"
    path.write_text("train:\n  lr: 1.0e-6\n  kl_coef: 0.1\n")
    assert problems(PPOConfig, [], path) == [
        f"(top level): unknown key 'train.lr' (did you mean 'actor_optim.lr' or 'critic_optim.lr'?) in the config file {path}",
        f"(top level): unknown key 'train.kl_coef' (did you mean 'experience.kl_coef'?) in the config file {path}",
    ]


def test_unknown_keys_inside_list_items_are_found():
    assert problems(SFTConfig, ["callbacks=[{kind: early_stopping, parms: {}}]"]) == [
        "callbacks.0: unknown key 'parms' (did you mean 'params'?) from the command line 'callbacks=[{kind: early_stopping, parms: {}}]'",
        # the rest of the item is checked too, as a callback spec (docs/callbacks.md): early_stopping needs a metric
        "callbacks.0: callback 'early_stopping': parameter 'metric': Field required from the command line 'callbacks=[{kind: early_stopping, parms: {}}]'",
    ]


def test_every_problem_is_reported_at_once_one_line_each(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lerning_rate: 0.1\n  epochs: 0\n")
    lines = problems(SFTConfig, ["data.max_seq_len=64", "train.batch_size=0", "lr=1"], path)
    assert len(lines) == 5
    assert sum("unknown key" in line for line in lines) == 3
    assert any(re.match(r"train.epochs: .* in the config file", line) for line in lines)
    assert any(line.startswith("train.batch_size: ") and "from the command line 'train.batch_size=0'" in line for line in lines)


def test_hints_on_a_small_tree():
    tree = {"train": {"lr": None, "epochs": None}, "ppo": {"kl_coef": None}, "actor_optim": {"lr": None}}
    assert similarity("learning_rate", "lr") == 1.0 and similarity("lerning_rate", "lr") > 0.9
    sibling = unknown_key_hint(("train",), ("lerning_rate",), tree)
    assert sibling.paths == (("lr",),) and not sibling.from_root
    moved = unknown_key_hint((), ("kl_coef",), tree)
    assert moved.paths == (("ppo", "kl_coef"),) and moved.from_root
    assert unknown_key_hint(("ppo",), ("lr",), tree).paths == (("train", "lr"), ("actor_optim", "lr"))
    assert unknown_key_hint(("train",), ("colour",), tree) is None
