"""Ray detached PPO with LoRA: a weight sync ships only the adapters and the critic's value head,
is still checked key by key, and leaves the maker generating with exactly the trainer's policy."""

from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")

from olingo.models import load_causal_lm  # noqa: E402
from olingo.models.lora import trainable_state  # noqa: E402
from olingo.ray.detached_trainer_ppo import DetachedPPOTrainer  # noqa: E402
from olingo.ray.experience_maker_holder import ExperienceMakerHolder  # noqa: E402
from olingo.ray.weights import load_synced_state, state_dict_for_sync, state_dict_nbytes  # noqa: E402
from olingo.recipes.common import LoraSettings  # noqa: E402
from olingo.recipes.ppo_ray import PPOModelsFn, PromptLoaderFn, TokenizerFn  # noqa: E402
from olingo.rewards.rlvr import RLVRRewardModel  # noqa: E402
from tests.conftest import read_jsonl  # noqa: E402
from tests.test_ray import actors, digit_share, ray_instance  # noqa: E402, F401 - the module's Ray fixtures

LORA = LoraSettings(r=4, alpha=8)
IDS = torch.tensor([[5, 17, 30, 41, 12, 9]])


def test_a_lora_sync_state_is_the_trainable_part_and_keeps_the_strict_key_check(assets):
    tok = str(assets.model_dir)
    actor, critic = PPOModelsFn(tok, tok, tok, lora=LORA)()
    for model in (actor, critic):
        state = state_dict_for_sync(model)
        assert state.keys() == trainable_state(model).keys()
        assert all("lora_" in k or k == "model.score.weight" for k in state)
        assert load_synced_state(model, state, "model") == len(state)
    full = load_causal_lm(tok).state_dict()  # a sender without LoRA
    with pytest.raises(ValueError, match="unexpected"):
        load_synced_state(actor, full, "actor")
    with pytest.raises(ValueError, match="missing"):
        load_synced_state(actor, dict(list(state_dict_for_sync(actor).items())[:2]), "actor")


@pytest.mark.slow
def test_ray_lora_sync_ships_only_adapters_and_the_maker_matches_the_trainer(assets, actors, tmp_path):  # noqa: F811 - a fixture
    tok = str(assets.model_dir)
    maker_models = PPOModelsFn(tok, tok, tok, reference=tok, reward=RLVRRewardModel([digit_share]), lora=LORA)
    actors.append(ExperienceMakerHolder.options(name="lora-maker", num_cpus=1).remote(
        ["lora-trainer"], maker_models, TokenizerFn(tok), PromptLoaderFn([str(assets.prompts_train)], tok, 64, 16),
        0.05, seed=0, call_timeout_s=60, max_new_tokens=4, temperature=1.0,
    ))
    trainer = DetachedPPOTrainer.options(name="lora-trainer", num_cpus=1).remote(
        ["lora-maker"], PPOModelsFn(tok, tok, tok, lora=LORA), train_batch_size=16, actor_lr=3e-2, critic_lr=3e-2,
        call_timeout_s=60, experience_timeout_s=120, log_dir=str(tmp_path), save_dir=str(tmp_path), tokenizer_fn=TokenizerFn(tok),
    )
    actors.append(trainer)
    assert ray.get(trainer.fit.remote(total_steps=2, update_steps=2), timeout=120)["steps"] == 2

    actor, critic = PPOModelsFn(tok, tok, tok, lora=LORA)()  # what one sync should carry
    sent = [state_dict_for_sync(actor), state_dict_for_sync(critic)]
    row = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["split"] == "train"][-1]
    assert row["perf/weight_sync_tensors"] == sum(len(s) for s in sent)
    assert row["perf/weight_sync_mb"] == pytest.approx(sum(state_dict_nbytes(s) for s in sent) / 1e6)
    full = sum(p.numel() * p.element_size() for m in (actor, critic) for n, p in m.named_parameters() if "lora_" not in n)
    assert row["perf/weight_sync_mb"] < 0.15 * full / 1e6  # about 9% on this tiny model, far less on real ones

    # The maker's base + synced adapters generate exactly what the trainer's merged export does.
    final = load_causal_lm(str(tmp_path / "checkpoints" / "final" / "actor")).eval()
    with torch.no_grad():
        expected, base = final(input_ids=IDS).logits, load_causal_lm(tok)(input_ids=IDS).logits
    got = ray.get(ray.get_actor("lora-maker").actor_fingerprint.remote(IDS), timeout=60)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert (got - base).abs().max() > 1e-3, "the adapters moved, so the maker must differ from the base"
