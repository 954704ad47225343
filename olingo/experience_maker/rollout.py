"""Batched rollout generation for PPO: left-padded prompts in, the DESIGN §4.1 layout out.

`generate_rollout` runs transformers `generate` (KV cache) on left-padded prompts and
returns `sequences = [left-padded prompt | response, right-padded with pad]`. The response
end is recomputed from the tokens (`action_mask_from_responses`) instead of trusted from
`generate`, so every per-token RL tensor can use the same (B, A) action mask.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig

from olingo.config_errors import did_you_mean

# `generate` fills every `None` field of the config we pass from `model.generation_config`.
# These fields have no "off" value that is not `None`, so a model's own setting would still
# change the sampled tokens; `generate_rollout` warns when a model sets one of them.
_FIELDS_WITHOUT_OFF_VALUE = (
    "bad_words_ids",
    "suppress_tokens",
    "begin_suppress_tokens",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "sequence_bias",
    "exponential_decay_length_penalty",
    "watermarking_config",
)
_SAMPLING_FIELDS_WITHOUT_OFF_VALUE = ("min_p", "top_h")


@dataclass
class GenerationSettings:
    """How rollouts are sampled. Values are checked on construction."""

    max_new_tokens: int = 64
    """Most response tokens per prompt (A <= max_new_tokens)."""
    do_sample: bool = True
    """Sample from the policy; False decodes greedily."""
    temperature: float = 1.0
    """Softmax temperature when sampling (> 0)."""
    top_k: int = 0
    """Keep the k most likely tokens when sampling; 0 = off."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1.0 = off."""
    stop_token_ids: list[int] | None = None
    """Token ids that end a response (included in it); None -> [tokenizer.eos_token_id];
    [] -> no stop token: every response runs to max_new_tokens (unless a stop string ends it)."""
    stop_strings: list[str] | None = None
    """Strings that end a response at the token completing them (included in it)."""

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be an int, got {self.max_new_tokens!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1.0 = off), got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if self.stop_token_ids is not None:
            self.stop_token_ids = _check_list(self.stop_token_ids, int, "stop_token_ids", allow_empty=True)
        if self.stop_strings is not None:
            self.stop_strings = _check_list(self.stop_strings, str, "stop_strings")
            if not all(self.stop_strings):
                raise ValueError("stop_strings must not contain the empty string")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> GenerationSettings:
        """Settings from keyword arguments; an unknown key is a TypeError with a did-you-mean."""
        known = [field.name for field in dataclasses.fields(cls)]
        for key in kwargs:
            if key not in known:
                raise TypeError(
                    f"unknown generation setting '{key}'{did_you_mean(key, known)}; "
                    f"known settings: {', '.join(known)}"
                )
        return cls(**kwargs)


