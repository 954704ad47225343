"""Where olingo's PPO update spends the time the minimal loop does not.

    python bench/ppo_profile.py [--config base|response_length=32|batch_size=32] [--repeats 3]
                                [--updates 8] [--threads N] [--only spans|ratio] [--baseline DIR]

Both parts run olingo's `PPOTrainer` and the minimal loop exactly as `ppo_run.py` runs them (the
spec of `suite.py` for that configuration), each in a fresh process, every repeat running every
implementation once in a rotating order; tables give medians over updates, then over repeats.
Times are wall (perf_counter) and the process's CPU time (process_time: every thread, torch's
intra-op threads and TensorBoard's writer included).
1. Spans (`--only spans`): the functions an update is made of, each wrapped from outside with a
   timer (and the garbage collector's pauses): inclusive and exclusive ms per update. The
   exclusive times are then summed into phases that mean the same in both implementations
   (generation, the four no-gradient forwards, the learn forwards, losses, backwards, optimizer,
   batching, metrics, callbacks, the rest). The wrappers cost a few microseconds a call, which
   lands in the caller's exclusive time.
2. Ratio (`--only ratio`): the same runs with nothing wrapped, only the update boundaries timed:
   olingo / minimal per repeat (wall and CPU), its median and range.
`--baseline DIR` adds a third implementation, olingo imported from `DIR/olingo` (e.g. a copy of
the tree before a change), so a change is measured side by side with what it replaces.
Nothing in olingo is changed: every timer is installed from outside.

The machine is shared: a busy neighbour slows torch's two intra-op threads many times over, so
`--threads 1` (one intra-op thread in each child) gives steadier numbers, and CPU time is less
sensitive than wall time to being descheduled; compare rows of one run.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if os.environ.get("PPO_PROFILE_OLINGO"):  # a child profiling another olingo tree (--baseline)
    sys.path.insert(0, os.environ["PPO_PROFILE_OLINGO"])

import torch  # noqa: E402

from bench import ppo_run, suite  # noqa: E402
from bench.common import OLINGO_PYTHON  # noqa: E402

WALL, CPU = time.perf_counter, time.process_time


class Spans:
    """Inclusive and exclusive wall and CPU seconds of wrapped functions, per update."""

    def __init__(self) -> None:
        self.stack: list[list] = []  # [label, wall start, cpu start, child wall, child cpu]
        self.update: dict[str, list[float]] = defaultdict(lambda: [0.0] * 4)  # inc wall, exc wall, inc cpu, exc cpu
        self.updates: list[dict[str, list[float]]] = []
        self.start: tuple[float, float] | None = None
        self.top = [0.0, 0.0]  # wall, cpu in spans not inside another span, this update
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict) -> None:
        """Collector pauses as spans of their own (they land in whatever code allocated last)."""
        if phase == "start":
            self.stack.append([f"gc (generation {info['generation']})", WALL(), CPU(), 0.0, 0.0])
        elif self.stack and self.stack[-1][0].startswith("gc "):
            self._close(self.stack.pop())

    def wrap(self, owner, attr: str, label) -> None:
        """Time `owner.attr` under `label` (a string, or a function of the call's arguments)."""
        original = getattr(owner, attr)
        spans = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            name = label(*args, **kwargs) if callable(label) else label
            spans.stack.append([name, WALL(), CPU(), 0.0, 0.0])
            try:
                return original(*args, **kwargs)
            finally:
                spans._close(spans.stack.pop())

        setattr(owner, attr, timed)

    def _close(self, frame: list) -> None:
        name, wall0, cpu0, child_wall, child_cpu = frame
        wall, cpu = WALL() - wall0, CPU() - cpu0
        row = self.update[name]
        row[0] += wall
        row[1] += wall - child_wall
        row[2] += cpu
        row[3] += cpu - child_cpu
        if self.stack:
            self.stack[-1][3] += wall
            self.stack[-1][4] += cpu
        else:
            self.top[0] += wall
            self.top[1] += cpu

    def mark(self) -> None:
        """An update boundary: the first call opens an update, the next one closes it."""
        now = (WALL(), CPU())
        if self.start is None:
            self.update, self.top, self.start = defaultdict(lambda: [0.0] * 4), [0.0, 0.0], now
            return
        wall, cpu = now[0] - self.start[0], now[1] - self.start[1]
        outside = [wall - self.top[0], cpu - self.top[1]]
        self.updates.append({**self.update, "(update)": [wall, wall, cpu, cpu], "(outside every span)": [outside[0]] * 2 + [outside[1]] * 2})
        self.start = None


class Marker:
    """Stands in for `ppo_run`'s PhaseClock: `install` wraps the four models' forwards, `take`
    marks update boundaries (both runners call it at the start and at the end of an update)."""

    def __init__(self, spans: Spans) -> None:
        self.spans = spans

    def install(self, models: dict) -> Marker:
        for name, model in models.items():
            self.spans.wrap(model, "forward", functools.partial(_forward_label, name))
        return self

    def take(self) -> dict:
        self.spans.mark()
        return {}


def _forward_label(name: str, *args, **kwargs) -> str:
    return f"{name} forward ({'grad' if torch.is_grad_enabled() else 'no grad'})"


def wrap_common(spans: Spans) -> None:
    from transformers.generation.utils import GenerationMixin

    spans.wrap(GenerationMixin, "generate", "generate (transformers)")
    spans.wrap(torch.autograd, "backward", "backward (autograd)")
    spans.wrap(torch.nn.utils, "clip_grad_norm_", "clip_grad_norm_")
    spans.wrap(torch.optim.AdamW, "step", "AdamW.step")
    spans.wrap(torch.optim.Optimizer, "zero_grad", "zero_grad")
    spans.wrap(torch.optim.lr_scheduler.LRScheduler, "step", "lr scheduler step")


def wrap_olingo(spans: Spans) -> None:
    for owner, attr, label in [*olingo_rollout_targets(), *olingo_learning_targets()]:
        if hasattr(owner, attr):  # olingo before or after the buffer change alike
            spans.wrap(owner, attr, label)
    from olingo.trainer.callbacks import builtin

    for name in ("JsonlMetrics", "TensorBoardLogger", "ProgressBar", "RolloutSamples"):
        spans.wrap(getattr(builtin, name), "on_step_end", f"callback {name}.on_step_end")


def olingo_rollout_targets() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, span label) of making experience: generation, scoring, advantages,
    and the buffer the experience goes into."""
    from olingo.engines import hf
    from olingo.experience_buffer import NaiveExperienceBuffer
    from olingo.experience_maker import advantages
    from olingo.experience_maker import ppo as ppo_maker
    from olingo.trainer import ppo

    return [
        (ppo.PPOTrainer, "_make_experience", "_make_experience"),
        (ppo_maker.PPOExperienceMaker, "make_experience", "make_experience"),
        (ppo_maker.PPOExperienceMaker, "rollout_and_score", "rollout_and_score"),
        (hf.HFEngine, "generate", "HFEngine.generate"),
        (hf, "build_generation_config", "build_generation_config"),
        (hf, "rollout_from_responses", "rollout_from_responses"),
        (ppo_maker, "action_log_probs", "action_log_probs (scoring)"),
        (ppo_maker, "action_values", "action_values (scoring)"),
        (ppo_maker, "score_rollout", "score_rollout (decode, reward)"),
        (ppo_maker, "kl_estimate", "kl_estimate"),
        (ppo_maker, "per_token_rewards", "per_token_rewards"),
        (advantages.GAE, "__call__", "GAE"),
        (ppo_maker, "masked_whiten", "masked_whiten"),
        (ppo_maker, "experience_info", "experience_info"),
        (ppo_maker.ScoredRollout, "samples", "ScoredRollout.samples"),
        (NaiveExperienceBuffer, "append", "buffer.append (split into items)"),
        (NaiveExperienceBuffer, "collate_fn", "buffer.collate_fn (re-pad)"),
        (NaiveExperienceBuffer, "dataloader", "buffer.dataloader"),
        (NaiveExperienceBuffer, "minibatch", "buffer.minibatch (index, trim)"),
    ]


def olingo_learning_targets() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, span label) of learning from experience: batching, the learners'
    losses, backward and optimizer steps, and the step's bookkeeping."""
    from olingo.booster.plugin import base as plugin_base
    from olingo.experience_buffer import NaiveExperienceBuffer
    from olingo.experience_maker.experience import Experience
    from olingo.rl.policy_loss import PolicyLoss, ValueLoss
    from olingo.trainer import online, ppo, ppo_learner
    from olingo.trainer.learner import TrainedModel

    return [
        (ppo.PPOTrainer, "_optimizer_step", "PPOTrainer._optimizer_step"),
        (ppo.PPOTrainer, "_learn", "_learn"),
        (torch.utils.data.DataLoader, "__iter__", "DataLoader.__iter__"),
        (torch.utils.data.dataloader._SingleProcessDataLoaderIter, "_next_data",
         lambda it: f"{'buffer' if isinstance(it._dataset, NaiveExperienceBuffer) else 'prompt'} DataLoader next (sampler, fetch)"),
        (ppo.PPOTrainer, "_train_group", "_train_group"),
        (Experience, "to_device", "Experience.to_device"),
        (ppo_learner.PPOLearner, "training_step", "PPOLearner.training_step"),
        (ppo_learner.PPOLearner, "any_rank", "any_rank (skip flag sync)"),
        (ppo_learner.PolicyLearner, "losses", "PolicyLearner.losses"),
        (ppo_learner, "policy_logits", "policy_logits (learn)"),
        (ppo_learner, "log_probs_from_logits", "log_probs_from_logits (learn)"),
        (PolicyLoss, "forward", "PolicyLoss"),
        (ppo_learner, "entropy_from_logits", "entropy_from_logits"),
        (ppo_learner, "masked_mean", "masked_mean (entropy)"),
        (ppo_learner.CriticLearner, "losses", "CriticLearner.losses"),
        (ppo_learner, "action_values", "action_values (learn)"),
        (ValueLoss, "forward", "ValueLoss"),
        (ppo_learner, "explained_variance", "explained_variance"),
        (TrainedModel, "backward", lambda self, loss: f"{self.name} backward"),
        (ppo_learner.PPOLearner, "optimizer_step", "PPOLearner.optimizer_step"),
        (TrainedModel, "step", lambda self: f"{self.name} step"),
        (plugin_base, "clip_gradients", "clip_gradients (norm, clip, float)"),
        (ppo.PPOTrainer, "_rollout_metrics", "_rollout_metrics"),
        (online.OLTrainer, "_after_step", "_after_step (on_step_end, stop check)"),
        (online, "dispatch", lambda callbacks, event, *a, **k: f"dispatch {event}"),
        (ppo, "dispatch", lambda callbacks, event, *a, **k: f"dispatch {event}"),
    ]


