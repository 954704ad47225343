"""`run_eval`: sample every model on the same prompts with the same seeds, score the samples as
training scores them, and summarise them with intervals and paired comparisons (docs/eval.md).

Sampling. The prompts are cut into batches of `eval.batch_size`; batch b (prompts i0..i1) is one
`source.sample(batch, settings, n)` call, the rollout source training uses (single-turn, or the
`environment:`'s multi-turn episodes), under `torch.manual_seed(batch_seed(run.seed, i0))`
inside `fork_rng` (vLLM draws its request seeds from that generator too). The seed depends on the
batch's first prompt only, never on what ran before, so:
    - every model draws sample j of prompt i from the same random stream (a paired comparison:
      common random numbers);
    - a killed eval, rerun, samples only its missing batches and gets the very same samples.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.engines import HFEngine
from olingo.eval.config import EvalConfig
from olingo.eval.results import per_prompt, summarize
from olingo.eval.sources import EvalModel, answer_extractor, resolve_models
from olingo.eval.store import SampleStore, prepare_eval_dir, write_result
from olingo.experience_maker.scoring import add_source_reward, score_rollout
from olingo.models import load_causal_lm, load_tokenizer, stop_token_ids
from olingo.recipes.common import build_rollout_engine, resolve_path
from olingo.recipes.online_config import warn_turn_cap
from olingo.recipes.rewards import load_reward
from olingo.rewards.functions import RewardFunction, reward_function
from olingo.rollout import PromptBatch, SingleTurnSource
from olingo.trainer.online_eval import mark_correct

logger = logging.getLogger("olingo.eval")
AfterBatch = Callable[[str, int], None]  # (model label, batch index), after the batch is on disk


@dataclass
class EvalResult:
    """What `run_eval` wrote: the eval directory and eval.json's content."""

    output_dir: Path
    result: dict[str, Any]


