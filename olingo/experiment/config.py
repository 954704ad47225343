"""The experiment config and its expansion into runs.

An experiment file names its arms in exactly one of three ways, each arm being an olingo stage
config (`stage: sft|rm|ppo|grpo|dpo|orpo|kto` plus that stage's fields, optionally on top of a `config:` file):

    run:    {stage: sft, train: {lr: 1e-3}}                 one arm, named after the experiment
    runs:   {small_lr: {stage: sft, ...}, big_lr: {...}}    arms by name
    matrix: {base: {stage: sft, ...}, axes: {train.lr: [1e-3, 3e-3]}, name: "lr{train.lr}"}

`plan_runs` turns it into the ordered list of training runs: every arm x every seed
(`base_seed + i`, i < n_repeats; replicates named `<arm>__s<seed>` when n_repeats > 1) x every
continual stage (`<replicate>__<stage>`, each starting from the previous run's final weights).
A continual stage may name another stage kind, so an arm can be a chain such as SFT -> GRPO:

    continual: [{name: rl, stage: grpo, config: packaged:grpo_tiny.yaml, overrides: {loop.episodes: 20}}]

Every run's stage config, and every link of every chain, is validated before anything trains.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from olingo.config import ConfigError, HomePath, StrictModel
from olingo.config_errors import did_you_mean
from olingo.config_problems import config_problems, format_problems
from olingo.recipes.common import CallbackSpec, packaged_config

PACKAGED_PREFIX = "packaged:"
SAFE_NAME = re.compile(r"[^A-Za-z0-9_.=+-]")


class BenchmarkSpec(StrictModel):
    """A benchmark scored on every run's model (see olingo.experiment.benchmarks)."""

    kind: str = Field("arithmetic", description="registered benchmark kind, e.g. arithmetic")
    name: str | None = Field(None, description="name in logs and results (default: the kind)")
    params: dict = Field(default_factory=dict, description="the benchmark's parameters")
    run_every: int = Field(0, ge=0, description="also score the live model every N optimizer steps (0: after training only)")

    @property
    def label(self) -> str:
        return self.name or self.kind


class MatrixSpec(StrictModel):
    """A Cartesian product of values over dotted config paths, on top of one base arm."""

    base: dict = Field(..., description="the arm every cell starts from ({stage: ..., ...})")
    axes: dict[str, list] = Field(..., description="dotted path -> values, e.g. {train.lr: [1e-3, 3e-3]}")
    name: str | None = Field(None, description="arm name template, e.g. 'lr{train.lr}' (default: leaf=value pairs)")

    @field_validator("axes", mode="before")
    @classmethod
    def _flatten(cls, axes: Any) -> Any:
        # Dotted overrides (`matrix.axes.train.lr=[...]`) arrive nested: flatten them back.
        return flatten_axes(axes) if isinstance(axes, dict) else axes

    @field_validator("axes")
    @classmethod
    def _non_empty(cls, axes: dict[str, list]) -> dict[str, list]:
        if not axes:
            raise ValueError("matrix.axes needs at least one dotted path with a list of values")
        for path, values in axes.items():
            if not values:
                raise ValueError(f"matrix.axes.{path} has no values")
        return axes


class ContinualStage(StrictModel):
    """A stage that continues from the previous stage's final weights with a fresh optimizer.

    Without `stage` and `config` it repeats the kind of the stage before it, on that stage's
    config (without that stage's overrides): `{name: more, overrides: {...}}` after an arm is the
    arm's config plus the overrides. A `stage` of another kind, or a `config` file, starts a new
    base config: the file (or the kind's defaults) plus the overrides.
    """

    name: str = Field(..., description="stage name; its runs are named <replicate>__<name>")
    stage: str | None = Field(None, description="stage kind (sft|rm|ppo|grpo|dpo|orpo|kto; default: the kind of the stage before it)")
    config: str | None = Field(None, description="base config file of this stage (packaged:<name> or a path relative to the experiment file)")
    overrides: dict = Field(default_factory=dict, description="changes to the stage's base config (nested or dotted keys)")


