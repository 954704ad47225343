"""The native Python API: a trainer built from one config object, a model and data, then
`train()`, as in TRL (`GRPOTrainer(config, reward_funcs=[fn], train_dataset=rows)`).

Each trainer is a thin front over its stage's recipe, the code `olingo <stage>` runs:
    1. the config (the stage's strict run config, e.g. `GRPOConfig`) is copied; `model=` and the
       dataset arguments replace its model path and data sources, and the result is validated
       again as a whole;
    2. in-memory rows (a list of dicts, a `datasets.Dataset`) become JSONL files that the config
       names, in `<run.output_dir>/<run.name>.data/`, so config.yaml records the data and a
       resumed run reads the same rows;
    3. GRPO and PPO: Python reward functions are registered under their `__name__`;
    4. `train()` writes the data files and calls the recipe's `run_*` function.
The classes of the same names in `olingo.trainer` are the ColossalChat-compatible ones, built
from models, boosters and dataloaders (docs/coming-from-colossalchat.md). docs/python-api.md
describes this module for users.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any, ClassVar

from olingo.config import ConfigError, StrictModel
from olingo.dataset.errors import DataError, type_name
from olingo.recipes.dpo import DPOConfig, KTOConfig, ORPOConfig
from olingo.recipes.grpo_config import GRPOConfig
from olingo.recipes.ppo_config import PPOConfig
from olingo.recipes.rm import RMConfig
from olingo.recipes.sft import SFTConfig
from olingo.rewards.registry import RewardError, register_reward, resolve_reward
from olingo.trainer.callbacks import Callback

# A file path, hub id or saved dataset (or a list of them), or rows: a list of dicts, a datasets.Dataset.
Data = str | os.PathLike | Sequence[str | os.PathLike] | Iterable[Mapping[str, Any]]
# Functions or names (registered, or 'package.module:function'), weight 1 each; or {function or name: weight}.
RewardFuncs = Callable[..., Any] | str | Sequence[Callable[..., Any] | str] | Mapping[Any, float]


class Trainer:
    """The shared front of the native trainers: one config, a model, data; `train()` runs the recipe.

    config: the stage's config object, or a dict of its sections (None: the defaults, which
        train the embedded tiny model on the embedded arithmetic task);
    model: a model directory, hub id, GGUF file or `builtin:` name, replacing the config's;
    train_dataset, eval_dataset: rows (a list of dicts, a `datasets.Dataset`) or a data path
        (or a list of paths), replacing the config's data sources; None keeps the config's; an
        empty `eval_dataset` turns evaluation off;
    callbacks: `olingo.Callback` objects, given to the run with the config's own.
    """

    config_class: ClassVar[type[StrictModel]]
    run_function: ClassVar[str]  # "module:function" of the recipe, imported when train() runs
    model_key: ClassVar[str] = "path"  # the field of the config's `model` section that names the model
    data_keys: ClassVar[tuple[str, str]] = ("train", "eval")  # the `data` fields: training, held out

    def __init__(
        self, config: StrictModel | Mapping[str, Any] | None = None, *, model: str | os.PathLike | None = None,
        train_dataset: Data | None = None, eval_dataset: Data | None = None, callbacks: Sequence[Callback] = (),
    ) -> None:
        sections = self._config_sections(config)
        run = sections["run"]
        self.data_dir = Path(run["output_dir"]) / f"{run['name']}.data"
        self._files: dict[Path, tuple[str, str]] = {}  # data file -> (argument name, JSONL text)
        if model is not None:
            sections["model"][self.model_key] = model_source(model)
        for key, dataset, stem in zip(self.data_keys, (train_dataset, eval_dataset), ("train", "eval"), strict=True):
            if dataset is not None:
                sections["data"][key] = self._sources(dataset, stem)
        self._override(sections)
        self.config = self.config_class.model_validate(sections)  # validated as a whole once more
        self.callbacks = list(callbacks)

    def train(self) -> dict:
        """Write the in-memory data into the data directory, then run the stage's recipe;
        returns what the recipe returns (run directory, final model, held-out metrics, steps)."""
        module, _, name = self.run_function.partition(":")
        run = getattr(import_module(module), name)
        self._write_data()
        return run(self.config, callbacks=self.callbacks)

    def _config_sections(self, config: StrictModel | Mapping[str, Any] | None) -> dict[str, Any]:
        """A copy of `config` (validated into `config_class`) as nested dicts; the caller's object stays as it is."""
        cls = self.config_class
        if isinstance(config, Mapping):
            config = cls.model_validate(dict(config))
        elif config is None:
            config = cls()
        elif not isinstance(config, cls):
            raise TypeError(f"{type(self).__name__} takes a {cls.__name__} (or a dict of its sections), got {type(config).__name__}")
        return config.model_dump()

    def _override(self, sections: dict[str, Any]) -> None:
        """Further changes a subclass makes to the config's sections before they are validated."""

    def _sources(self, dataset: Data, stem: str) -> list[str]:
        """The data sources the config will name for `dataset`: paths as given, rows as the JSONL
        file `<data_dir>/<stem>.jsonl` (written by `train`); no rows for `eval`: none (no evaluation)."""
        label = f"{stem}_dataset"
        if isinstance(dataset, str | os.PathLike):
            return [os.fspath(dataset)]
        if isinstance(dataset, Mapping):  # a DatasetDict, or one row by mistake
            raise TypeError(f"{label} is a {type(dataset).__name__}: pass rows (a list of dicts, one split such as dataset['{stem}']) or a path")
        if isinstance(dataset, list | tuple) and dataset and all(isinstance(d, str | os.PathLike) for d in dataset):
            return [os.fspath(d) for d in dataset]
        text = jsonl_text(dataset, label)
        if not text:
            if stem == "eval":
                return []
            raise DataError(label, None, None, "no rows")
        path = self.data_dir / f"{stem}.jsonl"
        self._files[path] = (label, text)
        return [str(path)]

    def _write_data(self) -> None:
        """Write each in-memory dataset's file. A fresh start replaces the files; a resumed run
        (`run.resume`) must be given the rows it recorded, so it trains on the same data; a run
        directory the recipe will refuse to reuse (no resume, no overwrite) leaves them alone."""
        run = self.config.run
        run_dir = Path(run.output_dir) / run.name
        if run.resume is None and not run.overwrite and run_dir.is_dir() and any(run_dir.iterdir()):
            return  # the recipe stops with "run directory ... already exists"; that run's data stays
        for path, (label, text) in self._files.items():
            recorded = path.read_text(encoding="utf-8") if path.is_file() else None
            if recorded == text:
                continue
            if run.resume is not None and recorded is not None:
                raise ConfigError(
                    f"run.resume={run.resume}: {label} holds other rows than the run recorded in {path}; "
                    "a resumed run trains on the same rows: pass those again, or start a new run"
                )
            write_atomically(path, text)


