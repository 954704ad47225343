"""The GRPO objectives of docs/algorithms.md against the clipped surrogate, per optimizer step, on the CLI.

    OMP_NUM_THREADS=1 .venv/bin/python bench/objectives_bench.py [--repeats 3] [--only gspo,cispo,...] [--quick]

Arms, each one `olingo grpo` run in a fresh process with OMP_NUM_THREADS=1 (one torch thread: far
less sensitive to other load on a shared machine), every arm changing one setting of the `grpo` arm:
- `grpo`: `loss.objective=ppo_clip` (the baseline every ratio divides by);
- `gspo`, `gspo_token`, `cispo`, `sapo`: `loss.objective=<arm>` (defaults of each objective; the
  aggregation stays `token_mean` in every arm, so only the per-token term differs);
- `gdpo`: `experience.reward_aggregation=gdpo` (every arm scores the same two reward terms,
  `arithmetic_exact` 1.0 and `arithmetic_format` 0.1, so only the aggregation differs);
- `distill`: on-policy distillation, `model.teacher=` the `h256x4` policy of `workload.py` (the same
  char tokenizer as the `h128x2` student) and `experience.distill_coef=1`, rewards kept.

Workload: the `h128x2` Llama of `workload.py` (fp32, CPU) on the arithmetic prompts of
`workload.write_arithmetic_prompts`; an episode is `--prompts` prompts x G = `--generations`
responses of at most `--max-new-tokens` tokens, learnt in `loop.update_steps=2` passes of
`--steps-per-pass` minibatches (so pi_old is a real forward in every arm, as distillation always
computes it, and the second pass has ratios != 1 for the objectives to act on), kl_coef 0 (no
reference model). Same seed in every arm: the same prompts and, until the updated policies drift
apart, the same samples (the mean response length is recorded per run to show it).

Measurement, from each run's metrics.jsonl, the first episode being warm-up:
- s/step: the wall time of each later episode from the `time` stamps (end of the last optimizer
  step of the previous episode to the end of its own last one: generation, scoring, teacher,
  pi_old, every learn step, logging) over its optimizer steps, median over the episodes;
- learn s/step: the trainer's `time/learn` (forward with gradients, backward, optimizer step,
  metrics) of each timed optimizer step, median;
- make-experience s/step: the trainer's `time/make_experience` of each timed episode over its
  optimizer steps, median;
- peak RSS of the CLI process (`os.wait4`), its wall and CPU time.
Repeats rotate the arms' order; each arm's ratio to `grpo` is taken between the runs of one
repeat, then median [min-max] over the repeats. The teacher's forward in `distill` is not
instrumented: it is `time/make_experience` of `distill` minus that of `grpo` in the same repeat
(seconds per episode; the same generation, scoring and pi_old forward otherwise), median
[min-max]; the teacher's load happens before the first episode and is outside every timing.
Target: each objective's learn s/step <= grpo's (ratio <= 1.05: this machine's run-to-run noise).

Writes bench/results/objectives.{jsonl,md}; `--quick` (1 repeat, 2 episodes of 4 x 4 short responses)
writes to bench/.work/objectives_quick/ and never replaces the committed table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import workload  # noqa: E402
from bench.common import BENCH, machine, median, table, write_results  # noqa: E402
from bench.packing_bench import run_cli  # noqa: E402

WORK = BENCH / ".work"
STUDENT, TEACHER = "h128x2", "h256x4"
REWARDS = "reward.functions={arithmetic_exact: 1.0, arithmetic_format: 0.1}"
ARMS = {
    "grpo": ["loss.objective=ppo_clip"],
    "gspo": ["loss.objective=gspo"],
    "gspo_token": ["loss.objective=gspo_token"],
    "cispo": ["loss.objective=cispo"],
    "sapo": ["loss.objective=sapo"],
    "gdpo": ["experience.reward_aggregation=gdpo"],
    "distill": ["experience.distill_coef=1.0"],  # + model.teacher, added where the teacher's path is known
}
OBJECTIVES = ("gspo", "gspo_token", "cispo", "sapo", "gdpo")  # the arms the learn-step target applies to
TOLERANCE = 1.05
SHAPE = {"prompts": 8, "generations": 8, "max_new_tokens": 32, "steps_per_pass": 2, "episodes": 5}


# ---- one run ----------------------------------------------------------------------------------
def overrides(arm: str, models: dict, prompts: str, shape: dict) -> list[str]:
    """The CLI overrides of `arm`: the shared workload, then the arm's own setting."""
    rollouts = shape["prompts"] * shape["generations"]
    base = [f"model.actor={models['student']}", f"data.prompts=[{prompts}]", "data.eval_prompts=[]", "run.seed=0", "logging.progress=false",
            f"loop.episodes={shape['episodes']}", f"loop.rollout_batch_size={shape['prompts']}",
            f"loop.train_batch_size={rollouts // shape['steps_per_pass']}", f"experience.num_generations={shape['generations']}",
            "loop.update_steps=2", "loop.save_interval=0", "loop.eval_interval=0", "loop.eval_before_training=false",
            f"generation.max_new_tokens={shape['max_new_tokens']}", "generation.temperature=1.0", "experience.advantage=grpo",
            "experience.kl_coef=0.0", "loss.aggregation=token_mean", REWARDS, "actor_optim.lr=1e-5", "actor_optim.weight_decay=0.0"]
    extra = [f"model.teacher={models['teacher']}"] if arm == "distill" else []
    return base + ARMS[arm] + extra


