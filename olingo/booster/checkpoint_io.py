"""Distributed checkpoint I/O with `torch.distributed.checkpoint` (DCP), for any plugin.

A DCP directory holds one file of shards per writing rank plus a `.metadata` index; DCP reshards
on load, so shards written by N ranks load into M ranks (or into one process with no process
group at all). The state dicts come from `torch.distributed.checkpoint.state_dict`, which speaks
the same fully qualified names for plain, DDP and FSDP2 models: a checkpoint saved under one
plugin loads under another.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

METADATA = ".metadata"


def is_dcp_checkpoint(path: str | Path) -> bool:
    """True when `path` is a directory written by `dcp.save` (it holds the `.metadata` index)."""
    return (Path(path) / METADATA).is_file()


@contextlib.contextmanager
def _single_process_ok() -> Iterator[None]:
    """DCP warns that it assumes one process when no process group exists: that is the intent
    of resuming a multi-rank checkpoint in one process, so the warning is noise here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to.*single process")
        yield


def save_model_shards(model: nn.Module, directory: str | Path) -> None:
    """Every rank writes its shards of `model` (a collective: call it on all ranks)."""
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(directory))


def load_model_shards(model: nn.Module, directory: str | Path) -> None:
    """Load shards written by `save_model_shards` under any world size, strictly."""
    state = {"model": get_model_state_dict(model)}
    with _single_process_ok():
        dcp.load(state, checkpoint_id=str(directory))
    set_model_state_dict(model, state["model"])


def save_optimizer_shards(model: nn.Module, optimizer: torch.optim.Optimizer, directory: str | Path) -> None:
    """Every rank writes its shards of the optimizer state, keyed by parameter names."""
    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(directory))


def load_optimizer_shards(model: nn.Module, optimizer: torch.optim.Optimizer, directory: str | Path) -> None:
    """Load optimizer shards under any world size; parameters are matched by name."""
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    with _single_process_ok():
        dcp.load(state, checkpoint_id=str(directory))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def gather_full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole (unsharded) state dict on rank 0's CPU, empty on other ranks; a collective."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def scatter_full_state(model: nn.Module, full: dict[str, Any]) -> None:
    """Shard rank 0's whole state dict `full` into `model` on every rank (others pass {})."""
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def meta_skeleton(model: nn.Module) -> nn.Module:
    """A copy of `model` whose parameters live on the meta device (no memory) and whose buffers
    are real: the model's structure, kept to rebuild an unsharded model for export.

    The memo hands deepcopy a meta parameter for each real one, so the parameters are never
    copied and tied parameters stay tied."""
    memo = {
        id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
        for p in model.parameters()
    }
    return copy.deepcopy(model, memo)


def materialise(skeleton: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """A real, unsharded copy of `skeleton` whose parameters are `state`'s tensors (assigned,
    not copied); buffers come from the skeleton."""
    model = copy.deepcopy(skeleton)
    model.load_state_dict(state, strict=True, assign=True)
    if hasattr(model, "tie_weights"):  # assign=True gives tied names separate Parameter objects
        model.tie_weights()
    return model
