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
token: the same position only when no sequence ends with the pad token. Chat rows end with the
end-of-turn token, often the eos that tokenizers reuse as their pad (SmolLM2: `<|im_end|>`), so
`use_scoring_pad_token` gives the reward model and its tokenizer a pad token the chat data never
holds; olingo warns at save time when the pad is still the eos.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from jinja2.exceptions import TemplateError
from torch import nn
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from olingo.dataset.chat_tokens import encode_chat
from olingo.models.loading import (
    LOAD_ERRORS,
    ONE_MODEL_LOAD_AT_A_TIME,
    check_model_path,
    explain_load_failure,
    load_safetensors_into,
    resolve_dtype,
)
from olingo.models.packing import check_packing, pack_batch, unpack
from olingo.models.pair_prefix import can_share, pair_layout, worth_sharing
from olingo.models.sources import resolve_model_path
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
        initialised with N(0, 1/(hidden+1)) from the global torch RNG, so
        a seeded run is reproducible.
        """
        path = resolve_model_path(path)  # builtin: names, `~`, GGUF files: what a config accepts
        check_model_path(path, f"{cls.kind} path")
        try:
            with ONE_MODEL_LOAD_AT_A_TIME:
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
    def config(self):  # returns the wrapped model's PretrainedConfig
        return self.model.config

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, packing: bool = False, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The value head at every position: (B, L). Critics read these per token.

        packing: run the attended tokens padding-free (`olingo.models.packing`); padding reads 0.
        position_ids: (B, L) for rows of several segments (`pack_batch`); they need packing.
        """
        body = getattr(self.model, self.model.base_model_prefix)
        if position_ids is not None and not packing:
            raise ValueError("rows holding several segments (position_ids) need model.packing: true")
        if not packing:
            hidden = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask), use_cache=False)
            return self.model.score(hidden.last_hidden_state).squeeze(-1)
        check_packing(self, lambda ids, pos: body(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state)
        packed = pack_batch(input_ids, attention_mask, position_ids=position_ids)
        hidden = body(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).last_hidden_state
        return unpack(self.model.score(hidden).squeeze(-1), packed)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, packing: bool = False, position_ids: torch.Tensor | None = None,
        pairs: bool = False,
    ) -> torch.Tensor:
        """Score at the last attended token. input_ids, attention_mask: (B, L) -> (B,).

        pairs: rows i and B/2 + i are a preference pair; where it pays, their shared opening runs
        once (`olingo.models.pair_prefix`), the same scores up to float rounding."""
        if pairs and position_ids is None:
            scores = self._pair_scores(input_ids, attention_mask, packing)
            if scores is not None:
                return scores
        values = self.values(input_ids, attention_mask, packing, position_ids)
        rows = torch.arange(values.shape[0], device=values.device)
        return values[rows, last_attended_index(attention_mask)]

    def _pair_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, packing: bool) -> torch.Tensor | None:
        """`forward(pairs=True)` through the shared openings, or None where that is not exact or not cheaper."""
        body = getattr(self.model, self.model.base_model_prefix)
        checkpointing = any(getattr(module, "gradient_checkpointing", False) for module in body.modules())  # set per layer
        if input_ids.shape[0] % 2 or not can_share(self.config, checkpointing):
            return None
        layout = pair_layout(input_ids, attention_mask, self.config.pad_token_id or 0)
        if not worth_sharing(layout, attention_mask, packing):
            return None
        opened = body(input_ids=layout.opening_ids, attention_mask=layout.opening_mask,
                      position_ids=position_ids_from_mask(layout.opening_mask), use_cache=True)
        cache, half = opened.past_key_values, layout.opening_ids.shape[0]
        cache.batch_select_indices(torch.arange(2 * half, device=input_ids.device) % half)  # chosen rows, then rejected rows
        mask = torch.cat([layout.opening_mask.repeat(2, 1), layout.own_mask], dim=1)
        hidden = body(input_ids=layout.own_ids, attention_mask=mask, position_ids=layout.own_positions, past_key_values=cache, use_cache=True)
        last = last_attended_index(layout.own_mask)
        return self.model.score(hidden.last_hidden_state[torch.arange(2 * half, device=last.device), last]).squeeze(-1)

    def save_pretrained(self, directory: str | Path, **kwargs) -> None:
        """Write a Hugging Face sequence-classification directory (config + safetensors)."""
        config = self.model.config
        # Only a model scored at its last token is read back that way; a critic reads every position.
        scores_last_token = type(self).forward is RewardModel.forward
        if scores_last_token and config.pad_token_id is not None and config.pad_token_id == getattr(config, "eos_token_id", None):
            logger.warning(
                "pad_token_id == eos_token_id: transformers' classifier will score the token before a "
                "trailing eos, while olingo scores the eos itself; use a distinct pad token (use_scoring_pad_token)"
            )
        self.model.save_pretrained(str(directory), **kwargs)

    def load_pretrained_weights(self, directory: str | Path) -> None:
        """Load a directory written by `save_pretrained` into this model in place, strictly."""
        load_safetensors_into(self.model, directory)

    def activation_checkpointing_enable(self, **kwargs) -> None:
        self.model.activation_checkpointing_enable(**kwargs)


