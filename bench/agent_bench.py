"""Multi-turn GRPO: olingo's `MultiTurnSource` against TRL 1.16's `GRPOTrainer(environment_factory=...)`.

    python bench/agent_bench.py [--repeats 3] [--updates 6] [--threads 1] [--quick] [--no-trl]

The same environment, policy, prompts and limits on both sides (`bench/agent_env.py`): B prompts x G
episodes per optimizer step, `max_turns` assistant turns per episode (each one Hermes tool call,
`max_new_tokens` at most), a tool reply between two turns, the token-mean clipped loss over the
sampled tokens and one AdamW step (`bench/agent_run.py`, `bench/trl/agent_trl.py`). For each
repeat, every configuration runs each implementation once, in a rotating order, each in a fresh
process; ratios olingo / TRL are per repeat, then the median and range. Both runners report the
tokens each step ran by role (sampled by the policy vs written by the environment), and the table
says whether the two sides ran the same ones. Writes bench/results/agent.{jsonl,md}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import workload  # noqa: E402
from bench.agent_env import build_agent_policy, write_agent_prompts  # noqa: E402
from bench.common import BENCH, OLINGO_PYTHON, machine, median, run_impl, table, write_results  # noqa: E402

WORK = BENCH / ".work"
CONFIGS = [
    {"name": "base", "batch_size": 4, "num_generations": 8, "max_turns": 3, "max_new_tokens": 64, "max_episode_tokens": 512},
    {"name": "turns=5", "batch_size": 4, "num_generations": 8, "max_turns": 5, "max_new_tokens": 64, "max_episode_tokens": 512},
]
ALGO = {"temperature": 1.0, "lr": 1e-5, "eps_low": 0.2, "eps_high": 0.2, "seed": 0}


def spec_for(config: dict, args) -> dict:
    """The run spec of one configuration (the scripted policy and prompts are built once)."""
    arithmetic = workload.write_arithmetic_prompts(WORK, 512)
    policy = build_agent_policy(WORK, arithmetic)  # taught episodes of up to 5 turns (CONFIGS has no more)
    prompts = write_agent_prompts(WORK, arithmetic, policy)
    spec = {**ALGO, **{k: v for k, v in config.items() if k != "name"}, "policy_dir": policy, "prompts": prompts,
            "updates": args.updates, "warmup_updates": 2 if not args.quick else 1}
    return spec | ({"threads": args.threads} if args.threads else {})


def agent_row(config: dict, impl: str, repeat: int, result: dict, load: float) -> dict:
    """One run's medians: step time, episodes/s, tokens/s by role, phases, peak RSS, tokens per step."""
    steps, tokens = result["step_times_s"], result["tokens"]
    step = median(steps)
    per_step = {key: median([float(t[key]) for t in tokens]) for key in ("episodes", "turns", "sampled", "env")}
    phases = [{**p, "learn": p.get("learn_fwd", 0.0) + p.get("learn_bwd", 0.0) + p.get("learn_optim", 0.0)} for p in result["phase_s"]]
    generation, learn = median([p.get("generation", 0.0) for p in phases]), median([p["learn"] for p in phases])
    row = {"bench": "agent", "config": config["name"], **{k: v for k, v in config.items() if k != "name"}, "impl": impl, "repeat": repeat,
           "step_s": step, "cpu_s": median(result["cpu_times_s"]), "episodes_per_s": per_step["episodes"] / step,
           "sampled_tokens_per_s": per_step["sampled"] / step, "env_tokens_per_s": per_step["env"] / step,
           "generation_s": generation, "learn_s": learn,
           "other_s": median([s - p.get("generation", 0.0) - p["learn"] for s, p in zip(steps, phases, strict=True)]),
           "peak_rss_mb": result["peak_rss_mb"], "load_avg_1m": load,
           "tokens_per_step": {k: sorted({int(t[k]) for t in tokens}) for k in ("episodes", "turns", "sampled", "env")}}
    if impl == "olingo":
        row["env_s"] = median([t["env_seconds"] for t in tokens])
    else:
        row["tool_loop_s"] = median([t["tool_loop_seconds"] for t in tokens])
        row["settings"] = result.get("settings")
    return row


def run_agent(args, impls: list[str]) -> list[dict]:
    rows = []
    configs = CONFIGS[:1] if args.quick else CONFIGS
    for repeat in range(args.repeats):
        for config in configs:
            spec = spec_for(config, args)
            order = impls[repeat % len(impls):] + impls[: repeat % len(impls)]
            for impl in order:
                load = os.getloadavg()[0]  # other work on the machine when the run started
                if impl == "trl":
                    from bench.trl.env import ensure_venv

                    result = run_impl(ensure_venv("grpo"), BENCH / "trl" / "agent_trl.py", spec, WORK / "runs", "agent-trl")
                else:
                    result = run_impl(OLINGO_PYTHON, BENCH / "agent_run.py", {**spec, "impl": impl}, WORK / "runs", f"agent-{impl}")
                row = agent_row(config, impl, repeat, result, load)
                rows.append(row)
                print(f"agent {config['name']:>8} {impl:>6} r{repeat}: {row['step_s']:6.3f} s/step gen {row['generation_s']:.3f} learn {row['learn_s']:.3f} "
                      f"other {row['other_s']:.3f}  {row['peak_rss_mb']:6.0f} MB  tokens {row['tokens_per_step']}  load {load:.1f}", flush=True)
    return rows