def wrap_minimal(spans: Spans) -> None:
    spans.wrap(ppo_run, "token_log_probs", "token_log_probs")
    spans.wrap(ppo_run, "token_values", "token_values")
    spans.wrap(ppo_run, "gae", "gae")


# Phases shared by both implementations: each span's exclusive time goes to one phase.
PHASES = {
    "generation (transformers generate)": ["generate (transformers)"],
    "generation wrapper (config, masks, modes)": ["HFEngine.generate", "build_generation_config", "rollout_from_responses"],
    "actor forward, no grad": ["actor forward (no grad)"],
    "reference forward": ["ref forward (no grad)"],
    "critic forward, no grad": ["critic forward (no grad)"],
    "reward forward": ["reward forward (no grad)"],
    "experience: prompt batch, log-probs/values glue, KL, rewards, GAE, whiten, info": [
        "prompt DataLoader next (sampler, fetch)", "_make_experience", "make_experience", "rollout_and_score", "action_log_probs (scoring)",
        "action_values (scoring)",
        "score_rollout (decode, reward)", "kl_estimate", "per_token_rewards", "GAE", "masked_whiten", "experience_info",
        "ScoredRollout.samples", "token_log_probs", "token_values", "gae"],
    "buffer: split, DataLoader, re-pad, to_device": [
        "buffer.append (split into items)", "buffer.collate_fn (re-pad)", "buffer.dataloader", "buffer.minibatch (index, trim)", "_learn",
        "Experience.to_device",
        "DataLoader.__iter__", "buffer DataLoader next (sampler, fetch)"],
    "actor forward with grad (+ log-probs)": ["actor forward (grad)", "policy_logits (learn)", "log_probs_from_logits (learn)"],
    "critic forward with grad": ["critic forward (grad)", "action_values (learn)"],
    "losses and their statistics": [
        "PPOLearner.training_step", "PolicyLearner.losses", "PolicyLoss", "entropy_from_logits", "masked_mean (entropy)",
        "CriticLearner.losses", "ValueLoss", "explained_variance", "_train_group"],
    "backward": ["backward (autograd)", "actor backward", "critic backward"],
    "optimizer (clip, AdamW, zero_grad, schedule)": [
        "clip_grad_norm_", "clip_gradients (norm, clip, float)", "AdamW.step", "zero_grad", "lr scheduler step", "actor step", "critic step"],
    "metrics (stack, all-reduce, .tolist, skip sync)": [
        "PPOLearner.optimizer_step", "PPOTrainer._optimizer_step", "_rollout_metrics", "any_rank (skip flag sync)"],
    "callbacks (logging, samples, progress)": ["_after_step (on_step_end, stop check)"],
}
REST = "rest (loop body outside every span)"


