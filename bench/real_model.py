"""olingo vs the minimal loop vs TRL on a real model: SmolLM2-135M-Instruct, fp32, on this CPU.

    OLINGO_HOME=/tmp/olh-tune .venv/bin/python bench/real_model.py [--repeats 3] [--steps 3] [--only rm,dpo] [--quick]
        [--sizes small|realistic] [--model smollm2|vocab262k] [--ppo-reuse] [--rm-prompt-length N]

Reward-model, DPO, GRPO and PPO steps, run by the suite's runners (`rm_run.py`, `dpo_run.py`,
`grpo_run.py`, `ppo_run.py` and `trl/*_trl.py`, unchanged in what they compute) on the real weights
(`workload.build_real_models`: the converted `builtin:smollm2` as policy and reference; reward and
value models with its body and a fresh 1-output head) and on data in its tokenizer, with batches
sized so that one step takes seconds, not minutes, on one core (`--sizes small`, the default) or
as a user trains (`--sizes realistic`: batches of 16-32 rows and 128-256 tokens, a minute a step).
`--model vocab262k` swaps the real weights for a random-init model of SmolLM2's shape with 4 layers
and a 262,144-token vocabulary (Gemma 3's), where the logits are most of a step's memory: the peak
RSS column then compares how each implementation handles them.

Measurement, chosen for a shared 2-core machine whose wall times swing 2x from run to run:
1. every run is a fresh process with one torch thread (`--threads 1`), so another process taking a
   core slows it without making two threads wait for each other;
2. every step is timed twice: wall clock, and the process CPU time (user + system, all threads),
   which another process on the machine barely changes;
3. runs are paired: in every repeat each stage runs olingo, minimal and TRL back to back (the order
   rotating from repeat to repeat: A B C, B C A, C A B), and a ratio is taken between the runs of one
   repeat, then given as median [min-max] over repeats.
`--rm-prompt-length N` makes the two rows of every RM pair share their first N tokens (a prompt);
olingo then runs them once per pair (`train.share_prompt`), TRL and the minimal loop twice.
`--ppo-reuse` adds a fourth PPO implementation, `olingo+reuse_logp`: olingo with
`experience.reuse_rollout_log_probs=true`, which takes pi_old from the logits `generate` computed, the
shortcut TRL's PPOTrainer always takes. Writes bench/results/real.{jsonl,md} (`--quick`: real_quick, a smoke run with tiny batches; other
sizes and models: real_realistic, vocab262k_realistic, ...; `--name` overrides).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import workload  # noqa: E402
from bench.common import BENCH, OLINGO_PYTHON, machine, median, run_impl, table, write_results  # noqa: E402
from bench.suite import DPO_ALGO, GRPO_ALGO, PPO_ALGO, RM_OPTIM, phase_sums, trl_python  # noqa: E402

WORK = BENCH / ".work"
IMPLS = ("olingo", "minimal", "trl")
# `--ppo-reuse`: PPO also as olingo with TRL's shortcut (pi_old from generate's own logits, no
# second actor forward), as the `olingo+reuse_logp` implementation.
REUSE = "olingo+reuse_logp"
STAGES = ("rm", "dpo", "grpo", "ppo")
# Batches per stage (the full run; --quick shrinks them). Tokens are those of the step's training batch.
# On one core a forward + backward of this model costs ~12 ms of CPU per token and AdamW's step
# 0.1-0.8 s, so these steps take 2-6 s of CPU each and the whole run about 25 minutes.
SIZES = {
    "rm": {"batch_size": 2, "length": 48},  # 2 pairs: one forward + backward of 4 rows x 48 tokens
    "dpo": {"batch_size": 2, "prompt_length": 16, "response_length": 16},  # 4 rows x 32 tokens, live reference
    "grpo": {"batch_size": 2, "num_generations": 4, "response_length": 8},  # 8 rows x (14 + 8) tokens
    "ppo": {"batch_size": 2, "response_length": 16},  # 2 rows x (14 + 16), 2 minibatches of 1
}
QUICK_SIZES = {
    "rm": {"batch_size": 1, "length": 16},
    "dpo": {"batch_size": 1, "prompt_length": 8, "response_length": 8},
    "grpo": {"batch_size": 1, "num_generations": 2, "response_length": 4},
    "ppo": {"batch_size": 2, "response_length": 4},
}
# As users train: GRPO 4 prompts x G=8 x 64 sampled tokens (32 rows), DPO 4 pairs of 64 + 192 tokens,
# RM 8 pairs of 128 tokens, PPO 8 prompts x 64 tokens in 2 minibatches: 30-60 s of CPU a step on one core.
REALISTIC_SIZES = {
    "rm": {"batch_size": 8, "length": 128},
    "dpo": {"batch_size": 4, "prompt_length": 64, "response_length": 192},
    "grpo": {"batch_size": 4, "num_generations": 8, "response_length": 64},
    "ppo": {"batch_size": 8, "response_length": 64},
}
SIZE_SETS = {"small": SIZES, "realistic": REALISTIC_SIZES}
MODELS = {
    "smollm2": ("Real model: SmolLM2-135M-Instruct (135M parameters, 30 layers, fp32, CPU)",
                "SmolLM2-135M-Instruct (builtin:smollm2, Q4_1 GGUF dequantised to fp32)"),
    "vocab262k": (f"Random-init model, SmolLM2's shape with {workload.BIG_VOCAB_LAYERS} layers and a {workload.BIG_VOCAB:,}-token vocabulary "
                  "(fp32, CPU)", f"random init, hidden 576, {workload.BIG_VOCAB_LAYERS} layers, vocabulary {workload.BIG_VOCAB}, tied embeddings"),
}
TRL_SCRIPTS = {"rm": "rm_trl.py", "dpo": "dpo_trl.py", "grpo": "grpo_trl.py", "ppo": "ppo_trl.py"}
OUR_SCRIPTS = {"rm": "rm_run.py", "dpo": "dpo_run.py", "grpo": "grpo_run.py", "ppo": "ppo_run.py"}


def stage_spec(stage: str, size: dict, models: dict[str, str], steps: int, warmup: int, threads: int) -> dict:
    """The runner spec of one stage: the suite's algorithm settings (no LR warm-up: a run is a
    handful of steps), the real model's directories and data files."""
    tok, common = models["policy"], {"threads": threads, "seed": 0}
    if stage == "rm":
        rows = (steps + warmup) * size["batch_size"]
        return {**RM_OPTIM, **common, "warmup_ratio": 0.0, "model_dir": models["reward"], "batch_size": size["batch_size"],
                "data": workload.write_word_pairs(WORK, tok, size["length"], rows, prompt_length=size.get("prompt_length", 0)),
                "steps": steps, "warmup_steps": warmup}
    if stage == "dpo":
        rows = (steps + warmup) * size["batch_size"]
        data = workload.write_word_dpo_pairs(WORK, tok, size["prompt_length"], size["response_length"], rows)
        return {**DPO_ALGO, **common, "warmup_ratio": 0.0, "policy_dir": models["policy"], "data": data, "prompt_length": size["prompt_length"],
                "response_length": size["response_length"], "batch_size": size["batch_size"], "steps": steps, "warmup_steps": warmup}
    prompts = workload.write_text_arithmetic_prompts(WORK, tok, 256)
    if stage == "grpo":
        return {**GRPO_ALGO, **common, "policy_dir": models["policy"], "prompts": prompts, "batch_size": size["batch_size"],
                "num_generations": size["num_generations"], "response_length": size["response_length"], "updates": steps, "warmup_updates": warmup}
    return {**PPO_ALGO, **common, "policy_dir": models["policy"], "reward_dir": models["reward"], "value_dir": models["value"], "prompts": prompts,
            "batch_size": size["batch_size"], "mini_batch_size": size["batch_size"] // 2, "response_length": size["response_length"],
            "updates": steps, "warmup_updates": warmup}


