"""Rollout engines: every engine holds to the sequence layout (docs/engines.md); the experience
maker and the PPO trainer generate only through the engine they are given; a learner without a
critic builds, trains and checkpoints none."""

from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch

from olingo.booster import Booster
from olingo.dataset.prompts import PromptCollator
from olingo.engines import (
    GenerationSettings,
    HFEngine,
    Rollout,
    RolloutEngine,
    repeat_prompts,
    rollout_from_responses,
)
from olingo.experience_maker import Experience, PPOExperienceMaker
from olingo.models import load_causal_lm, load_tokenizer
from olingo.models.critic import Critic
from olingo.rewards.rlvr import RLVRRewardModel
from olingo.trainer.learner import learn_step
from olingo.trainer.ppo import PPOTrainer
from olingo.trainer.ppo_learner import PolicyLearner, PPOLearner

PROMPTS = ["1+1=", "12+17=", "3+45="]


class CentredScore:
    """A critic-free estimator for these tests: each row's score minus the batch mean, on every token."""

    needs_critic = False

    def __call__(self, inputs):
        return (inputs.score - inputs.score.mean()).unsqueeze(-1).expand_as(inputs.rewards).clone(), None


class ScriptedEngine:
    """An engine that answers with a scripted sequence of responses (token ids), in order."""

    def __init__(self, tokenizer, responses: list[list[int]]) -> None:
        self.tokenizer, self.script, self.calls = tokenizer, itertools.cycle(responses), 0

    def generate(self, input_ids, attention_mask, settings, n=1) -> Rollout:
        self.calls += 1
        input_ids, attention_mask = repeat_prompts(input_ids, attention_mask, n)
        rows = [next(self.script)[: settings.max_new_tokens] for _ in range(input_ids.shape[0])]
        width = max(len(r) for r in rows)
        responses = torch.tensor([r + [self.tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        return rollout_from_responses(input_ids, attention_mask, responses, self.tokenizer, settings)

    shares_weights, can_sleep = True, False

    def update_weights(self, named_tensors, *, full=True) -> int:
        return len(list(named_tensors))

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def tok(assets):
    return load_tokenizer(str(assets.model_dir), padding_side="left")


def prompt_batch(tok, prompts=PROMPTS):
    items = [
        {"input_ids": tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=False), "gt_answer": "2"}
        for p in prompts
    ]
    return PromptCollator(tok.pad_token_id)(items)


def encode(tok, text: str, stop: bool = True) -> list[int]:
    return tok.encode(text, add_special_tokens=False) + ([tok.eos_token_id] if stop else [])


def check_layout(rollout: Rollout, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int, pad: int) -> None:
    """The layout of docs/engines.md: [left-padded prompt | response, right-padded]; the action mask
    covers the response up to and including its stop token; every (B, A) tensor lines up with it."""
    batch, prompt_width = input_ids.shape
    assert rollout.sequences.shape[0] == batch * n and rollout.num_prompt_tokens == prompt_width
    assert torch.equal(rollout.sequences[:, :prompt_width], input_ids.repeat_interleave(n, dim=0))
    assert torch.equal(rollout.attention_mask[:, :prompt_width], attention_mask.repeat_interleave(n, dim=0).long())
    width = rollout.num_actions
    assert rollout.sequences.shape[1] == prompt_width + width and rollout.action_mask.shape == (batch * n, width)
    assert rollout.action_mask.dtype == torch.bool
    assert torch.equal(rollout.attention_mask[:, prompt_width:].bool(), rollout.action_mask)
    lengths = rollout.action_mask.sum(-1)
    for row, length in enumerate(lengths.tolist()):
        assert rollout.action_mask[row, :length].all() and not rollout.action_mask[row, length:].any()  # right-padded
        assert (rollout.sequences[row, prompt_width + length:] == pad).all()
    assert len(rollout.finish_reasons) == batch * n and set(rollout.finish_reasons) <= {"stop", "length"}
    assert [r == "length" for r in rollout.finish_reasons] == rollout.truncated.tolist()
    if rollout.log_probs is not None:
        assert rollout.log_probs.shape == rollout.action_mask.shape


def engines(tok, assets):
    model = load_causal_lm(str(assets.model_dir))
    script = [encode(tok, "2"), encode(tok, "29"), encode(tok, "48", stop=False), encode(tok, "")]
    return {
        "hf": HFEngine(model, tok),
        "hf+log_probs": HFEngine(model, tok, with_log_probs=True),
        "scripted": ScriptedEngine(tok, script),
    }


@pytest.mark.parametrize("name", ["hf", "hf+log_probs", "scripted"])
@pytest.mark.parametrize("n", [1, 3])
def test_every_engine_keeps_the_sequence_layout(name, n, tok, assets):
    torch.manual_seed(0)
    engine = engines(tok, assets)[name]
    assert isinstance(engine, RolloutEngine)
    batch = prompt_batch(tok)
    settings = GenerationSettings(max_new_tokens=5, stop_token_ids=[tok.eos_token_id] + list(range(3, 30)))
    rollout = engine.generate(batch["input_ids"], batch["attention_mask"], settings, n=n)
    check_layout(rollout, batch["input_ids"], batch["attention_mask"], n, tok.pad_token_id)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_the_vllm_engine_keeps_the_sequence_layout(tok, assets):
    from olingo.engines import VLLMEngine, VLLMSettings

    batch = prompt_batch(tok)
    settings = GenerationSettings(max_new_tokens=5, stop_token_ids=[tok.eos_token_id] + list(range(3, 30)))
    with VLLMEngine(assets.model_dir, tok, VLLMSettings(kv_cache_memory_gb=0.05)) as engine:
        assert isinstance(engine, RolloutEngine)
        for n in (1, 3):
            torch.manual_seed(0)
            rollout = engine.generate(batch["input_ids"], batch["attention_mask"], settings, n=n)
            check_layout(rollout, batch["input_ids"], batch["attention_mask"], n, tok.pad_token_id)
            assert rollout.log_probs is not None


def test_samples_of_one_prompt_come_together_and_differ(tok, assets):
    torch.manual_seed(0)
    batch = prompt_batch(tok)
    engine = HFEngine(load_causal_lm(str(assets.model_dir)), tok)
    rollout = engine.generate(batch["input_ids"], batch["attention_mask"], GenerationSettings(max_new_tokens=6, stop_token_ids=[]), n=4)
    responses = rollout.sequences[:, rollout.num_prompt_tokens:]
    assert len({tuple(r) for r in responses[:4].tolist()}) > 1  # four samples, not four copies
    assert rollout.finish_reasons == ["length"] * 12 and not rollout.truncated.any()  # no stop asked for


def test_hf_engine_updates_weights_strictly(tok, assets):
    source, target = load_causal_lm(str(assets.model_dir)), load_causal_lm(str(assets.model_dir))
    with torch.no_grad():
        for p in source.parameters():
            p.add_(0.01)
    engine = HFEngine(target, tok)
    assert engine.update_weights(source.state_dict().items()) == len(source.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values(), strict=True))
    with pytest.raises(ValueError, match="do not match"):
        engine.update_weights({f"module.{k}": v for k, v in source.state_dict().items()}.items())


def test_ppo_trainer_generates_only_through_its_engine(tok, assets):
    """A scripted engine drives PPO: the experience holds exactly the scripted responses, laid out."""
    torch.manual_seed(0)
    actor, reference = load_causal_lm(str(assets.model_dir)), load_causal_lm(str(assets.model_dir)).eval()
    critic = Critic.from_pretrained(str(assets.model_dir), pad_token_id=tok.pad_token_id)
    actor_booster, critic_booster = Booster(), Booster()
    actor, actor_optim, *_ = actor_booster.boost(actor, torch.optim.AdamW(actor.parameters(), lr=1e-3))
    critic, critic_optim, *_ = critic_booster.boost(critic, torch.optim.AdamW(critic.parameters(), lr=1e-3))
    script = [encode(tok, "2"), encode(tok, "31"), encode(tok, "4444", stop=False)]
    engine = ScriptedEngine(tok, script)
    actor.generate = None  # a trainer that called generate itself would fail here
    trainer = PPOTrainer(
        actor_booster, critic_booster, actor, critic, RLVRRewardModel(["arithmetic_exact"]), reference, actor_optim, critic_optim,
        None, None, tok, ptx_coef=0.0, train_batch_size=3, engine=engine, max_new_tokens=4,
    )
    batch = prompt_batch(tok)
    experience = trainer.experience_maker.make_experience(batch["input_ids"], batch["attention_mask"], ["2", "29", "48"])
    assert engine.calls == 1
    prompt_width = batch["input_ids"].shape[1]
    expected = [script[0], script[1], script[2][:4]]
    for row, ids in enumerate(expected):
        length = int(experience.action_mask[row].sum())
        assert experience.sequences[row, prompt_width:prompt_width + length].tolist() == ids
    assert experience.truncated.tolist() == [False, False, True]
    assert experience.raw_score.tolist() == [1.0, 0.0, 0.0]  # '2' is right for 1+1=, '31' is not 29
    for name in experience.per_token_fields:
        assert getattr(experience, name).shape == experience.action_mask.shape


def test_learn_phase_without_a_critic_has_no_critic_anywhere(tok, assets, tmp_path):
    torch.manual_seed(0)
    actor, reference = load_causal_lm(str(assets.model_dir)), load_causal_lm(str(assets.model_dir)).eval()
    booster = Booster()
    actor, optim, *_ = booster.boost(actor, torch.optim.AdamW(actor.parameters(), lr=1e-3))
    learner = PPOLearner(PolicyLearner(booster, actor, optim, None))
    assert learner.critic is None and learner.critic_learner is None
    # Experience without values/returns: the advantage here is the centred score, broadcast.
    maker = PPOExperienceMaker(actor, None, RLVRRewardModel(["arithmetic_exact"]), reference, tok, estimator=CentredScore(),
                                 engine=ScriptedEngine(tok, [encode(tok, "2"), encode(tok, "5")]), generation=GenerationSettings(max_new_tokens=3))
    batch = prompt_batch(tok)
    experience = maker.make_experience(batch["input_ids"], batch["attention_mask"], ["2", "29", "48"])
    assert experience.values is None and experience.returns is None
    assert "values" not in experience.per_token_fields and "returns" not in experience.per_token_fields
    before = {k: v.clone() for k, v in actor.state_dict().items()}
    metrics = learn_step(learner, [experience], 1.0)
    assert not any("critic" in key or "value" in key for key in metrics), metrics
    assert any(not torch.equal(before[k], v) for k, v in actor.state_dict().items())
    learner.save(tmp_path)
    assert (tmp_path / "actor").is_dir() and not list(tmp_path.glob("critic*"))
    # The buffer keeps critic-free experience critic-free.
    from olingo.experience_maker import make_experience_batch, split_experience_batch

    rebuilt = make_experience_batch(split_experience_batch(experience), tok.pad_token_id)
    assert isinstance(rebuilt, Experience) and rebuilt.values is None and rebuilt.returns is None


def test_gae_without_a_critic_is_refused(tok, assets):
    actor = load_causal_lm(str(assets.model_dir))
    maker = PPOExperienceMaker(actor, None, RLVRRewardModel(["arithmetic_exact"]), actor, tok, engine=ScriptedEngine(tok, [encode(tok, "2")]))
    batch = prompt_batch(tok)
    with pytest.raises(ValueError, match="'gae' needs a critic"):
        maker.make_experience(batch["input_ids"], batch["attention_mask"], ["2", "29", "48"])
