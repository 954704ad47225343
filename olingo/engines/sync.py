"""Weight sync from the trained policy to a rollout engine that holds its own copy.

An engine with `shares_weights = False` (vLLM) generates from a copy of the policy made when it
started; after each optimizer step the trainer calls `sync_engine(engine, model)`, which streams
the policy's weights under their plain Hugging Face checkpoint names (`engine_weights`) into
`engine.update_weights(..., full=True)` one tensor at a time. An engine that shares the policy's
module (`HFEngine`) needs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from olingo.models.lora import _tuner_layer

# PeftModel wraps the model as `base_model` (LoraModel) -> `model`; olingo's `apply_lora` injects
# in place and adds no prefix.
_PEFT_PREFIX = "base_model.model."
_BASE_LAYER = ".base_layer"


@dataclass
class WeightSync:
    """What one sync moved: wall time, bytes and tensors streamed into the engine."""

    seconds: float
    nbytes: int
    tensors: int

    def metrics(self) -> dict[str, float]:
        """`time/weight_sync` (s) and `perf/weight_sync_GBps` (1e9 bytes/s; 0 when nothing moved)."""
        rate = self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0
        return {"time/weight_sync": self.seconds, "perf/weight_sync_GBps": rate}


def sync_engine(engine: Any, model: nn.Module) -> WeightSync:
    """Stream `model`'s weights into `engine` (a full update) and time it.

    Nothing is gathered whole: each tensor is produced, counted and handed on before the next
    (under FSDP2 every rank must call this, since gathering a parameter is a collective). An
    engine with `shares_weights` True already generates from `model`: nothing moves.
    """
    if getattr(engine, "shares_weights", False):
        return WeightSync(seconds=0.0, nbytes=0, tensors=0)
    nbytes = 0

    def counted() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal nbytes
        for name, tensor in engine_weights(model):
            nbytes += tensor.numel() * tensor.element_size()
            yield name, tensor

    started = time.perf_counter()
    tensors = engine.update_weights(counted(), full=True)
    return WeightSync(seconds=time.perf_counter() - started, nbytes=nbytes, tensors=tensors)


@torch.no_grad()
def engine_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights under plain Hugging Face checkpoint names, one detached tensor at a time.

    model: the unwrapped causal LM (no DDP wrapper), possibly with peft LoRA (a `PeftModel` or
    olingo's in-place `apply_lora`), possibly FSDP2-sharded. Yields, in state-dict order:
    * every parameter and persistent buffer once (tied weights once, under their first name,
      the one `save_pretrained` keeps);
    * a DTensor gathered with `full_tensor()`, one parameter at a time;
    * for a LoRA layer, W + sum of the active adapters' `get_delta_weight`, computed out of
      place (the trained weights are never touched), under the base name: `base_model.model.`
      and `.base_layer` stripped, no `lora_` tensors.
    Raises ValueError for what cannot be merged out of place exactly (adapters merged in place,
    LoRA variants such as DoRA, LoRA biases). The names are those of the module's state dict,
    which are the checkpoint's for the usual decoder models (Llama, Qwen2, Mistral...); where
    transformers renames or fuses tensors on load, the engine's name check refuses the update.
    """
    lora_layers = _lora_layers(model)
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        owner = _lora_owner(name, lora_layers)
        if owner is not None and not name.startswith(f"{owner}{_BASE_LAYER}."):
            continue  # the adapter's own tensors (lora_A/B...): merged into the base weight below
        if id(tensor) in seen:
            continue  # a tied weight, already sent under its first name
        seen.add(id(tensor))
        if owner is not None:
            leaf = name[len(owner) + len(_BASE_LAYER) + 1:]
            tensor = _merged(lora_layers[owner], tensor) if leaf == "weight" else _full(tensor)
            name = f"{owner}.{leaf}"
        else:
            tensor = _full(tensor)
        yield name.removeprefix(_PEFT_PREFIX), tensor.detach()


def _lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Module name -> peft LoRA layer, for every adapted layer in `model`."""
    layer_type = _tuner_layer()
    if layer_type is None:
        return {}
    return {name: module for name, module in model.named_modules() if isinstance(module, layer_type)}


def _lora_owner(name: str, lora_layers: dict[str, nn.Module]) -> str | None:
    """The LoRA layer a state-dict key belongs to, or None (a plain weight)."""
    module = name.rpartition(".")[0]
    while module:
        if module in lora_layers:
            return module
        module = module.rpartition(".")[0]
    return None


def _merged(layer: nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """The weight the peft layer's forward uses: base W plus each active adapter's delta, out of
    place and in W's dtype (as peft's own merge does), gathered if sharded."""
    if layer.merged:
        raise ValueError("engine_weights: LoRA adapters are merged into the base weights in place; unmerge them first")
    merged = _full(weight)
    if layer.disable_adapters:
        return merged
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A and adapter not in getattr(layer, "lora_embedding_A", {}):
            continue
        if adapter in getattr(layer, "lora_variant", {}) or getattr(layer, "lora_bias", {}).get(adapter, False):
            raise ValueError(f"engine_weights: adapter {adapter!r} is a LoRA variant (e.g. DoRA) or has a bias; "
                             "only plain LoRA can be merged out of place")
        merged = (merged + _full(layer.get_delta_weight(adapter))).to(weight.dtype)
    return merged


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2 shard) gathered whole; any other tensor as it is."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor
