"""Packing: padded vs packed vs length-grouped training on a length-skewed workload, on the CLI.

    OMP_NUM_THREADS=1 .venv/bin/python bench/packing_bench.py [--repeats 3] [--only sft,rm,dpo,grpo] [--quick]

Workload. Row lengths (chat template included, in tokens of the char tokenizer of `workload.py`,
where every character is one token) are drawn from a lognormal with median 64 and sigma 0.9,
rounded and clipped to [16, 512], fixed seed: a long tail of a few long rows among many short
ones, the case padding wastes most on. SFT rows are `{"prompt", "completion"}` rendered
`<s><|user|>P<|end|><|assistant|>C</s>` (5 template tokens + |P| + |C|, P a quarter of the text);
preference pairs share a prompt and draw the chosen and the rejected row's lengths apart. Every
row's length is checked against the tokenizer's chat template before a run. The model is the
`h128x2` Llama of `workload.py` (hidden 128, 2 layers, 512 positions; `--size h256x4` is several times
slower a step on this workload), fp32, CPU.

Stages and arms, each run `olingo <stage>` in a fresh process with OMP_NUM_THREADS=1 (one torch
thread: far less sensitive to other load on a shared machine):
- `sft`, `rm`, `dpo` (DPO with its default precomputed reference: one reference pass before the
  first step, outside every timed step): `padded` (`model.packing=false`), `packed`
  (`model.packing=true`), `grouped` (`model.packing=false train.group_by_length=true`);
- `grpo`: `padded` and `packed` only (no `group_by_length` there). Responses of the random-init
  policy end when it samples eos (p ~ 1/104 per token), so their lengths are roughly geometric,
  mean ~90, cut at `generation.max_new_tokens`.

Measurement. Supervised stages train 2 epochs of `--steps` optimizer steps over the same rows
(batches of `--batch-size` rows, or pairs); epoch 1 is warm-up. tokens/s = the real (attended)
tokens of the data set, every row once (a pair: both rows), over the wall time of epoch 2 from the
`time` stamps of metrics.jsonl (end of the last step of epoch 1 to the end of the last step of
epoch 2: batch fetch, collate, forward, backward, optimizer, logging; no eval, no checkpoint).
The trainer's own `perf/tokens_per_s` (forward + backward + optimizer only) and
`perf/padding_fraction` are read too where logged (median over epoch 2). GRPO: the learn phase
only, from the trainer's `perf/learn_tokens_per_s` and `time/learn` of each optimizer step after
the first (warm-up) episode: real learn tokens (rate x time) over the summed `time/learn`.
Peak RSS is the CLI process's own (`os.wait4`). Repeats rotate the arms' order (A B C, B C A,
C A B); a ratio (packed / padded, grouped / padded) is taken between the runs of one repeat and
given as median [min-max] over the repeats. Target: packed >= 1.5x padded tokens/s.

The minimal loops of bench/ (`rm_run.py`, `dpo_run.py`, `grpo_run.py`) are left out: they read
rows of one length as dense tensors (no padding, no mask), so they do not take this workload as it
is. Writes bench/results/packing.{jsonl,md}; `--quick` (1 repeat, 3 steps of 4 rows, short GRPO) writes to
bench/.work/packing_quick/ and never replaces the committed table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import string
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import workload  # noqa: E402
from bench.common import BENCH, OLINGO_PYTHON, machine, median, table, write_results  # noqa: E402

WORK = BENCH / ".work"
LENGTHS = {"median": 64, "sigma": 0.9, "low": 16, "high": 512, "seed": 0}
TEMPLATE_TOKENS = 5  # <s> <|user|> <|end|> <|assistant|> </s>
TEXT = string.ascii_letters + string.digits + " .,"  # no "<": a row never spells a special token
ARMS = {
    "padded": ["model.packing=false"],
    "packed": ["model.packing=true"],
    "grouped": ["model.packing=false", "train.group_by_length=true"],
}
STAGE_ARMS = {"sft": ["padded", "packed", "grouped"], "rm": ["padded", "packed", "grouped"],
              "dpo": ["padded", "packed", "grouped"], "grpo": ["padded", "packed"]}
# Optimiser settings of the supervised runs (the suite's RM/DPO ones); the lr is small so no arm diverges.
SUPERVISED = ["run.seed=0", "logging.progress=false", "data.eval=[]", "data.max_length=512", "train.epochs=2", "train.save_interval=0",
              "train.eval_interval=0", "train.lr=1e-4", "train.weight_decay=0.1", "train.adam_betas=[0.9,0.95]", "train.warmup_ratio=0.025",
              "train.min_lr_ratio=0.1", "train.accumulation_steps=1"]
GRPO = {"rollout_batch_size": 8, "num_generations": 8, "train_batch_size": 16, "max_new_tokens": 256, "episodes": 3}


# ---- workload ---------------------------------------------------------------------------------
def draw_lengths(count: int, seed: int) -> list[int]:
    """`count` row lengths: lognormal (median 64, sigma 0.9), rounded, clipped to [16, 512]."""
    rng = random.Random(seed)
    mu = math.log(LENGTHS["median"])
    return [min(LENGTHS["high"], max(LENGTHS["low"], round(rng.lognormvariate(mu, LENGTHS["sigma"])))) for _ in range(count)]


def length_stats(lengths: list[int]) -> dict:
    return {"rows": len(lengths), "mean": sum(lengths) / len(lengths), "median": median(lengths), "max": max(lengths),
            "min": min(lengths), "tokens": sum(lengths)}


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(TEXT) for _ in range(n))


def write_sft(path: Path, lengths: list[int], seed: int) -> list[dict]:
    """SFT rows whose rendered conversation is exactly each length: P = a quarter of the text."""
    rng = random.Random(seed)
    rows = []
    for total in lengths:
        body = total - TEMPLATE_TOKENS
        prompt = max(1, body // 4)
        rows.append({"prompt": _text(rng, prompt), "completion": _text(rng, body - prompt)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def write_pairs(path: Path, chosen: list[int], rejected: list[int], seed: int) -> list[dict]:
    """Preference pairs: a shared prompt (a quarter of the shorter row's text), each response
    filling its row to its own length."""
    rng = random.Random(seed)
    rows = []
    for c, r in zip(chosen, rejected, strict=True):
        prompt = max(1, (min(c, r) - TEMPLATE_TOKENS) // 4)
        text = _text(rng, prompt)
        rows.append({"prompt": text, "chosen": _text(rng, c - TEMPLATE_TOKENS - prompt), "rejected": _text(rng, r - TEMPLATE_TOKENS - prompt)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def check_lengths(tokenizer_dir: str, pairs: list[tuple[str, str]], lengths: list[int], what: str) -> None:
    """Every (prompt, response) renders to exactly its intended length under the model's chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    for i, ((prompt, response), want) in enumerate(zip(pairs, lengths, strict=True)):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": response}], tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # transformers 5 returns an encoding
        if len(ids) != want:
            raise RuntimeError(f"{what}, row {i}: renders to {len(ids)} tokens, not the drawn {want}")


def build_data(work: Path, size: str, rows: int) -> dict:
    """The model directories, the SFT file and the pair file of `rows` rows / pairs, with the lengths."""
    models = workload.build_models(work, size)
    sft_lengths = draw_lengths(rows, LENGTHS["seed"])
    pair_lengths = draw_lengths(2 * rows, LENGTHS["seed"] + 1)
    chosen, rejected = pair_lengths[0::2], pair_lengths[1::2]
    sft_path, pair_path = work / f"packing_sft_n{rows}.jsonl", work / f"packing_pairs_n{rows}.jsonl"
    sft = write_sft(sft_path, sft_lengths, 0)
    pairs = write_pairs(pair_path, chosen, rejected, 1)
    check_lengths(models["policy"], [(r["prompt"], r["completion"]) for r in sft], sft_lengths, sft_path.name)
    check_lengths(models["policy"], [(r["prompt"], r["chosen"]) for r in pairs] + [(r["prompt"], r["rejected"]) for r in pairs],
                  chosen + rejected, pair_path.name)
    return {"models": models, "sft": str(sft_path), "pairs": str(pair_path), "sft_lengths": sft_lengths, "pair_lengths": chosen + rejected,
            "prompts": workload.write_arithmetic_prompts(work, 512)}


# ---- one run ----------------------------------------------------------------------------------
def run_cli(stage: str, overrides: list[str], out: Path, name: str) -> dict:
    """`olingo <stage> ...` in a fresh process (OMP_NUM_THREADS=1): its metrics rows, wall time and
    peak RSS (this child's own, from os.wait4)."""
    shutil.rmtree(out / name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent), "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    argv = [str(OLINGO_PYTHON), "-m", "olingo.cli.main", stage, f"run.output_dir={out}", f"run.name={name}", *overrides]
    log = out / f"{name}.log"
    started = time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=BENCH.parent)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"olingo {stage} {' '.join(overrides)} failed (exit {proc.returncode}); log {log}:\n{log.read_text()[-4000:]}")
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    shutil.rmtree(out / name, ignore_errors=True)
    return {"rows": [r for r in rows if r.get("split") == "train"], "wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024,
            "cpu_s": usage.ru_utime + usage.ru_stime}