class OnlineTrainer(Trainer):
    """The front of the RL stages (GRPO, PPO): `reward_funcs` as well.

    reward_funcs: reward functions (Python functions, each registered under its `__name__`,
        or names: registered ones such as `math_answer`, or 'package.module:function'), weight 1
        each, or a dict {function or name: weight}; they replace the config's
        `reward.functions` (a `reward.model` stays). None keeps the config's.
    The other arguments are `Trainer`'s; `model` replaces `model.actor`, the datasets
    `data.prompts` and `data.eval_prompts` (rows {prompt or messages, gt_answer?, other fields}).
    """

    model_key = "actor"
    data_keys = ("prompts", "eval_prompts")

    def __init__(
        self, config: StrictModel | Mapping[str, Any] | None = None, *, model: str | os.PathLike | None = None,
        reward_funcs: RewardFuncs | None = None, train_dataset: Data | None = None, eval_dataset: Data | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        self.reward_weights, self._has_callables = (None, False) if reward_funcs is None else reward_weights(reward_funcs)
        super().__init__(config, model=model, train_dataset=train_dataset, eval_dataset=eval_dataset, callbacks=callbacks)

    def _override(self, sections: dict[str, Any]) -> None:
        if self.reward_weights is not None:
            sections["reward"]["functions"] = self.reward_weights
        if self._has_callables and sections["ray"]["enabled"]:
            raise ConfigError(
                "reward_funcs: a Python function is registered in this process only, and ray.enabled scores rewards in "
                "Ray actors; name it by its import path instead ('package.module:function')"
            )


class GRPOTrainer(OnlineTrainer):
    """The GRPO family (GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++) from a `GRPOConfig`: what
    `olingo grpo` runs (docs/grpo.md); arguments as `OnlineTrainer`'s.

    Not `olingo.trainer.GRPOTrainer`, ColossalChat's signature (built models, a booster, a
    dataloader), which this one builds and runs for you (docs/coming-from-colossalchat.md).
    """

    config_class = GRPOConfig
    run_function = "olingo.recipes.grpo:run_grpo"


class PPOTrainer(OnlineTrainer):
    """PPO with a critic from a `PPOConfig`: what `olingo ppo` runs (docs/ppo.md); arguments as
    `OnlineTrainer`'s (a reward model is `config.reward.model`).

    Not `olingo.trainer.PPOTrainer`, ColossalChat's signature (docs/coming-from-colossalchat.md).
    """

    config_class = PPOConfig
    run_function = "olingo.recipes.ppo:run_ppo"


class DPOTrainer(Trainer):
    """The DPO family (DPO, cDPO, IPO, SimPO) from a `DPOConfig`: what `olingo dpo` runs
    (docs/dpo.md); `model` replaces `model.path`, the datasets `data.train` and `data.eval`
    (preference pairs {prompt, chosen, rejected}).

    Not `olingo.trainer.DPOTrainer`, ColossalChat's signature (docs/coming-from-colossalchat.md).
    """

    config_class = DPOConfig
    run_function = "olingo.recipes.dpo:run_dpo"


class ORPOTrainer(Trainer):
    """ORPO from an `ORPOConfig` (`olingo orpo`, docs/dpo.md); data as `DPOTrainer`'s.

    Not `olingo.trainer.ORPOTrainer`, ColossalChat's signature (docs/coming-from-colossalchat.md).
    """

    config_class = ORPOConfig
    run_function = "olingo.recipes.dpo:run_orpo"


class KTOTrainer(Trainer):
    """KTO from a `KTOConfig` (`olingo kto`, docs/dpo.md); rows {prompt, completion, label} or pairs.

    Not `olingo.trainer.KTOTrainer`, ColossalChat's signature (docs/coming-from-colossalchat.md).
    """

    config_class = KTOConfig
    run_function = "olingo.recipes.dpo:run_kto"


class SFTTrainer(Trainer):
    """Supervised fine-tuning from an `SFTConfig`: what `olingo sft` runs (docs/sft.md); rows
    {prompt, completion}, {messages} or {text} (docs/data.md).

    Not `olingo.trainer.SFTTrainer`, ColossalChat's signature (docs/coming-from-colossalchat.md).
    """

    config_class = SFTConfig
    run_function = "olingo.recipes.sft:run_sft"


class RewardModelTrainer(Trainer):
    """A reward model from an `RMConfig`: what `olingo rm` runs (docs/reward-models.md); rows
    are preference pairs as for `DPOTrainer`.

    Not `olingo.trainer.RewardModelTrainer`, ColossalChat's signature (docs/coming-from-colossalchat.md).
    """

    config_class = RMConfig
    run_function = "olingo.recipes.rm:run_rm"


# ---- helpers ----------------------------------------------------------------------------------
def model_source(model: Any) -> str:
    """The model argument as the config's path string; a loaded model object is refused (the
    recipe loads, places and checkpoints the model itself)."""
    if isinstance(model, str | os.PathLike):
        return os.fspath(model)
    raise TypeError(
        f"model: expected a model directory, hub id, GGUF file or builtin: name, got {type(model).__name__}; "
        "save a loaded model with save_pretrained and pass its directory"
    )


def jsonl_text(rows: Iterable[Any], label: str) -> str:
    """`rows` as JSONL text, one object a line; a row that is not a dict or not JSON is a
    `DataError` naming `label` and the row (counted from 1, as the data loaders count lines)."""
    if not isinstance(rows, Iterable) or isinstance(rows, bytes):
        raise TypeError(f"{label}: expected rows (a list of dicts, a datasets.Dataset) or a path, got {type(rows).__name__}")
    lines = []
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, Mapping):
            raise DataError(label, number, None, f"expected an object (a dict of field -> value), got {type_name(row)}")
        try:
            lines.append(json.dumps(dict(row), ensure_ascii=False, allow_nan=False) + "\n")
        except (TypeError, ValueError) as err:
            raise DataError(label, number, None, f"cannot be written as JSON: {err}") from None
    return "".join(lines)


