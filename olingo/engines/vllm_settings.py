"""How olingo's settings become vLLM's arguments, for `VLLMEngine` (olingo/engines/vllm.py).

`VLLMSettings` is the `generation.vllm:` section (how the engine is built); `llm_kwargs` turns
it into vLLM `LLM` keyword arguments, `check_device` refuses what vLLM cannot do on a device,
and `sampling_kwargs` turns `GenerationSettings` into `SamplingParams` keyword arguments that
sample exactly as `HFEngine` does. Nothing here imports vllm.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from olingo.config import StrictModel
from olingo.engines.settings import GenerationSettings, resolve_stop_token_ids

__all__ = ["VLLMSettings", "check_device", "llm_kwargs", "model_dtype", "sampling_kwargs"]

# vLLM raises temperatures in (0, 0.01) to 0.01 and treats < 1e-5 as greedy (sampling_params.py).
_MIN_TEMPERATURE = 1e-2


class VLLMSettings(StrictModel):
    """The `generation.vllm:` section: how the in-process vLLM engine is built."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights/activations dtype; auto = the model's own (config.json dtype), not vLLM's fp32->fp16 rule")
    max_model_len: int | None = Field(
        None, gt=0, description="longest prompt + response in tokens; None = the model config's max_position_embeddings")
    kv_cache_memory_gb: float | None = Field(
        0.25, gt=0, description="KV-cache size in GiB (required on CPU); None on CUDA = use gpu_memory_utilization")
    gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1, description="CUDA: fraction of GPU memory vLLM may take when kv_cache_memory_gb is None")
    enforce_eager: bool = Field(True, description="no CUDA graphs / torch.compile: slower decoding, faster start")
    sleep_while_training: bool = Field(
        False, description="CUDA only: free the engine's GPU memory between rollouts (vLLM sleep mode); an error on CPU")
    sync_timeout_s: float = Field(300.0, gt=0, description="a weight sync taking longer than this raises TimeoutError")
    seed: int = Field(
        0, ge=0, description="vLLM's engine seed; each request carries its own seed drawn from the global torch RNG")


def check_device(device: torch.device, settings: VLLMSettings) -> None:
    """Raise ValueError for a device or setting in-process vLLM cannot serve (sleep mode or an
    unsized KV cache on CPU, a GPU other than the first visible one)."""
    if device.type == "cpu":
        if settings.sleep_while_training:
            raise ValueError("generation.vllm.sleep_while_training needs CUDA: vLLM has no sleep mode on CPU")
        if settings.kv_cache_memory_gb is None:
            raise ValueError("generation.vllm.kv_cache_memory_gb must be set on CPU (vLLM's CPU backend needs an explicit KV-cache size)")
    elif device.type == "cuda":
        if device.index not in (None, 0):
            raise ValueError(f"device={device}: in-process vLLM uses the first visible GPU; set CUDA_VISIBLE_DEVICES instead")
    else:
        raise ValueError(f"device={device}: VLLMEngine runs on 'cpu' or 'cuda'")


def model_dtype(model_path: Path, dtype: str) -> str:
    """The dtype to ask vLLM for: "auto" resolves to the config's own dtype, because vLLM's
    "auto" turns float32 checkpoints into float16."""
    if dtype != "auto":
        return dtype
    config = json.loads((model_path / "config.json").read_text())
    own = config.get("dtype") or config.get("torch_dtype") or "float32"
    return str(own).removeprefix("torch.")


def llm_kwargs(model_path: Path, device: torch.device, settings: VLLMSettings) -> dict[str, Any]:
    """vLLM `LLM` keyword arguments for the engine `settings` describe."""
    kwargs: dict[str, Any] = {
        "model": str(model_path),
        # Not skip_tokenizer_init: without a tokenizer vLLM silently ignores stop strings.
        "tokenizer": str(model_path),
        "dtype": model_dtype(model_path, settings.dtype),
        "seed": settings.seed,
        "max_model_len": settings.max_model_len,
        "enforce_eager": settings.enforce_eager,
        # Log-probs of the distribution each token was sampled from (see VLLMEngine.generate).
        "logprobs_mode": "processed_logprobs",
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "disable_log_stats": True,
    }
    if settings.kv_cache_memory_gb is not None:
        kwargs["kv_cache_memory_bytes"] = int(settings.kv_cache_memory_gb * 2**30)
    if settings.sleep_while_training and device.type == "cuda":
        kwargs["enable_sleep_mode"] = True
    return kwargs

def sampling_kwargs(settings: GenerationSettings, tokenizer: Any) -> dict[str, Any]:
    """`SamplingParams` keyword arguments (all but the seed) that reproduce `settings` exactly.

    Every processor that `HFEngine` turns off is off here too. eos is not special: `ignore_eos`
    with the resolved stop ids listed explicitly, so `stop_token_ids=[]` really means no stop
    token; a stop token stays in the output, and so does a stop string (`skip_special_tokens`
    off, so a string spelled with special tokens is seen as `decode(..., skip_special_tokens=False)`
    sees it). Raises ValueError for what vLLM would change: temperatures below 0.01.
    """
    if settings.do_sample and settings.temperature < _MIN_TEMPERATURE:
        raise ValueError(
            f"temperature={settings.temperature}: vLLM raises temperatures below {_MIN_TEMPERATURE} to "
            f"{_MIN_TEMPERATURE}; use do_sample=False for greedy decoding or a temperature >= {_MIN_TEMPERATURE}"
        )
    sampling = (
        {"temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p}
        if settings.do_sample
        else {"temperature": 0.0, "top_k": 0, "top_p": 1.0}
    )
    return {
        **sampling,
        "n": 1,
        "max_tokens": settings.max_new_tokens,
        "min_tokens": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "ignore_eos": True,
        "stop_token_ids": resolve_stop_token_ids(settings, tokenizer),
        "stop": list(settings.stop_strings or []),
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "logprobs": 0,  # the sampled token's log-prob only
        "detokenize": bool(settings.stop_strings),  # text is needed only to find stop strings
    }