def measure(result: dict, episodes: int) -> dict:
    """Per-step timings of the episodes after the first, from the train rows of metrics.jsonl."""
    rows = result["rows"]
    if not rows or len(rows) % episodes:
        raise RuntimeError(f"{len(rows)} train rows for {episodes} episodes: expected the same number of optimizer steps each")
    per = len(rows) // episodes
    ends = [rows[k * per + per - 1]["time"] for k in range(episodes)]
    step_s = [(b - a) / per for a, b in zip(ends, ends[1:], strict=False)]
    timed = rows[per:]
    make = [rows[k * per]["time/make_experience"] for k in range(1, episodes)]  # one value per episode, on each of its rows
    kl = [r["rollout/teacher_kl"] for r in timed if "rollout/teacher_kl" in r]
    length = [r["rollout/response_length"] for r in timed if "rollout/response_length" in r]
    return {"steps_per_episode": per, "timed_steps": len(timed), "step_s": median(step_s), "learn_s": median([r["time/learn"] for r in timed]),
            "make_experience_s": median(make) / per, "make_experience_episode_s": median(make), "episode_s": median(step_s) * per,
            "teacher_kl": median(kl) if kl else None, "response_length_mean": median(length) if length else None,
            "clipfrac": median([r.get("train/clipfrac", 0.0) for r in timed])}


# ---- driver -----------------------------------------------------------------------------------
def run_all(arms: list[str], args, models: dict, prompts: str, shape: dict) -> list[dict]:
    """Every arm once per repeat, the order rotating from repeat to repeat."""
    results, out = [], WORK / "runs" / "objectives"
    for repeat in range(args.repeats):
        for arm in arms[repeat % len(arms):] + arms[: repeat % len(arms)]:
            load = os.getloadavg()[0]  # other work on the machine when the run started
            result = run_cli("grpo", overrides(arm, models, prompts, shape), out, f"obj-{arm}-r{repeat}")
            row = {"bench": "objectives", "arm": arm, "repeat": repeat, "size": STUDENT, **shape, **measure(result, shape["episodes"]),
                   "peak_rss_mb": result["peak_rss_mb"], "process_wall_s": result["wall_s"], "process_cpu_s": result["cpu_s"], "load_avg_1m": load}
            results.append(row)
            print(f"{arm:>10} r{repeat}: {row['step_s']:.3f} s/step  learn {row['learn_s']:.3f}  make_exp {row['make_experience_s']:.3f}  "
                  f"{row['peak_rss_mb']:6.0f} MB  process {row['process_wall_s']:5.1f} s", flush=True)
    return results