def stage_overrides(stage: str, data: dict, steps: int, batch: int) -> list[str]:
    """The CLI overrides of a stage (every arm adds its own)."""
    policy = data["models"]["policy"]
    if stage == "sft":
        return [f"model.path={policy}", f"data.train=[{data['sft']}]", f"train.batch_size={batch}", *SUPERVISED]
    if stage in ("rm", "dpo"):
        return [f"model.path={policy}", f"data.train=[{data['pairs']}]", f"train.batch_size={batch}", *SUPERVISED]
    g = data["grpo"]
    return [f"model.actor={policy}", f"data.prompts=[{data['prompts']}]", "data.eval_prompts=[]", "run.seed=0", "logging.progress=false",
            f"loop.episodes={g['episodes']}", f"loop.rollout_batch_size={g['rollout_batch_size']}", f"loop.train_batch_size={g['train_batch_size']}",
            f"experience.num_generations={g['num_generations']}", "loop.update_steps=1", "loop.save_interval=0", "loop.eval_interval=0",
            "loop.eval_before_training=false", f"generation.max_new_tokens={g['max_new_tokens']}", "reward.functions={arithmetic_exact: 1.0}",
            "actor_optim.lr=1e-5"]


def supervised_row(result: dict, steps: int, real_tokens: int) -> dict:
    """tokens/s of epoch 2 from the metrics' time stamps; the trainer's own perf metrics of epoch 2."""
    rows = result["rows"]
    if len(rows) != 2 * steps:
        raise RuntimeError(f"{len(rows)} train rows, expected 2 epochs x {steps} steps")
    epoch_s = rows[-1]["time"] - rows[steps - 1]["time"]
    second = rows[steps:]
    perf = [r["perf/tokens_per_s"] for r in second if "perf/tokens_per_s" in r]
    pad = [r["perf/padding_fraction"] for r in second if "perf/padding_fraction" in r]
    steps_s = [b["time"] - a["time"] for a, b in zip(rows[steps - 1:], rows[steps:], strict=False)]
    return {"tokens_per_s": real_tokens / epoch_s, "epoch_s": epoch_s, "step_s_median": median(steps_s),
            "trainer_tokens_per_s": median(perf) if perf else None, "padding_fraction": median(pad) if pad else None,
            "final_loss": rows[-1].get("train/loss")}


