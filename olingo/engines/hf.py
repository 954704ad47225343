"""`HFEngine`: the default rollout engine, transformers `generate` with a KV cache.

`generate_rollout` runs `generate` on left-padded prompts and returns `sequences = [left-padded
prompt | response, right-padded with pad]`. The response end is recomputed from the tokens
(`action_mask_from_responses`) instead of trusted from `generate`, so every per-token RL tensor
can use the same (B, A) action mask. The engine generates with the very module it is given: in
single-process training that is the trained actor itself, so there are no weights to sync.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from olingo.engines.base import repeat_prompts
from olingo.engines.prefixes import KeptPrefixes, can_keep, continue_from, keep_after
from olingo.engines.settings import (
    GenerationSettings,
    Rollout,
    resolve_stop_token_ids,
    rollout_from_responses,
)
from olingo.models.weights import load_named_tensors

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
        return_dict_in_generate=True,  # the output's cache is what `HFEngine.keep_prefixes` keeps
    )


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
    the logits `generate` computed anyway, which saves PPO the actor's scoring forward. They are
    taken step by step (`SampledLogProbs`), so the cost is one (B, V) float32 step held at a time,
    not every step's logits (B x A x V: 2.4 GB for B=32, A=512, V=150k in bf16). The values match
    a full forward up to kernel rounding (KV-cache vs full attention: ~1e-6 in fp32, more in bf16).
    """
    return generate_continuing(model, input_ids, attention_mask, tokenizer, settings, with_log_probs=with_log_probs)[0]


@torch.no_grad()
def generate_continuing(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    tokenizer: Any,
    settings: GenerationSettings,
    *,
    with_log_probs: bool = False,
    kept: KeptPrefixes | None = None,
    keep: bool = False,
) -> tuple[Rollout, KeptPrefixes | None]:
    """`generate_rollout`, continuing from the cache `kept` where every prompt row extends one
    of its rows (olingo/engines/prefixes.py), and returning this call's cache when `keep`
    (None where it cannot be reused). The rollout is laid out over the given prompts either way."""
    _check_left_padded(input_ids, attention_mask)
    device = _model_device(model)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    config = build_generation_config(settings, tokenizer)
    model_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if config.eos_token_id == [] and not settings.stop_strings and model_eos is None:
        # No stop at all: None says the same while the model names no eos of its own (generate
        # fills None from it), and spares generate an empty stop check at every step.
        config.eos_token_id = None
    _warn_on_leaking_model_settings(model, settings)
    extra = {"tokenizer": tokenizer} if settings.stop_strings else {}
    collector = SampledLogProbs(settings.log_prob_temperature) if with_log_probs else None
    if collector is not None:
        extra["logits_processor"] = LogitsProcessorList([collector])
    keep = keep and can_keep(model)
    continuation = continue_from(kept, input_ids, attention_mask, tokenizer.pad_token_id) if kept is not None and keep else None
    kept = None  # a cache that is not continued from is freed before generating
    if continuation is not None:
        extra["past_key_values"] = continuation.cache
    gen_ids, gen_mask = (continuation.input_ids, continuation.attention_mask) if continuation else (input_ids, attention_mask)

    # Per-module modes, so a submodule kept in eval (e.g. a frozen part) stays in eval.
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        # synced_gpus=False: transformers turns it on for FSDP-managed models, stepping every rank
        # until all are done, which deadlocks when ranks make different numbers of generate calls
        # (multi-turn episodes, dynamic sampling); olingo generates inside `gathered`, where
        # forwards need no communication.
        output = model.generate(
            input_ids=gen_ids, attention_mask=gen_mask, generation_config=config, synced_gpus=False, **extra
        )
    finally:
        for module, training in modes:
            module.training = training

    responses = output.sequences[:, gen_ids.shape[1]:]
    log_probs = collector.finish(output.sequences) if collector is not None else None
    rollout = rollout_from_responses(input_ids, attention_mask, responses, tokenizer, settings, log_probs)
    if not keep or output.past_key_values is None:
        return rollout, None
    return rollout, keep_after(output.past_key_values, output.sequences, gen_mask, rollout.action_mask)


class SampledLogProbs(LogitsProcessor):
    """log softmax(raw logits / T) at each token `generate` samples, one step at a time.

    A logits processor that changes nothing: at step t it reads the token sampled at step t-1
    (the last column of `input_ids`) out of step t-1's log-softmax, then keeps step t's, so it
    holds one (B, V) float32 tensor; `finish` reads the last sampled token. It runs before the
    temperature, top-k and top-p warpers (transformers puts a caller's processors after its own
    non-warping ones, which `build_generation_config` leaves off), so it sees the raw logits and
    applies only the temperature: the distribution `policy_logits` defines, so the PPO ratio
    compares like with like.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature, self.previous, self.values = temperature, None, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.values.append(self.previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        logits = scores.float() if self.temperature == 1.0 else scores.float() / self.temperature
        self.previous = logits.log_softmax(-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """(B, A): the log-prob of each of the A tokens sampled (the last A columns of `sequences`)."""
        if self.previous is not None:
            self.values.append(self.previous.gather(-1, sequences[:, -1:]).squeeze(-1))
        self.previous = None
        return torch.stack(self.values, dim=1) if self.values else sequences.new_zeros((sequences.shape[0], 0), dtype=torch.float32)


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


class HFEngine:
    """transformers `generate` behind the `RolloutEngine` interface.

    model: the policy to sample from (a causal LM; in single-process training the trained
    actor itself, unwrapped). `with_log_probs`: also return log-probs of the sampled tokens
    from generate's own logits (see `generate_rollout`); otherwise the caller scores them.
    """

    shares_weights = True  # it generates with the trained module itself: nothing to sync
    can_sleep = False  # the module is the trainer's; there is nothing of its own to free

    def __init__(self, model: Any, tokenizer: Any, *, with_log_probs: bool = False) -> None:
        self.model, self.tokenizer, self.with_log_probs = model, tokenizer, with_log_probs
        self._keeping, self._kept = False, None

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, settings: GenerationSettings, n: int = 1) -> Rollout:
        """B left-padded prompts -> B * n rollouts (prompt-major); sampling uses the global torch RNG.
        Inside `keep_prefixes()`, a call whose prompts extend the previous call's rows continues
        from its KV cache."""
        input_ids, attention_mask = repeat_prompts(input_ids, attention_mask, n)
        kept, self._kept = self._kept, None
        rollout, self._kept = generate_continuing(
            self.model, input_ids, attention_mask, self.tokenizer, settings, with_log_probs=self.with_log_probs, kept=kept, keep=self._keeping
        )
        return rollout

    @contextlib.contextmanager
    def keep_prefixes(self) -> Iterator[None]:
        """Within the block, each `generate` keeps its KV cache for the next call to continue from
        (a multi-turn source's turns; olingo/engines/prefixes.py); the cache is freed on exit.
        The weights must not change inside the block (`update_weights` frees the cache)."""
        self._keeping, self._kept = True, None
        try:
            yield
        finally:
            self._keeping, self._kept = False, None

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, full: bool = True) -> int:
        """Copy weights into the engine's model by name, strictly (see `load_named_tensors`)."""
        self._kept = None  # computed with the old weights
        return load_named_tensors(self.model, dict(named_tensors), "policy", full=full)

    def sleep(self) -> None:
        """Nothing to free (`can_sleep` is False)."""

    def wake(self) -> None:
        """Nothing to take back."""

    def close(self) -> None:
        self._kept = None
        self.model = None  # the model may be the trained actor: drop the reference, free nothing else