def batch_seed(seed: int, first_prompt: int) -> int:
    """The sampling seed of the batch starting at prompt `first_prompt`: a hash of both, so it
    depends on nothing that ran before (resume) and not on the model (pairing)."""
    digest = hashlib.sha256(f"olingo-eval:{seed}:{first_prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**63)


def run_eval(cfg: EvalConfig, output: str | Path | None = None, *, after_batch: AfterBatch | None = None) -> EvalResult:
    """Evaluate `cfg.models` (the first is the baseline) and write the eval directory (`output`,
    default run.output_dir/run.name); a directory of the same settings is continued."""
    out_dir = Path(output) if output is not None else Path(cfg.run.output_dir) / cfg.run.name
    models = resolve_models(cfg.models, cfg.model.gguf_file)
    warn_turn_cap(cfg.environment, cfg.generation)
    prepare_eval_dir(out_dir, cfg, cfg.run.overwrite)
    sampler = Sampler(cfg, SampleStore(out_dir), after_batch)
    try:
        values = {model.label: sampler.run(model) for model in models}
    finally:
        sampler.close()
    summary = summarize(values, resamples=cfg.eval.bootstrap_resamples, confidence=cfg.eval.confidence, seed=cfg.run.seed)
    result = {
        "config": cfg.model_dump(mode="json"),
        "models": [dataclasses.asdict(m) for m in models],
        "prompts": sampler.prompt_count,
        "samples_per_prompt": cfg.eval.samples_per_prompt,
        "k": cfg.eval.k,
        **summary,
    }
    write_result(out_dir, result)
    return EvalResult(out_dir, result)


class Sampler:
    """Samples (or reads back) every batch of one model at a time, appending to the store."""

    def __init__(self, cfg: EvalConfig, store: SampleStore, after_batch: AfterBatch | None) -> None:
        self.cfg, self.store, self.after_batch = cfg, store, after_batch
        self.accuracy: RewardFunction | None = reward_function(cfg.eval.accuracy_function) if cfg.eval.accuracy_function else None
        self.extract = answer_extractor(cfg.eval.answer, cfg.eval.accuracy_function)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.prompt_count: int | None = None
        self.done: dict[tuple[str, int], list[dict[str, Any]]] | None = None
        self.bar: Any = None

    def run(self, model: EvalModel) -> dict[str, Any]:
        """The per-prompt metric values of `model`, sampling the batches not yet on disk."""
        cfg = self.cfg
        tokenizer = load_tokenizer(model.path, padding_side="left")
        cfg.environment.check_tokenizer(tokenizer)
        prompts = self._prompts(tokenizer, model)
        size, n = cfg.eval.batch_size, cfg.eval.samples_per_prompt
        batches = [(b, start, min(start + size, len(prompts))) for b, start in enumerate(range(0, len(prompts), size))]
        self._start(len(batches), lambda b: (min((b + 1) * size, len(prompts)) - b * size) * n)
        todo = [batch for batch in batches if (model.label, batch[0]) not in self.done]
        if todo:
            with _Loaded(cfg, model, tokenizer, self.device) as loaded:
                for b, start, stop in todo:
                    rows = self._sample(loaded, prompts, b, start, stop, model.label)
                    self.store.append(rows)
                    self.done[(model.label, b)] = rows
                    self.bar.update(1)
                    if self.after_batch is not None:
                        self.after_batch(model.label, b)
        rows = [row for b, _, _ in batches for row in self.done[(model.label, b)]]
        return per_prompt(rows, len(prompts), n, cfg.eval.k, maj_subsets=cfg.eval.maj_subsets)

    def _prompts(self, tokenizer: Any, model: EvalModel) -> Any:
        """The prompt dataset tokenized for `model`, cut to data.limit; every model must see as many prompts."""
        data = self.cfg.data
        prompts = build_prompt_dataset(
            [resolve_path(s) for s in data.prompts], tokenizer, data.max_prompt_length, overlong=data.overlong, length_key="data.max_prompt_length",
        )
        if data.limit:
            prompts.items = prompts.items[: data.limit]
        if self.prompt_count is not None and len(prompts) != self.prompt_count:
            raise ValueError(f"model {model.label} reads {len(prompts)} prompts, the first model {self.prompt_count}")
        self.prompt_count = len(prompts)
        return prompts

    def _start(self, batches: int, expected: Callable[[int], int]) -> None:
        """On the first model: read back the whole batches on disk and open the progress bar."""
        if self.done is not None:
            return
        from tqdm.auto import tqdm

        self.done = self.store.completed(expected)
        total = batches * len(self.cfg.models)
        self.bar = tqdm(total=total, initial=len(self.done), desc="eval", unit="batch", disable=not self.cfg.logging.progress)

    def _sample(self, loaded: _Loaded, prompts: Any, b: int, start: int, stop: int, label: str) -> list[dict[str, Any]]:
        """Batch b's samples as rows of samples.jsonl."""
        n = self.cfg.eval.samples_per_prompt
        batch = PromptBatch.from_collated(PromptCollator(loaded.tokenizer.pad_token_id)([prompts[i] for i in range(start, stop)])).to(self.device)
        seed = batch_seed(self.cfg.run.seed, start)
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(seed)
            state = random.getstate()
            random.seed(seed)  # an environment that draws from `random` draws the same too
            try:
                sampled = loaded.source.sample(batch, loaded.settings, n)
            finally:
                random.setstate(state)
            envs = loaded.recorder.take() if loaded.recorder is not None else None
        repeated = sampled.prompts
        scored = score_rollout(loaded.reward, loaded.tokenizer, repeated.input_ids, sampled.rollout, repeated.gt_answers, repeated.row_fields)
        scored = add_source_reward(scored, sampled)
        correct = self._correct(scored, repeated)
        mask = sampled.rollout.action_mask.bool().cpu()
        rows = []
        for r, (prompt, response, gt) in enumerate(zip(scored.prompts, scored.responses, scored.gt_answers, strict=True)):
            row = {
                "model": label, "batch": b, "prompt_index": start + r // n, "sample_index": r % n, "prompt": prompt, "response": response,
                "gt_answer": gt, "reward": float(scored.raw_score[r]), "correct": correct[r], "answer": self.extract(response),
                "response_length": int(mask[r].sum()), "truncated": bool(sampled.rollout.truncated[r]),
            }
            if envs is not None:
                row["turns"] = _turns(mask[r])
                row["tool_calls"] = float((envs[r].metrics() if callable(getattr(envs[r], "metrics", None)) else {}).get("tool_calls", 0))
            rows.append(row)
        return rows

    def _correct(self, scored: Any, prompts: PromptBatch) -> list[bool | None]:
        """Per sample: the accuracy function > 0 (None without a gt_answer), or without one reward > 0.
        The accuracy is training's evaluation call (`mark_correct`), so both count the same."""
        if self.accuracy is None:
            return [value > 0 for value in scored.raw_score.tolist()]
        rows = [{"prompt": p, "response": r, "gt_answer": gt, "correct": None}
                for p, r, gt in zip(scored.prompts, scored.responses, scored.gt_answers, strict=True)]
        mark_correct(self.accuracy, rows, prompts.row_fields)  # row_fields are per sample here: one row each
        return [row["correct"] for row in rows]

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _turns(mask: torch.Tensor) -> int:
    """Assistant turns of an episode: the runs of sampled tokens in its action mask."""
    starts = mask[1:] & ~mask[:-1]
    return int(starts.sum()) + int(bool(mask[0])) if mask.numel() else 0


class _Loaded:
    """One model ready to sample: its engine, rollout source, reward and settings; the engine is
    closed on exit (vLLM holds memory and one engine per process)."""

    def __init__(self, cfg: EvalConfig, model: EvalModel, tokenizer: Any, device: torch.device) -> None:
        self.cfg, self.model, self.tokenizer, self.device = cfg, model, tokenizer, device

    def __enter__(self) -> _Loaded:
        cfg, path = self.cfg, self.model.path
        gen = cfg.generation
        self.settings = gen.settings(stop_token_ids(self.tokenizer, path))
        engine = build_rollout_engine(gen.engine, gen.vllm, path, self.tokenizer, self.device)
        if engine is None:
            policy = load_causal_lm(path, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code).to(self.device).eval()
            engine = HFEngine(policy, self.tokenizer)
        self.engine = engine
        self.reward = load_reward(cfg.reward, self.tokenizer, cfg.model.dtype, cfg.model.trust_remote_code, self.device)
        source = cfg.environment.source(engine, self.tokenizer, cfg.data.prompts)
        self.recorder = EpisodeRecorder(source) if source is not None else None
        self.source = source if source is not None else SingleTurnSource(engine, self.tokenizer.pad_token_id)
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.close()


class EpisodeRecorder:
    """Keeps the environment of every episode a `MultiTurnSource` starts, in episode order
    (prompt-major, as the source builds them), for per-episode counters such as tool calls."""

    def __init__(self, source: Any) -> None:
        self.envs: list[Any] = []
        default, chooser = source.environment_factory, source.environment_for
        source.environment_factory = self._recording(default)
        source.environment_for = lambda name: self._recording(chooser(name))

    def _recording(self, factory: Callable[[], Any]) -> Callable[[], Any]:
        def make() -> Any:
            env = factory()
            self.envs.append(env)
            return env

        return make

    def take(self) -> list[Any]:
        envs, self.envs = self.envs, []
        return envs