def phase_of(label: str) -> str:
    if label.startswith("gc "):
        return "gc (collector pauses)"
    if label.startswith(("dispatch ", "callback ")):
        return "callbacks (logging, samples, progress)"
    for phase, labels in PHASES.items():
        if label in labels:
            return phase
    return REST


def child(spec_path: str, impl: str, out_path: str, threads: int | None, spans_on: bool) -> None:
    """One implementation's run; per-update span rows (only the update totals when `spans_on`
    is False) go to `out_path` as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    torch.manual_seed(spec["seed"])  # as `common.runner_main` does
    if threads:
        torch.set_num_threads(threads)
    spans = Spans()
    if spans_on:
        wrap_common(spans)
        (wrap_olingo if impl == "olingo" else wrap_minimal)(spans)
    marker = Marker(spans) if spans_on else UpdateMarks(spans)
    (ppo_run.run_olingo if impl == "olingo" else ppo_run.run_minimal)(spec, marker)
    Path(out_path).write_text(json.dumps(spans.updates[spec["warmup_updates"]:]))


class UpdateMarks(Marker):
    """Update boundaries only: no model is instrumented."""

    def install(self, models: dict) -> Marker:
        return self


def run_child(spec: dict, name: str, source: str | None, threads: int | None, spans_on: bool, workdir: Path) -> list[dict]:
    """`name` ("olingo", "minimal", or "olingo@<tree>": olingo imported from `source`) in a fresh process."""
    impl = "minimal" if name == "minimal" else "olingo"
    workdir.mkdir(parents=True, exist_ok=True)
    tag = name.replace("@", "-").replace("/", "_")
    spec_path, out_path = workdir / f"profile-{tag}.spec.json", workdir / f"profile-{tag}.json"
    spec_path.write_text(json.dumps(spec))
    command = [OLINGO_PYTHON, __file__, "--child", impl, "--spec", str(spec_path), "--out", str(out_path)]
    command += (["--threads", str(threads)] if threads else []) + ([] if spans_on else ["--no-spans"])
    proc = subprocess.run(command, capture_output=True, text=True, env=child_env(source), cwd=workdir)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: profile child failed\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(out_path.read_text())


def child_env(source: str | None) -> dict:
    """The suite's environment; `source` (a directory holding another `olingo/`) is imported from."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "TOKENIZERS_PARALLELISM": "false",
           "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    env.pop("PPO_PROFILE_OLINGO", None)
    return env | ({"PPO_PROFILE_OLINGO": source} if source else {})