def template_token_ids(tokenizer: Any) -> set[int]:
    """Every token id the chat template writes around empty messages (turn markers, bos, eos,
    a default system prompt), over a few probe conversations; templates that refuse one (e.g. a
    system turn) are probed with the others."""
    user, reply = {"role": "user", "content": ""}, {"role": "assistant", "content": ""}
    probes = [
        ([user], True),
        ([user, reply], False),
        ([{"role": "system", "content": ""}, user, reply, user, reply], False),
    ]
    found: set[int] = set()
    for messages, generation_prompt in probes:
        try:
            found.update(encode_chat(tokenizer, messages, add_generation_prompt=generation_prompt))
        except TemplateError:
            continue
    return found


def scoring_pad_token_id(tokenizer: Any, vocab_size: int | None = None) -> int | None:
    """A pad id that no chat row holds, so that transformers' classifier, which scores the
    rightmost token that is not the pad, scores where olingo does (the last attended token).

    The rule: the tokenizer's own pad if it is not the eos token and the chat template never
    writes it; otherwise the first special token (the named ones - unk, pad, bos, ... - then the
    other special added tokens, by id) that is not eos, not bos, not written by the chat template
    and, given ``vocab_size``, has an embedding. SmolLM2 (pad = eos = `<|im_end|>`) gets
    `<|endoftext|>` (id 0). No embedding is added or resized. Returns None when no token
    qualifies: the pad is then kept, and transformers scores a row that ends with it (pad == eos:
    every chat row) at the token before; olingo's own scores are unaffected. The only fix then
    is a new pad token with resized embeddings, before training.
    """
    eos, bos, pad = tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id
    written = template_token_ids(tokenizer)

    def usable(token: int | None) -> bool:
        in_vocab = vocab_size is None or (token is not None and 0 <= token < vocab_size)
        return token is not None and token not in (eos, bos) and token not in written and in_vocab

    if usable(pad):
        return pad
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special_added = sorted(token for token, added_token in added.items() if getattr(added_token, "special", False))
    for token in [*tokenizer.all_special_ids, *special_added]:
        if usable(token):
            return token
    return None


def use_scoring_pad_token(model: RewardModel, tokenizer: Any) -> int:
    """Give ``model`` (its config) and ``tokenizer`` the pad id of `scoring_pad_token_id`, so a
    saved reward model and its saved tokenizer score identically in transformers; returns the
    pad id in use. When no token qualifies, the tokenizer's pad is kept, with a warning."""
    vocab_size = model.model.get_input_embeddings().num_embeddings
    token = scoring_pad_token_id(tokenizer, vocab_size)
    if token is None:
        logger.warning(
            "no special token of the tokenizer can pad reward-model rows without occurring in them; "
            "keeping pad id %s: transformers' AutoModelForSequenceClassification will score rows that "
            "end with it at the token before (olingo's scores are unaffected)", tokenizer.pad_token_id,
        )
        token = tokenizer.pad_token_id
    elif token != tokenizer.pad_token_id:
        logger.info("reward model pads with %r (id %d) instead of %r, which chat rows end with",
                    tokenizer.convert_ids_to_tokens(token), token, tokenizer.pad_token)
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(token)
    model.model.config.pad_token_id = token
    return token
