"""`VLLMEngine`: rollouts from vLLM running inside the trainer's process.

The engine builds a vLLM `LLM` from a Hugging Face model directory in this process (no engine
subprocess: `VLLM_ENABLE_V1_MULTIPROCESSING=0`) and answers the `RolloutEngine` interface with
the same layout, finish reasons and truncation rule as `HFEngine` (`rollout_from_responses`).
Its weights are its own copy (`shares_weights = False`): after each optimizer step the trainer
streams the policy's weights in (`olingo.engines.sync.sync_engine` -> `update_weights`).

What it costs: a second copy of the weights plus a fixed KV cache (`kv_cache_memory_gb`); a
start of 6-9 s for the first engine of a process (mostly importing vLLM; ~1.3 s for a later one,
tiny model, 2 CPU cores); one full weight sync per update (~20 ms for the 0.5 MB tiny model).
What it buys: continuous batching and paged attention, several times `generate`'s throughput on
larger batches (see bench/).

Limits:
* vLLM is imported only inside this module's functions, so `import olingo.engines` never
  imports it. This module is the only one in olingo that imports vllm.
* While the engine lives it occupies the process's default torch.distributed group (gloo, world
  size 1): it refuses to start inside an initialised torch.distributed run, and DDP/FSDP cannot
  initialise in the same process until it is closed.
* vLLM changes the host process on start (it reseeds python/numpy/torch, replaces
  `torch.set_num_threads` and drops to 1 thread, sets environment variables, warnings filters).
  The constructor undoes all of it, so the trainer runs as before (and vLLM then generates with
  the trainer's thread count); vLLM's own "vllm" logger is left to vLLM (its INFO lines are
  quieted to WARNING unless VLLM_LOGGING_LEVEL is set).
* Weight updates are full updates only (see `update_weights`).
* LoRA is merged into the weights by the sender (`engine_weights`); vLLM's own LoRA support is
  not used (a mixed LoRA/base batch applies an adapter to base rows in vLLM 0.32).
* Sleep mode (`sleep_while_training`) exists on CUDA only.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import random
import threading
import time
import warnings
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from olingo.config import StrictModel
from olingo.config_errors import did_you_mean
from olingo.engines.base import repeat_prompts
from olingo.engines.hf import _check_left_padded
from olingo.engines.settings import (
    GenerationSettings,
    Rollout,
    resolve_stop_token_ids,
    rollout_from_responses,
)

# vLLM raises temperatures in (0, 0.01) to 0.01 and treats < 1e-5 as greedy (sampling_params.py).
_MIN_TEMPERATURE = 1e-2
_SEED_BOUND = 2**31 - 1


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


class VLLMEngine:
    """vLLM behind the `RolloutEngine` interface, in this process (see the module doc).

    model_path: a Hugging Face directory with safetensors weights and the tokenizer (vLLM
    loads both; the tokenizer detokenizes for stop strings). tokenizer: the same tokenizer,
    loaded by the caller (pad/eos ids, the stop-string rule). device: "cpu" or "cuda"/"cuda:0"
    (vLLM in-process always uses the first visible GPU). Use as a context manager or `close()`.
    """

    shares_weights = False  # its weights are its own copy: the trainer syncs after each update

    def __init__(self, model_path: str | Path, tokenizer: Any, settings: VLLMSettings | None = None, *, device: str | torch.device = "cpu") -> None:
        self.settings = settings if settings is not None else VLLMSettings()
        self.device = torch.device(device)
        self.model_path, self.tokenizer = Path(model_path), tokenizer
        _check_device(self.device, self.settings)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            raise ValueError(
                "VLLMEngine runs vLLM in this process, which needs its own torch.distributed world; "
                "it cannot start inside an initialised torch.distributed run (DDP/FSDP). Use HFEngine there."
            )
        self._shapes = checkpoint_shapes(self.model_path)
        self._failed: str | None = None  # why generate refuses: a failed update left mixed weights
        self._closed, self._sleeping, self._stuck = False, False, False
        started = time.perf_counter()
        self._llm = _start_llm(self.model_path, self.device, self.settings)
        self.start_seconds = time.perf_counter() - started
        self._max_model_len = int(self._llm.llm_engine.model_config.max_model_len)
        self._probe = _probe_name(_vllm_model(self._llm), self._shapes)
        self._quiet_reload = _BufferOnlyLayersFilter(_vllm_model(self._llm))

    # ---- RolloutEngine ------------------------------------------------------------------------
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, settings: GenerationSettings, n: int = 1) -> Rollout:
        """B left-padded prompts -> B * n rollouts (prompt-major), laid out as `HFEngine`'s.

        Each of the B * n requests gets its own vLLM seed, drawn from the global torch RNG
        (B * n draws per call, nothing else), so the trainer's seed and resume govern sampling;
        vLLM's own draws are kept off the global generator.

        `log_probs` (B * n, A): vLLM's "processed_logprobs" of each sampled token, i.e. the
        log-softmax of the logits the token was sampled from. Sampling: logits / T, then
        top-k/top-p masking (masked logits set to -inf), so with top-k and top-p off they are
        log_softmax(logits / T) at the token, the trainer's `policy_logits` at the same T; with
        top-k or top-p on they are the log-probs of the truncated distribution renormalised over
        the kept tokens (above the full-vocabulary value by -log of the kept probability mass), unlike
        `HFEngine(with_log_probs=True)`, which returns full-vocabulary log-probs. Greedy: the
        log-softmax of the raw logits (temperature 1). Columns after a row's end are 0.
        """
        self._check_usable("generate")
        if self.tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set one (e.g. tokenizer.pad_token = tokenizer.eos_token)")
        _check_left_padded(input_ids, attention_mask)
        input_ids, attention_mask = repeat_prompts(input_ids, attention_mask, n)
        prompts = prompt_token_lists(input_ids, attention_mask)
        self._check_lengths(prompts, settings)
        sampling = sampling_kwargs(settings, self.tokenizer)
        # Greedy decoding draws nothing, as with HFEngine.
        seeds = torch.randint(0, _SEED_BOUND, (len(prompts),)).tolist() if settings.do_sample else [None] * len(prompts)
        from vllm import SamplingParams

        params = [SamplingParams(**sampling, seed=seed) for seed in seeds]
        with _vllm_rng(self.device):
            outputs = self._llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        responses, log_probs, lengths = responses_from_outputs(outputs, self.tokenizer.pad_token_id)
        device = input_ids.device
        rollout = rollout_from_responses(input_ids, attention_mask, responses.to(device), self.tokenizer, settings, log_probs.to(device))
        check_response_ends(rollout, lengths, settings)
        return rollout

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, full: bool = True) -> int:
        """Load the policy's weights, under the checkpoint's Hugging Face names; returns how many.

        Full updates only: vLLM fuses q/k/v and gate/up into one tensor each and processes a layer
        once all of its tensors arrived, so a partial update touching part of a fused group
        silently corrupts it (vllm_findings); `full=False` raises ValueError.

        Names and shapes are checked against the checkpoint the engine was built from. A mapping
        or list is checked whole before anything loads, so a bad update leaves the engine as it
        was. A one-shot iterator is streamed (one tensor at a time reaches vLLM) and checked as
        it passes; an error found mid-stream aborts the load, restores real tensors in vLLM (no
        meta tensors left) and raises, and `generate` then refuses until a full update succeeds,
        since the weights are a mix of old and new. A load taking over `sync_timeout_s` raises
        TimeoutError. Afterwards one unfused tensor inside vLLM is compared with what was sent
        (it is poisoned with NaN first, so a load that silently skipped it is caught).
        """
        self._check_usable("update_weights", allow_failed=True)
        if not full:
            raise ValueError(
                "VLLMEngine.update_weights supports full updates only (full=True): vLLM fuses q/k/v and "
                "gate/up projections, and a partial update of a fused group silently corrupts it"
            )
        if isinstance(named_tensors, Mapping):
            named_tensors = list(named_tensors.items())
        if isinstance(named_tensors, Collection):
            check_update_names([(name, tuple(t.shape)) for name, t in named_tensors], self._shapes)
        stream = CheckedWeights(iter(named_tensors), self._shapes, self._probe)
        self._poison_probe()
        try:
            self._reload(stream)
        except BaseException as error:
            self._failed = f"the last weight update failed ({type(error).__name__}: {error})"
            raise
        # Cached KV blocks were computed with the old weights; reusing them would be silent.
        if self._llm.reset_prefix_cache() is False:
            self._failed = "vLLM could not reset its prefix cache after the update"
            raise RuntimeError(f"VLLMEngine.update_weights: {self._failed}")
        self._check_probe(stream.probe_value)
        self._failed = None
        return stream.count

    def close(self) -> None:
        """Shut vLLM down fully: engine core, its process groups and memory; idempotent.

        Afterwards torch.distributed is uninitialised again and another engine can start.
        """
        if self._closed:
            return
        self._closed = True
        llm, self._llm = self._llm, None
        _shutdown_llm(llm)

    # ---- sleep mode ---------------------------------------------------------------------------
    @property
    def can_sleep(self) -> bool:
        """Whether `sleep` frees memory: CUDA with `sleep_while_training`; never on CPU."""
        return self.settings.sleep_while_training and self.device.type == "cuda"

    def sleep(self) -> None:
        """Free the engine's GPU memory while the trainer trains (weights offloaded to CPU, KV
        cache dropped; vLLM sleep level 1). A no-op where `can_sleep` is False (CPU)."""
        self._check_usable("sleep", allow_failed=True)
        if self.can_sleep and not self._sleeping:
            self._llm.sleep(level=1)
            self._sleeping = True

    def wake(self) -> None:
        """Undo `sleep` before the next sync or generation; a no-op when not asleep."""
        self._check_usable("wake", allow_failed=True, allow_asleep=True)
        if self._sleeping:
            self._llm.wake_up()
            self._llm.reset_prefix_cache()
            self._sleeping = False

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ----------------------------------------------------------------------------
    def _check_usable(self, what: str, *, allow_failed: bool = False, allow_asleep: bool = False) -> None:
        if self._closed:
            raise RuntimeError(f"VLLMEngine.{what}: the engine is closed")
        if self._stuck:
            raise RuntimeError(f"VLLMEngine.{what}: a weight update timed out inside vLLM; close the engine and start a new one")
        if self._sleeping and not allow_asleep:
            raise RuntimeError(f"VLLMEngine.{what}: the engine is asleep; call wake() first")
        if self._failed and not allow_failed:
            raise RuntimeError(f"VLLMEngine.{what}: {self._failed}; its weights are a mix of old and new, "
                               "so it refuses to generate until a full update_weights succeeds")

    def _check_lengths(self, prompts: list[list[int]], settings: GenerationSettings) -> None:
        """vLLM ends a request silently at max_model_len; HF would keep going, so refuse instead."""
        longest = max(len(p) for p in prompts)
        if longest + settings.max_new_tokens > self._max_model_len:
            raise ValueError(
                f"max_new_tokens={settings.max_new_tokens} with a {longest}-token prompt exceeds the vLLM engine's "
                f"max_model_len={self._max_model_len}; lower max_new_tokens or raise generation.vllm.max_model_len"
            )

    def _reload(self, stream: CheckedWeights) -> None:
        """`reload_weights` in a worker thread, bounded by `sync_timeout_s`; on failure vLLM's
        layers get real tensors back (`finalize_layerwise_reload`) before the error propagates."""
        errors: list[BaseException] = []

        def load() -> None:
            try:
                with torch.no_grad():
                    self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream, "is_checkpoint_format": True})
            except BaseException as error:  # re-raised in the caller's thread
                errors.append(error)
                self._finalize_reload()

        thread = threading.Thread(target=load, name="olingo-vllm-reload", daemon=True)
        layerwise = logging.getLogger(_LAYERWISE_LOGGER)
        layerwise.addFilter(self._quiet_reload)
        try:
            thread.start()
            thread.join(self.settings.sync_timeout_s)
        finally:
            layerwise.removeFilter(self._quiet_reload)
        if thread.is_alive():
            stream.abort()  # the next tensor pulled raises, which ends vLLM's load
            thread.join(10.0)
            self._stuck = thread.is_alive()  # still inside vLLM's load: nothing can be trusted
            raise TimeoutError(
                f"VLLMEngine weight update did not finish within sync_timeout_s={self.settings.sync_timeout_s}s"
                + ("; vLLM is stuck in it, close the engine" if self._stuck else "")
            )
        if errors:
            raise errors[0]

    def _finalize_reload(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(_vllm_model(self._llm), self._llm.llm_engine.model_config)

    @torch.no_grad()
    def _poison_probe(self) -> None:
        if self._probe is not None:
            _vllm_parameter(self._llm, self._probe).fill_(float("nan"))

    def _check_probe(self, sent: torch.Tensor | None) -> None:
        if self._probe is None:
            return
        loaded = _vllm_parameter(self._llm, self._probe).detach().cpu()
        if sent is None or not torch.equal(loaded, sent.to(dtype=loaded.dtype, device="cpu")):
            self._failed = f"vLLM did not load {self._probe!r} from the update"
            raise RuntimeError(f"VLLMEngine.update_weights: {self._failed}; the update was not applied")


# ---- settings -> vLLM ---------------------------------------------------------------------------
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


def prompt_token_lists(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """(B, P) left-padded prompts -> B lists of the attended token ids (padding stripped)."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(input_ids.cpu(), attention_mask.cpu(), strict=True)]


