"""Learning benchmark: does a recipe raise its reward on every seed and every CPU kernel path?

A training run's trajectory depends on the CPU's kernels (AVX-512 or AVX2 reductions round
differently and the difference grows step by step), so "GRPO raises the reward" is a claim about a
distribution of runs, not one run. This script runs each recipe from its SFT start over several
seeds and under several `ATEN_CPU_CAPABILITY` values (what torch dispatches to: `avx512`, `avx2`,
`default`), each run in a fresh process, and reports for every run the mean rollout reward of the
first and last quarter of its steps, the rise between them, and the curves (a plot).

Recipes (the packaged configs the docs point users to):
- `grpo`: `grpo_tiny.yaml`, rewarded by the answer checker, shortened to 150 episodes of one
  update each (the packaged run takes 1000 of two).
- `agent`: `grpo_agent_tiny.yaml` as packaged: the two-turn `arithmetic_retry` environment. The
  gateway's `retry_arithmetic` agent trains the same rows token for token
  (tests/test_gateway_recipe.py checks that equality), so its curve is this one.

Each process trains `sft_tiny.yaml` for `--sft-epochs` epochs with the run's seed, then runs every
recipe from that SFT model.

    .venv/bin/python bench/learning.py                       # 3 seeds x (native, avx2), both recipes
    .venv/bin/python bench/learning.py --seeds 1,2,3,4,5 --capabilities native,avx2,default

Writes bench/results/learning.{jsonl,md} and learning.png. Not part of `make bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, machine, table, write_results  # noqa: E402

RECIPES = {
    "grpo": ("grpo_tiny.yaml", ["loop.episodes=150", "loop.update_steps=1"]),
    "agent": ("grpo_agent_tiny.yaml", []),
}
QUIET = ["loop.eval_interval=0", "loop.save_interval=0", "data.eval_prompts=[]", "logging.progress=false"]


def one_process(recipes: list[str], seed: int, sft_epochs: int, workdir: Path, extra: dict[str, list[str]]) -> dict:
    """In this process: SFT from the built-in tiny model, then each recipe from it (with `extra`'s
    overrides for it); the curves."""
    from olingo.config import load_config, packaged_config
    from olingo.recipes.grpo import GRPOConfig, run_grpo
    from olingo.recipes.sft import SFTConfig, run_sft

    start = time.perf_counter()
    sft = run_sft(load_config(SFTConfig, packaged_config("sft_tiny.yaml"), [
        f"run.output_dir={workdir}", "run.name=sft", f"run.seed={seed}", f"train.epochs={sft_epochs}", "logging.progress=false",
    ]))
    results = {"sft_seconds": time.perf_counter() - start}
    for recipe in recipes:
        start = time.perf_counter()
        config, overrides = RECIPES[recipe]
        run_grpo(load_config(GRPOConfig, packaged_config(config), [
            f"run.output_dir={workdir}", f"run.name={recipe}", f"run.seed={seed}", f"model.actor={sft['final_model']}",
            *overrides, *QUIET, *extra.get(recipe, []),
        ]))
        lines = (workdir / recipe / "metrics.jsonl").read_text().splitlines()
        rows = [r for r in map(json.loads, lines) if r.get("split") == "train" and "rollout/reward_mean" in r]
        results[recipe] = {"curve": [r["rollout/reward_mean"] for r in rows], "seconds": time.perf_counter() - start}
    return results


def quarters(curve: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last quarter of a curve."""
    q = max(1, len(curve) // 4)
    return sum(curve[:q]) / q, sum(curve[-q:]) / q


def launch(recipes: list[str], seed: int, capability: str, sft_epochs: int, extra: dict[str, list[str]]) -> list[dict]:
    """`one_process` in a fresh process with `ATEN_CPU_CAPABILITY` set (unset for `native`): one
    row per recipe."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability != "native":
        env["ATEN_CPU_CAPABILITY"] = capability
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[1]), WANDB_MODE="disabled", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    with tempfile.TemporaryDirectory(prefix="olingo-learning-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--one", ",".join(recipes), str(seed), str(sft_epochs), tmp, str(out), json.dumps(extra)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"seed {seed} {capability}: exit {proc.returncode}\n{proc.stderr[-4000:]}")
        result = json.loads(out.read_text())
    rows = []
    for recipe in recipes:
        first, last = quarters(result[recipe]["curve"])
        rows.append({"recipe": recipe, "seed": seed, "capability": capability, "first_quarter": first, "last_quarter": last,
                     "rise": last - first, "sft_seconds": result["sft_seconds"], **result[recipe]})
    return rows


def summary(rows: list[dict]) -> str:
    """Per run: first and last quarter and the rise; per recipe: the smallest rise."""
    lines = table(["recipe", "capability", "seed", "first quarter", "last quarter", "rise", "minutes"],
                  [[r["recipe"], r["capability"], r["seed"], r["first_quarter"], r["last_quarter"], r["rise"], r["seconds"] / 60] for r in rows])
    smallest = {recipe: min(r["rise"] for r in rows if r["recipe"] == recipe) for recipe in dict.fromkeys(r["recipe"] for r in rows)}
    return lines + "\nSmallest rise per recipe: " + ", ".join(f"{k} {v:+.3f}" for k, v in smallest.items()) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """One panel per recipe: every run's curve (a 10-step moving mean), coloured by capability."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = list(dict.fromkeys(r["recipe"] for r in rows))
    colours = {c: f"C{i}" for i, c in enumerate(dict.fromkeys(r["capability"] for r in rows))}
    fig, axes = plt.subplots(1, len(recipes), figsize=(6 * len(recipes), 4), squeeze=False)
    for ax, recipe in zip(axes[0], recipes, strict=True):
        for r in (r for r in rows if r["recipe"] == recipe):
            curve, w = r["curve"], 10
            smooth = [sum(curve[max(0, i - w + 1): i + 1]) / len(curve[max(0, i - w + 1): i + 1]) for i in range(len(curve))]
            ax.plot(smooth, color=colours[r["capability"]], alpha=0.7, label=f"{r['capability']} seed {r['seed']}")
        ax.set(title=f"{recipe}: rollout reward (10-step mean)", xlabel="step", ylabel="reward")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", default="grpo,agent", help="comma-separated, of: " + ", ".join(RECIPES))
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated run.seed values")
    parser.add_argument("--capabilities", default="native,avx2", help="ATEN_CPU_CAPABILITY values; native leaves it unset")
    parser.add_argument("--sft-epochs", type=int, default=60, help="epochs of sft_tiny.yaml before each recipe")
    parser.add_argument("--name", default="learning", help="result file stem under bench/results")
    parser.add_argument("--set", action="append", default=[], metavar="RECIPE:KEY=VALUE", help="an override for one recipe, e.g. agent:actor_optim.lr=2e-4")
    parser.add_argument("--one", nargs=6, metavar=("RECIPES", "SEED", "SFT_EPOCHS", "WORKDIR", "OUT", "EXTRA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        recipes, seed, epochs, workdir, out, extra = args.one
        Path(out).write_text(json.dumps(one_process(recipes.split(","), int(seed), int(epochs), Path(workdir), json.loads(extra))))
        return
    extra: dict[str, list[str]] = {}
    for item in args.set:
        recipe, override = item.split(":", 1)
        extra.setdefault(recipe, []).append(override)
    rows = []
    info = machine()
    info["overrides"] = {recipe: [*RECIPES[recipe][1], *extra.get(recipe, [])] for recipe in args.recipes.split(",")}
    for seed in map(int, args.seeds.split(",")):
        for capability in args.capabilities.split(","):
            for r in launch(args.recipes.split(","), seed, capability, args.sft_epochs, extra):
                rows.append(r)
                print(f"{r['recipe']} seed {seed} {capability}: {r['first_quarter']:.3f} -> {r['last_quarter']:.3f} ({r['seconds'] / 60:.1f} min)", flush=True)
            write_results(args.name, rows, info, summary(rows))  # after every process: a stopped run keeps what it measured
            plot(rows, RESULTS / f"{args.name}.png")
    print(summary(rows))

if __name__ == "__main__":
    main()