def tokens_per_step(stage: str, spec: dict) -> tuple[int, int]:
    """(tokens in the step's training batch, tokens generated in the step)."""
    if stage == "rm":
        return 2 * spec["batch_size"] * len(workload.read_jsonl(spec["data"])[0]["chosen_input_ids"]), 0
    if stage == "dpo":
        return 2 * spec["batch_size"] * (spec["prompt_length"] + spec["response_length"]), 0
    prompt = len(workload.read_jsonl(spec["prompts"])[0]["input_ids"])
    rows = spec["batch_size"] * spec.get("num_generations", 1)
    return rows * (prompt + spec["response_length"]), rows * spec["response_length"]


def run_one(stage: str, impl: str, spec: dict, threads: int) -> dict:
    """One fresh process of `impl` on `stage`; its result as the runner wrote it."""
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if impl == "trl":
        return run_impl(trl_python(stage), BENCH / "trl" / TRL_SCRIPTS[stage], {**spec, "mode": "fp32"}, WORK / "runs", f"real-{stage}-trl", env)
    if impl == REUSE:
        spec = {**spec, "impl": "olingo", "olingo_experience": {"reuse_rollout_log_probs": True}}
        return run_impl(OLINGO_PYTHON, BENCH / OUR_SCRIPTS[stage], spec, WORK / "runs", f"real-{stage}-olingo-reuse", env)
    return run_impl(OLINGO_PYTHON, BENCH / OUR_SCRIPTS[stage], {**spec, "impl": impl}, WORK / "runs", f"real-{stage}-{impl}", env)


