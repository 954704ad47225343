"""Padding-free forwards in online RL (`model.packing`): the experience makers' scoring forwards and
the PPO/GRPO learn forwards give, packed, what they give padded.

Tolerances: a packed forward runs differently shaped matmuls than the padded one (fewer, longer
rows and no padding columns), so float32 results differ by rounding only (~1e-7 measured here);
1e-5 bounds that, on single forwards and on weights after several optimizer steps alike.
"""

from __future__ import annotations

import pytest
import torch

from olingo.booster import Booster
from olingo.config import load_config, packaged_config
from olingo.engines import GenerationSettings, Rollout
from olingo.experience_maker import ExperienceConfig, PPOExperienceMaker, action_log_probs, action_values
from olingo.experience_maker.experience import make_experience_batch, split_experience_batch
from olingo.experience_maker.group import GroupExperienceConfig, GroupExperienceMaker
from olingo.experience_maker.scoring import score_rollout
from olingo.models import load_causal_lm, load_tokenizer
from olingo.models import packing as packing_module
from olingo.models import reward_model as reward_module
from olingo.models.critic import Critic
from olingo.models.reward_model import RewardModel
from olingo.rewards.functions import CompositeReward
from olingo.trainer.grpo_learner import GRPOLearner, GRPOLossConfig
from olingo.trainer.learner import learn_forward_metrics, learn_step
from olingo.trainer.ppo_learner import PPOLearner
from tests.conftest import read_jsonl
from tests.test_grpo import reward as varied_reward
from tests.test_ppo import prompt_batch

TOL = 1e-5


@pytest.fixture(scope="module")
def tok(assets):
    return load_tokenizer(str(assets.model_dir), padding_side="left")


@pytest.fixture
def packs(monkeypatch) -> list[int]:
    """Counts the packed batches built, so a test sees the packed path really ran."""
    calls: list[int] = []
    for module in (packing_module, reward_module):
        original = module.pack_batch
        monkeypatch.setattr(module, "pack_batch", lambda ids, *args, _f=original, **kwargs: calls.append(ids.shape[0]) or _f(ids, *args, **kwargs))
    return calls


def rollout_batch(tok, lengths: list[int], seed: int = 0) -> Rollout:
    """Left-padded prompts and random responses of `lengths` tokens, right-padded."""
    prompts = prompt_batch(tok)
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    responses = torch.randint(3, 100, (len(lengths), width), generator=generator)
    action = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    sequences = torch.cat([prompts["input_ids"], responses.masked_fill(~action, tok.pad_token_id)], dim=1)
    mask = torch.cat([prompts["attention_mask"], action.long()], dim=1)
    return Rollout(sequences, mask, action, torch.zeros(len(lengths), dtype=torch.bool), prompts["input_ids"].shape[1])


def test_scoring_forwards_packed_equal_padded(assets, tok, packs):
    torch.manual_seed(0)
    actor = load_causal_lm(str(assets.model_dir)).eval()
    critic = Critic.from_pretrained(str(assets.model_dir), pad_token_id=tok.pad_token_id).eval()
    scorer = RewardModel.from_pretrained(str(assets.model_dir), pad_token_id=tok.pad_token_id).eval()
    rollout = rollout_batch(tok, [5, 1, 7, 3, 2, 7, 4, 6])
    seq, mask, action, a = rollout.sequences, rollout.attention_mask, rollout.action_mask, rollout.num_actions
    prompts = prompt_batch(tok)["input_ids"]
    with torch.no_grad():
        got = {p: (action_log_probs(actor, seq, mask, a, 0.7, packing=p), action_values(critic, seq, mask, a, packing=p),
                   score_rollout(scorer, tok, prompts, rollout, None, None, packing=p).raw_score,
                   score_rollout(CompositeReward((), neural=scorer, allow_empty=True), tok, prompts, rollout, None, None, packing=p).raw_score)
               for p in (False, True)}
    assert len(packs) == 4  # each of the four forwards packed once, the padded ones not at all
    for packed, padded in zip(got[True][:2], got[False][:2], strict=True):
        assert (packed - padded)[action].abs().max() < TOL
    for packed, padded in zip(got[True][2:], got[False][2:], strict=True):
        assert (packed - padded).abs().max() < TOL


def test_a_multi_turn_row_scores_the_same_packed(assets, tok):
    """Row 0: turn, environment reply (attended, not an action), turn; row 1: one turn; each
    equals its own unpadded forward too."""
    actor = load_causal_lm(str(assets.model_dir)).eval()
    prompt = torch.tensor([[0, 0, 5, 6], [0, 8, 9, 7]])
    response = torch.tensor([[10, 11, 90, 91, 12, 13, 0], [20, 21, 22, 0, 0, 0, 0]])
    action = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    attended = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]])
    seq, mask = torch.cat([prompt, response], 1), torch.cat([(prompt != 0).long(), attended], 1)
    with torch.no_grad():
        packed = action_log_probs(actor, seq, mask, 7, packing=True)
        padded = action_log_probs(actor, seq, mask, 7, packing=False)
        alone = [action_log_probs(actor, seq[i][mask[i].bool()][None], torch.ones(1, int(mask[i].sum())), int(attended[i].sum())) for i in (0, 1)]
    assert (packed - padded)[action].abs().max() < TOL
    for i in (0, 1):
        n = int(attended[i].sum())
        assert (packed[i, :n] - alone[i][0])[action[i, :n]].abs().max() < TOL


def micro_batches(experience, size: int, pad_token_id: int):
    items = split_experience_batch(experience)
    return [make_experience_batch(items[i : i + size], pad_token_id) for i in range(0, len(items), size)]


