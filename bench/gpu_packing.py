"""Padding-free training on one GPU: padded rows vs packed rows under each attention kernel.

    PYTHONPATH=. python bench/gpu_packing.py                       # H100/H200: Qwen2.5-0.5B and SmolLM2-135M shapes, bf16
    PYTHONPATH=. python bench/gpu_packing.py --device cpu --shapes tiny --batches 2 --repeats 1   # smoke test

Standalone (no downloads): randomly initialised causal LMs built from configs with the shapes of
Qwen2.5-0.5B (`qwen0.5b`: hidden 896, 24 layers, 14/2 heads, vocab 151936, tied) and
SmolLM2-135M (`smollm2`: hidden 576, 30 layers, 9/3 heads, vocab 49152, tied). `--batches`
micro-batches of `--rows` rows of random token ids, lengths lognormal (median `--median`, sigma
`--sigma`, clipped to [16, `--max-len`], seed `--seed`), right-padded.

One step is what `olingo sft` runs per micro-batch: `olingo.experience_maker.scoring.lm_nll` (the
next-token NLL over every attended token, the output head a chunk of tokens at a time where the
logits would be large), divided by the token count, then backward. Arms:
- `padded/sdpa`: the padded (B, L) batch with its attention mask (`model.packing: false`);
- `packed/sdpa`: `model.packing: true` (`olingo.models.packing`), torch's SDPA with the
  block-diagonal causal mask transformers builds from the restarting position ids;
- `packed/flex_attention`: the same packed rows under transformers' flex_attention (a block mask
  that skips the blocks between rows; compiled by torch on first use, which the warm-up holds);
- `packed/torch_varlen`: the same packed rows under `torch.nn.attention.varlen.varlen_attn`, torch's
  own flash-attention varlen kernel, registered with transformers' `AttentionInterface` here
  (`torch_varlen_attention`: cumulative sequence lengths from the position ids);
- `packed/flash_attention_2`: the flash-attn package's varlen kernels, where it is installed.
An arm that cannot run (kernel missing, error) is recorded with its reason.

Timing: every arm first runs every micro-batch once (warm-up; its seconds are reported: compile
time for flex); then `--repeats` rounds, the arms in rotating order, each over every micro-batch,
synchronised. tokens/s counts attended tokens only. Peak memory: the arm's peak over its rounds.
Agreement: per-token log-probs of micro-batch 0 (eval mode) under every arm, against the same
model in float32 with padded SDPA; the padded bf16 arm's distance is the floor that rounding sets.

Prints a JSON summary and writes it to $OUT/gpu_packing.json when $OUT is set (and to --out).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import math
import os
import platform
import random
import sys
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from olingo.experience_maker.scoring import action_log_probs, lm_nll  # noqa: E402

SHAPES = {
    "qwen0.5b": dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                     intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768),
    "smollm2": dict(model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192),
    "tiny": dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=512, tie_word_embeddings=True, max_position_embeddings=4096),
}
ARMS = [("padded", "sdpa"), ("packed", "sdpa"), ("packed", "torch_varlen"), ("packed", "flash_attention_2"), ("packed", "flex_attention")]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--shapes", default="qwen0.5b,smollm2", help=f"comma-separated, of {sorted(SHAPES)}")
    p.add_argument("--rows", type=int, default=16, help="rows per micro-batch")
    p.add_argument("--batches", type=int, default=8, help="micro-batches (each a different length mix)")
    p.add_argument("--median", type=int, default=256)
    p.add_argument("--sigma", type=float, default=0.9)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arms", default=",".join(f"{a}/{b}" for a, b in ARMS))
    p.add_argument("--warmup-limit", type=float, default=150.0, help="seconds: an arm whose warm-up runs longer is dropped (flex's compiles)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    return p.parse_args()


# --- torch's flash-attention varlen kernel as a transformers attention implementation ---------------

_SEGMENTS: dict = {}


def segments(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(cumulative sequence starts (N+1,) int32, longest sequence) of a (B, T) packed batch: a
    sequence starts at every row start and wherever the position does not step by one. Kept for
    the forward's one position tensor (every layer asks); holding the tensor keeps its memory from
    being reused by another batch's positions while the entry stands."""
    if _SEGMENTS.get("positions") is not position_ids:
        flat = position_ids.flatten()
        start = torch.ones_like(flat, dtype=torch.bool)
        start[1:] = flat[1:] != flat[:-1] + 1
        start[:: position_ids.shape[1]] = True
        starts = torch.cat([start.nonzero().squeeze(1), flat.new_tensor([flat.numel()])]).to(torch.int32)
        _SEGMENTS.update(positions=position_ids, value=(starts, int((starts[1:] - starts[:-1]).max())))
    return _SEGMENTS["value"]


