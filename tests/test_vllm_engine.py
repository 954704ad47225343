"""VLLMEngine (vLLM in this process) against HFEngine and the trainer's forward, the weight sync
from a full and a LoRA policy, strict and recoverable updates, and the process it runs in.

One engine serves the module (vLLM takes seconds to import and start); before each test the
checkpoint's weights are loaded back into it, so tests do not depend on each other's syncs.
The last test closes it and starts a second one.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import random
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from olingo.engines import (
    GenerationSettings,
    HFEngine,
    Rollout,
    RolloutEngine,
    VLLMEngine,
    VLLMSettings,
    engine_weights,
    sync_engine,
)
from olingo.engines.vllm_weights import checkpoint_shapes
from olingo.experience_maker import policy_logits
from olingo.models import load_causal_lm
from olingo.rl.logprobs import log_probs_from_logits
from olingo.tasks.tiny_model import build_tiny_llama, save_pretrained_pair
from olingo.tasks.tokenizer import build_char_tokenizer

# Not imported here: importing vllm changes the environment of the whole test session.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")]

# vLLM's CPU kernels and the transformers forward in float32 agree to ~1e-6 on this model.
LOG_PROB_TOLERANCE = 1e-4


@dataclass
class ProcessState:
    """What vLLM's start may change in the host process."""

    torch_rng: torch.Tensor
    python_rng: object
    numpy_rng: tuple
    threads: int
    set_num_threads: object
    environ: dict[str, str]
    warning_filters: list
    root_handlers: list

    @classmethod
    def now(cls) -> ProcessState:
        return cls(torch.get_rng_state(), random.getstate(), np.random.get_state(), torch.get_num_threads(),
                   torch.set_num_threads, dict(os.environ), list(warnings.filters), list(logging.getLogger().handlers))


@dataclass
class Started:
    engine: VLLMEngine
    before: ProcessState
    after: ProcessState


@pytest.fixture(scope="module")
def tok():
    tokenizer = build_char_tokenizer()
    tokenizer.padding_side = "left"
    return tokenizer


@pytest.fixture(scope="module")
def model_dir(tok, tmp_path_factory) -> Path:
    # head_dim 32: vLLM's CPU attention refuses 16.
    model = build_tiny_llama(tok, hidden_size=64, num_layers=2, num_heads=2, seed=7)
    return save_pretrained_pair(model, tok, tmp_path_factory.mktemp("vllm") / "tiny")


@pytest.fixture(scope="module")
def started(model_dir, tok):
    torch.manual_seed(1234)
    before = ProcessState.now()
    engine = VLLMEngine(model_dir, tok, VLLMSettings(kv_cache_memory_gb=0.05))
    after = ProcessState.now()
    yield Started(engine, before, after)
    engine.close()


@pytest.fixture
def engine(started, model_dir) -> VLLMEngine:
    """The module's engine, holding the checkpoint's weights (a full update from the files)."""
    started.engine.update_weights(load_file(str(model_dir / "model.safetensors")))
    return started.engine


@pytest.fixture
def hf_model(model_dir):
    return load_causal_lm(str(model_dir)).eval()


def prompt_batch(tok, count: int = 18) -> dict[str, torch.Tensor]:
    """`count` chat prompts of different lengths, left-padded."""
    questions = [f"{7919 * i % 10 ** (1 + i % 5)}+{317 * i % 10 ** (1 + i // 2 % 4)}=" for i in range(count)]
    chats = [[{"role": "user", "content": q}] if i % 3 else [{"role": "system", "content": "add"}, {"role": "user", "content": q}]
             for i, q in enumerate(questions)]
    ids = [tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=False) for chat in chats]
    assert len({len(i) for i in ids}) >= min(count, 6)  # really of different lengths
    return tok.pad({"input_ids": ids}, return_tensors="pt")


def assert_same_rollout(a: Rollout, b: Rollout) -> None:
    assert a.num_prompt_tokens == b.num_prompt_tokens
    assert torch.equal(a.sequences, b.sequences)
    assert torch.equal(a.attention_mask, b.attention_mask)
    assert torch.equal(a.action_mask, b.action_mask)
    assert torch.equal(a.truncated, b.truncated)
    assert a.finish_reasons == b.finish_reasons


