"""Models: loading from Hugging Face directories, `RewardModel`, and the ColossalChat loss names
(`olingo.models.loss`; the losses live in `olingo.rl`)."""

from olingo.models.loading import (
    load_backbone,
    load_causal_lm,
    load_safetensors_into,
    load_tokenizer,
    name_stop_tokens,
    set_chat_template,
    stop_token_ids,
)
from olingo.models.loss import GPTLMLoss, LogExpLoss, LogSigLoss
from olingo.models.reward_model import RewardModel
from olingo.models.sources import resolve_model_path, resolve_path
from olingo.models.utils import last_attended_index, position_ids_from_mask

__all__ = [
    "GPTLMLoss",
    "LogExpLoss",
    "LogSigLoss",
    "RewardModel",
    "last_attended_index",
    "load_backbone",
    "load_causal_lm",
    "load_safetensors_into",
    "load_tokenizer",
    "name_stop_tokens",
    "position_ids_from_mask",
    "resolve_model_path",
    "resolve_path",
    "set_chat_template",
    "stop_token_ids",
]
