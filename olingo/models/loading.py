"""Load tokenizers and models from a local Hugging Face directory or a hub id."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype '{name}'; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


def explain_load_failure(path: str, err: Exception) -> OSError:
    where = "local directory" if os.path.isdir(path) else "path or hub id"
    return OSError(f"could not load '{path}' ({where}): {err}")


def load_tokenizer(path: str, padding_side: str | None = None) -> PreTrainedTokenizerBase:
    """AutoTokenizer with a pad token guaranteed (eos is reused when the model has none)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise explain_load_failure(path, err) from err
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer at '{path}' has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    return tokenizer


def load_causal_lm(path: str, dtype: str = "float32", trust_remote_code: bool = False) -> PreTrainedModel:
    """Any `AutoModelForCausalLM` from a directory or hub id."""
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise explain_load_failure(path, err) from err


def load_backbone(path: str, dtype: str = "float32", trust_remote_code: bool = False) -> PreTrainedModel:
    """The transformer body without a head (`AutoModel`), e.g. for custom heads."""
    try:
        return AutoModel.from_pretrained(path, dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise explain_load_failure(path, err) from err


def load_safetensors_into(model: torch.nn.Module, directory: str | Path) -> None:
    """Load every `*.safetensors` file of `directory` into `model` in place, strictly.

    Keys missing from the files are accepted only when they are tied to a loaded parameter
    (e.g. an output embedding sharing the input embedding's storage); anything else missing or
    unexpected is an error, so a checkpoint can never silently load nothing.
    """
    files = sorted(glob.glob(os.path.join(str(directory), "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {directory}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise KeyError(f"{directory}: keys not in the model: {result.unexpected_keys[:5]}")
    params = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    loaded_ptrs = {params[k].data_ptr() for k in state if k in params}
    untied = [k for k in result.missing_keys if k not in params or params[k].data_ptr() not in loaded_ptrs]
    if untied:
        raise KeyError(f"{directory}: model keys missing from the checkpoint: {untied[:5]}")
