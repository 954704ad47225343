"""CPU thread policies alone and beside other work: a tiny GRPO run and a SmolLM2-135M GRPO run.

    .venv/bin/python bench/threads_bench.py [--repeats 3] [--only small,real] [--quick] [--policies default,auto,...]
        [--timeout SECONDS] [--name threads]

The full run is about 50 minutes on a quiet 2-core machine (estimated from --quick runs; `--only small`
about 15); --quick about 8 minutes for `--only small` on a loaded one.

torch computes on an OpenMP pool (libgomp) whose idle workers spin before they sleep; beside a busy
process that spinning, and every parallel region waiting for the worker that lost its core, can make
a run several times slower (olingo/threads.py, docs/scaling.md). Each policy is an environment for a
fresh `olingo grpo` process (an explicit variable wins over olingo's own choice):
  default   torch and libgomp untouched: one thread per physical core, GOMP_SPINCOUNT 300000 (libgomp's
            default when OMP_WAIT_POLICY is unset, given explicitly so olingo leaves it)
  passive   the same count, OMP_WAIT_POLICY=PASSIVE (idle workers sleep at once)
  spin100 / spin1k / spin10k   the same count, idle workers spin that many turns, then sleep
  one       OMP_NUM_THREADS=1
  auto      nothing set: olingo's `run.threads=auto`, `run.omp_wait=auto` (what it chose is recorded)
Conditions: alone, and beside a busy process (one pure-Python loop per usable core, started before the
block and killed after it). Runs are interleaved: every repeat runs each condition's policies back to
back in a rotated order, so a slow spell of the machine hits all alike; medians over repeats. The
machine is rarely truly idle: the load average at each run's start is recorded. Wall time is the whole
process (imports, model load, the run), as a user sees it. Writes bench/results/threads.{jsonl,md}
(`--quick`: a smoke run, one repeat of shortened runs and fewer policies, written to
bench/.work/threads_quick/ so that it never replaces the committed table). `--timeout` caps each run:
a run past it is killed and recorded as censored (the table shows "> cap"), since torch's default
beside busy work can take tens of times its alone time. `--name` names the results files.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BENCH, OLINGO_PYTHON, machine, median, table, write_results  # noqa: E402

CPUS = len(os.sched_getaffinity(0))
POLICIES = {
    "default": {"GOMP_SPINCOUNT": "300000"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin100": {"GOMP_SPINCOUNT": "100"},
    "spin1k": {"GOMP_SPINCOUNT": "1000"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "one": {"OMP_NUM_THREADS": "1"},
    "auto": {},
}
QUICK_POLICIES = ("default", "passive", "spin1k", "one", "auto")
RUN = ["run.output_dir={out}", "run.overwrite=true", "logging.progress=false", "loop.eval_interval=0", "loop.save_interval=0"]
WORKLOADS = {  # the `olingo grpo` arguments of each workload; {episodes} is filled per mode
    "small": ["--config", "grpo_tiny.yaml", "loop.episodes={episodes}"],
    "real": ["--config", "grpo_smollm2.yaml", "data.prompts=[builtin:prompts_train]", "loop.episodes={episodes}",
             "generation.max_new_tokens=8", "loop.rollout_batch_size=2", "experience.num_generations=4",
             "loop.train_batch_size=8", "loop.accumulation_steps=2"],
}
EPISODES = {"small": 60, "real": 2}
QUICK_EPISODES = {"small": 20, "real": 1}
BUSY = "import multiprocessing as m\ndef spin():\n    while True: pass\nif __name__ == '__main__':\n" \
       "    ps = [m.Process(target=spin) for _ in range({n})]\n    [p.start() for p in ps]\n    [p.join() for p in ps]\n"


def torch_default_threads() -> int:
    """torch's own intra-op count here (one per physical core), probed in a clean process."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([OLINGO_PYTHON, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True, env=env)
    return int(out.stdout.strip())


def start_busy() -> subprocess.Popen:
    """One pure-Python spinning loop per usable core, in its own process group (killed as one)."""
    proc = subprocess.Popen([OLINGO_PYTHON, "-c", BUSY.format(n=CPUS)], start_new_session=True)
    time.sleep(1.0)  # let the loops start before a measured run does
    return proc


def stop_busy(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_once(workload: str, episodes: int, policy: str, default_threads: int, workdir: Path, timeout: float | None = None) -> dict:
    """One fresh `olingo grpo` process under `policy`: wall seconds and what olingo logged; past
    `timeout` seconds it is killed and the row is censored (its wall time is the cap)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"})
    if policy not in ("one", "auto"):
        env["OMP_NUM_THREADS"] = str(default_threads)
    env.update(POLICIES[policy])
    args = [a.format(episodes=episodes, out=workdir) for a in WORKLOADS[workload] + RUN]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.Popen([OLINGO_PYTHON, "-m", "olingo.cli.main", "grpo", *args], env=env, cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"wall_s": round(timeout, 2), "censored": True, "load_at_start": round(load, 2), "olingo_choice": None}
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{workload}/{policy}: olingo grpo failed (exit {proc.returncode})\n{stdout[-2000:]}\n{stderr[-4000:]}")
    logged = re.search(r"CPU threads: .*", stderr)
    return {"wall_s": round(wall, 2), "censored": False, "load_at_start": round(load, 2), "olingo_choice": logged.group(0) if logged else None}


def measure(workloads: list[str], policies: list[str], repeats: int, episodes: dict[str, int], timeout: float | None = None) -> list[dict]:
    """Every (workload, repeat, condition, policy) once, policies in a rotated order per repeat."""
    default_threads, rows = torch_default_threads(), []
    with tempfile.TemporaryDirectory(prefix="olingo-threads-") as tmp:
        for workload in workloads:
            for repeat in range(repeats):
                for condition in ("alone", "busy"):
                    busy = start_busy() if condition == "busy" else None
                    try:
                        order = policies[repeat % len(policies):] + policies[:repeat % len(policies)]
                        for policy in order:
                            row = run_once(workload, episodes[workload], policy, default_threads, Path(tmp), timeout)
                            rows.append({"workload": workload, "repeat": repeat, "condition": condition, "policy": policy, **row})
                            over = ">" if row["censored"] else " "
                            print(f"{workload} r{repeat} {condition:5} {policy:8} {over}{row['wall_s']:7.1f} s  load {row['load_at_start']}", flush=True)
                    finally:
                        if busy is not None:
                            stop_busy(busy)
    return rows


def wall_median(rows: list[dict], workload: str, policy: str, condition: str) -> tuple[float, bool]:
    """The median wall seconds of these runs, and whether it reached a censored run's cap (then it
    is only a lower bound)."""
    runs = [r for r in rows if (r["workload"], r["policy"], r["condition"]) == (workload, policy, condition)]
    value = median([r["wall_s"] for r in runs])
    return value, any(r.get("censored") and r["wall_s"] <= value for r in runs)


def policy_row(rows: list[dict], workload: str, policy: str) -> list[str]:
    """alone s, beside busy s, busy / alone, speed alone and busy against the default alone; ">"
    marks a lower bound on a time (a censored run), "<" the upper bound on a speed it gives."""
    base, _ = wall_median(rows, workload, "default", "alone")
    (alone, late_alone), (busy, late_busy) = (wall_median(rows, workload, policy, c) for c in ("alone", "busy"))
    cell = lambda value, sign: f"{sign} {value:.3g}" if sign else f"{value:.3g}"  # noqa: E731
    ratio = ">" if late_busy and not late_alone else "~" if late_busy else ""
    return [policy, cell(alone, ">" * late_alone), cell(busy, ">" * late_busy), cell(busy / alone, ratio),
            cell(base / alone, "<" * late_alone), cell(base / busy, "<" * late_busy)]


def summary(rows: list[dict], workloads: list[str], policies: list[str]) -> str:
    """Per workload: median wall alone and busy, busy / alone, and each against the default alone."""
    parts = []
    for workload in workloads:
        lines = [policy_row(rows, workload, p) for p in policies]
        parts.append(f"### {workload}\n\n" + table(
            ["policy", "alone s", "beside busy s", "busy / alone", "speed alone vs default alone", "speed busy vs default alone"], lines))
        choices = sorted({r["olingo_choice"] for r in rows if r["workload"] == workload and r["policy"] == "auto" and r["olingo_choice"]})
        parts.append("auto chose: " + "; ".join(f"`{c}`" for c in choices) + "\n")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="small,real", help="comma-separated workloads: small, real")
    parser.add_argument("--quick", action="store_true", help="one repeat, shortened runs, fewer policies (a smoke run)")
    parser.add_argument("--policies", default=None, help=f"comma-separated subset of {','.join(POLICIES)} (default: all; --quick: fewer)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds a run may take before it is killed and recorded as censored")
    parser.add_argument("--name", default="threads", help="results file name under bench/results (threads.md, threads.jsonl)")
    args = parser.parse_args()
    workloads = args.only.split(",")
    policies = args.policies.split(",") if args.policies else list(QUICK_POLICIES if args.quick else POLICIES)
    if "default" not in policies or not set(policies) <= set(POLICIES):
        parser.error(f"--policies must be among {', '.join(POLICIES)} and include default (the table's baseline)")
    episodes = QUICK_EPISODES if args.quick else EPISODES
    rows = measure(workloads, policies, 1 if args.quick else args.repeats, episodes, args.timeout)
    cap = f"; a run past {args.timeout:g} s was killed and counts as {args.timeout:g} (\"> \": a lower bound)" if args.timeout else ""
    head = (f"`olingo grpo` per policy, alone and beside {CPUS} spinning Python loops (one per usable core); "
            f"episodes: {', '.join(f'{w} {episodes[w]}' for w in workloads)}; median wall seconds of the whole process over "
            f"{1 if args.quick else args.repeats} repeat(s){cap}; load average at each run's start in the jsonl.\n\n")
    out = {"out_dir": BENCH / ".work" / "threads_quick"} if args.quick else {}
    write_results("threads_quick" if args.quick else args.name, rows, machine(run_git=False), head + summary(rows, workloads, policies), **out)


if __name__ == "__main__":
    main()