def interleaved(spec: dict, impls: dict[str, str | None], repeats: int, threads: int | None, spans_on: bool, workdir: Path) -> dict[str, list]:
    """{name: one result per repeat}; each repeat runs every implementation once, in a rotating order."""
    names, runs = list(impls), {name: [] for name in impls}
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[: repeat % len(names)]:
            runs[name].append(run_child(spec, name, impls[name], threads, spans_on, workdir))
    return runs


def median_rows(runs: list[list[dict]]) -> dict[str, list[float]]:
    """Median over updates of each run, then median over runs: {label: [inc wall, exc wall, inc cpu, exc cpu]}."""
    labels = list(dict.fromkeys(k for run in runs for update in run for k in update))
    per_run = [{label: [statistics.median([u.get(label, [0.0] * 4)[i] for u in run]) for i in range(4)] for label in labels} for run in runs]
    return {label: [statistics.median([r[label][i] for r in per_run]) for i in range(4)] for label in labels}


def phase_rows(runs: list[list[dict]]) -> dict[str, list[float]]:
    """{phase: [wall, cpu]}: medians over updates and runs of the summed exclusive times."""
    per_run = []
    for run in runs:
        sums = []
        for update in run:
            phases: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
            for label, (_, exc_wall, _, exc_cpu) in update.items():
                if label == "(update)":
                    continue
                phases[phase_of(label)][0] += exc_wall
                phases[phase_of(label)][1] += exc_cpu
            phases["(update)"] = [update["(update)"][0], update["(update)"][2]]
            sums.append(phases)
        names = list(dict.fromkeys(k for s in sums for k in s))
        per_run.append({n: [statistics.median([s.get(n, [0.0, 0.0])[i] for s in sums]) for i in range(2)] for n in names})
    names = [*PHASES, "gc (collector pauses)", REST, "(update)"]
    return {n: [statistics.median([r.get(n, [0.0, 0.0])[i] for r in per_run]) for i in range(2)] for n in names}