def _check_list(values: Any, kind: type, name: str, allow_empty: bool = False) -> list:
    """`values` as a list of `kind` (non-empty unless `allow_empty`); a bare string or int is
    refused, not split."""
    if isinstance(values, (str, int)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list of {kind.__name__}, got {values!r}")
    values = list(values)
    if not values and not allow_empty:
        raise ValueError(f"{name} must not be empty; leave it None for the default")
    if not all(isinstance(v, kind) and not isinstance(v, bool) for v in values):
        raise TypeError(f"{name} must be a list of {kind.__name__}, got {values!r}")
    return values


@dataclass
class Rollout:
    """One batch of generated responses in the shared sequence layout (DESIGN §4.1)."""

    sequences: torch.Tensor
    """(B, P + A) long: [left-padded prompt | response, right-padded with the pad id]."""
    attention_mask: torch.Tensor
    """(B, P + A) long: prompt attention mask | action mask."""
    action_mask: torch.Tensor
    """(B, A) bool: response tokens up to and including the stop token, nothing after."""
    truncated: torch.Tensor
    """(B,) bool: the response used all A columns without a stop token or stop string."""
    num_prompt_tokens: int
    """P, the width of the left-padded prompt block."""
    log_probs: torch.Tensor | None = None
    """(B, A) float: log-probs of the sampled tokens under the sampling distribution, read
    from `generate`'s own logits (`generate_rollout(..., with_log_probs=True)`); else None."""

    @property
    def num_actions(self) -> int:
        """A, the width of the response block."""
        return self.action_mask.shape[1]


def resolve_stop_token_ids(settings: GenerationSettings, tokenizer: Any) -> list[int]:
    """The stop ids: `settings.stop_token_ids`, or the tokenizer's eos id."""
    if settings.stop_token_ids is not None:
        return list(settings.stop_token_ids)
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token; set GenerationSettings.stop_token_ids")
    return [tokenizer.eos_token_id]


def build_generation_config(settings: GenerationSettings, tokenizer: Any) -> GenerationConfig:
    """An explicit `GenerationConfig` for `settings`, every logits processor set to off.

    `generate` fills each `None` field from the model's own generation_config and then from
    library defaults (top_k=50), so "off" must be written out: top_k=0 disables top-k, while
    top_k=None would become 50. Greedy decoding gets the neutral temperature/top_p/top_k
    (1.0/1.0/50): they are ignored without sampling, and leaving them None lets a model's
    sampling defaults in, which makes transformers warn about flags it will ignore.
    """
    if tokenizer.pad_token_id is None:
        raise ValueError(
            "the tokenizer has no pad token; set one (e.g. tokenizer.pad_token = "
            "tokenizer.eos_token) before padding prompts"
        )
    sampling = (
        {"temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p}
        if settings.do_sample
        else {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
    )
    neutral_sampling = {"typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}
    return GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        do_sample=settings.do_sample,
        **sampling,
        **(neutral_sampling if settings.do_sample else {}),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=resolve_stop_token_ids(settings, tokenizer),
        stop_strings=settings.stop_strings,
        use_cache=True,
        num_beams=1,
        num_return_sequences=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        min_new_tokens=0,  # takes precedence over any min_length of the model
        return_dict_in_generate=False,
    )


@torch.no_grad()
def generate_rollout(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    tokenizer: Any,
    settings: GenerationSettings,
    *,
    with_log_probs: bool = False,
) -> Rollout:
    """Generate responses for left-padded prompts and lay them out as a `Rollout`.

    input_ids, attention_mask: (B, P), left-padded. The model generates in eval mode (no
    dropout) and gets its mode back afterwards. Sampling draws from the global torch RNG,
    which is never reseeded here. Returned tensors live on the model's device.

    `with_log_probs` also returns log pi(token j | prefix) at the sampling temperature, from
    the logits `generate` computed anyway, which saves PPO the actor's scoring forward. Cost:
    generate keeps every step's raw logits until it returns, B x A x V floats (fine for small
    vocabularies; 2.4 GB for B=32, A=512, V=150k in bf16). The values match a full forward
    up to kernel rounding (KV-cache vs full attention: ~1e-6 in fp32, more in bf16).
    """
    _check_left_padded(input_ids, attention_mask)
    device = _model_device(model)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    config = build_generation_config(settings, tokenizer)
    _warn_on_leaking_model_settings(model, settings)
    extra = {"tokenizer": tokenizer} if settings.stop_strings else {}

    # Per-module modes, so a submodule kept in eval (e.g. a frozen part) stays in eval.
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        if with_log_probs:
            extra |= {"output_logits": True, "return_dict_in_generate": True}
        output = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=config, **extra
        )
    finally:
        for module, training in modes:
            module.training = training

    num_prompt_tokens = input_ids.shape[1]
    responses = (output.sequences if with_log_probs else output)[:, num_prompt_tokens:]
    log_probs = _sampled_log_probs(output.logits, responses, settings) if with_log_probs else None
    action_mask, truncated = action_mask_from_responses(
        responses, resolve_stop_token_ids(settings, tokenizer), settings.stop_strings, tokenizer
    )
    # Whatever the model produced after the stop becomes pad, so the layout is exact.
    responses = responses.masked_fill(~action_mask, tokenizer.pad_token_id)
    return Rollout(
        sequences=torch.cat([input_ids, responses], dim=1),
        attention_mask=torch.cat([attention_mask.long(), action_mask.long()], dim=1),
        action_mask=action_mask,
        truncated=truncated,
        num_prompt_tokens=num_prompt_tokens,
        log_probs=log_probs,
    )


def _sampled_log_probs(step_logits: tuple[torch.Tensor, ...], responses: torch.Tensor, settings: GenerationSettings) -> torch.Tensor:
    """log softmax(raw logits / T) at each sampled token: A tensors (B, V) -> (B, A).

    The raw (unprocessed) logits, divided by the temperature and nothing else: the same
    distribution `policy_logits` defines, so the PPO ratio compares like with like.
    """
    temperature = settings.temperature if settings.do_sample else 1.0
    logits = torch.stack(step_logits, dim=1).float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.gather(logits.log_softmax(-1), -1, responses.unsqueeze(-1)).squeeze(-1)


def action_mask_from_responses(
    responses: torch.Tensor,
    stop_token_ids: Sequence[int],
    stop_strings: Sequence[str] | None = None,
    tokenizer: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each response ends: (action_mask (B, A) bool, truncated (B,) bool).

    responses: (B, A) token ids. A row ends at its first stop token id (inclusive). With
    stop strings, a row whose stop id does not come first ends at the first token k such that
    `tokenizer.decode(row[:k+1], skip_special_tokens=False)` contains a stop string
    (inclusive). A row with neither is truncated and its mask covers all A columns; with no stop
    ids and no stop strings every row simply runs to A columns, and none counts as truncated.
    """
    batch, width = responses.shape
    if not stop_token_ids and not stop_strings:
        return torch.ones_like(responses, dtype=torch.bool), torch.zeros(batch, dtype=torch.bool, device=responses.device)
    is_stop = torch.isin(responses, torch.as_tensor(list(stop_token_ids), dtype=responses.dtype, device=responses.device))
    # argmax returns the first maximal index, i.e. the first stop column.
    ends = torch.where(is_stop.any(dim=1), is_stop.int().argmax(dim=1), width)
    if stop_strings:
        if tokenizer is None:
            raise ValueError("stop_strings need a tokenizer to decode the responses")
        rows = responses.tolist()
        string_ends = [
            _first_stop_string_end(row[:end], stop_strings, tokenizer)
            for row, end in zip(rows, ends.tolist(), strict=True)
        ]
        found = [end if end is not None else width for end in string_ends]
        ends = torch.minimum(ends, torch.tensor(found, device=responses.device))
    columns = torch.arange(width, device=responses.device).expand(batch, width)
    action_mask = columns <= ends.unsqueeze(1)
    return action_mask, ends == width


def _first_stop_string_end(
    ids: list[int], stop_strings: Sequence[str], tokenizer: Any
) -> int | None:
    """The first k whose decoded prefix ids[:k+1] contains a stop string, or None.

    Binary search: log2(A) decodes per row instead of A. It relies on a longer prefix
    decoding to a text that extends the shorter one, which holds for ordinary tokenizers.
    """

    def contains_stop(k: int) -> bool:
        text = tokenizer.decode(ids[: k + 1], skip_special_tokens=False)
        return any(stop in text for stop in stop_strings)

    if not ids or not contains_stop(len(ids) - 1):
        return None
    low, high = 0, len(ids) - 1
    while low < high:
        middle = (low + high) // 2
        if contains_stop(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _check_left_padded(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """Raise unless both are (B, P) and every row's last mask entry is 1."""
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be (B, P), got {tuple(input_ids.shape)} "
            f"and {tuple(attention_mask.shape)}"
        )
    right_padded = (attention_mask[:, -1] == 0).nonzero().flatten().tolist()
    if right_padded:
        raise ValueError(
            f"prompts must be left-padded, but rows {right_padded} end with padding; "
            'set tokenizer.padding_side = "left" before tokenizing the prompts'
        )


def _model_device(model: Any) -> torch.device:
    """The device of the model's parameters (HF models also expose it as `.device`)."""
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else next(model.parameters()).device


def _warn_on_leaking_model_settings(model: Any, settings: GenerationSettings) -> None:
    """Warn when the model's generation_config sets a processor `generate` will apply anyway."""
    model_config = getattr(model, "generation_config", None)
    if model_config is None:
        return
    fields = _FIELDS_WITHOUT_OFF_VALUE
    fields += _SAMPLING_FIELDS_WITHOUT_OFF_VALUE if settings.do_sample else ()
    fields += ("stop_strings",) if settings.stop_strings is None else ()
    leaking = [name for name in fields if getattr(model_config, name, None) is not None]
    if leaking:
        warnings.warn(
            f"model.generation_config sets {leaking}; generate applies them to rollouts on top "
            "of GenerationSettings. Set them to None on model.generation_config to sample from "
            "the plain policy.",
            stacklevel=3,
        )