def ratios(rows: list[dict], arm: str, key: str, base: str = "grpo") -> list[float]:
    """arm / base of `key` within each repeat (the two ran side by side)."""
    by = {(r["arm"], r["repeat"]): r[key] for r in rows}
    return [v / by[(base, k)] for (a, k), v in by.items() if a == arm and (base, k) in by and by[(base, k)] > 0]


def spread(values: list[float], digits: int = 3) -> str:
    """median [min-max], or '-' when there is nothing."""
    if not values:
        return "-"
    return f"{median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def teacher_seconds(rows: list[dict]) -> list[float]:
    """distill's make-experience seconds per episode minus grpo's, per repeat: the teacher's forward."""
    by = {(r["arm"], r["repeat"]): r["make_experience_episode_s"] for r in rows}
    return [v - by[("grpo", k)] for (a, k), v in by.items() if a == "distill" and ("grpo", k) in by]


def _med(rows: list[dict], key: str):
    values = [r[key] for r in rows if r.get(key) is not None]
    return median(values) if values else "-"


def markdown(rows: list[dict], args, shape: dict) -> str:
    """Intro, the per-arm table with paired ratios and the target, then the teacher's share."""
    body = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        learn = ratios(rows, arm, "learn_s")
        met = "-" if arm not in OBJECTIVES or not learn else ("yes" if median(learn) <= TOLERANCE else "no")
        body.append([arm, _med(mine, "step_s"), _med(mine, "learn_s"), _med(mine, "make_experience_s"), spread(ratios(rows, arm, "step_s")),
                     spread(learn), spread(ratios(rows, arm, "make_experience_s")), met, _med(mine, "peak_rss_mb"), _med(mine, "response_length_mean")])
    headers = ["arm", "s/step", "learn s/step", "make-exp s/step", "s/step / grpo", "learn / grpo", "make-exp / grpo",
               f"learn <= grpo (<= {TOLERANCE})", "peak RSS MB", "response tokens"]
    return intro(rows, args, shape) + table(headers, body) + distill_note(rows)


def distill_note(rows: list[dict]) -> str:
    """The teacher's forward, from the paired make-experience difference."""
    diff = teacher_seconds(rows)
    if not diff:
        return ""
    base = [r["make_experience_episode_s"] for r in rows if r["arm"] == "grpo"]
    kl = _med([r for r in rows if r["arm"] == "distill"], "teacher_kl")
    kl_text = f"{kl:.3g}" if isinstance(kl, float) else kl
    return (f"\nDistillation's teacher forward ({TEACHER} teacher, {STUDENT} student), not instrumented: `time/make_experience` of `distill` "
            f"minus `grpo`'s in the same repeat, seconds per episode, median [min-max] over {len(diff)} repeat(s): {spread(diff)} "
            f"(grpo's make-experience: {median(base):.3f} s an episode). Its learn step is the same work as grpo's (the teacher only adds a "
            f"per-token term to the advantages). `rollout/teacher_kl` of the timed episodes (median): {kl_text}.\n")


