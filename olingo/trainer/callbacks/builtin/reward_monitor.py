"""`reward_monitor`: watch an RL run for reward over-optimisation and length hacking (docs/monitor.md).

At each evaluation of the policy (`on_eval` of the evaluator `eval_name`, "eval" by default) it
reads the proxy, the training reward on held-out prompts (`eval/reward`, already computed by the
evaluation), the KL to the reference (`eval/kl`) and the mean response length, and scores the
evaluation's own samples (prompt, response, gt_answer; never training rollouts) with the gold
scorers: reward-function specs (registered names such as `arithmetic_exact`, or
`package.module:function` paths, as in `reward.functions`) or `reward_model:<dir>` for a second,
held-out reward model. The gold never enters the training reward.

It writes one row per evaluation to `monitor.jsonl` in the run directory, shaped like an eval row of
`metrics.jsonl` (`eval_name` "monitor"; `olingo report` reads both):
`monitor/proxy`, `monitor/gold` (the mean of the gold scorers), `monitor/gold/<name>` per scorer,
`monitor/gap` (proxy - gold), `monitor/kl`, `monitor/sqrt_kl`, `monitor/length` and
`monitor/length_corr` (Pearson correlation of the proxy with response length over the
evaluation's samples), and keeps `monitor.json` (flags, best gold) in the run directory.
The rules are in `olingo.trainer.monitor_rule`. A flag logs a warning with its evidence, is written
to `monitor.json` (and so to the run's and the experiment's summaries), and with `stop_on_flag`
requests a stop. `best_gold` in the run directory is the policy of the best-gold evaluation:
a link to that step's checkpoint when one was taken there, else the policy saved there
(`best_gold/actor/`, with `save_best_gold`).
"""

# No `from __future__ import annotations`: build_callback validates params from the constructor's annotations.

import json
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import AfterValidator, Field

from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.builtin.jsonl import read_metrics
from olingo.trainer.callbacks.registry import checked_init, register_callback
from olingo.trainer.callbacks.state import LoopState, ManifestRow, kept_on_resume
from olingo.trainer.monitor_gold import GoldScorer, check_gold_specs, gold_scorer
from olingo.trainer.monitor_rule import Flag, best_index, length_hacking, moments, overoptimisation, pearson

logger = logging.getLogger("olingo.callbacks")
SUMMARY = "monitor.json"
ROWS = "monitor.jsonl"
SERIES = ("step", "proxy", "gold", "kl", "length")