def torch_varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query (B, H, T, D), key/value (B, Hkv, T, D) -> ((B, T, H, D), None), causal within each sequence."""
    from torch.nn.attention.varlen import varlen_attn

    if attention_mask is not None:
        raise ValueError("torch_varlen runs packed rows only (no padding mask)")
    batch, heads, length, dim = query.shape
    starts, longest = segments(kwargs["position_ids"])
    if key.shape[1] != heads:  # grouped-query attention: share each KV head among its query heads
        key, value = (t.repeat_interleave(heads // key.shape[1], dim=1) for t in (key, value))
    q, k, v = (t.transpose(1, 2).reshape(batch * length, heads, dim) for t in (query, key, value))
    params = inspect.signature(varlen_attn).parameters
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    out = varlen_attn(q, k, v, starts, starts, longest, longest, scale=scaling, **causal)
    return out.view(batch, length, heads, dim), None


def register_torch_varlen() -> str | None:
    """Register `torch_varlen` with transformers; the reason it cannot run, or None."""
    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen"
    if not torch.cuda.is_available():
        return "varlen_attn runs on CUDA only"
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import flash_attention_mask

    AttentionInterface.register("torch_varlen", torch_varlen_attention)
    AttentionMaskInterface.register("torch_varlen", flash_attention_mask)
    return None


# --- workload ------------------------------------------------------------------------------------------

def build_model(shape: str, dtype: torch.dtype, device: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(SHAPES[shape])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa").to(device)
    return model


def draw_batches(args, vocab: int, device: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    rng = random.Random(args.seed)
    batches = []
    for _ in range(args.batches):
        lengths = [min(args.max_len, max(16, round(args.median * math.exp(rng.gauss(0, args.sigma))))) for _ in range(args.rows)]
        width = max(lengths)
        ids = torch.zeros(args.rows, width, dtype=torch.long)
        mask = torch.zeros(args.rows, width, dtype=torch.long)
        for r, n in enumerate(lengths):
            ids[r, :n] = torch.tensor([rng.randrange(1, vocab) for _ in range(n)])
            mask[r, :n] = 1
        batches.append((ids.to(device), mask.to(device)))
    return batches


def arm_reason(attention: str, varlen_reason: str | None) -> str | None:
    if attention == "torch_varlen":
        return varlen_reason
    if attention == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        return "flash_attn is not installed (PyPI has it as source only)"
    return None


def step(model, batch, packed: bool) -> None:
    ids, mask = batch
    nll, count = lm_nll(model, ids, mask, mask, packing=packed)
    (nll / count).backward()
    model.zero_grad(set_to_none=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_round(model, batches, packed: bool, device: str) -> float:
    sync(device)
    start = time.perf_counter()
    for batch in batches:
        step(model, batch, packed)
    sync(device)
    return time.perf_counter() - start


@torch.no_grad()
def token_log_probs(model, batch, packed: bool) -> torch.Tensor:
    ids, mask = batch
    model.eval()
    try:
        return action_log_probs(model, ids, mask, ids.shape[1] - 1, packing=packed).float()[mask[:, 1:].bool()]
    finally:
        model.train()


def run_shape(shape: str, args, dtype: torch.dtype, varlen_reason: str | None) -> dict:
    device = args.device
    model = build_model(shape, dtype, device).train()
    batches = draw_batches(args, model.config.vocab_size, device)
    real = sum(int(m.sum()) for _, m in batches)
    padded = sum(m.numel() for _, m in batches)
    wanted = [tuple(a.split("/")) for a in args.arms.split(",")]
    result = {"shape": shape, "parameters": sum(p.numel() for p in model.parameters()), "real_tokens_per_round": real,
              "padded_positions_per_round": padded, "padding_fraction": 1 - real / padded,
              "row_lengths": [int(m.sum(1).max()) for _, m in batches], "arms": {}}
    reference = model.float()
    reference.set_attn_implementation("sdpa")
    truth = token_log_probs(reference, batches[0], packed=False)
    model = reference.to(dtype)
    live = []
    for layout, attention in wanted:
        name = f"{layout}/{attention}"
        reason = arm_reason(attention, varlen_reason)
        if reason:
            result["arms"][name] = {"skipped": reason}
            continue
        try:
            model.set_attn_implementation(attention)
            start = time.perf_counter()
            for i, batch in enumerate(batches):
                step(model, batch, layout == "packed")
                if time.perf_counter() - start > args.warmup_limit and i + 1 < len(batches):
                    raise TimeoutError(f"warm-up over {args.warmup_limit:.0f} s after {i + 1} of {len(batches)} micro-batches")
            sync(device)
            warmup = time.perf_counter() - start
            diff = (token_log_probs(model, batches[0], layout == "packed") - truth).abs()
            result["arms"][name] = {"warmup_s": warmup, "max_abs_logp_diff_vs_fp32": float(diff.max()),
                                    "mean_abs_logp_diff_vs_fp32": float(diff.mean()), "round_s": [], "peak_mib": 0.0}
            live.append((layout, attention))
        except Exception as err:  # an arm that breaks is reported, the others still run
            result["arms"][name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"}
            traceback.print_exc()
    for r in range(args.repeats):
        order = live[r % max(1, len(live)):] + live[: r % max(1, len(live))]
        for layout, attention in order:
            arm = result["arms"][f"{layout}/{attention}"]
            model.set_attn_implementation(attention)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            arm["round_s"].append(timed_round(model, batches, layout == "packed", device))
            if device == "cuda":
                arm["peak_mib"] = max(arm["peak_mib"], torch.cuda.max_memory_allocated() / 2**20)
    for arm in result["arms"].values():
        if arm.get("round_s"):
            arm["median_round_s"] = sorted(arm["round_s"])[len(arm["round_s"]) // 2]
            arm["tokens_per_s"] = real / arm["median_round_s"]
    base = result["arms"].get("padded/sdpa", {}).get("round_s")
    for arm in result["arms"].values():
        if base and arm.get("round_s"):
            ratios = sorted(b / a for a, b in zip(arm["round_s"], base, strict=True))  # per round: padded time / this arm's time
            arm["speedup_vs_padded"] = {"median": ratios[len(ratios) // 2], "min": ratios[0], "max": ratios[-1]}
    del model, reference
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def main() -> None:
    args = parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    varlen_reason = register_torch_varlen()
    import transformers

    summary = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
               "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(), "dtype": str(dtype),
               "flash_attn": importlib.util.find_spec("flash_attn") is not None, "args": {k: str(v) for k, v in vars(args).items()},
               "shapes": []}
    for shape in args.shapes.split(","):
        summary["shapes"].append(run_shape(shape, args, dtype, varlen_reason))
        print(json.dumps(summary["shapes"][-1], indent=1), flush=True)
    text = json.dumps(summary, indent=1)
    for path in [Path(os.environ["OUT"]) / "gpu_packing.json" if os.environ.get("OUT") else None, args.out]:
        if path is not None:
            path.write_text(text)


if __name__ == "__main__":
    main()
