"""olingo: RL post-training of language models (docs/python-api.md).

The main names in one namespace, as TRL has them: `from olingo import GRPOConfig, GRPOTrainer`.
Each config is the strict run config of a CLI stage (what `olingo grpo` reads from YAML); each
trainer runs that stage from one config, a model and data (`olingo.api`). The names load on
first use, so `import olingo` (and the CLI's start) imports no torch. The trainers of the same
names in `olingo.trainer` are the ColossalChat-compatible classes (docs/coming-from-colossalchat.md).
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "GRPOTrainer": "olingo.api",
    "GRPOConfig": "olingo.recipes.grpo_config",
    "PPOTrainer": "olingo.api",
    "PPOConfig": "olingo.recipes.ppo_config",
    "DPOTrainer": "olingo.api",
    "DPOConfig": "olingo.recipes.dpo",
    "ORPOTrainer": "olingo.api",
    "ORPOConfig": "olingo.recipes.dpo",
    "KTOTrainer": "olingo.api",
    "KTOConfig": "olingo.recipes.dpo",
    "SFTTrainer": "olingo.api",
    "SFTConfig": "olingo.recipes.sft",
    "RewardModelTrainer": "olingo.api",
    "RMConfig": "olingo.recipes.rm",
    "Callback": "olingo.trainer.callbacks",
    "load_config": "olingo.config",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'olingo' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
