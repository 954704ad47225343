"""ColossalChat's trainer keywords -> olingo's typed sections: the one conversion the
`PPOTrainer` and `GRPOTrainer` adapters make (docs/coming-from-colossalchat.md).

Inside olingo every component receives its own section (`OnlineLoopConfig`, the loss and
experience sections, `GenerationSettings`); the flat keyword signatures exist only at these
two public constructors, and each keyword is turned into its field here, once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel

from olingo.engines import GenerationSettings
from olingo.trainer.online_config import OnlineLoopConfig


def merge_keywords(cls: type[BaseModel], config: BaseModel | None, config_name: str, keywords: dict[str, tuple[Any, Any]]) -> Any:
    """A typed section from flat keywords and, optionally, a section object passed beside them.

    `keywords`: field -> (keyword value, keyword default). Without `config` the keywords fill
    the fields. With one, a keyword left at its default defers to it; a keyword set to another
    value fills a field the section left unset, and disagreeing with a field the section set
    (`model_fields_set`) is an error: two different values for one setting never resolve
    silently. The result is validated (ranges) either way."""
    if config is None:
        return cls.model_validate({field: value for field, (value, _) in keywords.items()})
    update = {}
    for field, (value, default) in keywords.items():
        if value == default or value == getattr(config, field):
            continue
        if field in config.model_fields_set:
            raise ValueError(f"{field}={value!r} (keyword) disagrees with {config_name}.{field}={getattr(config, field)!r}: set it in one place")
        update[field] = value
    return cls.model_validate({**config.model_dump(), **update})


def loop_section(
    train_batch_size: int, buffer_limit: int, buffer_cpu_offload: bool, sample_buffer: bool, dataloader_pin_memory: bool,
    offload_inference_models: bool, accumulation_steps: int, save_interval: int, eval_interval: int, eval_before_training: bool,
) -> OnlineLoopConfig:
    """The loop keywords as the `loop:` section (its episode counts are `fit`'s arguments)."""
    return OnlineLoopConfig(
        train_batch_size=train_batch_size, buffer_limit=buffer_limit, buffer_cpu_offload=buffer_cpu_offload, sample_buffer=sample_buffer,
        pin_memory=dataloader_pin_memory, offload_inference_models=offload_inference_models, accumulation_steps=accumulation_steps,
        save_interval=save_interval, eval_interval=eval_interval, eval_before_training=eval_before_training,
    )


def generation_settings(generate_kwargs: dict[str, Any], eval_generate_kwargs: dict[str, Any] | None) -> tuple[GenerationSettings, GenerationSettings]:
    """`**generate_kwargs` as the rollout's `GenerationSettings` (an unknown key is a TypeError
    naming it) and held-out evaluation's: the same with `eval_generate_kwargs` applied."""
    rollout = GenerationSettings.from_kwargs(**generate_kwargs)
    if not eval_generate_kwargs:
        return rollout, rollout
    GenerationSettings.from_kwargs(**eval_generate_kwargs)  # names an unknown key
    return rollout, dataclasses.replace(rollout, **eval_generate_kwargs)
