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
* vLLM is imported only inside functions of this module and of vllm_process.py, so
  `import olingo.engines` never imports it. These are the only modules in olingo that import vllm.
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

Its helpers: olingo/engines/vllm_settings.py (settings -> vLLM arguments),
olingo/engines/vllm_weights.py (the checked weight stream) and olingo/engines/vllm_process.py
(start, containment, shutdown).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from olingo.engines.base import repeat_prompts
from olingo.engines.hf import _check_left_padded
from olingo.engines.settings import GenerationSettings, Rollout, rollout_from_responses
from olingo.engines.vllm_process import shutdown_llm, start_llm, vllm_rng
from olingo.engines.vllm_settings import VLLMSettings, check_device, sampling_kwargs
from olingo.engines.vllm_weights import (
    LAYERWISE_LOGGER,
    BufferOnlyLayersFilter,
    CheckedWeights,
    check_update_names,
    checkpoint_shapes,
    probe_name,
    vllm_model,
    vllm_parameter,
)

# VLLMSettings lives in vllm_settings.py; it stays importable from here (olingo.engines and the recipes import it).
__all__ = ["VLLMEngine", "VLLMSettings", "check_response_ends", "prompt_token_lists", "responses_from_outputs", "score_requests"]

_SEED_BOUND = 2**31 - 1


def score_requests(
    sequences: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None,
) -> tuple[list[list[int]], list[tuple[int, torch.Tensor]]]:
    """The prompts `VLLMEngine.score` sends: each row's attended tokens, split where its position
    ids restart at 0; beside each, (row, the columns its tokens came from)."""
    rows, spans = [], []
    for b in range(sequences.shape[0]):
        columns = attention_mask[b].nonzero().squeeze(1).cpu()
        starts = [0]
        if position_ids is not None:
            starts = (position_ids[b].cpu()[columns] == 0).nonzero().squeeze(1).tolist() or [0]
            starts = starts if starts[0] == 0 else [0, *starts]
        for start, end in zip(starts, [*starts[1:], len(columns)], strict=True):
            rows.append(sequences[b, columns[start:end]].tolist())
            spans.append((b, columns[start:end]))
    return rows, spans


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
        check_device(self.device, self.settings)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            raise ValueError(
                "VLLMEngine runs vLLM in this process, which needs its own torch.distributed world; "
                "it cannot start inside an initialised torch.distributed run (DDP/FSDP). Use HFEngine there."
            )
        self._shapes = checkpoint_shapes(self.model_path)
        self._failed: str | None = None  # why generate refuses: a failed update left mixed weights
        self._closed, self._sleeping, self._stuck = False, False, False
        started = time.perf_counter()
        self._llm = start_llm(self.model_path, self.device, self.settings)
        self.start_seconds = time.perf_counter() - started
        self._max_model_len = int(self._llm.llm_engine.model_config.max_model_len)
        self._probe = probe_name(vllm_model(self._llm), self._shapes)
        self._quiet_reload = BufferOnlyLayersFilter(vllm_model(self._llm))

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
        with vllm_rng(self.device):
            outputs = self._llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        responses, log_probs, lengths = responses_from_outputs(outputs, self.tokenizer.pad_token_id)
        device = input_ids.device
        rollout = rollout_from_responses(input_ids, attention_mask, responses.to(device), self.tokenizer, settings, log_probs.to(device))
        check_response_ends(rollout, lengths, settings)
        return rollout

    def score(self, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The `ScoringEngine` method: log p of each of the last `num_actions` columns' tokens
        given the row's tokens before it, at temperature 1: (B, num_actions) float32.

        sequences, attention_mask: (B, L) rollout rows in the shared layout (left-padded prompt,
        right-padded response; environment tokens inside a multi-turn response are attended).
        position_ids: (B, L) or None; where they restart at 0 a new segment begins (a template
        split), scored as a prompt of its own. Each row's (segment's) attended tokens go to vLLM
        as one prompt with `prompt_logprobs=0` and one greedy token to generate; vLLM returns the
        log-softmax of the raw logits at every prompt token but the first, which is why the
        temperature is 1 (vLLM applies no temperature to prompt log-probs). 0 at padding and at
        a segment's first token (never a sampled token).
        """
        self._check_usable("score")
        from vllm import SamplingParams

        rows, spans = score_requests(sequences, attention_mask, position_ids)
        too_long = max((len(r) for r in rows), default=0)
        if too_long + 1 > self._max_model_len:
            raise ValueError(f"a row of {too_long} tokens does not fit the scoring engine's max_model_len ({self._max_model_len}); "
                             "raise generation.vllm.max_model_len")
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        with vllm_rng(self.device):
            outputs = self._llm.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False)
        full = torch.zeros(sequences.shape, dtype=torch.float32)
        for (b, columns), tokens, output in zip(spans, rows, outputs, strict=True):
            values = [entry[token].logprob for entry, token in zip(output.prompt_logprobs[1:], tokens[1:], strict=True)]
            full[b, columns[1:]] = torch.tensor(values, dtype=torch.float32)
        return full[:, -num_actions:].to(sequences.device)

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
        shutdown_llm(llm)

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
        layerwise = logging.getLogger(LAYERWISE_LOGGER)
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

        finalize_layerwise_reload(vllm_model(self._llm), self._llm.llm_engine.model_config)

    @torch.no_grad()
    def _poison_probe(self) -> None:
        if self._probe is not None:
            vllm_parameter(self._llm, self._probe).fill_(float("nan"))

    def _check_probe(self, sent: torch.Tensor | None) -> None:
        if self._probe is None:
            return
        loaded = vllm_parameter(self._llm, self._probe).detach().cpu()
        if sent is None or not torch.equal(loaded, sent.to(dtype=loaded.dtype, device="cpu")):
            self._failed = f"vLLM did not load {self._probe!r} from the update"
            raise RuntimeError(f"VLLMEngine.update_weights: {self._failed}; the update was not applied")



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