def write_atomically(path: Path, text: str) -> None:
    """Write `path` through a temporary file and a rename: under torchrun every rank writes the
    same text, and none may read a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def reward_weights(reward_funcs: RewardFuncs) -> tuple[dict[str, float], bool]:
    """({name: weight} for the config's `reward.functions`, whether any is a Python function),
    registering each function under its `__name__`."""
    if callable(reward_funcs) or isinstance(reward_funcs, str):
        items: list[tuple[Any, float]] = [(reward_funcs, 1.0)]
    elif isinstance(reward_funcs, Mapping):
        items = list(reward_funcs.items())
    elif isinstance(reward_funcs, Iterable):
        items = [(fn, 1.0) for fn in reward_funcs]
    else:
        raise TypeError(f"reward_funcs: expected functions or names (a list, or a dict of weights), got {type(reward_funcs).__name__}")
    if not items:
        raise RewardError("reward_funcs is empty: give at least one function or name (None keeps the config's reward.functions)")
    weights = {resolvable(fn) if isinstance(fn, str) else register(fn): weight for fn, weight in items}
    return weights, any(not isinstance(fn, str) for fn, _ in items)


def resolvable(name: str) -> str:
    """`name` once it resolves to a function (an unknown one is the registry's `RewardError`, with a did-you-mean)."""
    resolve_reward(name)
    return name


def register(fn: Any) -> str:
    """Register Python function `fn` in the reward registry under its `__name__`; its name.
    A name taken by another function (a built-in such as `math_answer`) is a `RewardError`."""
    name = getattr(fn, "__name__", None)
    if not callable(fn):
        raise TypeError(f"reward_funcs: expected a function or a name, got {type(fn).__name__}")
    if not isinstance(name, str) or not name.isidentifier():
        raise RewardError(f"reward_funcs: {fn!r} has no name to register it under (__name__ {name!r}); define it with def, or set its __name__")
    try:
        register_reward(name)(fn)
    except RewardError as err:
        raise RewardError(f"reward_funcs: {err} (a Python function is registered under its __name__: rename it)") from None
    return name
