"""The weight update of `VLLMEngine` (olingo/engines/vllm.py): checks of the names and shapes
sent against the checkpoint the engine was built from, the checked stream vLLM consumes, and the
probe tensor that proves a load really happened.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from olingo.config_errors import did_you_mean

__all__ = [
    "BufferOnlyLayersFilter",
    "CheckedWeights",
    "check_one_name",
    "check_update_names",
    "checkpoint_shapes",
    "probe_name",
    "vllm_model",
    "vllm_parameter",
]


def checkpoint_shapes(model_path: str | Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the directory's safetensors files (headers only)."""
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_path}: no *.safetensors weights (vLLM and the weight sync need them)")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # safe_open is not a mapping
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


def check_update_names(named_shapes: list[tuple[str, tuple[int, ...]]], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Raise ValueError unless the names are exactly the checkpoint's, once each, with its shapes."""
    names = [name for name, _ in named_shapes]
    unknown = sorted(set(names) - set(shapes))
    missing = sorted(set(shapes) - set(names))
    duplicated = sorted(name for name, count in Counter(names).items() if count > 1)
    wrong = [f"{name} {shape} (checkpoint {shapes[name]})" for name, shape in named_shapes if name in shapes and shape != shapes[name]]
    if unknown or missing or duplicated or wrong:
        raise ValueError(
            "VLLMEngine weight update does not match the checkpoint it was built from: "
            f"{len(unknown)} unknown names {unknown[:5]}, {len(missing)} missing {missing[:5]}, "
            f"duplicated {duplicated[:5]}, wrong shapes {wrong[:5]}; send the Hugging Face checkpoint names "
            "(olingo.engines.sync.engine_weights) of the same architecture"
        )


class CheckedWeights:
    """The update stream as vLLM consumes it: each tensor's name and shape are checked before
    vLLM sees it, and after the last one a missing name raises; an exception raised here ends
    vLLM's load. Keeps a copy of the probe tensor (one small unfused tensor) and the count."""

    def __init__(self, items: Iterator[tuple[str, torch.Tensor]], shapes: Mapping[str, tuple[int, ...]], probe: str | None) -> None:
        self._items, self._shapes, self._probe = items, shapes, probe
        self._seen: set[str] = set()
        self._aborted = False
        self.count = 0
        self.probe_value: torch.Tensor | None = None

    def abort(self) -> None:
        self._aborted = True

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._items:
            if self._aborted:
                raise TimeoutError("weight update aborted (sync_timeout_s)")
            check_one_name(name, tuple(tensor.shape), self._shapes, self._seen)
            self._seen.add(name)
            if name == self._probe:
                self.probe_value = tensor.detach().to("cpu", copy=True)
            self.count += 1
            yield name, tensor
        if len(self._seen) != len(self._shapes):
            missing = sorted(set(self._shapes) - self._seen)
            raise ValueError(f"VLLMEngine weight update: a full update is missing {len(missing)} names, e.g. {missing[:5]}")


def check_one_name(name: str, shape: tuple[int, ...], shapes: Mapping[str, tuple[int, ...]], seen: Collection[str]) -> None:
    """Raise ValueError for a streamed tensor that is unknown, sent twice or of the wrong shape."""
    if name not in shapes:
        raise ValueError(f"VLLMEngine weight update: unknown name {name!r}{did_you_mean(name, list(shapes))}; "
                         "send the Hugging Face checkpoint names (olingo.engines.sync.engine_weights)")
    if name in seen:
        raise ValueError(f"VLLMEngine weight update: {name!r} sent twice")
    if shape != shapes[name]:
        raise ValueError(f"VLLMEngine weight update: {name!r} has shape {shape}, the checkpoint {shapes[name]}")


def probe_name(model: torch.nn.Module, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """The smallest checkpoint tensor that vLLM keeps under the same name and shape (a norm
    weight on Llama-like models): neither fused, padded nor repacked, so it compares exactly."""
    params = {name: tuple(p.shape) for name, p in model.named_parameters()}
    candidates = [name for name, shape in shapes.items() if params.get(name) == shape]
    return min(candidates, key=lambda name: (int(np.prod(shapes[name])), name)) if candidates else None


LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class BufferOnlyLayersFilter(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" warning for layers that hold buffers but
    no parameters (rotary embeddings' cos/sin cache): no checkpoint has tensors for them, so
    every reload would warn. A real miss is caught by the name check and the probe."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.layers = {type(m).__name__ for m in model.modules()
                       if not list(m.parameters(recurse=False)) and list(m.buffers(recurse=False))}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        expected = record.msg == "%s: Failed to load weights" and bool(args) and args[0] in self.layers
        return not expected


def vllm_model(llm: Any) -> torch.nn.Module:
    """The model inside the in-process engine (UniProcExecutor -> worker -> model runner)."""
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()


def vllm_parameter(llm: Any, name: str) -> torch.Tensor:
    """The parameter `name` of the model inside the in-process engine."""
    return vllm_model(llm).get_parameter(name)