def impls_for(stage: str, ppo_reuse: bool) -> tuple[str, ...]:
    """The implementations a stage runs: olingo, minimal, TRL, and for PPO with `--ppo-reuse` olingo with TRL's shortcut."""
    return IMPLS + ((REUSE,) if stage == "ppo" and ppo_reuse else ())


def step_series(result: dict) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds of every timed step, whichever runner wrote `result`: TRL's reward
    runner gives end-to-end steps as iter_*, the PPO runners per update, the others per step."""
    if "iter_times_s" in result:
        return result["iter_times_s"], result["iter_cpu_times_s"]
    if "update_times_s" in result:
        return result["update_times_s"], result["cpu_times_s"]
    return result["step_times_s"], result["cpu_times_s"]


def generation_seconds(stage: str, result: dict) -> float | None:
    """Median seconds per step inside `generate` (PPO and GRPO), from the runners' phase clocks."""
    if stage == "ppo":
        return median([p.get("generation", 0.0) for p in phase_sums(result)])
    if stage == "grpo":
        return median([p.get("generation", 0.0) for p in result["phase_s"]])
    return None


def measure(stage: str, impl: str, repeat: int, spec: dict, threads: int) -> dict:
    load, start = os.getloadavg()[0], time.perf_counter()
    result = run_one(stage, impl, spec, threads)
    wall, cpu = step_series(result)
    trained, generated = tokens_per_step(stage, spec)
    gen_s = generation_seconds(stage, result)
    row = {"bench": "real", "model": "smollm2", "stage": stage, "impl": impl, "repeat": repeat, "wall_s": median(wall), "cpu_s": median(cpu),
           "wall_steps_s": wall, "cpu_steps_s": cpu, "tokens_per_step": trained, "tokens_per_s": trained / median(wall),
           "gen_tokens_per_s": generated / gen_s if gen_s else None, "peak_rss_mb": result["peak_rss_mb"], "load_avg_1m": load,
           "process_s": time.perf_counter() - start, "threads": threads,
           "size": {k: spec[k] for k in ("batch_size", "num_generations", "response_length", "prompt_length") if k in spec}}
    if "final_loss" in result:
        row["final_loss"] = result["final_loss"]
    if "mean_reward" in result:
        row["mean_reward"] = sum(result["mean_reward"]) / len(result["mean_reward"])
    return row