@register_callback("reward_monitor")
class RewardMonitor(Callback):
    """Score held-out samples with proxy and gold, detect over-optimisation (module doc).

    gold: gold scorer specs (held out: never a term of the training reward). tolerance: how far
    gold may fall below its best before an evaluation counts as hacked. patience: hacked (or
    length-explained) evaluations in a row that raise a flag. proxy_margin: how far above its
    value at the best gold the proxy must stand. length_threshold: the share of the proxy's gain
    explained by length that counts as length hacking; length_min_gain: the proxy gain below
    which that share is not taken; min_evals: evaluations needed before it is. stop_on_flag:
    request a stop at the first flag. save_best_gold: save the policy at a best-gold evaluation
    that has no checkpoint of its own (single-process runs).
    """

    @checked_init  # the annotations are the checks: run with the config, before any model loads (gold paths included)
    def __init__(
        self,
        gold: Annotated[list[str] | None, AfterValidator(check_gold_specs)] = None,
        eval_name: str = "eval",
        tolerance: Annotated[float, Field(ge=0)] = 0.05,
        patience: Annotated[int, Field(ge=1)] = 2,
        proxy_margin: float = 0.0,
        length_threshold: Annotated[float, Field(gt=0, le=1)] = 0.8,
        length_min_gain: float = 0.0,
        min_evals: Annotated[int, Field(ge=3)] = 3,
        stop_on_flag: bool = False,
        save_best_gold: bool = True,
    ) -> None:
        self.gold_specs = list(gold or [])
        self.gold: list[GoldScorer] = [gold_scorer(spec) for spec in self.gold_specs]
        self.eval_name, self.tolerance, self.patience, self.proxy_margin = eval_name, tolerance, patience, proxy_margin
        self.length_threshold, self.length_min_gain, self.min_evals = length_threshold, length_min_gain, min_evals
        self.stop_on_flag, self.save_best_gold = stop_on_flag, save_best_gold
        self._reset()

    def _reset(self) -> None:
        self.history: dict[str, list[float]] = {key: [] for key in SERIES}
        self.flags: list[Flag] = []
        self.best_gold: dict[str, Any] | None = None  # step, gold, proxy, source ("checkpoint" / "saved" / "none"), path
        self._checkpoints: dict[int, str] = {}  # step -> checkpoint directory relative to the run directory

    # ---- hooks ----------------------------------------------------------------------------
    def on_train_start(self, state: LoopState) -> None:
        if state.step == 0:  # a fresh run starts a fresh watch; a resumed one keeps its restored state
            self._reset()
        if state.is_master and state.output_dir is not None:
            drop_rows_after(Path(state.output_dir) / ROWS, state.step)

    def on_checkpoint(self, state: LoopState, row: ManifestRow) -> None:
        self._checkpoints[int(row.step)] = row.path
        best = self.best_gold
        if best is not None and best["step"] == row.step and best["source"] != "checkpoint" and state.is_master:
            self._link_best(state, row.path)  # the final checkpoint of a best-gold last evaluation replaces the saved copy

    def on_eval(self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]) -> None:
        if eval_name != self.eval_name or "eval/reward" not in metrics:
            return
        samples = state.extra.get("eval_samples")  # set by the evaluation that fired this hook
        row = self._measure(state, metrics, samples)
        for key, value in (("step", step_idx), ("proxy", row["monitor/proxy"]), ("gold", row.get("monitor/gold", math.nan)),
                           ("kl", row.get("monitor/kl", math.nan)), ("length", row.get("monitor/length", math.nan))):
            self.history[key].append(float(value))
        if self.gold and math.isfinite(self.history["gold"][-1]) and best_index(self.history["gold"]) == len(self.history["gold"]) - 1:
            self._keep_best(state, int(step_idx), row)
        new_flags = self._detect()
        row.update({f"monitor/{flag.kind}": 1.0 for flag in new_flags})
        if state.is_master and state.output_dir is not None:
            append_row(Path(state.output_dir) / ROWS, int(step_idx), row)
            self._write_summary(Path(state.output_dir))
        for flag in new_flags:
            logger.warning("reward_monitor: %s (evidence: %s)", flag.message, json.dumps(flag.evidence))
        if new_flags and self.stop_on_flag and not state.stop_requested:
            kept = (self.best_gold or {}).get("path")
            logger.warning("reward_monitor: stop_on_flag: requesting a stop; best-gold policy: %s", f"best_gold/ ({kept})" if kept else "not kept")
            state.request_stop()

    # ---- checkpointed state ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Curves, flags, the best gold and the checkpoints seen: what a resumed run continues from."""
        return {"history": self.history, "flags": [f.to_json() for f in self.flags], "best_gold": self.best_gold,
                "checkpoints": {str(k): v for k, v in self._checkpoints.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self.history = {key: list(state_dict.get("history", {}).get(key, [])) for key in SERIES}
        self.flags = [Flag(**f) for f in state_dict.get("flags", [])]
        self.best_gold = state_dict.get("best_gold")
        self._checkpoints = {int(k): v for k, v in state_dict.get("checkpoints", {}).items()}

    # ---- measuring ------------------------------------------------------------------------
    def _measure(self, state: LoopState, metrics: dict[str, float], samples: list[dict[str, Any]] | None) -> dict[str, float]:
        """The monitor row of one evaluation: proxy, kl, length from its metrics; gold and the
        length correlation from its samples (summed over ranks: each rank holds its shard)."""
        row = {"monitor/proxy": float(metrics["eval/reward"])}
        if "eval/kl" in metrics:
            row["monitor/kl"] = float(metrics["eval/kl"])
            row["monitor/sqrt_kl"] = math.sqrt(max(row["monitor/kl"], 0.0))  # the k1 estimate can dip below 0 by noise
        if "eval/response_length" in metrics:
            row["monitor/length"] = float(metrics["eval/response_length"])
        if samples is None:
            if self.gold:
                logger.warning("reward_monitor: evaluation %r gave no samples (state.extra['eval_samples']); gold not scored", self.eval_name)
            return row
        gold_sums = [float(scorer.score(samples, state.tokenizer).sum()) for scorer in self.gold]
        lengths = [float(response_length(s["response"], state.tokenizer)) for s in samples]
        sums = all_reduce_sum([*gold_sums, *moments(lengths, [float(s["reward"]) for s in samples])])
        n, gold_sums, corr_sums = sums[len(self.gold)], sums[: len(self.gold)], sums[len(self.gold):]
        if n > 0 and self.gold:
            for scorer, total in zip(self.gold, gold_sums, strict=True):
                row[f"monitor/gold/{scorer.name}"] = total / n
            row["monitor/gold"] = sum(gold_sums) / n / len(self.gold)
            row["monitor/gap"] = row["monitor/proxy"] - row["monitor/gold"]
        corr = pearson(corr_sums)
        if corr is not None:
            row["monitor/length_corr"] = corr
        return row

    def _detect(self) -> list[Flag]:
        """Flags raised by this evaluation (each kind is raised once per run)."""
        h, raised, new = self.history, {f.kind for f in self.flags}, []
        steps = [int(s) for s in h["step"]]
        if self.gold and "overoptimisation" not in raised:
            flag = overoptimisation(steps, h["proxy"], h["gold"], tolerance=self.tolerance, patience=self.patience, proxy_margin=self.proxy_margin)
            new += [flag] if flag is not None else []
        if "length_hacking" not in raised and all(math.isfinite(x) for x in h["length"]):
            flag = length_hacking(steps, h["proxy"], h["length"], threshold=self.length_threshold, patience=self.patience,
                                  min_gain=self.length_min_gain, min_evals=self.min_evals)
            new += [flag] if flag is not None else []
        self.flags += new
        return new

    # ---- best-gold policy and the summary -----------------------------------------------------
    def _keep_best(self, state: LoopState, step: int, row: dict[str, float]) -> None:
        self.best_gold = {"step": step, "gold": row["monitor/gold"], "proxy": row["monitor/proxy"], "source": "none", "path": None}
        if not state.is_master or state.output_dir is None:
            return
        if step in self._checkpoints:  # a checkpoint at step N is taken before the evaluations of step N
            self._link_best(state, self._checkpoints[step])
        elif self.save_best_gold:
            self._save_best(state)

    def _link_best(self, state: LoopState, checkpoint: str) -> None:
        """`best_gold` -> the checkpoint directory (a relative link; a copy where links fail)."""
        target = Path(state.output_dir) / "best_gold"
        _remove(target)
        try:
            os.symlink(checkpoint, target, target_is_directory=True)
        except OSError:
            shutil.copytree(Path(state.output_dir) / checkpoint, target)
        self.best_gold.update(source="checkpoint", path=checkpoint)

    def _save_best(self, state: LoopState) -> None:
        """The live policy into `best_gold/actor/` (Hugging Face directory), written aside and then
        renamed. Only in one process: a sharded policy is not whole on any rank."""
        policy = state.policy
        if policy is None or not hasattr(policy, "save_pretrained") or world_size() > 1:
            return
        run_dir = Path(state.output_dir)
        tmp, target = run_dir / ".tmp-best_gold", run_dir / "best_gold"
        _remove(tmp)
        policy.save_pretrained(str(tmp / "actor"))
        if state.tokenizer is not None:
            state.tokenizer.save_pretrained(str(tmp / "actor"))
        _remove(target)
        tmp.rename(target)
        self.best_gold.update(source="saved", path="best_gold")

    def _write_summary(self, run_dir: Path) -> None:
        summary = {
            "flagged": bool(self.flags), "flags": [f.to_json() for f in self.flags], "best_gold": self.best_gold,
            "evaluations": len(self.history["step"]), "gold": self.gold_specs,
            "rule": {"tolerance": self.tolerance, "patience": self.patience, "proxy_margin": self.proxy_margin,
                     "length_threshold": self.length_threshold, "length_min_gain": self.length_min_gain, "min_evals": self.min_evals},
        }
        tmp = run_dir / (SUMMARY + ".tmp")
        tmp.write_text(json.dumps(summary, indent=2, default=float) + "\n")
        tmp.replace(run_dir / SUMMARY)


# ---- helpers ----------------------------------------------------------------------------------
def response_length(text: str, tokenizer: Any) -> int:
    """Tokens of a decoded response (whitespace words without a tokenizer)."""
    if tokenizer is None:
        return len(text.split())
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def world_size() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_available() and torch.distributed.is_initialized() else 1


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sums over ranks (every rank evaluated its own shard of the prompts); as is in one process."""
    if world_size() == 1:
        return values
    device = torch.device("cuda", torch.cuda.current_device()) if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(tensor)
    return tensor.cpu().tolist()


def append_row(path: Path, step: int, row: dict[str, float]) -> None:
    """One row of `monitor.jsonl`, shaped like an eval row of `metrics.jsonl` (`eval_name` "monitor")."""
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"step": step, "split": "eval", "time": time.time(), "eval_name": "monitor", **row}) + "\n")


def drop_rows_after(path: Path, step: int) -> None:
    """Keep the rows of evaluations before `step`: a resumed run evaluates at `step` again, a
    fresh one (step 0) starts the file afresh."""
    if path.is_file():
        rows = [row for row in read_metrics(path, strict=False) if kept_on_resume(int(row.get("step", 0)), "eval", step)]
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
