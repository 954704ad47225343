"""`RewardModel`: a transformer backbone plus a scalar value head.

olingo keeps a reward model as a Hugging Face `*ForSequenceClassification` model with one label:
its backbone is the causal LM's body and its `score` layer is the value head (Linear(hidden, 1),
no bias: a bias cancels in every pairwise loss, so it could never be learned). Saving therefore
writes the exact directory format that `transformers.AutoModelForSequenceClassification`, TRL,
OpenRLHF and serving stacks read.

The score of a sequence is the head's output at the last attended token (the last position whose
attention mask is 1), for left and right padding alike; RM training, evaluation and PPO all read it
through `RewardModel.forward`. Positions are counted over attended tokens so that padding side does
not change a score. Hugging Face's own classifier reads the rightmost token that is not the pad
token: the same position whenever the pad token does not occur inside the text (olingo warns at
save time when pad == eos, the usual way that can break).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from olingo.models.loading import (
    LOAD_ERRORS,
    check_model_path,
    explain_load_failure,
    load_safetensors_into,
    resolve_dtype,
)
from olingo.models.utils import last_attended_index, position_ids_from_mask

logger = logging.getLogger("olingo.models")


class RewardModel(nn.Module):
    """Backbone + value head; `forward` returns one score per sequence, shape (B,)."""

    kind = "reward model"  # named in load errors

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        if getattr(model.config, "num_labels", None) != 1 or not hasattr(model, "score"):
            raise ValueError("RewardModel wraps a *ForSequenceClassification model with num_labels=1")
        self.model = model

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        pad_token_id: int | None = None,
        dtype: str = "float32",
        trust_remote_code: bool = False,
    ) -> RewardModel:
        """Load a saved reward model, or start one from a causal LM / backbone directory.

        When the directory has no trained value head (e.g. it holds a causal LM), the head is
        initialised with N(0, 1/(hidden+1)) from the global torch RNG, as ColossalChat does, so
        a seeded run is reproducible.
        """
        check_model_path(path, f"{cls.kind} path")
        try:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, dtype=resolve_dtype(dtype), output_loading_info=True,
                trust_remote_code=trust_remote_code,
            )
        except LOAD_ERRORS as err:
            raise explain_load_failure(path, err, cls.kind) from None
        if pad_token_id is not None:
            model.config.pad_token_id = pad_token_id
        if any(key.startswith("score.") for key in info["missing_keys"]):
            hidden = model.score.in_features
            nn.init.normal_(model.score.weight, std=1.0 / (hidden + 1))
            logger.info("initialised a new value head on %s", path)
        return cls(model)

    @property
    def config(self):  # noqa: ANN201 - the wrapped model's PretrainedConfig
        return self.model.config

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The value head at every position: (B, L). Critics read these per token."""
        body = getattr(self.model, self.model.base_model_prefix)
        hidden = body(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state
        return self.model.score(hidden).squeeze(-1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Score at the last attended token. input_ids, attention_mask: (B, L) -> (B,)."""
        values = self.values(input_ids, attention_mask)
        rows = torch.arange(values.shape[0], device=values.device)
        return values[rows, last_attended_index(attention_mask)]

    def save_pretrained(self, directory: str | Path, **kwargs) -> None:
        """Write a Hugging Face sequence-classification directory (config + safetensors)."""
        config = self.model.config
        if config.pad_token_id is not None and config.pad_token_id == getattr(config, "eos_token_id", None):
            logger.warning(
                "pad_token_id == eos_token_id: transformers' classifier will score the token before a "
                "trailing eos, while olingo scores the eos itself; use a distinct pad token"
            )
        self.model.save_pretrained(str(directory), **kwargs)

    def load_pretrained_weights(self, directory: str | Path) -> None:
        """Load a directory written by `save_pretrained` into this model in place, strictly."""
        load_safetensors_into(self.model, directory)

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.model.gradient_checkpointing_enable(**kwargs)
