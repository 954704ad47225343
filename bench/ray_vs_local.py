"""Local vs Ray PPO throughput, and weight-sync bandwidth, side by side in one run.

    python bench/ray_vs_local.py [--episodes 12] [--repeats 3]

1. The same PPO job (tiny Llama, answer-checker reward, 64 prompts per episode, 8 new tokens,
   minibatches of 16, 2 passes) runs single-process and on Ray with 1 and 2 experience makers,
   interleaved, `--repeats` times. Reported per mode (medians): wall seconds of the whole job
   (model loading and actor start included), steady-state optimizer steps/s and trained
   rollouts/s (from the metrics rows' timestamps, first episode excluded), and for Ray the
   median `perf/weight_sync_gbps`.
2. Weight sync alone: a state dict of 1, 64 and 256 MB put in the object store once and loaded
   (strict keys) by 1 and 2 receiver actors; GB/s = bytes x receivers / seconds.
Writes bench/results/ray_vs_local.jsonl (one line per measurement) and ray_vs_local.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray
import torch

from olingo.config import load_config
from olingo.ray.weights import load_synced_state, state_dict_for_sync, state_dict_nbytes
from olingo.recipes.common import packaged_config
from olingo.recipes.ppo import PPOConfig, run_ppo

RESULTS = Path(__file__).resolve().parent / "results"


def ppo_job(output_dir: str, name: str, episodes: int, makers: int) -> dict:
    overrides = [
        f"run.output_dir={output_dir}", f"run.name={name}", "logging.progress=false", f"loop.episodes={episodes}",
        "loop.eval_interval=0", "loop.save_interval=0", "data.eval_prompts=[]", "loop.rollout_batch_size=64",
        "loop.train_batch_size=16", "loop.update_steps=2", "generation.max_new_tokens=8",
    ]
    if makers:
        # the 2 cores split evenly: the trainer gets one, the makers share the other
        overrides += ["ray.enabled=true", f"ray.num_makers={makers}", "ray.num_cpus=2",
                      f"ray.maker_resources.num_cpus={1 / makers}", "ray.trainer_resources.num_cpus=1"]
    cfg = load_config(PPOConfig, packaged_config("ppo_tiny.yaml"), overrides)
    start = time.perf_counter()
    run_ppo(cfg)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (Path(output_dir) / name / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["split"] == "train"]
    per_episode = len(rows) // episodes
    steady = rows[per_episode - 1 :]  # from the end of the first episode on
    seconds = steady[-1]["time"] - steady[0]["time"]
    steps = len(steady) - 1
    rollouts_per_step = 16 / 2  # each rollout is trained on in 2 passes of minibatches of 16
    result = {"mode": f"ray x{makers}" if makers else "local", "wall_s": wall, "steps_per_s": steps / seconds,
              "rollouts_per_s": steps * rollouts_per_step / seconds}
    if makers:
        result["weight_sync_gbps"] = statistics.median({r["perf/weight_sync_gbps"] for r in rows})
        result["weight_sync_s"] = statistics.median({r["perf/weight_sync_s"] for r in rows})
    return result


@ray.remote(num_cpus=0)
class Receiver:
    def __init__(self, sizes_mb: int) -> None:
        self.model = make_model(sizes_mb)

    def load(self, state: dict) -> int:
        return load_synced_state(self.model, state, "model")


def make_model(size_mb: int) -> torch.nn.Module:
    """Linear layers of 1024 x 1024 floats (4 MB each) adding up to about `size_mb`."""
    layers = max(1, size_mb // 4)
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(layers)]) if size_mb >= 4 else torch.nn.Linear(512, 512, bias=False)


def weight_sync(size_mb: int, receivers: int, repeats: int) -> dict:
    actors = [Receiver.remote(size_mb) for _ in range(receivers)]
    state = state_dict_for_sync(make_model(size_mb))
    nbytes = state_dict_nbytes(state)
    ray.get([a.load.remote(state) for a in actors], timeout=600)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ref = ray.put(state)
        ray.get([a.load.remote(ref) for a in actors], timeout=600)
        times.append(time.perf_counter() - start)
    for a in actors:
        ray.kill(a)
    seconds = statistics.median(times)
    return {"mode": "weight_sync", "mb": nbytes / 1e6, "receivers": receivers, "seconds": seconds, "gbps": nbytes * receivers / seconds / 1e9}


def machine() -> dict:
    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "ray": ray.__version__, "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):  # interleaved, so drift hits every mode alike
            for makers in (0, 1, 2):
                result = ppo_job(tmp, f"r{repeat}m{makers}", args.episodes, makers)
                print(json.dumps(result), flush=True)
                lines.append({"repeat": repeat, **result})
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for size in (1, 64, 256):
            for receivers in (1, 2):
                result = weight_sync(size, receivers, args.repeats)
                print(json.dumps(result), flush=True)
                lines.append(result)
    finally:
        ray.shutdown()
    write(lines, machine(), args)


def write(lines: list[dict], info: dict, args: argparse.Namespace) -> None:
    (RESULTS / "ray_vs_local.jsonl").write_text("".join(json.dumps({**line, "machine": info}) + "\n" for line in lines))
    table = ["| mode | wall s (job) | steps/s (steady) | rollouts/s | weight sync s | weight sync GB/s |", "|---|---|---|---|---|---|"]
    for mode in ("local", "ray x1", "ray x2"):
        runs = [r for r in lines if r["mode"] == mode]

        def med(key: str, runs: list[dict] = runs) -> float:
            return statistics.median(r[key] for r in runs) if key in runs[0] else float("nan")

        table.append(f"| {mode} | {med('wall_s'):.1f} | {med('steps_per_s'):.1f} | {med('rollouts_per_s'):.0f} "
                     f"| {med('weight_sync_s'):.4f} | {med('weight_sync_gbps'):.3f} |")
    sync = ["| state dict MB | receivers | seconds | GB/s |", "|---|---|---|---|"]
    sync += [f"| {r['mb']:.1f} | {r['receivers']} | {r['seconds']:.4f} | {r['gbps']:.2f} |" for r in lines if r["mode"] == "weight_sync"]
    text = (
        f"# Local vs Ray PPO\n\nMachine: {info}\n\nPPO on the embedded task, {args.episodes} episodes, medians of {args.repeats} "
        "interleaved runs. Steady state excludes the first episode (actor start, model loading).\n\n"
        + "\n".join(table) + "\n\n## Weight sync alone (one `ray.put`, strict load in every receiver)\n\n" + "\n".join(sync) + "\n"
    )
    (RESULTS / "ray_vs_local.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