def grpo_row(result: dict, episodes: int) -> dict:
    """Learn-phase tokens/s of the episodes after the first: real tokens (rate x time/learn) over time/learn."""
    rows = result["rows"]
    if not rows or len(rows) % episodes:
        raise RuntimeError(f"{len(rows)} train rows for {episodes} episodes")
    per = len(rows) // episodes
    timed = rows[per:]
    # The whole episode (generation + learn), end to end from the time stamps: a check on time/learn from outside.
    ends = [rows[k * per + per - 1]["time"] for k in range(episodes)]
    episode_s = median([b - a for a, b in zip(ends, ends[1:], strict=False)])
    learn = [r for r in timed if "time/learn" in r and "perf/learn_tokens_per_s" in r]
    if not learn:
        return {"tokens_per_s": None, "epoch_s": sum(r.get("time/learn", 0.0) for r in timed), "step_s_median": None,
                "trainer_tokens_per_s": None, "padding_fraction": None, "episode_s": episode_s}
    seconds = sum(r["time/learn"] for r in learn)
    tokens = sum(r["perf/learn_tokens_per_s"] * r["time/learn"] for r in learn)
    pad = [r["perf/padding_fraction"] for r in learn if "perf/padding_fraction" in r]
    lengths = [r["rollout/response_length"] for r in timed if "rollout/response_length" in r]
    return {"tokens_per_s": tokens / seconds, "epoch_s": seconds, "step_s_median": median([r["time/learn"] for r in learn]),
            "trainer_tokens_per_s": median([r["perf/learn_tokens_per_s"] for r in learn]), "padding_fraction": median(pad) if pad else None,
            "learn_tokens": tokens, "response_length_mean": median(lengths) if lengths else None, "episode_s": episode_s}