def greedy(engine, batch, **kwargs) -> Rollout:
    settings = GenerationSettings(max_new_tokens=24, do_sample=False, **kwargs)
    return engine.generate(batch["input_ids"], batch["attention_mask"], settings)


def trainer_log_probs(model, rollout: Rollout, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = policy_logits(model, rollout.sequences, rollout.attention_mask, rollout.num_actions, temperature)
    return log_probs_from_logits(logits, rollout.sequences[:, -rollout.num_actions:])


def test_greedy_is_token_identical_to_hf(engine, hf_model, tok):
    batch = prompt_batch(tok)
    reasons = []
    digits = tok.convert_tokens_to_ids(list("01234"))
    for stops in (None, [tok.eos_token_id, *digits]):
        vllm_rollout = greedy(engine, batch, stop_token_ids=stops)
        hf_rollout = HFEngine(hf_model, tok, with_log_probs=True).generate(
            batch["input_ids"], batch["attention_mask"], GenerationSettings(max_new_tokens=24, do_sample=False, stop_token_ids=stops))
        assert_same_rollout(vllm_rollout, hf_rollout)
        mask = vllm_rollout.action_mask
        # Greedy log-probs are at temperature 1, like HFEngine's.
        assert (vllm_rollout.log_probs - hf_rollout.log_probs)[mask].abs().max() < LOG_PROB_TOLERANCE
        assert (vllm_rollout.log_probs[~mask] == 0).all()
        reasons += vllm_rollout.finish_reasons
    assert {"stop", "length"} <= set(reasons)  # both ways of ending were compared


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_match_the_trainer_forward(engine, hf_model, tok, temperature):
    batch = prompt_batch(tok, 8)
    settings = GenerationSettings(max_new_tokens=16, temperature=temperature, stop_token_ids=[])
    rollout = engine.generate(batch["input_ids"], batch["attention_mask"], settings, n=2)
    expected = trainer_log_probs(hf_model, rollout, temperature)
    mask = rollout.action_mask
    assert mask.all()
    assert (rollout.log_probs - expected)[mask].abs().max() < LOG_PROB_TOLERANCE
    # At another temperature the values differ by far more: the test can tell them apart.
    other = trainer_log_probs(hf_model, rollout, 1.0 if temperature != 1.0 else 0.7)
    assert (rollout.log_probs - other)[mask].abs().max() > 100 * LOG_PROB_TOLERANCE


def test_log_probs_under_top_k_are_those_of_the_truncated_distribution(engine, hf_model, tok):
    """With top-k on, the sampled token's log-prob renormalised over the k kept tokens (documented)."""
    batch = prompt_batch(tok, 8)
    settings = GenerationSettings(max_new_tokens=16, temperature=0.7, top_k=5, stop_token_ids=[])
    rollout = engine.generate(batch["input_ids"], batch["attention_mask"], settings)
    with torch.no_grad():
        logits = policy_logits(hf_model, rollout.sequences, rollout.attention_mask, rollout.num_actions, 0.7)
    kth = logits.topk(5, dim=-1).values[..., -1:]
    truncated = logits.masked_fill(logits < kth, float("-inf"))
    tokens = rollout.sequences[:, -rollout.num_actions:]
    assert (logits.gather(-1, tokens.unsqueeze(-1)) >= kth).all()  # every token from the top 5
    expected = log_probs_from_logits(truncated, tokens)
    assert (rollout.log_probs - expected).abs().max() < LOG_PROB_TOLERANCE
    assert (rollout.log_probs - log_probs_from_logits(logits, tokens)).min() > 0  # not the full-vocabulary value


def test_samples_are_prompt_major_seeded_from_the_global_rng(engine, tok):
    batch = prompt_batch(tok, 4)
    settings = GenerationSettings(max_new_tokens=12, stop_token_ids=[])

    def sample(seed: int) -> tuple[Rollout, float]:
        torch.manual_seed(seed)
        rollout = engine.generate(batch["input_ids"], batch["attention_mask"], settings, n=3)
        return rollout, torch.rand(1).item()

    first, after_first = sample(5)
    again, _ = sample(5)
    other, _ = sample(6)
    assert torch.equal(first.sequences, again.sequences)
    assert not torch.equal(first.sequences, other.sequences)
    width = first.num_prompt_tokens
    assert torch.equal(first.sequences[:, :width], batch["input_ids"].repeat_interleave(3, dim=0))
    responses = first.sequences[:, width:].tolist()
    assert all(len({tuple(r) for r in responses[i * 3:(i + 1) * 3]}) > 1 for i in range(4))  # 3 samples, not copies
    # The global generator moved by exactly one seed per request: vLLM's own draws stay off it.
    torch.manual_seed(5)
    torch.randint(0, 2**31 - 1, (12,))
    assert torch.rand(1).item() == after_first


def test_no_stop_token_runs_to_max_new_tokens(engine, tok):
    torch.manual_seed(0)
    batch = prompt_batch(tok)
    rollout = engine.generate(batch["input_ids"], batch["attention_mask"], GenerationSettings(max_new_tokens=40, stop_token_ids=[]))
    responses = rollout.sequences[:, rollout.num_prompt_tokens:]
    assert (responses == tok.eos_token_id).any()  # eos was sampled, and did not stop the row
    assert rollout.num_actions == 40 and rollout.action_mask.all()
    assert rollout.finish_reasons == ["length"] * len(responses) and not rollout.truncated.any()


def test_stop_strings_end_at_the_completing_token_like_hf(engine, hf_model, tok):
    batch = prompt_batch(tok)
    plain = greedy(engine, batch, stop_token_ids=[])
    row = plain.sequences[0, plain.num_prompt_tokens:].tolist()
    stop = tok.decode(row[5:7], skip_special_tokens=False)  # two tokens: the second completes it
    settings = GenerationSettings(max_new_tokens=24, do_sample=False, stop_token_ids=[], stop_strings=[stop])
    vllm_rollout = engine.generate(batch["input_ids"], batch["attention_mask"], settings)
    hf_rollout = HFEngine(hf_model, tok).generate(batch["input_ids"], batch["attention_mask"], settings)
    assert_same_rollout(vllm_rollout, hf_rollout)
    assert vllm_rollout.finish_reasons[0] == "stop" and vllm_rollout.action_mask[0].sum() <= 7
    # Sampled: every row that stopped ends at the token completing the string.
    torch.manual_seed(0)
    settings = GenerationSettings(max_new_tokens=24, stop_token_ids=[], stop_strings=["1", "<|end|>"])
    rollout = engine.generate(batch["input_ids"], batch["attention_mask"], settings, n=2)
    assert "stop" in rollout.finish_reasons
    for row, reason in enumerate(rollout.finish_reasons):
        ids = rollout.sequences[row, rollout.num_prompt_tokens:][rollout.action_mask[row]].tolist()
        text, shorter = tok.decode(ids, skip_special_tokens=False), tok.decode(ids[:-1], skip_special_tokens=False)
        ends_here = any(s in text for s in settings.stop_strings) and not any(s in shorter for s in settings.stop_strings)
        assert ends_here == (reason == "stop"), (row, text)


def perturbed(model, seed: int):
    """A deterministic policy update: a few AdamW steps of next-token loss on random tokens."""
    model = copy.deepcopy(model).train()
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    for _ in range(3):
        ids = torch.randint(8, 104, (4, 16), generator=generator)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


def test_sync_after_a_policy_update_matches_hf(engine, hf_model, tok, caplog):
    batch = prompt_batch(tok)
    before = greedy(engine, batch, stop_token_ids=[])
    updated = perturbed(hf_model, seed=1)
    sync = sync_engine(engine, updated)
    assert sync.tensors == len(checkpoint_shapes(engine.model_path))
    assert sync.nbytes == sum(p.numel() * p.element_size() for p in updated.parameters())
    metrics = sync.metrics()
    assert metrics["time/weight_sync"] > 0 and metrics["perf/weight_sync_GBps"] > 0
    after = greedy(engine, batch, stop_token_ids=[])
    assert not torch.equal(before.sequences, after.sequences)  # the update changed the rollouts
    assert_same_rollout(after, greedy(HFEngine(updated, tok), batch, stop_token_ids=[]))
    assert "Failed to load weights" not in caplog.text  # vLLM's rotary-embedding noise is filtered


def lora_policy(model, kind: str):
    """A LoRA policy whose adapter changes the outputs: a peft `PeftModel` or olingo's in-place injection."""
    import peft

    if kind == "peft":
        config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        return peft.get_peft_model(copy.deepcopy(model), config).eval()
    from olingo.models.lora import apply_lora

    policy = apply_lora(copy.deepcopy(model), r=8, alpha=16, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator))
    return policy.eval()


