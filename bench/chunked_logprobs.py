"""Chunked log-probs: peak memory and time of a GRPO/PPO learn forward + backward through a
262k-token vocabulary (Gemma 3's), whole logits vs a chunk at a time.

    .venv/bin/python bench/chunked_logprobs.py [--repeats 3] [--vocab 262144] [--rows 8] [--actions 128]

Each measurement runs in a fresh process with OMP_NUM_THREADS=1 and MALLOC_MMAP_THRESHOLD_=65536
(every tensor of 64 KiB or more is its own mapping, returned to the OS when freed, so RSS follows
the live tensors: docs/plan.md). The model is a random-init Llama with the given vocabulary,
hidden 64, 2 layers, tied embeddings, fp32; the batch is `--rows` rows of 32 prompt + `--actions`
response tokens. The measured call is `olingo.experience_maker.policy_token_stats` (the learners'
forward: log-probs and entropy of the response tokens) followed by backward of the log-probs' sum:
`whole` with chunking off (chunk_elements above the logits' size), `chunked` with the default
(chunked above CHUNK_ELEMENTS = 2^24 logits, 2^22 per chunk). Peak = the process's peak RSS (`ru_maxrss`) minus its RSS
just before the call (model built, one warm-up call of the same mode done). Also checks that
the two modes' log-probs agree within 1e-5 and writes bench/results/chunked_logprobs.{jsonl,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def measure(mode: str, vocab: int, rows: int, actions: int) -> dict:
    """One mode in this process: peak RSS growth (MiB) and seconds of the measured call."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from olingo.experience_maker import policy_token_stats
    from olingo.rl.logprobs import CHUNK_ELEMENTS

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=2, tie_word_embeddings=True))
    ids = torch.randint(1, vocab, (rows, 32 + actions))
    mask = torch.ones_like(ids)
    chunk = CHUNK_ELEMENTS if mode == "chunked" else 1 << 62

    def call() -> torch.Tensor:
        log_probs, _ = policy_token_stats(model, ids, mask, actions, 1.0, packing=False, chunk_elements=chunk)
        log_probs.sum().backward()
        model.zero_grad(set_to_none=True)
        return log_probs.detach()

    first = call()
    before = rss_mib()
    start = time.perf_counter()
    call()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    return {"mode": mode, "vocab": vocab, "rows": rows, "actions": actions, "peak_mib": peak, "seconds": seconds,
            "log_probs_sum": float(first.double().sum()), "logits_mib": rows * actions * vocab * 4 / 2**20}


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=262144)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--actions", type=int, default=128)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.vocab, args.rows, args.actions)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    results = []
    for repeat in range(args.repeats):
        for mode in (("whole", "chunked") if repeat % 2 == 0 else ("chunked", "whole")):
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--vocab", str(args.vocab), "--rows", str(args.rows),
                                  "--actions", str(args.actions)], env=env, capture_output=True, text=True, check=True)
            results.append({**json.loads(out.stdout.strip().splitlines()[-1]), "repeat": repeat})
            print(results[-1], flush=True)
    write(results)


def write(results: list[dict]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "chunked_logprobs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    first = results[0]
    sums = {r["mode"]: r["log_probs_sum"] for r in results}
    lines = [
        "# Chunked log-probs: whole logits vs a chunk at a time (bench/chunked_logprobs.py)", "",
        f"Random-init Llama, vocabulary {first['vocab']}, {first['rows']} rows x {first['actions']} response tokens "
        f"(whole fp32 logits: {first['logits_mib']:.0f} MiB); forward + backward of `policy_token_stats`, one thread, "
        "MALLOC_MMAP_THRESHOLD_=65536, a fresh process per run.", "",
        "| repeat | mode | peak RSS growth (MiB) | seconds |", "|---|---|---|---|",
        *(f"| {r['repeat']} | {r['mode']} | {r['peak_mib']:.0f} | {r['seconds']:.2f} |" for r in results), "",
        f"Sum of the log-probs: whole {sums['whole']:.6f}, chunked {sums['chunked']:.6f}.",
    ]
    for mode in ("whole", "chunked"):
        peaks = sorted(r["peak_mib"] for r in results if r["mode"] == mode)
        times = sorted(r["seconds"] for r in results if r["mode"] == mode)
        lines.append(f"- {mode}: peak median {peaks[len(peaks) // 2]:.0f} MiB, time median {times[len(times) // 2]:.2f} s")
    (RESULTS / "chunked_logprobs.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