# ---- driver -----------------------------------------------------------------------------------
def run_shape(stage: str, args, data: dict) -> dict:
    """The batch shape a row of `stage` records."""
    g = data["grpo"]
    if stage == "grpo":
        return {"micro_batch": g["train_batch_size"], "rollouts_per_episode": g["rollout_batch_size"] * g["num_generations"],
                "max_new_tokens": g["max_new_tokens"], "episodes": g["episodes"]}
    return {"micro_batch": args.batch_size, "steps_per_epoch": args.steps}


def run_stage(stage: str, args, data: dict, out: Path) -> list[dict]:
    """Every arm of `stage` once per repeat, the order rotating from repeat to repeat."""
    results = []
    arms = STAGE_ARMS[stage]
    base = stage_overrides(stage, data, args.steps, args.batch_size)
    real = sum(data["sft_lengths"] if stage == "sft" else data["pair_lengths"])
    for repeat in range(args.repeats):
        for arm in arms[repeat % len(arms):] + arms[: repeat % len(arms)]:
            load = os.getloadavg()[0]  # other work on the machine when the run started
            result = run_cli(stage, base + ARMS[arm], out, f"{stage}-{arm}-r{repeat}")
            measured = grpo_row(result, data["grpo"]["episodes"]) if stage == "grpo" else supervised_row(result, args.steps, real)
            row = {"bench": "packing", "stage": stage, "arm": arm, "repeat": repeat, "size": args.size, **run_shape(stage, args, data),
                   **measured, "peak_rss_mb": result["peak_rss_mb"], "process_wall_s": result["wall_s"], "process_cpu_s": result["cpu_s"],
                   "load_avg_1m": load}
            results.append(row)
            rate = f"{row['tokens_per_s']:8.0f}" if row["tokens_per_s"] else "   (none)"
            pad = f"{row['padding_fraction']:.3f}" if row["padding_fraction"] is not None else "-"
            print(f"{stage:>4} {arm:>7} r{repeat}: {rate} tok/s  timed {row['epoch_s']:6.2f} s  padding {pad}  "
                  f"{row['peak_rss_mb']:6.0f} MB  process {row['process_wall_s']:5.1f} s", flush=True)
    return results


def paired(rows: list[dict], stage: str, arm: str, base: str = "padded") -> str:
    """arm / base tokens/s within each repeat (the two ran side by side): median [min-max]."""
    by = {(r["arm"], r["repeat"]): r["tokens_per_s"] for r in rows if r["stage"] == stage and r["tokens_per_s"]}
    ratios = [v / by[(base, k)] for (a, k), v in by.items() if a == arm and (base, k) in by]
    if not ratios:
        return "-"
    return f"{median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"