class ExperimentConfig(StrictModel):
    """An experiment (`olingo experiment run EXP.yaml`): arms x repeats x continual stages."""

    name: str = Field("experiment", description="experiment name; its directory is <output_dir>/<name>")
    output_dir: HomePath = Field("runs/experiments", description="parent of experiment directories")
    overwrite: bool = Field(False, description="delete an existing experiment directory instead of refusing to start")
    hypothesis: str = Field("", description="what the experiment is meant to show (written to experiment.md)")
    success_metric: str | None = Field(None, description="metric that ranks arms, e.g. arithmetic/accuracy or eval/loss")
    success_mode: Literal["max", "min"] = Field("max", description="whether a higher or lower success_metric is better")
    n_repeats: int = Field(1, ge=1, description="seeds per arm")
    base_seed: int | None = Field(None, ge=0, description="first seed; replicate i uses base_seed + i (default: the arm's run.seed)")
    run: dict | None = Field(None, description="a single arm: {stage: sft|rm|ppo|grpo|dpo|orpo|kto, config?: file, ...stage fields}")
    runs: dict[str, dict] | None = Field(None, description="arms by name: {name: {stage: ..., ...}}")
    matrix: MatrixSpec | None = Field(None, description="arms as a Cartesian product over dotted paths")
    continual: list[ContinualStage] = Field(default_factory=list, description=(
        "stages after each arm, [{name, stage?, config?, overrides}], each from the previous final weights; "
        "stage may be another kind (SFT -> GRPO)"))
    benchmarks: list[BenchmarkSpec] = Field(default_factory=list, description="benchmarks scored on every run")
    callbacks: list[CallbackSpec] = Field(
        default_factory=lambda: [CallbackSpec(kind="local_logger"), CallbackSpec(kind="print_progress")],
        description="experiment callbacks [{kind, params}]; they also get every run's loop hooks",
    )

    @model_validator(mode="after")
    def _check(self) -> ExperimentConfig:
        given = [key for key in ("run", "runs", "matrix") if getattr(self, key) is not None]
        if len(given) != 1:
            raise ValueError(f"set exactly one of run, runs or matrix (got {', '.join(given) or 'none'})")
        if self.runs is not None and not self.runs:
            raise ValueError("runs is empty: name at least one arm")
        for what, names in (("continual stage", [s.name for s in self.continual]), ("benchmark", [b.label for b in self.benchmarks])):
            if len(set(names)) != len(names):
                raise ValueError(f"{what} names must be unique, got {names}")
        return self


