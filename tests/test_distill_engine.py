"""A distillation teacher on a vLLM engine of its own (`model.teacher_engine=vllm`): the engine's
scores against the trainer's forward on single-turn and segmented rows, and a run that equals the
run with the teacher as a model up to the two forwards' rounding, its engine closed at the end."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from olingo.config import load_config, packaged_config
from olingo.engines import GenerationSettings, HFEngine, ScoringEngine, VLLMEngine, VLLMSettings
from olingo.experience_maker.scoring import action_log_probs
from olingo.models import load_causal_lm, load_tokenizer
from olingo.recipes.grpo import run_grpo
from olingo.recipes.grpo_config import GRPOConfig
from olingo.tasks.tiny_model import build_tiny_llama, save_pretrained_pair
from tests.conftest import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")]

# vLLM's CPU kernels and the transformers forward, both float32, sum in different orders; measured
# ~2e-6 apart on this model, so 1e-4 per token is far from both rounding and a real difference.
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def teacher_dir(assets, tmp_path_factory):
    """A teacher with peaked next-token distributions (its head scaled up) and head_dim 32, which
    vLLM's CPU attention needs (the test assets' model has 16)."""
    tok = load_tokenizer(str(assets.model_dir))
    teacher = build_tiny_llama(tok, num_heads=2, seed=1)
    with torch.no_grad():
        teacher.lm_head.weight.mul_(20.0)
    return save_pretrained_pair(teacher, tok, tmp_path_factory.mktemp("teacher") / "teacher")


def segment_log_probs(model, tokens: torch.Tensor) -> torch.Tensor:
    """log p(token t | tokens before it) for t >= 1 of one segment, by a plain forward: (n - 1,)."""
    with torch.no_grad():
        logits = model(tokens[None]).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, tokens[1:, None])[:, 0]


def test_the_engine_scores_sampled_rows_and_segments_as_the_trainer_forward(assets, teacher_dir):
    tok = load_tokenizer(str(assets.model_dir), padding_side="left")
    model = load_causal_lm(str(teacher_dir)).eval()
    prompts = tok(["1+2=", "12+345=", "7+80="], padding=True, return_tensors="pt")
    torch.manual_seed(0)
    rollout = HFEngine(model, tok).generate(prompts.input_ids, prompts.attention_mask, GenerationSettings(max_new_tokens=8), n=2)
    expected = action_log_probs(model, rollout.sequences, rollout.attention_mask, rollout.num_actions)
    first, second = (rollout.sequences[k][rollout.attention_mask[k].bool()] for k in (0, 3))
    row = torch.cat([first, second])[None]
    positions = torch.cat([torch.arange(len(first)), torch.arange(len(second))])[None]
    with VLLMEngine(teacher_dir, tok, VLLMSettings(kv_cache_memory_gb=0.05)) as engine:
        assert isinstance(engine, ScoringEngine)
        got = engine.score(rollout.sequences, rollout.attention_mask, rollout.num_actions)
        padded = engine.score(torch.nn.functional.pad(rollout.sequences, (0, 2)), torch.nn.functional.pad(rollout.attention_mask, (0, 2)),
                              rollout.num_actions + 2)  # two more columns of padding after every row
        split = engine.score(row, torch.ones_like(row), row.shape[1] - 2, positions)
    sampled = rollout.action_mask.bool()
    assert (got - expected)[sampled].abs().max() < TOLERANCE
    assert (padded[:, :-2] - got).abs().max() < TOLERANCE and not padded[:, -2:].any()  # 0 after each row's end
    # two segments scored apart: each token after a segment's first given only its own segment; 0 at the second's first
    alone = torch.cat([torch.zeros(1), segment_log_probs(model, first), torch.zeros(1), segment_log_probs(model, second)])[2:]
    assert split[0, len(first) - 2] == 0.0
    assert (split[0] - alone).abs().max() < TOLERANCE


def config(out, name, student, teacher, *extra) -> GRPOConfig:
    return load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), [
        f"run.output_dir={out}", f"run.name={name}", f"model.actor={student}", f"model.teacher={teacher}", "experience.distill_coef=1.0",
        "reward.functions={}", "loop.accuracy_function=null", "experience.num_generations=4", "loop.rollout_batch_size=4",
        "loop.train_batch_size=16", "loop.update_steps=1", "generation.max_new_tokens=6", "actor_optim.lr=1e-2", "loop.eval_interval=0",
        "loop.episodes=2", "loop.save_interval=0", "loop.eval_batch_size=64", "logging.progress=false", "generation.vllm.kv_cache_memory_gb=0.05", *extra,
    ])


def test_a_run_with_the_teacher_on_its_engine_equals_the_run_with_the_teacher_as_a_model(tmp_path, assets, teacher_dir):
    """The same seed samples the same first batch and held-out answers (the student samples
    through its own HF engine), so the teacher's KL there agrees to the scoring tolerance per
    token (6 tokens a response); the engine is closed when the run ends."""
    extra = [f"data.eval_prompts=[{assets.prompts_eval}]"]
    model = run_grpo(config(tmp_path, "model", assets.model_dir, teacher_dir, *extra))
    engine = run_grpo(config(tmp_path, "engine", assets.model_dir, teacher_dir, "model.teacher_engine=vllm", *extra))
    assert engine["steps"] == model["steps"] == 2
    assert engine["eval_before"]["eval/teacher_kl"] == pytest.approx(model["eval_before"]["eval/teacher_kl"], abs=6 * TOLERANCE)
    rows = {name: [r for r in read_jsonl(tmp_path / name / "metrics.jsonl") if "rollout/teacher_kl" in r] for name in ("model", "engine")}
    assert rows["engine"][0]["rollout/teacher_kl"] == pytest.approx(rows["model"][0]["rollout/teacher_kl"], abs=6 * TOLERANCE)
    assert rows["engine"][0]["rollout/teacher_kl"] > 1.0  # a real difference to measure: the teacher is far from the student
    assert not torch.distributed.is_initialized()  # the teacher's engine was shut down with its process group
