"""Rollout engines: generation backends behind one interface (`RolloutEngine`).

    settings   `GenerationSettings` (how to sample) and `Rollout` (the shared sequence layout)
    base       the `RolloutEngine` protocol every backend implements; `ScoringEngine`, an engine
               that scores given tokens (a distillation teacher on vLLM)
    hf         `HFEngine`: transformers `generate`, the default
    vllm       `VLLMEngine` and its `VLLMSettings`: vLLM in this process (imports vllm only when
               an engine is built)
    sync       `sync_engine`/`engine_weights`: stream the policy into an engine holding a copy
"""

from olingo.engines.base import RolloutEngine, ScoringEngine, repeat_prompts
from olingo.engines.hf import HFEngine, generate_rollout
from olingo.engines.settings import (
    GenerationSettings,
    Rollout,
    action_mask_from_responses,
    concat_rollouts,
    rollout_from_responses,
)
from olingo.engines.sync import WeightSync, engine_weights, sync_engine
from olingo.engines.vllm import VLLMEngine, VLLMSettings

__all__ = [
    "GenerationSettings",
    "HFEngine",
    "Rollout",
    "RolloutEngine",
    "ScoringEngine",
    "VLLMEngine",
    "VLLMSettings",
    "WeightSync",
    "action_mask_from_responses",
    "concat_rollouts",
    "engine_weights",
    "generate_rollout",
    "repeat_prompts",
    "rollout_from_responses",
    "sync_engine",
]
