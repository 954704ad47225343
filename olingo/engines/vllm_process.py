"""vLLM in the trainer's process: start it with its side effects on the process undone, keep its
sampling draws off the global RNG, and shut it down fully (`VLLMEngine`, olingo/engines/vllm.py).

vllm is imported only inside these functions, so importing this module does not import it.
"""

from __future__ import annotations

import gc
import os
import random
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from olingo.engines.vllm_settings import VLLMSettings, llm_kwargs

__all__ = ["destroy_vllm_distributed", "process_state_kept", "shutdown_llm", "start_llm", "vllm_rng"]


def start_llm(model_path: Path, device: torch.device, settings: VLLMSettings) -> Any:
    """Construct vLLM's `LLM` in this process with its side effects on the process undone."""
    with process_state_kept():
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM
        from vllm.platforms import current_platform

        if current_platform.device_type != device.type:
            raise ValueError(f"device={device}, but the installed vLLM runs on {current_platform.device_type!r}")
        try:
            return LLM(**llm_kwargs(model_path, device, settings))
        except BaseException:
            destroy_vllm_distributed()  # a failed start may have set up its process group
            raise


@contextmanager
def process_state_kept() -> Iterator[None]:
    """Restore what vLLM's import and start change in the host process: the python, numpy and
    torch RNG states (`LLM(seed=...)` reseeds them), `torch.set_num_threads` (replaced by a
    function that refuses) and the thread count (dropped to 1), os.environ (LD_PRELOAD, VLLM_*,
    TORCHINDUCTOR_*...; vLLM caches what it read at start) and the warnings filters."""
    environ = dict(os.environ)
    python_rng, numpy_rng, torch_rng = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    filters = list(warnings.filters)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        random.setstate(python_rng)
        np.random.set_state(numpy_rng)
        torch.set_rng_state(torch_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        warnings.filters[:] = filters


@contextmanager
def vllm_rng(device: torch.device) -> Iterator[None]:
    """Keep vLLM's sampling draws off the global generator: its CPU sampler draws a seed per row
    and step from it even for seeded requests, which would couple the trainer's stream to
    response lengths."""
    devices = [torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield


def shutdown_llm(llm: Any) -> None:
    """The shutdown sequence from vllm_findings: engine core, then the model and its memory,
    then vLLM's process groups, so torch.distributed is uninitialised again."""
    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()
        destroy_vllm_distributed()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def destroy_vllm_distributed() -> None:
    """Tear down vLLM's model-parallel groups and the world group it created, and forget the
    environment it cached, so a later engine reads the environment afresh."""
    from vllm import envs
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
    )

    destroy_model_parallel()
    destroy_distributed_environment()
    envs.disable_envs_cache()