def report_spans(title: str, rows: dict[str, list[float]]) -> None:
    print(f"\n### {title}: spans, ms per update (median over updates, then repeats)\n")
    print("| span | incl. wall | excl. wall | incl. CPU | excl. CPU |\n|---|---|---|---|---|")
    for label, values in rows.items():
        print(f"| {label} | " + " | ".join(f"{1000 * v:.2f}" for v in values) + " |")


def report_phases(phases: dict[str, dict[str, list[float]]]) -> None:
    names = list(phases)
    print("\n### phases: exclusive ms per update, wall | process CPU, median over updates, then repeats\n")
    print("| phase | " + " | ".join(f"{n} wall" for n in names) + " | " + " | ".join(f"{n} CPU" for n in names) + " |")
    print("|---|" + "---|" * (2 * len(names)))
    for phase in phases[names[0]]:
        cells = [f"{1000 * phases[n][phase][0]:.1f}" for n in names] + [f"{1000 * phases[n][phase][1]:.1f}" for n in names]
        print(f"| {phase} | " + " | ".join(cells) + " |")


def report_ratios(runs: dict[str, list]) -> None:
    """Per repeat, each run's median update over the minimal loop's (and a baseline olingo's) of
    the same repeat: median and range of those ratios."""
    def medians(run: list[dict], i: int) -> float:
        return statistics.median([u["(update)"][i] for u in run])

    def ratio_cell(results: list, reference: list, i: int) -> str:
        ratios = [medians(r, i) / medians(m, i) for r, m in zip(results, reference, strict=True)]
        return f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"

    references = ["minimal"] + [n for n in runs if n.startswith("olingo@")]
    print("\n| implementation | wall s/update | CPU s/update | " + " | ".join(f"x {ref} wall | x {ref} CPU" for ref in references) + " |")
    print("|---|---|---|" + "---|---|" * len(references))
    for name, results in runs.items():
        cells = [f"{statistics.median([medians(r, i) for r in results]):.4f}" for i in (0, 2)]
        cells += [ratio_cell(results, runs[ref], i) for ref in references for i in (0, 2)]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="base", help="base, or one axis of suite.PPO_AXES as name=value")
    parser.add_argument("--updates", type=int, default=8, help="timed updates per run (after 2 warm-up updates)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch intra-op threads in each child (default: torch's)")
    parser.add_argument("--only", choices=["spans", "ratio"])
    parser.add_argument("--baseline", help="a directory holding another olingo/ tree, run as a third implementation (e.g. olingo before a change)")
    parser.add_argument("--child", choices=["olingo", "minimal"], help=argparse.SUPPRESS)
    parser.add_argument("--no-spans", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.spec, args.child, args.out, args.threads, not args.no_spans)
        return
    config = dict(suite.PPO_BASE, name="base")
    if args.config != "base":
        key, value = args.config.split("=")
        config = dict(suite.PPO_BASE, **{key: type(suite.PPO_BASE[key])(value)}, name=args.config)
    suite.WORK.mkdir(parents=True, exist_ok=True)
    spec = suite.ppo_spec(config, args.updates, 2)
    impls = {"olingo": None, "minimal": None} | ({"olingo@baseline": args.baseline} if args.baseline else {})
    workdir = suite.WORK / "runs"
    print(f"config {config}; threads {args.threads or 'torch default'}; {args.repeats} repeats x {args.updates} updates; {impls}")
    if args.only in (None, "spans"):
        runs = interleaved(spec, impls, args.repeats, args.threads, True, workdir)
        for name, results in runs.items():
            report_spans(name, median_rows(results))
        report_phases({name: phase_rows(results) for name, results in runs.items()})
        print("\nwith spans:")
        report_ratios(runs)
    if args.only in (None, "ratio"):
        print("\nwithout spans (update boundaries only):")
        report_ratios(interleaved(spec, impls, args.repeats, args.threads, False, workdir))


if __name__ == "__main__":
    main()