def responses_from_outputs(outputs: list[Any], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """vLLM `RequestOutput`s -> (responses (B, A) long right-padded with pad, log_probs (B, A)
    float32 with 0 after each row's end, lengths: B response lengths); A = the longest."""
    rows = [output.outputs[0] for output in outputs]
    lengths = [len(row.token_ids) for row in rows]
    width = max(lengths)
    responses = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    log_probs = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        ids = list(row.token_ids)
        responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        if row.logprobs is not None:
            log_probs[i, : len(ids)] = torch.tensor([step[token].logprob for step, token in zip(row.logprobs, ids, strict=True)])
    return responses, log_probs, lengths


def check_response_ends(rollout: Rollout, lengths: list[int], settings: GenerationSettings) -> None:
    """Raise if a row's action mask covers more tokens than vLLM produced for it.

    That happens only when vLLM stopped a row on a stop string that the tokenizer's plain
    `decode` does not show (incremental detokenization differing from `decode`): the row would
    be laid out as truncated with padding inside its action mask.
    """
    ends = rollout.action_mask.sum(dim=1).tolist()
    bad = [row for row, (end, length) in enumerate(zip(ends, lengths, strict=True)) if end > length]
    if bad:
        raise RuntimeError(
            f"vLLM stopped rows {bad[:8]} on a stop string {settings.stop_strings} that tokenizer.decode does not "
            "show in their tokens; vLLM's detokenizer and the tokenizer disagree, use HFEngine for these stop strings"
        )


# ---- weights ------------------------------------------------------------------------------------
def checkpoint_shapes(model_path: str | Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the directory's safetensors files (headers only)."""
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_path}: no *.safetensors weights (vLLM and the weight sync need them)")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
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


def _probe_name(model: torch.nn.Module, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """The smallest checkpoint tensor that vLLM keeps under the same name and shape (a norm
    weight on Llama-like models): neither fused, padded nor repacked, so it compares exactly."""
    params = {name: tuple(p.shape) for name, p in model.named_parameters()}
    candidates = [name for name, shape in shapes.items() if params.get(name) == shape]
    return min(candidates, key=lambda name: (int(np.prod(shapes[name])), name)) if candidates else None


_LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _BufferOnlyLayersFilter(logging.Filter):
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


def _vllm_model(llm: Any) -> torch.nn.Module:
    """The model inside the in-process engine (UniProcExecutor -> worker -> model runner)."""
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()


def _vllm_parameter(llm: Any, name: str) -> torch.Tensor:
    return _vllm_model(llm).get_parameter(name)


# ---- process: start, containment, shutdown -------------------------------------------------------
def _check_device(device: torch.device, settings: VLLMSettings) -> None:
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


def _model_dtype(model_path: Path, dtype: str) -> str:
    """The dtype to ask vLLM for: "auto" resolves to the config's own dtype, because vLLM's
    "auto" turns float32 checkpoints into float16."""
    if dtype != "auto":
        return dtype
    config = json.loads((model_path / "config.json").read_text())
    own = config.get("dtype") or config.get("torch_dtype") or "float32"
    return str(own).removeprefix("torch.")


def _llm_kwargs(model_path: Path, device: torch.device, settings: VLLMSettings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": str(model_path),
        # Not skip_tokenizer_init: without a tokenizer vLLM silently ignores stop strings.
        "tokenizer": str(model_path),
        "dtype": _model_dtype(model_path, settings.dtype),
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


def _start_llm(model_path: Path, device: torch.device, settings: VLLMSettings) -> Any:
    """Construct vLLM's `LLM` in this process with its side effects on the process undone."""
    with _process_state_kept():
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM
        from vllm.platforms import current_platform

        if current_platform.device_type != device.type:
            raise ValueError(f"device={device}, but the installed vLLM runs on {current_platform.device_type!r}")
        try:
            return LLM(**_llm_kwargs(model_path, device, settings))
        except BaseException:
            _destroy_vllm_distributed()  # a failed start may have set up its process group
            raise


@contextmanager
def _process_state_kept() -> Iterator[None]:
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
def _vllm_rng(device: torch.device) -> Iterator[None]:
    """Keep vLLM's sampling draws off the global generator: its CPU sampler draws a seed per row
    and step from it even for seeded requests, which would couple the trainer's stream to
    response lengths."""
    devices = [torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield


def _shutdown_llm(llm: Any) -> None:
    """The shutdown sequence from vllm_findings: engine core, then the model and its memory,
    then vLLM's process groups, so torch.distributed is uninitialised again."""
    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()
        _destroy_vllm_distributed()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _destroy_vllm_distributed() -> None:
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
