"""Trainers (`from olingo.trainer import PPOTrainer`; docs/coming-from-colossalchat.md maps the
ColossalChat imports). The names load on first use, so importing a submodule never pulls in
every trainer."""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "PPOTrainer": "olingo.trainer.ppo",
    "GRPOTrainer": "olingo.trainer.grpo",
    "OLTrainer": "olingo.trainer.online",
    "OnlineTrainer": "olingo.trainer.online_trainer",
    "SLTrainer": "olingo.trainer.supervised",
    "SFTTrainer": "olingo.trainer.sft",
    "RewardModelTrainer": "olingo.trainer.rm",
    "DPOTrainer": "olingo.trainer.dpo",
    "ORPOTrainer": "olingo.trainer.orpo",
    "KTOTrainer": "olingo.trainer.kto",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'olingo.trainer' has no attribute {name!r}")