def _med(rows: list[dict], key: str):
    values = [r[key] for r in rows if r.get(key) is not None]
    return median(values) if values else "-"


def markdown(rows: list[dict], data: dict, args) -> str:
    """Summary (tokens/s per arm, paired ratios, the 1.5x target) and every arm's detail."""
    stages = list(dict.fromkeys(r["stage"] for r in rows))
    summary, detail = [], []
    for stage in stages:
        mine = [r for r in rows if r["stage"] == stage]
        rate = {arm: _med([r for r in mine if r["arm"] == arm], "tokens_per_s") for arm in ("padded", "packed", "grouped")}
        ratio = paired(rows, stage, "packed")
        met = "yes" if ratio != "-" and float(ratio.split()[0]) >= 1.5 else "no"
        summary.append([stage, rate["padded"], rate["packed"], rate["grouped"], ratio, paired(rows, stage, "grouped"), met])
        for arm in STAGE_ARMS[stage]:
            runs = [r for r in mine if r["arm"] == arm]
            detail.append([stage, arm, *(_med(runs, k) for k in ("tokens_per_s", "epoch_s", "step_s_median", "trainer_tokens_per_s",
                                                                  "padding_fraction", "peak_rss_mb", "process_wall_s"))])
    headers = ["stage", "arm", "tokens/s", "timed s", "step s (median)", "trainer tok/s", "padding fraction", "peak RSS MB", "process s"]
    return (intro(data, args, rows) + table(["stage", "padded tok/s", "packed tok/s", "grouped tok/s", "packed / padded", "grouped / padded",
                                              "packed >= 1.5x padded"], summary) + DETAIL + table(headers, detail) + grpo_note(rows))


def grpo_note(rows: list[dict]) -> str:
    """GRPO's sampled lengths per arm: the arms learn on the same rollouts only where these agree."""
    mine = [r for r in rows if r["stage"] == "grpo" and r.get("response_length_mean") is not None]
    if not mine:
        return ""
    per = ", ".join(f"{r['arm']} r{r['repeat']} {r['response_length_mean']:.1f} tokens, {r['episode_s']:.2f} s" for r in mine)
    return (f"\nGRPO, per run: the mean response length of the timed episodes (the same seed samples the same responses in every arm "
            f"unless float rounding of the updated policy flips a sample) and the median episode wall time from metrics.jsonl's time "
            f"stamps (generation + learn; generation is the same work in both arms, so the difference is the learn phase's): {per}.\n")


DETAIL = ("\n### Every arm (medians over repeats)\n\n`timed s`: epoch 2's wall time (SFT, RM, DPO) or the summed `time/learn` of the "
          "timed episodes (GRPO). `trainer tok/s`: the trainer's own `perf/tokens_per_s` (forward, backward, optimizer step only; GRPO: "
          "`perf/learn_tokens_per_s`), median over the timed steps. `padding fraction`: the trainer's `perf/padding_fraction`, the share "
          "of computed positions that are padding (packed: of the packed rows). `process s`: the whole CLI process, start-up, data, "
          "warm-up and final checkpoint included. `-`: not logged by this olingo.\n\n")