@pytest.mark.parametrize("kind", ["peft", "apply_lora"])
def test_sync_of_a_lora_policy_merges_out_of_place(engine, hf_model, tok, kind):
    batch = prompt_batch(tok)
    policy = lora_policy(hf_model, kind)
    trained = {name: p.detach().clone() for name, p in policy.named_parameters()}
    names = [name for name, _ in engine_weights(policy)]
    assert not any("lora_" in name for name in names)
    assert sorted(names) == sorted(checkpoint_shapes(engine.model_path))  # plain checkpoint names
    sync_engine(engine, policy)
    assert all(torch.equal(trained[name], p) for name, p in policy.named_parameters())  # nothing merged in place
    rollout = greedy(engine, batch, stop_token_ids=[])
    assert_same_rollout(rollout, greedy(HFEngine(policy, tok), batch, stop_token_ids=[]))
    assert not torch.equal(rollout.sequences, greedy(HFEngine(hf_model, tok), batch, stop_token_ids=[]).sequences)


def test_tied_weights_are_sent_once_under_the_saved_name(tok, tmp_path):
    model = build_tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=1)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    save_pretrained_pair(model, tok, tmp_path)
    assert sorted(name for name, _ in engine_weights(model)) == sorted(checkpoint_shapes(tmp_path))


