"""The vLLM engine's CUDA-only paths: bf16 weights, sleep mode between rollouts, a sync after
waking. Skipped without a CUDA device and the CUDA `vllm` package (CI has neither)."""

from __future__ import annotations

import pytest
import torch

from olingo.engines import GenerationSettings, HFEngine, sync_engine
from olingo.tasks.tiny_model import build_tiny_llama, save_pretrained_pair
from olingo.tasks.tokenizer import build_char_tokenizer


def _cuda_vllm() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return current_platform.is_cuda()


pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.skipif(not _cuda_vllm(), reason="needs a CUDA device and the CUDA vllm package")]


def test_sleep_sync_and_greedy_parity_on_cuda(tmp_path):
    from olingo.engines.vllm import VLLMEngine, VLLMSettings

    tok = build_char_tokenizer()
    tok.padding_side = "left"
    model = build_tiny_llama(tok, hidden_size=64, num_layers=2, num_heads=2, seed=3)
    model_dir = save_pretrained_pair(model, tok, tmp_path / "tiny")
    chats = [tok.apply_chat_template([{"role": "user", "content": f"{i}+{2 * i}="}], add_generation_prompt=True, return_dict=False) for i in range(16)]
    ids = tok.pad({"input_ids": chats}, return_tensors="pt")
    settings = GenerationSettings(max_new_tokens=16, do_sample=False, stop_token_ids=[])
    vllm_settings = VLLMSettings(dtype="float32", kv_cache_memory_gb=None, gpu_memory_utilization=0.2, sleep_while_training=True)
    with VLLMEngine(model_dir, tok, vllm_settings, device="cuda") as engine:
        assert engine.can_sleep
        free_awake = torch.cuda.mem_get_info()[0]
        engine.sleep()
        assert torch.cuda.mem_get_info()[0] > free_awake  # the KV cache and weights left the GPU
        engine.wake()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        model = model.cuda().eval()
        sync_engine(engine, model)
        got = engine.generate(ids["input_ids"], ids["attention_mask"], settings)
        want = HFEngine(model, tok).generate(ids["input_ids"], ids["attention_mask"], settings)
        assert torch.equal(got.sequences.cpu(), want.sequences.cpu())