def intro(data: dict, args, rows: list[dict]) -> str:
    sft, pairs = length_stats(data["sft_lengths"]), length_stats(data["pair_lengths"])
    g = data["grpo"]
    quick = "**`--quick` validation run: a smoke test of the script, not results.**\n\n" if args.quick else ""
    loads = [r["load_avg_1m"] for r in rows]
    return (
        f"## Packing: padded vs packed vs length-grouped (fp32, CPU, OMP_NUM_THREADS=1, `{args.size}`)\n\n{quick}"
        f"Row lengths (chat template included): lognormal, median {LENGTHS['median']}, sigma {LENGTHS['sigma']}, rounded and clipped to "
        f"[{LENGTHS['low']}, {LENGTHS['high']}], seed {LENGTHS['seed']}. SFT: {sft['rows']} rows, mean {sft['mean']:.1f}, median "
        f"{sft['median']:.0f}, max {sft['max']} ({sft['tokens']} tokens an epoch). RM / DPO: {pairs['rows'] // 2} pairs, rows mean "
        f"{pairs['mean']:.1f}, median {pairs['median']:.0f}, max {pairs['max']} ({pairs['tokens']} tokens an epoch). Micro-batch "
        f"{args.batch_size} rows (SFT) or pairs (RM, DPO: 2 x {args.batch_size} rows a forward), {args.steps} optimizer steps an epoch, "
        f"2 epochs, epoch 2 timed. GRPO: {g['rollout_batch_size']} prompts x G = {g['num_generations']}, responses up to "
        f"{g['max_new_tokens']} tokens ending at the random policy's eos, micro-batch {g['train_batch_size']} rollouts, mu = 1, "
        f"{g['episodes']} episodes, the first one warm-up; learn phase only.\n\n"
        f"tokens/s counts real (attended) tokens only: SFT / RM / DPO the data set's tokens over epoch 2's wall time from metrics.jsonl's "
        f"`time` stamps (batch fetch, collate, forward, backward, optimizer step and logging; DPO's reference log-probs are precomputed "
        f"before step 1, outside the timing); GRPO the trainer's `perf/learn_tokens_per_s` x `time/learn` summed, over the summed "
        f"`time/learn`. Ratios are taken between the runs of one repeat (arms in rotating order, each a fresh process), then median "
        f"[min-max] over {args.repeats} repeat(s). 1-minute load average at the runs' starts: {min(loads):.1f}-{max(loads):.1f}. "
        f"Target: packed >= 1.5x padded tokens/s. The minimal loops of bench/ take rows of one length only and are left out.\n\n"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of every arm per stage (ratios paired within a repeat)")
    parser.add_argument("--only", default="sft,rm,dpo,grpo", help="comma-separated stages among sft,rm,dpo,grpo")
    parser.add_argument("--steps", type=int, default=16, help="optimizer steps per epoch (2 epochs, the second timed)")
    parser.add_argument("--batch-size", type=int, default=8, help="rows (SFT) or pairs (RM, DPO) per micro-batch")
    parser.add_argument("--size", default="h128x2", choices=sorted(workload.SIZES), help="model size of workload.py")
    parser.add_argument("--grpo-episodes", type=int, default=GRPO["episodes"], help="GRPO episodes (the first is warm-up)")
    parser.add_argument("--max-new-tokens", type=int, default=GRPO["max_new_tokens"], help="GRPO response length cap")
    parser.add_argument("--name", default="packing", help="results file name (default packing; packing_quick with --quick)")
    parser.add_argument("--out-dir", type=Path, help="results directory (default bench/results; bench/.work/packing_quick with --quick)")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 3 steps of 4 rows, short GRPO: a smoke run, not results")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps, args.batch_size = 1, 3, 4
        args.grpo_episodes, args.max_new_tokens = 2, 24
        args.name = "packing_quick" if args.name == "packing" else args.name
        args.out_dir = args.out_dir or WORK / "packing_quick"
    return args


def main() -> None:
    args = parse_args()
    stages = [s for s in args.only.split(",") if s]
    if unknown := set(stages) - set(STAGE_ARMS):
        raise SystemExit(f"--only: unknown stage(s) {sorted(unknown)}; choose among {list(STAGE_ARMS)}")
    WORK.mkdir(parents=True, exist_ok=True)
    data = build_data(WORK, args.size, args.steps * args.batch_size)
    data["grpo"] = dict(GRPO, episodes=args.grpo_episodes, max_new_tokens=args.max_new_tokens)
    if args.quick:
        data["grpo"].update(rollout_batch_size=2, num_generations=4, train_batch_size=8)
    info = machine()
    info["git"] = f"{info['git']} (measured on its working tree)"
    info["omp_num_threads"] = 1
    start = time.time()
    rows = []
    for stage in stages:
        rows += run_stage(stage, args, data, WORK / "runs" / "packing")
    print(write_results(args.name, rows, info, markdown(rows, data, args), args.out_dir or BENCH / "results"))
    print(f"done in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