FSDP_SCRIPT = """
import copy, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from olingo.engines import engine_weights
from olingo.models.lora import apply_lora
from olingo.tasks.tiny_model import build_tiny_llama
from olingo.tasks.tokenizer import build_char_tokenizer

dist.init_process_group("gloo")
for lora in (False, True):
    model = build_tiny_llama(build_char_tokenizer(), hidden_size=32, num_layers=2, num_heads=1, seed=3)
    if lora:
        model = apply_lora(model, r=4, alpha=8, target_modules=["q_proj", "v_proj"])
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_()
    expected = {name: t.clone() for name, t in engine_weights(model)}
    sharded = copy.deepcopy(model)
    for layer in sharded.model.layers:
        fully_shard(layer)
    fully_shard(sharded)
    assert any(isinstance(p, DTensor) for p in sharded.parameters())
    got = dict(engine_weights(sharded))
    assert got.keys() == expected.keys(), got.keys() ^ expected.keys()
    for name, tensor in got.items():
        assert not isinstance(tensor, DTensor) and torch.allclose(tensor, expected[name], atol=1e-6), name
dist.destroy_process_group()
print("OK")
"""


def test_engine_weights_gathers_fsdp2_parameters(tmp_path):
    """FSDP2 (one gloo rank, in a subprocess: the module's engine holds this process's group):
    DTensor parameters come out whole, with and without LoRA, equal to the unsharded model's."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = tmp_path / "fsdp_weights.py"
    script.write_text(textwrap.dedent(FSDP_SCRIPT))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180, cwd=Path(__file__).parents[1])
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


def test_bad_updates_raise_before_loading_and_leave_the_engine_working(engine, hf_model, tok, model_dir):
    batch = prompt_batch(tok)
    reference = greedy(HFEngine(hf_model, tok), batch)
    state = load_file(str(model_dir / "model.safetensors"))
    with pytest.raises(ValueError, match=r"unknown names \['model.bogus.weight'\]"):
        engine.update_weights({**{k: v + 1 for k, v in state.items()}, "model.bogus.weight": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"1 missing \['lm_head.weight'\]"):
        engine.update_weights({k: v + 1 for k, v in state.items() if k != "lm_head.weight"})
    with pytest.raises(ValueError, match="wrong shapes"):
        engine.update_weights({**state, "model.norm.weight": torch.ones(3)})
    with pytest.raises(ValueError, match="full updates only"):
        engine.update_weights(state, full=False)
    assert_same_rollout(greedy(engine, batch), reference)


@pytest.mark.parametrize("problem", ["unknown", "missing"])
def test_a_failed_stream_blocks_generation_until_a_full_update(engine, hf_model, tok, model_dir, problem):
    batch = prompt_batch(tok)
    state = load_file(str(model_dir / "model.safetensors"))
    items = list(state.items())

    def stream():
        if problem == "unknown":
            yield from items[:5]
            yield "model.bogus.weight", torch.zeros(3)
        else:
            yield from items[:-1]

    with pytest.raises(ValueError, match="unknown name 'model.bogus.weight'" if problem == "unknown" else "missing 1 names"):
        engine.update_weights(stream())
    with pytest.raises(RuntimeError, match="refuses to generate"):
        greedy(engine, batch)
    assert engine.update_weights(iter(items)) == len(items)
    assert_same_rollout(greedy(engine, batch), greedy(HFEngine(hf_model, tok), batch))


def test_a_slow_update_times_out_and_the_engine_recovers(engine, hf_model, tok, model_dir):
    batch = prompt_batch(tok, 4)
    items = list(load_file(str(model_dir / "model.safetensors")).items())

    def slow():
        yield items[0]
        time.sleep(1.5)
        yield from items[1:]

    engine.settings.sync_timeout_s = 0.5
    try:
        with pytest.raises(TimeoutError, match="sync_timeout_s=0.5"):
            engine.update_weights(slow())
    finally:
        engine.settings.sync_timeout_s = 300.0
    with pytest.raises(RuntimeError, match="refuses to generate"):
        greedy(engine, batch)
    engine.update_weights(items)
    assert_same_rollout(greedy(engine, batch), greedy(HFEngine(hf_model, tok), batch))


def test_settings_vllm_cannot_honour_are_refused(engine, tok):
    batch = prompt_batch(tok, 2)
    with pytest.raises(ValueError, match="temperature=0.005"):
        engine.generate(batch["input_ids"], batch["attention_mask"], GenerationSettings(temperature=0.005))
    with pytest.raises(ValueError, match="max_model_len=256"):
        engine.generate(batch["input_ids"], batch["attention_mask"], GenerationSettings(max_new_tokens=250))
    with pytest.raises(ValueError, match="sleep_while_training needs CUDA"):
        VLLMEngine(engine.model_path, tok, VLLMSettings(sleep_while_training=True))
    with pytest.raises(ValueError, match="unknown key 'kv_cache_gb'"):
        VLLMSettings(kv_cache_gb=1.0)


def test_process_side_effects_are_contained(started):
    before, after = started.before, started.after
    assert torch.equal(before.torch_rng, after.torch_rng)
    assert before.python_rng == after.python_rng
    assert all(np.array_equal(a, b) for a, b in zip(before.numpy_rng, after.numpy_rng, strict=True))
    assert before.threads == after.threads and after.set_num_threads is before.set_num_threads
    assert before.environ == after.environ
    assert before.warning_filters == after.warning_filters and before.root_handlers == after.root_handlers


def test_engine_interface(started):
    engine = started.engine
    assert isinstance(engine, RolloutEngine)
    assert engine.shares_weights is False and HFEngine.shares_weights is True
    assert engine.can_sleep is False
    engine.sleep()  # no-ops on CPU
    engine.wake()
    hf = HFEngine(torch.nn.Linear(1, 1), None)
    assert sync_engine(hf, torch.nn.Linear(1, 1)).metrics() == {"time/weight_sync": 0.0, "perf/weight_sync_GBps": 0.0}


def test_importing_the_engines_does_not_import_vllm():
    code = "import sys, olingo.engines; from olingo.engines import VLLMSettings; VLLMSettings(); assert 'vllm' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1])
    assert result.returncode == 0, result.stderr[-2000:]


def test_close_leaves_the_process_ready_for_another_engine(started, model_dir, hf_model, tok):
    """Runs last: it closes the module's engine."""
    started.engine.close()
    assert not torch.distributed.is_initialized()
    with pytest.raises(RuntimeError, match="closed"):
        greedy(started.engine, prompt_batch(tok, 2))
    with VLLMEngine(model_dir, tok, VLLMSettings(kv_cache_memory_gb=0.05)) as second:
        batch = prompt_batch(tok)
        assert_same_rollout(greedy(second, batch), greedy(HFEngine(hf_model, tok), batch))
    assert not torch.distributed.is_initialized()