# ---- dotted paths and merging (pure) ------------------------------------------------------------
def flatten_axes(axes: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'train': {'lr': [1, 2]}} -> {'train.lr': [1, 2]}; lists (the values) are leaves."""
    flat: dict[str, Any] = {}
    for key, value in axes.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_axes(value, prefix=f"{path}."))
        else:
            flat[path] = value
    return flat


def set_dotted(data: dict[str, Any], path: str, value: Any) -> None:
    """Set `data['a']['b'] = value` for path 'a.b', creating missing sections."""
    keys = path.split(".")
    node = data
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set '{path}': '{key}' is not a section")
        node = child
    node[keys[-1]] = value


def get_dotted(data: dict[str, Any], path: str, default: Any = None) -> Any:
    node: Any = data
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` laid over it: sections merge key by key, other values replace;
    a dotted key ('train.lr') in `changes` addresses a nested field. An empty mapping replaces
    (`reward: {functions: {}}` clears the base's reward functions, as the override
    `reward.functions={}` does): merged, it would change nothing, silently."""
    merged = copy.deepcopy(base)
    for key, value in changes.items():
        if "." in key:
            set_dotted(merged, key, copy.deepcopy(value))
        elif isinstance(value, dict) and value and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def render_name(template: str | None, cell: dict[str, Any]) -> str:
    """The arm name of one matrix cell: `template` with each {dotted.path} replaced by its value;
    without a template, 'leaf=value' pairs joined by '_' (lr=0.001_kl_coef=0.1)."""
    if template is None:
        return safe_name("_".join(f"{path.rsplit('.', 1)[-1]}={value}" for path, value in cell.items()))

    def value_of(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in cell:
            raise ConfigError(f"matrix.name: '{{{key}}}' is not an axis{did_you_mean(key, cell)}; axes: {', '.join(cell)}")
        return str(cell[key])

    return safe_name(re.sub(r"\{([^{}]+)\}", value_of, template))


def safe_name(name: str) -> str:
    """A name usable as a directory: characters other than letters, digits and _.=+- become '_'."""
    return SAFE_NAME.sub("_", name)


def expand_matrix(matrix: MatrixSpec) -> dict[str, dict[str, Any]]:
    """Arm name -> arm spec for every cell of the product, in axis order (last axis fastest)."""
    paths = list(matrix.axes)
    arms: dict[str, dict[str, Any]] = {}
    for values in itertools.product(*(matrix.axes[p] for p in paths)):
        cell = dict(zip(paths, values, strict=True))
        spec = copy.deepcopy(matrix.base)
        for path, value in cell.items():
            set_dotted(spec, path, value)
        name = render_name(matrix.name, cell)
        if name in arms:
            raise ConfigError(f"matrix.name gives the same arm name '{name}' to two cells: put every axis in the template")
        arms[name] = spec
    return arms


def arm_specs(cfg: ExperimentConfig) -> dict[str, dict[str, Any]]:
    """Arm name -> arm spec, in the order the file gives them."""
    if cfg.run is not None:
        return {safe_name(cfg.name): cfg.run}
    if cfg.runs is not None:
        return {safe_name(name): spec for name, spec in cfg.runs.items()}
    assert cfg.matrix is not None
    return expand_matrix(cfg.matrix)


# ---- stages ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """How the runner drives one olingo stage."""

    config_model: type[StrictModel]
    run: Callable[..., dict]  # run_sft / run_rm / run_ppo / run_grpo / run_dpo / ...
    model_path: str  # dotted field that a continual stage points at the previous final weights
    # The trained model is a policy (a causal LM that writes answers): benchmarks that decode
    # need one, and so does a policy stage continuing from it.
    generates: bool
    check: Callable[[Any], None] | None = None  # the recipe's cross-section checks, run at plan time


def stages() -> dict[str, Stage]:
    """The stages an arm may name (imported lazily: they pull in torch and transformers)."""
    from olingo.recipes.dpo import DPOConfig, KTOConfig, ORPOConfig, run_dpo, run_kto, run_orpo
    from olingo.recipes.grpo import GRPOConfig, check_grpo_config, run_grpo
    from olingo.recipes.ppo import PPOConfig, check_ppo_config, run_ppo
    from olingo.recipes.rm import RMConfig, run_rm
    from olingo.recipes.sft import SFTConfig, run_sft

    return {
        "sft": Stage(SFTConfig, run_sft, "model.path", generates=True),
        "rm": Stage(RMConfig, run_rm, "model.path", generates=False),
        "ppo": Stage(PPOConfig, run_ppo, "model.actor", generates=True, check=check_ppo_config),
        "grpo": Stage(GRPOConfig, run_grpo, "model.actor", generates=True, check=check_grpo_config),
        "dpo": Stage(DPOConfig, run_dpo, "model.path", generates=True),
        "orpo": Stage(ORPOConfig, run_orpo, "model.path", generates=True),
        "kto": Stage(KTOConfig, run_kto, "model.path", generates=True),
    }


def check_kind(kind: Any, where: str) -> str:
    """`kind` when it names a stage, else a ConfigError at `where` with a did-you-mean."""
    known = stages()
    if kind not in known:
        raise ConfigError(f"{where}: expected one of {', '.join(known)}, got {kind!r}{did_you_mean(str(kind), known)}")
    return kind


def resolve_arm(spec: Any, where: str, base_dir: Path) -> tuple[str, dict[str, Any]]:
    """(stage kind, stage config as a dict) of one arm spec; `config:` files are read here."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: an arm is a mapping {{stage: {'|'.join(stages())}, ...}}, got {type(spec).__name__}")
    spec = dict(spec)
    kind = check_kind(spec.pop("stage", None), f"{where}.stage")
    source = spec.pop("config", None)
    base = read_stage_file(source, where, base_dir) if source else {}
    return kind, deep_merge(base, spec)


def read_stage_file(source: str, where: str, base_dir: Path) -> dict[str, Any]:
    """A stage config file: `packaged:<name>` (olingo/configs) or a path relative to the experiment file."""
    if source.startswith(PACKAGED_PREFIX):
        path = packaged_config(source[len(PACKAGED_PREFIX):])
    else:
        path = Path(source).expanduser()
        path = path if path.is_absolute() else base_dir / path
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where}.config: file not found: {path}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}.config: {path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}.config: {path} must hold a mapping")
    return data


def validate_stage(kind: str, data: dict[str, Any], where: str) -> StrictModel:
    """The stage config model for `data`; every problem is reported with `where` in front."""
    stage = stages()[kind]
    model, problems = config_problems(stage.config_model, data)
    if model is None:  # the same did-you-mean and range messages as a stage's own config
        raise ConfigError(f"invalid {kind} config in {where}:\n" + format_problems(problems, prefix=where))
    if model.run.resume is not None:
        raise ConfigError(f"{where}.run.resume: experiments start every run fresh; leave run.resume unset")
    if model.plugin.name != "single":
        raise ConfigError(f"{where}.plugin.name: an experiment runs its arms one after another in one process; use plugin.name=single")
    ray = getattr(model, "ray", None)
    if ray is not None and ray.enabled:  # the recipe refuses it too, but only once training starts
        raise ConfigError(f"{where}.ray.enabled: not available inside an experiment (its callbacks would run in a Ray actor); leave it false")
    if stage.check is not None:
        try:
            stage.check(model)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
    return model


# ---- chains ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChainLink:
    """One stage of an arm's chain, before seeds are given: the arm's run or a continual stage."""

    kind: str
    data: dict[str, Any]  # the stage config as a dict, without run.name/output_dir/seed
    where: str  # for error messages: "runs.A" or "runs.A continual.rl"
    stage: str | None  # continual stage name (None: the arm's own run)


def check_continual_kinds(continual: list[ContinualStage]) -> None:
    """Every `continual[i].stage` names a known stage kind."""
    for stage in continual:
        if stage.stage is not None:
            check_kind(stage.stage, f"continual.{stage.name}.stage")


def check_link(before: ChainLink, kind: str, stage: ContinualStage, where: str) -> None:
    """A continual stage of `kind` can start from the final weights of `before`."""
    known = stages()
    if known[kind].generates and not known[before.kind].generates:
        raise ConfigError(
            f"{where}.stage: {kind} trains a policy and starts from one, but the stage before it "
            f"({before.where}, {before.kind}) trains a reward model; only an rm stage can continue a reward model"
        )
    model_path = known[kind].model_path
    if get_dotted(deep_merge({}, stage.overrides), model_path) is not None:
        raise ConfigError(
            f"{where}.overrides.{model_path}: a continual stage starts from the final weights of the stage "
            f"before it ({before.where}); leave {model_path} unset"
        )


def arm_chain(cfg: ExperimentConfig, kind: str, data: dict[str, Any], where: str, base_dir: Path) -> list[ChainLink]:
    """The arm's run, then its continual stages, each with its kind and config.

    A stage without `stage` and `config` (or naming the kind before it) takes the base config of
    the stage before it; another kind or a `config` file starts a new base. A stage's overrides
    never carry over to the next stage.
    """
    links, base = [ChainLink(kind, data, where, None)], data
    for stage in cfg.continual:
        before, stage_where = links[-1], f"{where} continual.{stage.name}"
        kind = stage.stage or before.kind
        check_link(before, kind, stage, stage_where)
        if stage.config is not None or kind != before.kind:
            base = read_stage_file(stage.config, f"continual.{stage.name}", base_dir) if stage.config else {}
        links.append(ChainLink(kind, deep_merge(base, stage.overrides), stage_where, stage.name))
    return links


# ---- the plan -------------------------------------------------------------------------------------
@dataclass
class RunPlan:
    """One training run of the experiment, before it runs."""

    name: str  # "<arm>", "<arm>__s<seed>", + "__<stage>" for continual stages
    arm: str
    group: str | None  # the arm, when it has repeats or continual stages
    seed: int
    kind: str  # sft | rm | ppo | grpo
    config: dict[str, Any]  # the stage config as a dict (run.name, run.output_dir, run.seed set)
    where: str  # where in the experiment file it comes from, for error messages
    stage: str | None = None  # continual stage name (None: the arm's own run)
    previous: str | None = None  # run whose final weights this continual stage starts from
    model_path: str | None = None  # dotted field set to the previous run's final model (model.path, model.actor)


def replicate_name(arm: str, seed: int, n_repeats: int) -> str:
    """'<arm>__s<seed>' when the arm has several seeds, else the arm's name."""
    return f"{arm}__s{seed}" if n_repeats > 1 else arm


def plan_runs(cfg: ExperimentConfig, base_dir: Path, runs_dir: Path) -> list[RunPlan]:
    """Every run in order: arms, then seeds, then continual stages; each config validated."""
    check_continual_kinds(cfg.continual)
    plans: list[RunPlan] = []
    for arm, spec in arm_specs(cfg).items():
        where = "run" if cfg.run is not None else (f"runs.{arm}" if cfg.runs is not None else f"matrix[{arm}]")
        kind, data = resolve_arm(spec, where, base_dir)
        chain = arm_chain(cfg, kind, data, where, base_dir)
        first_seed = cfg.base_seed if cfg.base_seed is not None else int(get_dotted(data, "run.seed", 42))
        group = arm if cfg.n_repeats > 1 or cfg.continual else None
        for seed in range(first_seed, first_seed + cfg.n_repeats):
            replicate, previous = replicate_name(arm, seed, cfg.n_repeats), None
            for link in chain:
                name = replicate if link.stage is None else f"{replicate}__{safe_name(link.stage)}"
                stage_data = deep_merge(link.data, {"run": {"name": name, "output_dir": str(runs_dir), "seed": seed}})
                validate_stage(link.kind, stage_data, link.where)
                model_path = stages()[link.kind].model_path if previous else None
                plans.append(RunPlan(name, arm, group, seed, link.kind, stage_data, link.where, link.stage, previous, model_path))
                previous = name
    names = [p.name for p in plans]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"two runs would share the directory of {duplicates}: give arms and stages distinct names")
    return plans
