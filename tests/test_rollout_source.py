"""The rollout-source contract (olingo/rollout/source.py) and the seam it opens: a source built
outside the library trains through the same experience maker, learner and loop, untouched."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch

from olingo.booster import Booster
from olingo.engines import GenerationSettings
from olingo.experience_maker.group import GroupExperienceConfig, GroupExperienceMaker
from olingo.models import load_causal_lm
from olingo.rollout import PromptBatch, SingleTurnSource
from olingo.trainer.grpo_learner import GRPOLearner, GRPOLossConfig
from olingo.trainer.online_config import OnlineLoopConfig
from olingo.trainer.online_trainer import OnlineTrainer
from tests.test_engines import ScriptedEngine, encode, prompt_batch, tok  # noqa: F401 - the module's tokenizer fixture
from tests.test_grpo import loader, reward

SCRIPT = ["2", "5", "17", "ab"]
ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def scripted(tok) -> ScriptedEngine:  # noqa: F811 - the imported fixture
    return ScriptedEngine(tok, [encode(tok, text) for text in SCRIPT])


def test_single_turn_source_keeps_the_sampled_ids_prompt_major_with_the_rows_repeated(tok):  # noqa: F811 - the imported fixture
    batch = PromptBatch.from_collated(prompt_batch(tok))
    batch = dataclasses.replace(batch, gt_answers=["a", "b", "c"], row_fields={"level": [1, 2, 3]})
    sampled = SingleTurnSource(scripted(tok), tok.pad_token_id).sample(batch, GenerationSettings(max_new_tokens=6), n=2)
    rollout, width = sampled.rollout, batch.input_ids.shape[1]
    assert rollout.sequences.shape[0] == 6
    assert torch.equal(sampled.prompts.input_ids, batch.input_ids.repeat_interleave(2, dim=0))
    assert sampled.prompts.gt_answers == ["a", "a", "b", "b", "c", "c"] and sampled.prompts.row_fields == {"level": [1, 1, 2, 2, 3, 3]}
    for row, text in enumerate(SCRIPT + SCRIPT[:2]):  # the script in order: exactly the ids the engine produced
        ids = encode(tok, text)
        assert rollout.sequences[row, width : width + len(ids)].tolist() == ids
        assert int(rollout.action_mask[row].sum()) == len(ids)  # the policy's tokens, stop included, nothing after


def test_engine_calls_of_a_bounded_size_give_the_same_rows(tok):  # noqa: F811 - the imported fixture
    batch = PromptBatch.from_collated(prompt_batch(tok))
    settings = GenerationSettings(max_new_tokens=6)
    whole_engine, chunked_engine = scripted(tok), scripted(tok)
    whole = SingleTurnSource(whole_engine, tok.pad_token_id).sample(batch, settings, n=2)
    chunked = SingleTurnSource(chunked_engine, tok.pad_token_id, inference_batch_size=2).sample(batch, settings, n=2)
    assert (whole_engine.calls, chunked_engine.calls) == (1, 3)  # 2 sequences per call: one prompt x n
    for name in ("sequences", "attention_mask", "action_mask", "truncated"):
        assert torch.equal(getattr(whole.rollout, name), getattr(chunked.rollout, name)), name


def counting_source_class() -> type:
    """The example source of docs/architecture.md, run as written."""
    [code] = [block for block in re.findall(r"```python\n(.*?)```", ARCHITECTURE.read_text(), flags=re.S) if "class CountingSource" in block]
    namespace: dict = {}
    exec(compile(code, str(ARCHITECTURE), "exec"), namespace)
    return namespace["CountingSource"]


def test_a_new_source_trains_through_the_unchanged_maker_learner_and_loop(assets, tok):  # noqa: F811 - the imported fixture
    torch.manual_seed(0)
    actor, booster = load_causal_lm(str(assets.model_dir)), Booster()
    actor, optim, *_ = booster.boost(actor, torch.optim.AdamW(actor.parameters(), lr=1e-3))
    experience, generation = GroupExperienceConfig(num_generations=4), GenerationSettings(max_new_tokens=4)
    source = counting_source_class()(SingleTurnSource(scripted(tok), tok.pad_token_id))
    maker = GroupExperienceMaker(booster.unwrap(actor), reward(), None, tok, config=experience, generation=generation, source=source)
    learner = GRPOLearner.build(booster, actor, optim, None, GRPOLossConfig(), experience, generation)
    before = {k: v.clone() for k, v in actor.state_dict().items()}
    trainer = OnlineTrainer(booster, learner, maker, tok, OnlineLoopConfig(train_batch_size=16, eval_before_training=False))
    trainer.show_progress = False
    artifacts = trainer.fit(2, 1, 1, loader(assets, tok))
    assert source.rows == 2 * 4 * 4  # 2 episodes x 4 prompts x G
    assert artifacts.completed_steps == 2
    assert any(not torch.equal(before[k], v) for k, v in actor.state_dict().items())  # scripted answers differ in reward: a gradient