def intro(rows: list[dict], args, shape: dict) -> str:
    quick = "**`--quick` validation run: a smoke test of the script, not results.**\n\n" if args.quick else ""
    loads = [r["load_avg_1m"] for r in rows]
    rollouts = shape["prompts"] * shape["generations"]
    return (
        f"## GRPO objectives per optimizer step (fp32, CPU, OMP_NUM_THREADS=1, `{STUDENT}` policy)\n\n{quick}"
        f"`olingo grpo` on arithmetic prompts: {shape['prompts']} prompts x G = {shape['generations']} responses of at most "
        f"{shape['max_new_tokens']} tokens an episode, 2 passes (mu = 2) of {shape['steps_per_pass']} minibatches of "
        f"{rollouts // shape['steps_per_pass']} rollouts = {2 * shape['steps_per_pass']} optimizer steps an episode, {shape['episodes']} "
        f"episodes, the first one warm-up. Rewards `arithmetic_exact` 1.0 + `arithmetic_format` 0.1 in every arm, kl_coef 0, "
        f"`token_mean`, lr 1e-5. Each arm changes one setting of `grpo` (`loss.objective=ppo_clip`): `loss.objective` = gspo, "
        f"gspo_token, cispo, sapo (their defaults); gdpo = `experience.reward_aggregation=gdpo`; distill = `model.teacher` "
        f"(`{TEACHER}`, same char tokenizer) with `experience.distill_coef=1`.\n\n"
        f"s/step: each timed episode's wall time from metrics.jsonl's `time` stamps over its optimizer steps; learn s/step: the "
        f"trainer's `time/learn` per step; make-exp s/step: `time/make_experience` per episode over its steps; medians. Ratios to "
        f"`grpo` are taken between the runs of one repeat (arms in rotating order, each a fresh process), then median [min-max] over "
        f"{args.repeats} repeat(s). 1-minute load average at the runs' starts: {min(loads):.1f}-{max(loads):.1f}. Target: each "
        f"objective's learn step no slower than grpo's (median ratio <= {TOLERANCE}, the noise of this machine). `response tokens`: mean "
        f"sampled length (same seed, so the same work unless the updated policies' samples drift apart).\n\n"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of every arm (ratios paired within a repeat)")
    parser.add_argument("--only", default=",".join(a for a in ARMS if a != "grpo"), help="comma-separated arms besides grpo (always run)")
    parser.add_argument("--episodes", type=int, default=SHAPE["episodes"], help="episodes per run (the first is warm-up)")
    parser.add_argument("--prompts", type=int, default=SHAPE["prompts"], help="prompts per episode")
    parser.add_argument("--generations", type=int, default=SHAPE["generations"], help="responses per prompt (G)")
    parser.add_argument("--max-new-tokens", type=int, default=SHAPE["max_new_tokens"], help="response length cap")
    parser.add_argument("--name", default="objectives", help="results file name (default objectives; objectives_quick with --quick)")
    parser.add_argument("--out-dir", type=Path, help="results directory (default bench/results; bench/.work/objectives_quick with --quick)")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 2 episodes of 4 x 4 responses of 8 tokens: a smoke run, not results")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.episodes, args.prompts, args.generations, args.max_new_tokens = 1, 2, 4, 4, 8
        args.name = "objectives_quick" if args.name == "objectives" else args.name
        args.out_dir = args.out_dir or WORK / "objectives_quick"
    return args


def main() -> None:
    args = parse_args()
    arms = ["grpo"] + [a for a in args.only.split(",") if a and a != "grpo"]
    if unknown := set(arms) - set(ARMS):
        raise SystemExit(f"--only: unknown arm(s) {sorted(unknown)}; choose among {list(ARMS)}")
    WORK.mkdir(parents=True, exist_ok=True)
    models = {"student": workload.build_models(WORK, STUDENT)["policy"], "teacher": workload.build_models(WORK, TEACHER)["policy"]}
    prompts = workload.write_arithmetic_prompts(WORK, 512)
    shape = dict(SHAPE, episodes=args.episodes, prompts=args.prompts, generations=args.generations, max_new_tokens=args.max_new_tokens)
    info = machine()
    info["git"] = f"{info['git']} (measured on its working tree)"
    info["omp_num_threads"] = 1
    start = time.time()
    rows = run_all(arms, args, models, prompts, shape)
    print(write_results(args.name, rows, info, markdown(rows, args, shape), args.out_dir or BENCH / "results"))
    print(f"done in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