def adamw_probe(policy_dir: str, steps: int = 3) -> dict:
    """Wall and CPU seconds of one AdamW step over the policy's parameters (random gradients), for
    torch's CPU default (the minimal loop's optimizer), foreach=True and fused=True (TRL's
    `adamw_torch_fused` and olingo's default): median of `steps` steps after the one that creates the state."""
    import torch
    from transformers import AutoModelForCausalLM

    params = [p for p in AutoModelForCausalLM.from_pretrained(policy_dir).parameters() if p.requires_grad]
    out = {"parameters": sum(p.numel() for p in params), "torch_threads": torch.get_num_threads()}
    for name, kwargs in (("default", {}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        optimizer = torch.optim.AdamW(params, lr=1e-6, betas=(0.9, 0.95), **kwargs)
        wall, cpu = [], []
        for step in range(steps + 1):
            for p in params:  # a fresh gradient every step, as backward leaves after zero_grad(set_to_none=True)
                p.grad = torch.randn_like(p)
            start, cpu_start = time.perf_counter(), time.process_time()
            optimizer.step()
            if step:
                wall.append(time.perf_counter() - start)
                cpu.append(time.process_time() - cpu_start)
        out[name] = {"wall_s": median(wall), "cpu_s": median(cpu)}
        del optimizer
    return out


def run_adamw_probe(policy_dir: str, threads: int) -> dict:
    """`adamw_probe` in a fresh process with `threads` torch threads."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONPATH": str(BENCH.parent)}
    proc = subprocess.run([str(OLINGO_PYTHON), __file__, "--adamw-probe", policy_dir], capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def paired(rows: list[dict], stage: str, impl: str, base: str, key: str) -> list[float]:
    """impl / base for every repeat in which both ran (back to back)."""
    by = {(r["impl"], r["repeat"]): r[key] for r in rows if r["stage"] == stage}
    return [by[(impl, k)] / by[(base, k)] for (i, k) in by if i == impl and (base, k) in by]


def spread(values: list[float], scale: float = 1.0) -> str:
    """median [min-max], or '-' when there is nothing; 3 significant digits, whole numbers from 100."""
    def cell(value: float) -> str:
        return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"

    if not values:
        return "-"
    return f"{cell(median(values) * scale)} [{cell(min(values) * scale)}-{cell(max(values) * scale)}]"


def describe(stage: str, size: dict) -> str:
    if stage == "rm":
        shared = f", {size['prompt_length']} of them a shared prompt" if size.get("prompt_length") else ""
        return f"RM ({size['batch_size']} pairs x {size['length']} tokens{shared})"
    if stage == "dpo":
        return f"DPO ({size['batch_size']} pairs x {size['prompt_length']} + {size['response_length']} tokens, live reference)"
    if stage == "grpo":
        return f"GRPO ({size['batch_size']} prompts x G={size['num_generations']} x {size['response_length']} tokens)"
    return f"PPO ({size['batch_size']} prompts x {size['response_length']} tokens, 2 minibatches)"


def markdown(rows: list[dict], sizes: dict, steps: dict, warmup: int, threads: int, adamw: dict | None, title: str = MODELS["smollm2"][0]) -> str:
    stages = [s for s in STAGES if any(r["stage"] == s for r in rows)]
    repeats = len({r["repeat"] for r in rows})
    ratio_headers = ["stage", "olingo / minimal wall", "olingo / minimal CPU", "olingo / TRL wall", "olingo / TRL CPU", "TRL / minimal CPU"]
    ratios = [[describe(s, sizes[s]), spread(paired(rows, s, "olingo", "minimal", "wall_s")), spread(paired(rows, s, "olingo", "minimal", "cpu_s")),
               spread(paired(rows, s, "olingo", "trl", "wall_s")), spread(paired(rows, s, "olingo", "trl", "cpu_s")),
               spread(paired(rows, s, "trl", "minimal", "cpu_s"))] for s in stages]
    ratios += [[f"{describe(s, sizes[s])}, {REUSE}", spread(paired(rows, s, REUSE, "minimal", "wall_s")), spread(paired(rows, s, REUSE, "minimal", "cpu_s")),
                spread(paired(rows, s, REUSE, "trl", "wall_s")), spread(paired(rows, s, REUSE, "trl", "cpu_s")), "-"]
               for s in stages if any(r["stage"] == s and r["impl"] == REUSE for r in rows)]
    headers = ["stage", "impl", "wall ms/step", "CPU ms/step", "CPU / wall", "tokens/s", "gen tokens/s", "peak RSS MB", "load 1m"]
    lines = []
    for s in stages:
        for impl in IMPLS + (REUSE,):
            mine = [r for r in rows if r["stage"] == s and r["impl"] == impl]
            if not mine:
                continue
            gen = [r["gen_tokens_per_s"] for r in mine if r["gen_tokens_per_s"]]
            lines.append([s, impl, spread([r["wall_s"] for r in mine], 1000), spread([r["cpu_s"] for r in mine], 1000),
                          median([r["cpu_s"] / r["wall_s"] for r in mine]), spread([r["tokens_per_s"] for r in mine]),
                          spread(gen) if gen else "-", spread([r["peak_rss_mb"] for r in mine]), spread([r["load_avg_1m"] for r in mine])])
    intro = (f"## {title}\n\n"
             f"olingo, the minimal loop and TRL on the same weights, data and batches. Every run is a fresh process with {threads} torch "
             f"thread(s); a run's step time is the median of its timed steps ({', '.join(f'{s}: {n}' for s, n in steps.items())}) after {warmup} "
             "warm-up step(s). Wall time is end to end; "
             "CPU time is the process's user + system time over the same interval (all threads), which other processes on the machine "
             f"change far less. Each value is median [min-max] over {repeats} repeats; in a repeat the three implementations ran back to "
             "back (order rotating between repeats), and a ratio is computed within a repeat, then summarised.\n\n"
             "### Ratios (paired per repeat: median [min-max])\n\n")
    detail = ("\n### Every implementation\n\n`tokens/s`: tokens of the step's training batch (rows x sequence length) per wall second; "
              "`gen tokens/s`: generated tokens per second inside `generate` (PPO, GRPO); `load 1m`: the machine's 1-minute load average "
              "when the run started (this benchmark's own process counts 1).\n\n")
    text = intro + table(ratio_headers, ratios) + detail + table(headers, lines)
    if adamw:
        probe = [[name, 1000 * adamw[name]["wall_s"], 1000 * adamw[name]["cpu_s"]] for name in ("default", "foreach", "fused")]
        text += (f"\n### AdamW alone\n\nOne `torch.optim.AdamW` step over the policy's {adamw['parameters'] / 1e6:.1f}M parameters with fresh "
                 f"gradients, {adamw['torch_threads']} thread(s), in a process of its own: torch's CPU default (what the minimal loops build, "
                 "and olingo's `implementation: torch`), `foreach=True`, and `fused=True` (TRL's default `adamw_torch_fused`, and olingo's "
                 "`implementation: auto`, the default). Every RM, DPO and GRPO "
                 "step has one such step, a PPO update four (actor and critic, 2 minibatches).\n\n" + table(["AdamW", "wall ms/step", "CPU ms/step"], probe))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of every implementation per stage; ratios are paired per repeat")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per RM, DPO and GRPO run, after --warmup")
    parser.add_argument("--ppo-steps", type=int, default=2, help="timed updates per PPO run, after --warmup")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps at the start of every run")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads in every run")
    parser.add_argument("--only", default=",".join(STAGES), help="comma-separated stages among rm,dpo,grpo,ppo")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 1 timed step, tiny batches: a smoke run written to NAME_quick")
    parser.add_argument("--name", help="results file name under bench/results/ (default: real, real_realistic, vocab262k_realistic, ...; --quick adds _quick)")
    parser.add_argument("--sizes", choices=sorted(SIZE_SETS), default="small", help="batch sizes: small (a step in seconds) or realistic")
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2", help="the real SmolLM2 weights, or a random-init 262k-vocabulary model")
    parser.add_argument("--no-adamw-probe", action="store_true", help="skip timing AdamW alone")
    parser.add_argument("--rm-prompt-length", type=int, default=0,
                        help="RM pairs share their first N tokens, as responses to one prompt do (default 0: no shared prompt)")
    parser.add_argument("--ppo-reuse", action="store_true", help=f"PPO also as {REUSE}: olingo taking pi_old from generate's logits, as TRL does")
    parser.add_argument("--adamw-probe", metavar="POLICY_DIR", help=argparse.SUPPRESS)  # internal: the probe's own process
    args = parser.parse_args()
    if args.adamw_probe:
        print(json.dumps(adamw_probe(args.adamw_probe)))
        return
    stages = [s for s in args.only.split(",") if s]
    if unknown := set(stages) - set(STAGES):
        parser.error(f"unknown stages {sorted(unknown)}; choose among {','.join(STAGES)}")
    sizes = QUICK_SIZES if args.quick else SIZE_SETS[args.sizes]
    if args.rm_prompt_length:
        sizes = {**sizes, "rm": {**sizes["rm"], "prompt_length": args.rm_prompt_length}}
    if args.quick:
        args.repeats, args.steps, args.ppo_steps = 1, 1, 1
    steps = {s: args.ppo_steps if s == "ppo" else args.steps for s in stages}
    WORK.mkdir(parents=True, exist_ok=True)
    models = workload.build_big_vocab_models(WORK) if args.model == "vocab262k" else workload.build_real_models(WORK)
    from bench.trl.env import versions

    info = machine(run_git=False) | {"model": MODELS[args.model][1], "model_dirs": models, "sizes_name": args.sizes,
                        "torch_threads": args.threads, "steps": steps, "warmup": args.warmup, "sizes": {s: sizes[s] for s in stages}}
    info["git"] = f"{info['git']} (measured on its working tree)"
    info["extra_versions"] = {"trl (RM, DPO, GRPO)": versions("rm").get("trl", "?"), "trl (PPO)": versions("ppo").get("trl", "?")}
    specs = {s: stage_spec(s, sizes[s], models, steps[s], args.warmup, args.threads) for s in stages}
    start, rows = time.time(), []
    adamw = None if args.no_adamw_probe else run_adamw_probe(models["policy"], args.threads)
    if adamw:
        info["adamw_probe"] = adamw
        probes = ", ".join(f"{k} {1000 * adamw[k]['wall_s']:.0f} / {1000 * adamw[k]['cpu_s']:.0f}" for k in ("default", "foreach", "fused"))
        print("AdamW step alone (ms wall / CPU): " + probes, flush=True)
    for repeat in range(args.repeats):
        for stage in stages:
            impls = impls_for(stage, args.ppo_reuse)
            order = impls[repeat % len(impls):] + impls[: repeat % len(impls)]
            for impl in order:
                row = measure(stage, impl, repeat, specs[stage], args.threads)
                rows.append(row)
                print(f"{stage:>4} {impl:>17} r{repeat}: wall {1000 * row['wall_s']:8.0f} ms/step  cpu {1000 * row['cpu_s']:8.0f} ms/step  "
                      f"{row['peak_rss_mb']:6.0f} MB  load {row['load_avg_1m']:.1f}  ({row['process_s']:.0f} s, {time.time() - start:.0f} s in)", flush=True)
    default_name = ("real" if args.model == "smollm2" else args.model) + ("" if args.sizes == "small" else f"_{args.sizes}")
    name = args.name or (f"{default_name}_quick" if args.quick else default_name)
    info["total_s"] = round(time.time() - start)
    print(write_results(name, rows, info, markdown(rows, sizes, steps, args.warmup, args.threads, adamw, MODELS[args.model][0])))
    print(f"done in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
