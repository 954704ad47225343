"""LoRA through peft: adapters injected in place, merged on export, saved apart for resume.

`apply_lora` injects peft LoRA layers into the model *in place* (`peft.inject_adapter_in_model`)
instead of wrapping it in a `PeftModel`: the model keeps its type, so `generate`, `RewardModel`'s
`values`, DDP and every loader work unchanged. Only the adapters (and a reward model's or
critic's value head, which is new and must learn) stay trainable.

Two directory formats, because an export and a resume need different things:

* the export (what `save_model` writes at the top of a model directory) is the merged, plain
  Hugging Face model: `W + (alpha / r) B A` folded into `W`, no adapter keys, so it loads with
  `from_pretrained`, vLLM and friends (`merged_copy`);
* the resume state (`lora/trainable.safetensors` inside the same directory) holds the trainable
  tensors exactly as trained. Merged weights cannot be split back into W, A and B, so a resumed
  run reloads the frozen base from the config's model path and only these tensors from the
  checkpoint (`restore_lora`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from olingo.errors import require
from olingo.models.reward_model import RewardModel

LORA_DIR = "lora"
STATE_FILE = "trainable.safetensors"
CONFIG_FILE = "lora_config.json"
# The fields of a peft LoraConfig that change what the adapter computes: a resume must match them.
CONFIG_FIELDS = ("r", "lora_alpha", "lora_dropout", "target_modules", "exclude_modules")


def apply_lora(model: nn.Module, *, r: int, alpha: float, dropout: float = 0.0, target_modules: str | list[str] = "all-linear") -> nn.Module:
    """Inject LoRA adapters into `model` in place and freeze everything but them (and heads).

    A causal LM: adapters on `target_modules` ("all-linear" = every linear layer except the output
    head, peft's rule). A `RewardModel`/`Critic`: the same on its backbone, and the value head
    `score` stays fully trainable. Returns `model`.
    """
    peft = require("peft", "LoRA (model.lora.r > 0)")
    is_reward = isinstance(model, RewardModel)
    target = model.model if is_reward else model
    config = peft.LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, bias="none",
        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules),
        # peft's "all-linear" spares a causal LM's output embedding but would adapt a classifier's head.
        exclude_modules=["score"] if is_reward else None,
    )
    peft.inject_adapter_in_model(config, target)
    if is_reward:
        model.model.score.requires_grad_(True)
    return model


def _tuner_layer() -> type | None:
    """peft's adapter-layer base class, or None when peft was never imported: then no model
    can hold adapters, and runs without LoRA never need peft installed."""
    if "peft" not in sys.modules:
        return None
    from peft.tuners.tuners_utils import BaseTunerLayer

    return BaseTunerLayer


def has_lora(model: nn.Module) -> bool:
    """Whether peft LoRA layers were injected anywhere in `model`."""
    layer = _tuner_layer()
    return layer is not None and any(isinstance(module, layer) for module in model.modules())


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a LoRA run trains (adapters and heads), by their names in `model`, detached."""
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


def lora_config_of(model: nn.Module) -> dict:
    """The adapter-defining fields of the peft config injected into `model` (JSON-able)."""
    for module in model.modules():
        configs = getattr(module, "peft_config", None)
        if isinstance(configs, dict) and "default" in configs:
            raw = configs["default"].to_dict()
            return {k: sorted(v) if isinstance(v, set) else v for k, v in raw.items() if k in CONFIG_FIELDS}
    raise ValueError("the model has no injected LoRA config")


def merged_copy(model: nn.Module) -> nn.Module:
    """A deep copy of `model` with every LoRA layer merged into its base layer and removed.

    The copy is plain (no peft modules, no adapter keys) and the original keeps training
    untouched: merging in place and unmerging would leave rounding errors in the frozen weights.
    This is peft's `merge_and_unload`, for a model injected without a `PeftModel` wrapper.
    """
    merged = copy.deepcopy(model)
    layer_type = _tuner_layer()
    names = [name for name, module in merged.named_modules() if layer_type is not None and isinstance(module, layer_type)]
    for name in names:
        layer = merged.get_submodule(name)
        layer.merge()
        parent_name, _, child = name.rpartition(".")
        setattr(merged.get_submodule(parent_name), child, layer.get_base_layer())
    for module in merged.modules():  # the injected config would make the export look like an adapter
        if isinstance(getattr(module, "peft_config", None), dict):
            del module.peft_config
    return merged.requires_grad_(False)


def export_lora(model: nn.Module, directory: str | Path) -> nn.Module:
    """Before saving `model` to `directory`: for a LoRA model, write its resume state to
    `directory/lora/` and return the merged copy to save as the plain export; otherwise return
    `model` unchanged."""
    if not has_lora(model):
        return model
    lora_dir = Path(directory) / LORA_DIR
    lora_dir.mkdir(parents=True, exist_ok=True)
    state = {name: t.to("cpu").contiguous() for name, t in trainable_state(model).items()}
    save_file(state, str(lora_dir / STATE_FILE))
    (lora_dir / CONFIG_FILE).write_text(json.dumps(lora_config_of(model), indent=2) + "\n")
    return merged_copy(model)


def restore_lora(model: nn.Module, directory: str | Path) -> bool:
    """Load a LoRA checkpoint's trainable tensors into `model`, strictly; False when `model` has
    no LoRA (the caller then loads the directory as a plain model).

    The frozen base weights are not in the resume state: `model` must have been built from the
    same base model and LoRA settings as the run that wrote `directory`.
    """
    if not has_lora(model):
        return False
    lora_dir = Path(directory) / LORA_DIR
    if not (lora_dir / STATE_FILE).exists():
        raise FileNotFoundError(f"{directory}: no LoRA state ({LORA_DIR}/{STATE_FILE}); it was not written by a LoRA run")
    saved_config = json.loads((lora_dir / CONFIG_FILE).read_text())
    if saved_config != lora_config_of(model):
        raise ValueError(f"{directory}: LoRA settings {saved_config} differ from this run's {lora_config_of(model)}")
    load_trainable(model, load_file(str(lora_dir / STATE_FILE)), str(directory))
    return True


def load_trainable(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Copy `state` into `model`'s trainable tensors; its keys must be exactly those tensors."""
    expected = set(trainable_state(model))
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise KeyError(f"{what}: LoRA state does not match the model ({len(missing)} missing, e.g. {missing[:3]}; "
                       f"{len(unexpected)} unexpected, e.g. {unexpected[:3]})")
    model.load_state_dict(state, strict=False)  # shape mismatches raise here


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run `model` as its frozen base: every LoRA layer skips its adapter inside the block.

    The reference policy of a LoRA run (DPO, KTO) is the base model with adapters disabled, so no
    second copy of the model is ever loaded. peft's `enable_adapters` also flips requires_grad,
    so each parameter's flag is restored exactly on the way out.
    """
    layer_type = _tuner_layer()
    layers = [m for m in model.modules() if layer_type is not None and isinstance(m, layer_type)]
    if not layers:
        raise ValueError("the model has no LoRA adapters to disable")
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for p, flag in flags:
            p.requires_grad_(flag)


class AdaptersDisabled(nn.Module):
    """The frozen base of a LoRA model, as a model of its own: the reference policy of a LoRA
    run (GRPO's KL term) with no second copy of the weights.

    Its forward is `model`'s with every adapter disabled (`adapters_disabled`), in eval mode and
    without gradient. `model` is deliberately not a submodule: `.to()` (parking inference models
    on the CPU), `.eval()`, `state_dict()` and checkpoints never reach the trained model, and the
    view holds no state of its own. `parameters()` yields the base's frozen weights (no adapter),
    so callers can read its device; the optimizer is given the trained model, never this.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not has_lora(model):
            raise ValueError("AdaptersDisabled: the model has no LoRA adapters to disable")
        if any(p.requires_grad for name, p in model.named_parameters() if "lora_" not in name):
            raise ValueError("the base weights of the LoRA model are trainable: with adapters disabled it would not be a frozen reference")
        self._model = (model,)  # a tuple hides it from nn.Module's registration

    @property
    def base(self) -> nn.Module:
        """The LoRA model this view runs."""
        return self._model[0]

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Iterator[tuple[str, nn.Parameter]]:
        for name, p in self.base.named_parameters(prefix, recurse, remove_duplicate):
            if "lora_" not in name:
                yield name, p

    def requires_grad_(self, requires_grad: bool = True) -> AdaptersDisabled:
        if requires_grad:
            raise ValueError("the base of a LoRA model is frozen: its reference view cannot be made trainable")
        return self

    def extra_repr(self) -> str:
        return f"base of {type(self.base).__name__} with LoRA adapters disabled"

    def forward(self, *args: object, **kwargs: object) -> object:
        model = self.base
        modes = [(module, module.training) for module in model.modules()]  # given back module by module
        model.eval()  # a reference has no dropout
        try:
            with torch.no_grad(), adapters_disabled(model):
                return model(*args, **kwargs)
        finally:
            for module, training in modes:
                module.training = training