def assert_same_weights(a: dict, b: dict, start: dict) -> None:
    for name, value in a.items():
        torch.testing.assert_close(b[name], value, atol=TOL, rtol=0, msg=name)
    assert any((a[k] - v).abs().max() > 10 * TOL for k, v in start.items()), "training changed nothing"


def test_grpo_learn_packed_equals_padded(assets, tok, packs):
    torch.manual_seed(3)
    actor = load_causal_lm(str(assets.model_dir))
    gen = GenerationSettings(max_new_tokens=6, stop_token_ids=list(range(3, 40)))  # responses end at different steps
    maker = GroupExperienceMaker(actor, varied_reward(), None, tok, config=GroupExperienceConfig(num_generations=2, kl_coef=0.0),
                                 generation=gen, packing=False)
    batch = prompt_batch(tok)
    experience = maker.finish(maker.sample(batch["input_ids"], batch["attention_mask"]))
    groups = micro_batches(experience, 4, tok.pad_token_id)
    ptx = {"input_ids": torch.randint(3, 100, (3, 9)), "attention_mask": torch.tensor([[1] * 9, [1] * 4 + [0] * 5, [1] * 7 + [0] * 2])}
    ptx["loss_mask"] = ptx["attention_mask"]
    start = {k: v.clone() for k, v in actor.state_dict().items()}
    weights = {}
    for packing in (False, True):
        actor.load_state_dict(start)
        booster = Booster()
        model, optim, *_ = booster.boost(actor, torch.optim.AdamW(actor.parameters(), lr=1e-3))
        learner = GRPOLearner(booster, model, optim, None, GRPOLossConfig(ptx_coef=0.5), max_length=6, packing=packing)
        before = len(packs)
        for _ in range(3):
            metrics = learn_step(learner, groups, 1.0, lambda: ptx)
        assert (len(packs) > before) == packing
        assert 0 <= metrics["perf/padding_fraction"] < 1 and metrics["perf/learn_tokens_per_s"] > 0
        weights[packing] = {k: v.clone() for k, v in actor.state_dict().items()}
    assert_same_weights(weights[False], weights[True], start)


def test_ppo_learn_packed_equals_padded_for_actor_and_critic(assets, tok):
    torch.manual_seed(5)
    actor, reference = load_causal_lm(str(assets.model_dir)), load_causal_lm(str(assets.model_dir)).eval()
    critic = Critic.from_pretrained(str(assets.model_dir), pad_token_id=tok.pad_token_id)
    gen = GenerationSettings(max_new_tokens=6, stop_token_ids=list(range(3, 40)))
    maker = PPOExperienceMaker(actor, critic, varied_reward(), reference, tok, 0.1, config=ExperienceConfig(), generation=gen, packing=False)
    batch = prompt_batch(tok)
    groups = micro_batches(maker.make_experience(batch["input_ids"], batch["attention_mask"]), 4, tok.pad_token_id)
    start = {**{f"a.{k}": v.clone() for k, v in actor.state_dict().items()}, **{f"c.{k}": v.clone() for k, v in critic.state_dict().items()}}
    weights = {}
    for packing in (False, True):
        actor.load_state_dict({k[2:]: v for k, v in start.items() if k.startswith("a.")})
        critic.load_state_dict({k[2:]: v for k, v in start.items() if k.startswith("c.")})
        boosters = Booster(), Booster()
        a, a_optim, *_ = boosters[0].boost(actor, torch.optim.AdamW(actor.parameters(), lr=1e-3))
        c, c_optim, *_ = boosters[1].boost(critic, torch.optim.AdamW(critic.parameters(), lr=1e-3))
        learner = PPOLearner.build(boosters[0], boosters[1], a, c, a_optim, c_optim, None, None, packing=packing)
        for _ in range(3):
            learn_step(learner, groups, 1.0)
        weights[packing] = {**{f"a.{k}": v.clone() for k, v in actor.state_dict().items()}, **{f"c.{k}": v.clone() for k, v in critic.state_dict().items()}}
    assert_same_weights(weights[False], weights[True], start)


def test_learn_forward_metrics_by_hand():
    class Batch:  # only the attention mask of a micro-batch is read
        attention_mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 0], [0, 0, 1, 1]])

    # 8 real tokens; padded: 3 x 4 = 12 computed; packed: rows [4] and [2, 2] -> 2 x 4 = 8.
    padded = learn_forward_metrics([Batch()], False, 2.0)
    packed = learn_forward_metrics([Batch()], True, 2.0)
    assert padded == {"perf/padding_fraction": 1 - 8 / 12, "perf/learn_tokens_per_s": 4.0}
    assert packed == {"perf/padding_fraction": 0.0, "perf/learn_tokens_per_s": 4.0}


def test_a_grpo_run_logs_the_learn_metrics(tmp_path):
    from olingo.recipes.grpo import GRPOConfig, run_grpo

    cfg = load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), [
        f"run.output_dir={tmp_path}", "run.name=packed", "model.packing=true", "loop.episodes=1", "loop.rollout_batch_size=4",
        "loop.train_batch_size=8", "loop.update_steps=1", "experience.num_generations=2", "loop.eval_interval=0", "loop.save_interval=0",
        "data.eval_prompts=[]", "logging.progress=false",
    ])
    run_grpo(cfg)
    row = [r for r in read_jsonl(tmp_path / "packed" / "metrics.jsonl") if r["split"] == "train"][-1]
    assert 0 <= row["perf/padding_fraction"] < 1 and row["perf/learn_tokens_per_s"] > 0 and row["perf/tokens_per_s"] > 0