def ratio_spread(rows: list[dict], config: str, impl: str, base: str, key: str = "step_s") -> str:
    """impl / base of `key` (wall or CPU seconds per step) per repeat (they ran side by side): median [min-max]."""
    by = {(r["impl"], r["repeat"]): r[key] for r in rows if r["config"] == config}
    ratios = [by[(impl, k)] / by[(base, k)] for (i, k) in by if i == impl and (base, k) in by]
    return f"{median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]" if ratios else "-"


def agent_markdown(rows: list[dict], threads: int | None) -> str:
    configs, impls = list(dict.fromkeys(r["config"] for r in rows)), list(dict.fromkeys(r["impl"] for r in rows))
    repeats = len({r["repeat"] for r in rows})
    summary, detail = [], []
    for config in configs:
        c = next(r for r in rows if r["config"] == config)
        mine = {i: [r for r in rows if r["config"] == config and r["impl"] == i] for i in impls}
        same = len({str(r["tokens_per_step"]) for r in rows if r["config"] == config}) == 1
        tokens = c["tokens_per_step"]
        shape = f"{c['batch_size']} x {c['num_generations']}, {c['max_turns']} turns"
        line = [f"{config} ({shape})", f"{tokens['sampled']} / {tokens['env']}", "yes" if same else "NO"]
        line += [median([r["step_s"] for r in mine[i]]) for i in impls]
        line += [median([r["cpu_s"] for r in mine[i]]) for i in impls]
        summary.append(line + ([ratio_spread(rows, config, "olingo", "trl"), ratio_spread(rows, config, "olingo", "trl", "cpu_s")] if "trl" in impls else []))
        for impl in impls:
            m = {k: median([r[k] for r in mine[impl]]) for k in ("step_s", "cpu_s", "episodes_per_s", "sampled_tokens_per_s", "env_tokens_per_s",
                                                                 "generation_s", "learn_s", "other_s", "peak_rss_mb", "load_avg_1m")}
            env = median([r.get("env_s", r.get("tool_loop_s", 0.0)) for r in mine[impl]])
            detail.append([config, impl, m["step_s"], m["cpu_s"], m["episodes_per_s"], m["sampled_tokens_per_s"], m["env_tokens_per_s"],
                           m["generation_s"], m["learn_s"], m["other_s"], env, m["peak_rss_mb"], m["load_avg_1m"]])
    headers = ["config (prompts x G, turns)", "sampled / env tokens per step", "same tokens both sides"] + [f"{i} s/step" for i in impls]
    headers += [f"{i} CPU s/step" for i in impls]
    headers += ["olingo / TRL wall: median [min-max]", "olingo / TRL CPU"] if "trl" in impls else []
    intro = ("## Multi-turn GRPO (fp32; one optimizer step = B prompts x G episodes of `max_turns` tool-calling turns, tool replies between "
             "them, token-mean clipped loss over the sampled tokens, one AdamW step; mu = 1, kl_coef 0)\n\n"
             f"Ratios are per repeat (the implementations ran side by side, in rotating order), then the median and range over {repeats} "
             f"repeats. Torch intra-op threads: {threads or 'default (one per core)'}. Tokens per step are every step's count (one value: "
             "all steps alike).\n\n")
    detail_intro = ("\n### Every implementation (medians over repeats)\n\n`generation` is every `generate` call of the step; `learn` the "
                    "forward with gradients, backward and optimizer step; `other` the rest (environment, parsing, scoring, batching, "
                    "logging). `env / tool loop s` is olingo's `env_seconds` (resets and steps of the environments) and TRL's "
                    "`_tool_call_loop` (tool calls plus the generation of every turn after the first).\n\n")
    dheaders = ["config", "impl", "s/step", "CPU s/step", "episodes/s", "sampled tok/s", "env tok/s", "generation", "learn", "other",
                "env / tool loop s", "peak RSS MB", "load avg 1m"]
    return intro + table(headers, summary) + detail_intro + table(dheaders, detail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of every implementation per configuration")
    parser.add_argument("--updates", type=int, default=6, help="timed optimizer steps per run (after 2 warm-up steps)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads in every run (default: torch's, one per core)")
    parser.add_argument("--no-trl", action="store_true", help="olingo only (no TRL venv is built)")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 2 steps, the base configuration: a smoke run, not results")
    parser.add_argument("--name", help="results file name under bench/results/ (default agent; agent_quick with --quick)")
    parser.add_argument("--out-dir", type=Path, default=None, help="where the results go (default bench/results)")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.updates = 1, 2
    WORK.mkdir(parents=True, exist_ok=True)
    info = {**machine(), "torch_threads": args.threads or "default (one per core)"}
    info["git"] = f"{info['git']} (measured on its working tree)"
    impls = ["olingo"] + ([] if args.no_trl else ["trl"])
    if not args.no_trl:
        from bench.trl.env import ensure_venv, versions

        ensure_venv("grpo")
        info["extra_versions"] = {"trl": versions("grpo").get("trl", "?")}
    start = time.time()
    rows = run_agent(args, impls)
    name = args.name or ("agent_quick" if args.quick else "agent")
    extra = {"out_dir": args.out_dir} if args.out_dir else {}
    print(write_results(name, rows, info, agent_markdown(rows, args.threads), **extra))
    print(f"done in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
