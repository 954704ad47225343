"""The timed implementations of bench/gpu_generation.py (see its docstring for what is measured):
transformers `generate` and olingo's `HFEngine` (`bench_hf`), their greedy agreement
(`greedy_check`), plain vLLM (`bench_vllm`) and olingo's `VLLMEngine` (`bench_olingo_vllm`),
with the timing helpers they share. Each returns its part of the JSON summary.
"""

from __future__ import annotations

import gc
import os
import sys
import time

import torch


# ---- helpers --------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def is_oom(error: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    return isinstance(error, oom) or "out of memory" in str(error).lower()


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def plain_config(new_tokens: int, sample: bool):
    from transformers import GenerationConfig

    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {"do_sample": False}
    return GenerationConfig(max_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0, use_cache=True, num_beams=1, **sampling)


def chunked(fn, ids: torch.Tensor, mask: torch.Tensor, chunk: int) -> list:
    return [fn(ids[i:i + chunk], mask[i:i + chunk]) for i in range(0, ids.shape[0], chunk)]


class Runner:
    """Times a batch function on all prompts, in chunks; halves the chunk after a CUDA OOM."""

    def __init__(self, device: torch.device, chunk: int) -> None:
        self.device, self.chunk, self.ooms = device, chunk, 0

    def run(self, fn, ids: torch.Tensor, mask: torch.Tensor) -> tuple[float, list]:
        while True:
            try:
                sync(self.device)
                start = time.perf_counter()
                out = chunked(fn, ids, mask, self.chunk)
                sync(self.device)
                return time.perf_counter() - start, out
            except Exception as error:
                if self.device.type != "cuda" or not is_oom(error) or self.chunk == 1:
                    raise
                free_memory(self.device)
                self.ooms += 1
                self.chunk = max(1, self.chunk // 2)
                print(f"OOM: chunk -> {self.chunk}", file=sys.stderr, flush=True)


# ---- HF generate and olingo's HFEngine --------------------------------------------------------------------
def response_lengths_ok(outs: list, prompt_len: int, new_tokens: int) -> bool:
    return all(o.shape[1] == prompt_len + new_tokens for o in outs)


def bench_hf(args, model, tokenizer, olingo, ids: torch.Tensor, mask: torch.Tensor, device: torch.device) -> dict:
    impls = {}
    config = plain_config(args.new_tokens, sample=True)

    def plain(i, m):
        return model.generate(input_ids=i, attention_mask=m, generation_config=config)

    impls["hf_generate"] = plain
    if olingo is not None:
        engine = olingo.HFEngine(model, tokenizer)
        settings = olingo.GenerationSettings(max_new_tokens=args.new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, stop_token_ids=[])

        def from_olingo(i, m):
            return engine.generate(i, m, settings).sequences

        impls["olingo_hf_engine"] = from_olingo
    runner = Runner(device, args.chunk or ids.shape[0])
    result = {name: {"seconds": [], "tokens_per_s": []} for name in impls}
    # warm-up: one whole call per implementation (kernels of every shape, cuBLAS handles, and the
    # allocator grown to the full KV cache): after a warm-up of 8 prompts x 16 tokens, or of the
    # whole batch x 32 tokens, the first timed call on an H100 still took 2.5-3.3x the later ones
    start = time.perf_counter()
    with torch.no_grad():
        for impl in impls.values():
            runner.run(impl, ids, mask)
    sync(device)
    warmup_s = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    names = list(impls)
    for repeat in range(args.repeats):
        order = names if repeat % 2 == 0 else names[::-1]  # A/B, then B/A
        for name in order:
            torch.manual_seed(args.seed + repeat)
            with torch.no_grad():
                seconds, outs = runner.run(impls[name], ids, mask)
            if not response_lengths_ok(outs, args.prompt_len, args.new_tokens):
                raise RuntimeError(f"{name}: responses of other lengths than {args.new_tokens}: {[tuple(o.shape) for o in outs]}")
            result[name]["seconds"].append(seconds)
            result[name]["tokens_per_s"].append(ids.shape[0] * args.new_tokens / seconds)
            tokens_per_s = ids.shape[0] * args.new_tokens / seconds
            print(f"{name} repeat {repeat}: {seconds:.2f} s, {tokens_per_s:.0f} tok/s (chunk {runner.chunk})", file=sys.stderr, flush=True)
            del outs
    for name in result:
        result[name]["best_tokens_per_s"] = max(result[name]["tokens_per_s"])
    if "olingo_hf_engine" in result:
        pairs = zip(result["olingo_hf_engine"]["seconds"], result["hf_generate"]["seconds"], strict=True)
        result["olingo_over_plain_seconds_per_repeat"] = [round(a / b, 4) for a, b in pairs]
    result |= {"warmup_s": warmup_s, "chunk": runner.chunk, "ooms": runner.ooms, "attn_implementation": model.config._attn_implementation}
    if device.type == "cuda":
        result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return result


def greedy_check(args, model, tokenizer, olingo, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """olingo's HFEngine greedy vs plain greedy generate: the same tokens?

    Checked in the model's dtype and again in fp32 (the bf16 weights cast up exactly, then back).
    A randomly initialised model's next-token logits are nearly tied, so in bf16 any difference
    in rounding flips a greedy choice and the sequences part from there: the control is plain
    `generate` run twice, and `identical` in fp32 is what says the engine decodes as generate does."""
    out = {"prompts": min(args.check_prompts, ids.shape[0]), "new_tokens": args.check_tokens}
    dtype = next(model.parameters()).dtype
    for name, check_dtype in (("model_dtype", dtype), ("float32", torch.float32)):
        model.to(check_dtype)
        out[name] = _greedy_agreement(args, model, tokenizer, olingo, ids, mask) | {"dtype": str(check_dtype)}
    model.to(dtype)
    return out


def _greedy_agreement(args, model, tokenizer, olingo, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    GenerationSettings, HFEngine = olingo.GenerationSettings, olingo.HFEngine

    n, k = min(args.check_prompts, ids.shape[0]), args.check_tokens
    with torch.no_grad():
        plain = [model.generate(input_ids=ids[:n], attention_mask=mask[:n], generation_config=plain_config(k, sample=False))[:, ids.shape[1]:]
                 for _ in range(2)]
        rollout = HFEngine(model, tokenizer).generate(ids[:n], mask[:n], GenerationSettings(max_new_tokens=k, do_sample=False, stop_token_ids=[]))
    ours = rollout.sequences[:, ids.shape[1]:]

    def agreement(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a == b).float().mean()) if a.shape == b.shape else 0.0

    return {"identical": bool(ours.shape == plain[0].shape and torch.equal(ours, plain[0])), "token_agreement": agreement(ours, plain[0]),
            "plain_twice_identical": bool(torch.equal(plain[0], plain[1])), "plain_twice_agreement": agreement(plain[0], plain[1]),
            "action_mask_all_true": bool(rollout.action_mask.all())}


# ---- vLLM -----------------------------------------------------------------------------------------------
def vllm_available() -> tuple[bool, str | None]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process, as olingo runs it
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the JSON summary only
    try:
        import vllm  # noqa: F401
    except Exception as error:  # ImportError, or a broken install
        return False, f"{type(error).__name__}: {error}"
    return True, None


def shutdown_llm(llm) -> None:
    """Free a vLLM engine fully so another can start (olingo's sequence where olingo imports)."""
    try:
        from olingo.engines.vllm_process import shutdown_llm as olingo_shutdown_llm
    except Exception:  # olingo's package not importable here
        olingo_shutdown_llm = None
    if olingo_shutdown_llm is not None:
        olingo_shutdown_llm(llm)
        return
    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()
        try:
            from vllm.distributed.parallel_state import (
                destroy_distributed_environment,
                destroy_model_parallel,
            )

            destroy_model_parallel()
            destroy_distributed_environment()
        except Exception:
            pass
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def kv_bytes(args, dtype: torch.dtype) -> int:
    """CPU: KV cache for every prompt at full length, x1.5 (vLLM's CPU backend needs an explicit size)."""
    head_dim = args.hidden // args.heads
    per_token = 2 * args.layers * args.kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    return max(64 * 2**20, int(1.5 * args.prompts * (args.prompt_len + args.new_tokens + 128) * per_token))


def bench_vllm(args, model_dir: str, prompts: list[list[int]], device: torch.device, dtype: torch.dtype) -> dict:
    from vllm import LLM, SamplingParams

    kwargs = {"model": model_dir, "tokenizer": model_dir, "dtype": str(dtype).removeprefix("torch."), "seed": args.seed,
              "max_model_len": args.prompt_len + args.new_tokens, "enforce_eager": not args.cuda_graphs, "disable_log_stats": True}
    if device.type == "cuda":
        kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
    else:
        kwargs["kv_cache_memory_bytes"] = kv_bytes(args, dtype)
    start = time.perf_counter()
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - start
    result = {"start_s": start_s, "enforce_eager": kwargs["enforce_eager"], "seconds": [], "tokens_per_s": []}
    try:
        def params(tokens: int, seed: int | None = None):
            return SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_tokens=tokens, min_tokens=0, ignore_eos=True,
                                  detokenize=False, seed=seed)

        requests = [{"prompt_token_ids": p} for p in prompts]
        start = time.perf_counter()
        llm.generate(requests[:8], params(min(16, args.new_tokens)), use_tqdm=False)
        result["warmup_s"] = time.perf_counter() - start
        for repeat in range(args.repeats):
            sync(device)
            start = time.perf_counter()
            outputs = llm.generate(requests, params(args.new_tokens), use_tqdm=False)
            sync(device)
            seconds = time.perf_counter() - start
            lengths = {len(o.outputs[0].token_ids) for o in outputs}
            if lengths != {args.new_tokens}:
                raise RuntimeError(f"vllm: response lengths {sorted(lengths)}, expected {args.new_tokens}")
            result["seconds"].append(seconds)
            result["tokens_per_s"].append(len(prompts) * args.new_tokens / seconds)
            print(f"vllm repeat {repeat}: {seconds:.2f} s, {result['tokens_per_s'][-1]:.0f} tok/s", file=sys.stderr, flush=True)
        result["best_tokens_per_s"] = max(result["tokens_per_s"])
    finally:
        shutdown_llm(llm)
    return result


def bench_olingo_vllm(args, model_dir: str, tokenizer, ids: torch.Tensor, mask: torch.Tensor, device: torch.device, dtype: torch.dtype) -> dict:
    from olingo.engines import GenerationSettings, VLLMEngine, VLLMSettings

    settings = VLLMSettings(dtype=str(dtype).removeprefix("torch."), max_model_len=args.prompt_len + args.new_tokens,
                            kv_cache_memory_gb=None if device.type == "cuda" else kv_bytes(args, dtype) / 2**30,
                            gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=not args.cuda_graphs)
    start = time.perf_counter()
    engine = VLLMEngine(model_dir, tokenizer, settings, device=device.type)
    result = {"start_s": time.perf_counter() - start, "seconds": [], "tokens_per_s": [],
              "note": "log-probs of every sampled token included (olingo always asks vLLM for them)"}
    try:
        sampling = GenerationSettings(max_new_tokens=args.new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, stop_token_ids=[])
        engine.generate(ids[:8], mask[:8], GenerationSettings(max_new_tokens=min(16, args.new_tokens), stop_token_ids=[]))
        for repeat in range(args.repeats):
            sync(device)
            start = time.perf_counter()
            rollout = engine.generate(ids, mask, sampling)
            sync(device)
            seconds = time.perf_counter() - start
            if rollout.num_actions != args.new_tokens or not bool(rollout.action_mask.all()):
                raise RuntimeError("olingo VLLMEngine: responses shorter than --new-tokens")
            result["seconds"].append(seconds)
            result["tokens_per_s"].append(ids.shape[0] * args.new_tokens / seconds)
            print(f"olingo_vllm_engine repeat {repeat}: {seconds:.2f} s, {result['tokens_per_s'][-1]:.0f} tok/s", file=sys.stderr, flush=True)
        result["best_tokens_per_s"] = max(result["tokens_per_s"])
    finally:
        engine.close()
    return result
