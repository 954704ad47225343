"""The benchmark suite: olingo vs a minimal PyTorch loop vs TRL, side by side in one run.

    python bench/suite.py [--repeats 3] [--only rm|ppo|grpo|dpo] [--no-trl] [--quick]

Reward-model training (`bench/rm_run.py`, `bench/trl/rm_trl.py`), PPO (`bench/ppo_run.py`,
`bench/trl/ppo_trl.py`), GRPO (`bench/grpo_run.py`, `bench/trl/grpo_trl.py`) and DPO
(`bench/dpo_run.py`, `bench/trl/dpo_trl.py`) run on the workloads of `bench/workload.py`: a base
configuration and one variation per scaling axis (model size, sequence/response length, batch size;
for GRPO the group size G and the response length).
For each repeat, every configuration runs every implementation once, in a rotating order, each
in a fresh process; reported numbers are medians over repeats of each run's median step. Ratios
compare implementations within this one run. Writes bench/results/{rm,ppo,grpo,dpo}.{jsonl,md}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import workload  # noqa: E402
from bench.common import BENCH, OLINGO_PYTHON, machine, median, run_impl, table, write_results  # noqa: E402
from bench.phases import PHASES  # noqa: E402

WORK = BENCH / ".work"
RM_BASE = {"size": "h128x2", "length": 64, "batch_size": 8}
RM_AXES = [("size", "h256x4"), ("length", 128), ("batch_size", 16)]
PPO_BASE = {"size": "h128x2", "response_length": 16, "batch_size": 16}
PPO_AXES = [("size", "h256x4"), ("response_length", 32), ("batch_size", 32)]
RM_OPTIM = {"lr": 1e-4, "weight_decay": 0.1, "adam_betas": [0.9, 0.95], "max_grad_norm": 1.0, "warmup_ratio": 0.025, "min_lr_ratio": 0.1, "seed": 0}
# GRPO: B prompts x G responses = 128 rollouts per optimizer step in every configuration
GRPO_CONFIGS = [
    {"name": "base", "size": "h128x2", "batch_size": 16, "num_generations": 8, "response_length": 8},
    {"name": "G=16,prompts=8", "size": "h128x2", "batch_size": 8, "num_generations": 16, "response_length": 8},
    {"name": "response_length=32", "size": "h128x2", "batch_size": 16, "num_generations": 8, "response_length": 32},
]
GRPO_ALGO = {"temperature": 1.0, "lr": 1e-5, "eps_low": 0.2, "eps_high": 0.2, "seed": 0}
# DPO: pairs of a 32-token prompt and two responses (each ending with eos), B pairs per optimizer step
DPO_BASE = {"size": "h128x2", "prompt_length": 32, "response_length": 32, "batch_size": 8}
DPO_AXES = [("size", "h256x4"), ("response_length", 96), ("batch_size", 16)]
DPO_ALGO = {**RM_OPTIM, "beta": 0.1}
DPO_IMPLS = ["minimal", "minimal+precompute", "olingo", "olingo+precompute"]
DPO_TRL_IMPLS = ["trl-fp32", "trl-fp32+precompute"]
PPO_ALGO = {"ppo_epochs": 1, "temperature": 1.0, "kl_coef": 0.05, "cliprange": 0.2, "vf_coef": 0.1, "cliprange_value": 0.2,
            "gamma": 1.0, "lam": 0.95, "lr": 1e-5, "seed": 0}


def configurations(base: dict, axes: list[tuple[str, object]]) -> list[dict]:
    """The base configuration, then one per axis with that one value changed."""
    return [dict(base, name="base")] + [dict(base, **{key: value}, name=f"{key}={value}") for key, value in axes]


def trl_python(which: str) -> Path:
    from bench.trl.env import ensure_venv

    return ensure_venv(which)


# ---- reward model ---------------------------------------------------------------------------
def rm_spec(config: dict, steps: int, warmup: int) -> dict:
    models = workload.build_models(WORK, config["size"])
    rows = (steps + warmup) * config["batch_size"]
    data = workload.write_pairs(WORK, config["length"], rows)
    return {**RM_OPTIM, "model_dir": models["reward"], "data": data, "batch_size": config["batch_size"], "steps": steps, "warmup_steps": warmup}


def run_rm(args, impls: list[str]) -> list[dict]:
    rows = []
    configs = configurations(RM_BASE, RM_AXES)
    for repeat in range(args.repeats):
        for config in configs:
            spec = rm_spec(config, args.rm_steps, 3)
            order = impls[repeat % len(impls):] + impls[: repeat % len(impls)]
            for impl in order:
                if impl.startswith("trl"):
                    result = run_impl(trl_python("rm"), BENCH / "trl" / "rm_trl.py", {**spec, "mode": impl.split("-", 1)[1]}, WORK / "runs", f"rm-{impl}")
                    times = result["iter_times_s"][-args.rm_steps + 1:]  # end to end, like ours
                else:
                    result = run_impl(OLINGO_PYTHON, BENCH / "rm_run.py", {**spec, "impl": impl}, WORK / "runs", f"rm-{impl}")
                    times = result["step_times_s"]
                row = {"bench": "rm", "config": config["name"], **config, "impl": impl, "repeat": repeat, "step_s": median(times),
                       "pairs_per_s": config["batch_size"] / median(times), "peak_rss_mb": result["peak_rss_mb"], "final_loss": result.get("final_loss")}
                rows.append(row)
                print(f"rm {config['name']:>16} {impl:>13} r{repeat}: {1000 * row['step_s']:7.1f} ms/step  {row['peak_rss_mb']:6.0f} MB", flush=True)
    return rows


def rm_markdown(rows: list[dict], impls: list[str]) -> str:
    out = ["## Reward-model training (fp32 unless noted; median ms per optimizer step, end to end)\n"]
    headers = ["config", "impl", "ms/step", "pairs/s", "x minimal", "peak RSS MB"]
    lines = []
    for config in dict.fromkeys(r["config"] for r in rows):
        base = median([r["step_s"] for r in rows if r["config"] == config and r["impl"] == "minimal"])
        for impl in impls:
            mine = [r for r in rows if r["config"] == config and r["impl"] == impl]
            step = median([r["step_s"] for r in mine])
            lines.append([config, impl, 1000 * step, median([r["pairs_per_s"] for r in mine]), step / base, median([r["peak_rss_mb"] for r in mine])])
    return "\n".join(out) + table(headers, lines)


# ---- PPO ------------------------------------------------------------------------------------
def ppo_spec(config: dict, updates: int, warmup: int) -> dict:
    models = workload.build_models(WORK, config["size"])
    prompts = workload.write_prompts(WORK, 16, 256)
    return {**PPO_ALGO, "policy_dir": models["policy"], "reward_dir": models["reward"], "value_dir": models["value"], "prompts": prompts,
            "batch_size": config["batch_size"], "mini_batch_size": config["batch_size"] // 2, "response_length": config["response_length"],
            "updates": updates, "warmup_updates": warmup}


OLINGO_VARIANTS = {  # optimisations, each switchable: impl name -> (runner impl, spec changes)
    "olingo": ("olingo", {}),
    "olingo+reuse_logp": ("olingo", {"olingo_experience": {"reuse_rollout_log_probs": True}}),
    "olingo kl=0": ("olingo", {"kl_coef": 0.0}),
    "olingo kl=0+skip_ref": ("olingo", {"kl_coef": 0.0, "olingo_experience": {"skip_reference_when_kl_zero": True}}),
}


MODEL_PHASES = ("generation", "actor_fwd", "ref_fwd", "critic_fwd", "reward_fwd", "learn")


def phase_sums(result: dict) -> list[dict]:
    """Per update: {phase: seconds} in our phase names, for our runners and TRL's alike;
    `learn` is forwards with gradients + backward + optimizer steps."""
    if isinstance(result["phase_s"], list):
        return [{**p, "learn": p.get("learn_fwd", 0.0) + p.get("learn_bwd", 0.0) + p.get("learn_optim", 0.0)} for p in result["phase_s"]]
    trl = result["phase_s"]  # {trl phase: [per update]}
    names = {"generation": "generation", "policy_forward": "actor_fwd", "ref_forward": "ref_fwd", "value_forward": "critic_fwd",
             "reward_forward": "reward_fwd", "learning": "learn"}
    count = len(result["update_times_s"])
    return [{ours: trl.get(theirs, [0.0] * count)[i] for theirs, ours in names.items()} for i in range(count)]


def ppo_row(config: dict, impl: str, repeat: int, result: dict) -> dict:
    updates, phases = result["update_times_s"], phase_sums(result)
    row = {"bench": "ppo", "config": config["name"], **config, "impl": impl, "repeat": repeat, "update_s": median(updates),
           "peak_rss_mb": result["peak_rss_mb"]}
    for phase in (*PHASES, "learn"):
        row[f"{phase}_s"] = median([p.get(phase, 0.0) for p in phases])
    model_time = [sum(p.get(k, 0.0) for k in MODEL_PHASES) for p in phases]
    row["outside_share"] = median([1 - m / u for m, u in zip(model_time, updates, strict=True)])
    tokens = config["batch_size"] * config["response_length"]
    row["gen_tokens_per_s"] = tokens / row["generation_s"] if row["generation_s"] else float("nan")
    if "gc_s" in result:
        row["gc_s"] = median(result["gc_s"])
    return row


def run_ppo(args, impls: list[str]) -> list[dict]:
    rows = []
    configs = configurations(PPO_BASE, PPO_AXES)
    for repeat in range(args.repeats):
        for config in configs:
            spec = ppo_spec(config, args.ppo_updates, 2)
            names = impls if config["name"] == "base" else [i for i in impls if i in ("olingo", "minimal", "trl-ppo", "bare_generate")]
            order = names[repeat % len(names):] + names[: repeat % len(names)]
            for impl in order:
                if impl == "trl-ppo":
                    result = run_impl(trl_python("ppo"), BENCH / "trl" / "ppo_trl.py", {**spec, "mode": "fp32"}, WORK / "runs", "ppo-trl")
                else:
                    runner, changes = OLINGO_VARIANTS.get(impl, (impl, {}))
                    result = run_impl(OLINGO_PYTHON, BENCH / "ppo_run.py", {**spec, **changes, "impl": runner}, WORK / "runs", f"ppo-{impl}")
                row = ppo_row(config, impl, repeat, result)
                rows.append(row)
                print(f"ppo {config['name']:>18} {impl:>20} r{repeat}: {row['update_s']:6.3f} s/update gen {row['generation_s']:.3f} "
                      f"learn {row['learn_s']:.3f} outside {100 * row['outside_share']:4.1f}%  {row['peak_rss_mb']:6.0f} MB", flush=True)
    return rows


def ppo_markdown(rows: list[dict]) -> str:
    headers = ["config", "impl", "s/update", "x minimal", "generation", "actor fwd", "ref fwd", "critic fwd", "reward fwd", "learn",
               "outside models", "gen tok/s", "peak RSS MB"]
    lines = []
    for config in dict.fromkeys(r["config"] for r in rows):
        base = median([r["update_s"] for r in rows if r["config"] == config and r["impl"] == "minimal"])
        for impl in dict.fromkeys(r["impl"] for r in rows if r["config"] == config):
            mine = [r for r in rows if r["config"] == config and r["impl"] == impl]
            keys = ("update_s", "generation_s", "actor_fwd_s", "ref_fwd_s", "critic_fwd_s", "reward_fwd_s", "learn_s", "outside_share",
                    "gen_tokens_per_s", "peak_rss_mb")
            m = {key: median([r[key] for r in mine]) for key in keys}
            lines.append([config, impl, m["update_s"], m["update_s"] / base, m["generation_s"], m["actor_fwd_s"], m["ref_fwd_s"], m["critic_fwd_s"],
                          m["reward_fwd_s"], m["learn_s"], f"{100 * m['outside_share']:.1f}%", m["gen_tokens_per_s"], m["peak_rss_mb"]])
    intro = ("## PPO (fp32; median seconds per update and per phase; one update = generate, score, 1 PPO epoch over 2 minibatches)\n\n"
             "`bare_generate` is `generate` alone on the same batch: its tok/s is the ceiling for the generation phase.\n\n")
    return intro + table(headers, lines)


# ---- GRPO -----------------------------------------------------------------------------------
def grpo_spec(config: dict, updates: int, warmup: int) -> dict:
    models = workload.build_models(WORK, config["size"])
    return {**GRPO_ALGO, "policy_dir": models["policy"], "prompts": workload.write_arithmetic_prompts(WORK, 512),
            "batch_size": config["batch_size"], "num_generations": config["num_generations"], "response_length": config["response_length"],
            "updates": updates, "warmup_updates": warmup}


GRPO_PHASES = ("generation", "scoring", "reward_fn", "learn")


def grpo_row(config: dict, impl: str, repeat: int, result: dict) -> dict:
    steps = result["step_times_s"]
    phases = [{**p, "learn": p.get("learn_fwd", 0.0) + p.get("learn_bwd", 0.0) + p.get("learn_optim", 0.0)} for p in result["phase_s"]]
    row = {"bench": "grpo", "config": config["name"], **{k: v for k, v in config.items() if k != "name"}, "impl": impl, "repeat": repeat,
           "step_s": median(steps), "peak_rss_mb": result["peak_rss_mb"], "mean_reward": sum(result["mean_reward"]) / len(result["mean_reward"])}
    for phase in (*GRPO_PHASES, "learn_fwd", "learn_bwd", "learn_optim", "actor_fwd"):
        row[f"{phase}_s"] = median([p.get(phase, 0.0) for p in phases])
    # the rest of the step: outside generation, scoring and learning (clipping, logging, batching, hooks)
    row["other_s"] = median([s - sum(p.get(k, 0.0) for k in ("generation", "scoring", "learn")) for s, p in zip(steps, phases, strict=True)])
    tokens = config["batch_size"] * config["num_generations"] * config["response_length"]
    row["gen_tokens_per_s"] = tokens / row["generation_s"] if row["generation_s"] else float("nan")
    return row


def run_grpo(args, impls: list[str]) -> list[dict]:
    rows = []
    for repeat in range(args.repeats):
        for config in GRPO_CONFIGS:
            spec = grpo_spec(config, args.grpo_updates, 2) | ({"threads": args.threads} if args.threads else {})
            order = impls[repeat % len(impls):] + impls[: repeat % len(impls)]
            for impl in order:
                load = os.getloadavg()[0]  # other work on the machine when the run started (the tables use medians)
                if impl.startswith("trl"):
                    result = run_impl(trl_python("grpo"), BENCH / "trl" / "grpo_trl.py", {**spec, "mode": impl.split("-", 1)[1]}, WORK / "runs", f"grpo-{impl}")
                else:
                    result = run_impl(OLINGO_PYTHON, BENCH / "grpo_run.py", {**spec, "impl": impl}, WORK / "runs", f"grpo-{impl}")
                row = grpo_row(config, impl, repeat, result) | {"load_avg_1m": load}
                rows.append(row)
                print(f"grpo {config['name']:>18} {impl:>9} r{repeat}: {row['step_s']:6.3f} s/step gen {row['generation_s']:.3f} "
                      f"scoring {row['scoring_s']:.4f} learn {row['learn_s']:.3f} other {row['other_s']:.4f}  {row['peak_rss_mb']:6.0f} MB", flush=True)
    return rows


def ratio_spread(rows: list[dict], config: str, impl: str, base: str = "minimal") -> tuple[float, float, float]:
    """impl / base per repeat (the two ran side by side): median, min, max over repeats."""
    by = {(r["impl"], r["repeat"]): r["step_s"] for r in rows if r["config"] == config}
    ratios = [by[(impl, k)] / by[(base, k)] for (i, k) in by if i == impl and (base, k) in by]
    return median(ratios), min(ratios), max(ratios)


def grpo_markdown(rows: list[dict], threads: int | None = None) -> str:
    configs, impls = list(dict.fromkeys(r["config"] for r in rows)), list(dict.fromkeys(r["impl"] for r in rows))
    repeats = len({r["repeat"] for r in rows})
    summary_headers = ["config (prompts x G, response tokens)", "olingo s/step", "minimal s/step", "olingo / minimal: median [min-max]"]
    has_trl = any(i.startswith("trl") for i in impls)
    if has_trl:
        summary_headers += ["TRL s/step", "TRL / minimal", "olingo / TRL"]
    summary = []
    for config in configs:
        c = next(r for r in rows if r["config"] == config)
        step = {i: median([r["step_s"] for r in rows if r["config"] == config and r["impl"] == i]) for i in impls}
        mid, lo, hi = ratio_spread(rows, config, "olingo")
        shape = f"{c['batch_size']} x {c['num_generations']}, {c['response_length']}"
        line = [f"{config} ({shape})", step["olingo"], step["minimal"], f"{mid:.3f} [{lo:.3f}-{hi:.3f}]"]
        if has_trl:
            trl = next(i for i in impls if i.startswith("trl"))
            t_mid, t_lo, t_hi = ratio_spread(rows, config, trl)
            o_mid, o_lo, o_hi = ratio_spread(rows, config, "olingo", trl)
            line += [step[trl], f"{t_mid:.3f} [{t_lo:.3f}-{t_hi:.3f}]", f"{o_mid:.3f} [{o_lo:.3f}-{o_hi:.3f}]"]
        summary.append(line)
    headers = ["config", "impl", "s/step", "x minimal", "generation", "scoring", "(reward fn)", "learn", "other", "gen tok/s", "peak RSS MB", "mean reward"]
    lines = []
    for config in configs:
        base = median([r["step_s"] for r in rows if r["config"] == config and r["impl"] == "minimal"])
        for impl in impls:
            mine = [r for r in rows if r["config"] == config and r["impl"] == impl]
            keys = ("step_s", "generation_s", "scoring_s", "reward_fn_s", "learn_s", "other_s", "gen_tokens_per_s", "peak_rss_mb", "mean_reward")
            m = {key: median([r[key] for r in mine]) for key in keys}
            lines.append([config, impl, m["step_s"], m["step_s"] / base, m["generation_s"], m["scoring_s"], m["reward_fn_s"], m["learn_s"], m["other_s"],
                          m["gen_tokens_per_s"], m["peak_rss_mb"], m["mean_reward"]])
    intro = (f"## GRPO (fp32; one optimizer step = B prompts x G responses generated, scored by the arithmetic checker, group-normalised "
             f"advantages, token-mean clipped loss, one AdamW step; mu = 1, kl_coef 0)\n\n"
             f"Ratios are per repeat (the implementations ran side by side, in rotating order), then the median and range over {repeats} repeats. "
             f"Torch intra-op threads: {threads or 'default (one per core)'}.\n\n")
    detail = ("\n### Phases (median seconds per step)\n\n`scoring` is the time from the end of `generate` to the first forward with gradients "
              "(decoding, the reward function, advantages, batching); `(reward fn)` is the part of it inside the reward call; `learn` is "
              "forward with gradients + backward + optimizer step; `other` is the rest of the step (gradient clipping, logging, data, hooks).\n\n")
    return intro + table(summary_headers, summary) + detail + table(headers, lines)


# ---- DPO ------------------------------------------------------------------------------------
def dpo_spec(config: dict, steps: int, warmup: int) -> dict:
    models = workload.build_models(WORK, config["size"])
    rows = (steps + warmup) * config["batch_size"]
    data = workload.write_dpo_pairs(WORK, config["prompt_length"], config["response_length"], rows)
    return {**DPO_ALGO, "policy_dir": models["policy"], "data": data, "prompt_length": config["prompt_length"],
            "response_length": config["response_length"], "batch_size": config["batch_size"], "steps": steps, "warmup_steps": warmup}


def run_dpo(args, impls: list[str]) -> list[dict]:
    rows = []
    configs = configurations(DPO_BASE, DPO_AXES)
    for repeat in range(args.repeats):
        for config in configs:
            spec = dpo_spec(config, args.dpo_steps, 3)
            order = impls[repeat % len(impls):] + impls[: repeat % len(impls)]
            for impl in order:
                load = os.getloadavg()[0]  # other work on the machine when the run started
                if impl.startswith("trl"):
                    result = run_impl(trl_python("dpo"), BENCH / "trl" / "dpo_trl.py", {**spec, "mode": impl.split("-", 1)[1]}, WORK / "runs", f"dpo-{impl}")
                else:
                    result = run_impl(OLINGO_PYTHON, BENCH / "dpo_run.py", {**spec, "impl": impl}, WORK / "runs", f"dpo-{impl}")
                step, cpu = median(result["step_times_s"]), median(result["cpu_times_s"])
                row = {"bench": "dpo", "config": config["name"], **{k: v for k, v in config.items() if k != "name"}, "impl": impl, "repeat": repeat,
                       "step_s": step, "cpu_s": cpu, "pairs_per_s": config["batch_size"] / step, "precompute_s": result["precompute_s"],
                       "peak_rss_mb": result["peak_rss_mb"], "final_loss": result["final_loss"], "load_avg_1m": load}
                rows.append(row)
                pre = f"  precompute {row['precompute_s']:.2f} s" if row["precompute_s"] is not None else ""
                print(f"dpo {config['name']:>19} {impl:>19} r{repeat}: {1000 * step:7.1f} ms/step  cpu {1000 * cpu:7.1f} ms  "
                      f"{row['peak_rss_mb']:6.0f} MB  loss {row['final_loss']:.5f}{pre}", flush=True)
    return rows


def dpo_markdown(rows: list[dict]) -> str:
    configs, impls = list(dict.fromkeys(r["config"] for r in rows)), list(dict.fromkeys(r["impl"] for r in rows))
    repeats = len({r["repeat"] for r in rows})

    def spread(impl: str, base: str, config: str) -> str:
        mid, lo, hi = ratio_spread(rows, config, impl, base)
        return f"{mid:.3f} [{lo:.3f}-{hi:.3f}]"

    def step(config: str, impl: str) -> float:
        return median([r["step_s"] for r in rows if r["config"] == config and r["impl"] == impl])

    summaries = []
    for suffix, title in (("", "live reference (a frozen copy, forward under no_grad every step)"),
                          ("+precompute", "precomputed reference log-probs (one pass before training, outside the step)")):
        olingo, minimal, trl = f"olingo{suffix}", f"minimal{suffix}", f"trl-fp32{suffix}"
        has_trl = trl in impls
        headers = ["config (P + R tokens, B pairs)", "olingo ms/step", "minimal ms/step", "olingo / minimal: median [min-max]"]
        if has_trl:
            headers += ["TRL ms/step", "TRL / minimal", "olingo / TRL"]
        lines = []
        for config in configs:
            c = next(r for r in rows if r["config"] == config)
            line = [f"{config} ({c['prompt_length']} + {c['response_length']}, {c['batch_size']})", 1000 * step(config, olingo), 1000 * step(config, minimal),
                    spread(olingo, minimal, config)]
            if has_trl:
                line += [1000 * step(config, trl), spread(trl, minimal, config), spread(olingo, trl, config)]
            lines.append(line)
        summaries.append(f"### {title}\n\n" + table(headers, lines))
    headers = ["config", "impl", "ms/step", "x minimal", "CPU ms/step", "CPU / wall", "pairs/s", "precompute s", "peak RSS MB", "final loss"]
    lines = []
    for config in configs:
        for impl in impls:
            mine = [r for r in rows if r["config"] == config and r["impl"] == impl]
            base = step(config, "minimal+precompute" if impl.endswith("+precompute") else "minimal")
            m = {key: median([r[key] for r in mine]) for key in ("step_s", "cpu_s", "pairs_per_s", "peak_rss_mb", "final_loss")}
            pre = [r["precompute_s"] for r in mine if r["precompute_s"] is not None]
            lines.append([config, impl, 1000 * m["step_s"], m["step_s"] / base, 1000 * m["cpu_s"], m["cpu_s"] / m["step_s"], m["pairs_per_s"],
                          median(pre) if pre else "-", m["peak_rss_mb"], m["final_loss"]])
    intro = ("## DPO (fp32; one optimizer step = one policy forward of the 2B chosen+rejected rows, summed response log-probs, the "
             "reference's log-probs of the same rows, sigmoid loss with beta 0.1, backward, clipping, AdamW, cosine schedule)\n\n"
             f"Ratios are per repeat (the implementations ran side by side, in rotating order), then the median and range over {repeats} "
             "repeats. A step is end to end (end of one optimizer step to the end of the next).\n\n")
    detail = ("\n### Every implementation (medians over repeats)\n\n`x minimal` is against the minimal loop with the same kind of reference "
              "(live or precomputed). `CPU ms/step` is the process's user + system time over the step (all threads). `precompute s` is "
              "the one-off reference pass before training (olingo: `DPOTrainer._precompute_reference`, fingerprint, pass of 32 pairs a "
              "batch and cache file; TRL: `hash_module` and `_precompute_ref_logps`, B pairs a batch, Arrow cache; minimal: the pass, B "
              "pairs a batch). Every implementation trains on the same batches in the same order, so their final losses agree.\n\n")
    return intro + "\n".join(summaries) + detail + table(headers, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of every implementation per configuration (medians are reported)")
    parser.add_argument("--only", choices=["rm", "ppo", "grpo", "dpo"], help="run one benchmark")
    parser.add_argument("--no-trl", action="store_true", help="skip TRL (no venvs are built)")
    parser.add_argument("--rm-steps", type=int, default=30, help="timed optimizer steps per reward-model run")
    parser.add_argument("--ppo-updates", type=int, default=8, help="timed updates per PPO run")
    parser.add_argument("--grpo-updates", type=int, default=8, help="timed optimizer steps per GRPO run")
    parser.add_argument("--dpo-steps", type=int, default=30, help="timed optimizer steps per DPO run")
    parser.add_argument("--dpo-name", help="DPO: results file name under bench/results/ (default dpo; dpo_quick with --quick)")
    parser.add_argument("--quick", action="store_true", help="1 repeat, few steps: a smoke run, not results")
    parser.add_argument("--threads", type=int, help="GRPO: torch intra-op threads in every run (default: torch's, one per core)")
    parser.add_argument("--grpo-name", default="grpo", help="GRPO: results file name under bench/results/ (e.g. grpo_threads1)")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.rm_steps, args.ppo_updates, args.grpo_updates, args.dpo_steps = 1, 5, 2, 2, 5
    WORK.mkdir(parents=True, exist_ok=True)
    info = machine()
    if not args.no_trl:
        from bench.trl.env import versions

        info["extra_versions"] = {}
        if args.only in (None, "rm", "grpo", "dpo"):
            info["extra_versions"]["trl (RM, GRPO, DPO)"] = versions("rm").get("trl", "?")
        if args.only in (None, "ppo"):
            info["extra_versions"]["trl (PPO)"] = versions("ppo").get("trl", "?")
    start = time.time()
    if args.only in (None, "rm"):
        impls = ["minimal", "olingo"] + ([] if args.no_trl else ["trl-fp32", "trl-defaults"])
        if not args.no_trl:
            trl_python("rm")
        rows = run_rm(args, impls)
        print(write_results("rm", rows, info, rm_markdown(rows, impls)))
    if args.only in (None, "ppo"):
        impls = ["minimal", "olingo", "bare_generate", *[v for v in OLINGO_VARIANTS if v != "olingo"]] + ([] if args.no_trl else ["trl-ppo"])
        if not args.no_trl:
            trl_python("ppo")
        rows = run_ppo(args, impls)
        print(write_results("ppo", rows, info, ppo_markdown(rows)))
    if args.only in (None, "grpo"):
        impls = ["minimal", "olingo"] + ([] if args.no_trl else ["trl-fp32"])
        if not args.no_trl:
            trl_python("grpo")
        rows = run_grpo(args, impls)
        info_grpo = {**info, "git": f"{info['git']} (measured on its working tree)", "torch_threads": args.threads or "default (one per core)"}
        print(write_results(args.grpo_name, rows, info_grpo, grpo_markdown(rows, args.threads)))
    if args.only in (None, "dpo"):
        impls = DPO_IMPLS + ([] if args.no_trl else DPO_TRL_IMPLS)
        if not args.no_trl:
            trl_python("dpo")
        rows = run_dpo(args, impls)
        name = args.dpo_name or ("dpo_quick" if args.quick else "dpo")  # a smoke run never replaces the committed table
        print(write_results(name, rows, {**info, "git": f"{info['git']} (measured on its working tree)"}, dpo_markdown(rows)))
    print(f"done in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
