"""GRPOTrainer: groups, hooks, no critic, no reference at kl_coef 0, invariance, resume, the CLI."""

from __future__ import annotations

import os
import random
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from olingo.booster import Booster
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.errors import ModelLoadError
from olingo.experience_maker.group import GroupExperienceConfig, GroupExperienceMaker
from olingo.models import load_causal_lm, load_tokenizer
from olingo.rewards.functions import CompositeReward
from olingo.trainer.grpo import GRPOTrainer
from olingo.trainer.grpo_learner import GRPOLossConfig
from tests.conftest import kill_when_logged, olingo_cmd, read_jsonl
from tests.test_ppo import Recorder, prompt_batch


@pytest.fixture(scope="module")
def tok(assets):
    return load_tokenizer(str(assets.model_dir), padding_side="left")


def varied_reward(prompt: str, response: str, gt_answer: str | None) -> float:
    """A deterministic reward that differs inside groups, so advantages are not all zero."""
    return float(sum(map(ord, response)) % 5) / 4


def reward() -> CompositeReward:
    return CompositeReward([(varied_reward, 1.0)])


def build(assets, tok, *, lr=1e-3, seed=0, reference=True, **kwargs) -> GRPOTrainer:
    torch.manual_seed(seed)
    actor = load_causal_lm(str(assets.model_dir))
    ref = load_causal_lm(str(assets.model_dir)).eval() if reference else None
    booster = Booster()
    optim = torch.optim.AdamW(actor.parameters(), lr=lr)
    actor, optim, *_ = booster.boost(actor, optim)
    kwargs = {"kl_coef": 0.0, "ptx_coef": 0.0, "num_generation": 4, "max_new_tokens": 4, **kwargs}
    trainer = GRPOTrainer(booster, actor, reward(), ref, optim, None, tok, **kwargs)
    trainer.show_progress = False
    return trainer


def loader(assets, tok, batch_size=4):
    data = build_prompt_dataset(str(assets.prompts_train), tok, 64)
    return Booster().plugin.prepare_dataloader(data, batch_size, shuffle=True, seed=0, collate_fn=PromptCollator(tok.pad_token_id), drop_last=True)


# ---- experience ---------------------------------------------------------------------------------
def test_groups_are_contiguous_and_generation_chunks_do_not_change_them(assets, tok):
    actor = load_causal_lm(str(assets.model_dir))
    batch = prompt_batch(tok)
    rows = {}
    for chunk in (None, 4):
        torch.manual_seed(3)
        maker = GroupExperienceMaker(actor, reward(), None, tok, config=GroupExperienceConfig(num_generations=4, inference_batch_size=chunk))
        experience = maker.finish(maker.sample(batch["input_ids"], batch["attention_mask"]))
        rows[chunk] = experience
        assert experience.batch_size == 8 * 4
        prompts = experience.sequences[:, : experience.num_prompt_tokens]
        for g in range(8):  # each group answers one prompt
            assert all(torch.equal(prompts[g * 4], prompts[g * 4 + i]) for i in range(4))
        # grpo: every group's advantages sum to 0 on each token column of a response's first token
        first = experience.advantages[:, 0].view(8, 4)
        torch.testing.assert_close(first.sum(-1), torch.zeros(8), atol=1e-5, rtol=0)
        assert experience.values is None and experience.base_action_log_probs is None and experience.kl is None
    # in chunks of 4 sequences (one prompt's group per generate call) the batch is the same 8 whole groups
    assert rows[None].sequences.shape[0] == rows[4].sequences.shape[0]
    assert torch.equal(rows[None].sequences[:, : rows[None].num_prompt_tokens], rows[4].sequences[:, : rows[4].num_prompt_tokens])


def test_kl_coef_zero_never_builds_or_runs_a_reference(assets, tok, monkeypatch, tmp_path):
    from olingo.recipes import grpo as recipe
    from olingo.recipes.grpo import GRPOConfig

    loaded = []
    real = recipe.load_causal_lm
    monkeypatch.setattr(recipe, "load_causal_lm", lambda path, **kw: loaded.append(path) or real(path, **kw))
    cfg = GRPOConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": "nokl"}, "model": {"actor": str(assets.model_dir)},
        "loop": {"episodes": 1, "rollout_batch_size": 2, "train_batch_size": 8, "eval_interval": 0}, "data": {"eval_prompts": []},
        "experience": {"num_generations": 4, "kl_coef": 0.0}, "generation": {"max_new_tokens": 3}, "logging": {"progress": False},
    })
    recipe.run_grpo(cfg)
    assert loaded == [str(assets.model_dir)], "only the actor is loaded"
    trainer = build(assets, tok)  # a reference handed over with kl_coef 0 is dropped, never run
    assert trainer.initial_model is None and trainer.experience_maker.reference is None
    assert not (tmp_path / "nokl" / "checkpoints" / "final" / "critic").exists()


def test_kl_coef_needs_a_reference(assets, tok):
    with pytest.raises(ValueError, match="reference model"):
        build(assets, tok, reference=False, kl_coef=0.1)


def test_coati_traps_fail_early(assets, tok):
    with pytest.raises(ValueError, match="critic"):
        build(assets, tok, vf_coef=0.5)
    with pytest.raises(ValueError, match="tensor parallelism"):
        build(assets, tok, use_tp=True)
    with pytest.raises(ValueError, match="test-time"):
        build(assets, tok, use_tts_inference=True)
    with pytest.raises(TypeError, match="max_new_token"):
        build(assets, tok, max_new_token=3)
    with pytest.raises(ValueError, match="num_generations=4 .* disagrees"):
        build(assets, tok, num_generation=4, experience_config=GroupExperienceConfig(num_generations=6))
    trainer = build(assets, tok, experience_config=GroupExperienceConfig(num_generations=6), num_generation=8)  # the default defers
    assert trainer.config.num_generations == 6
    trainer = build(assets, tok, ptx_coef=0.9)  # coati's default: needs a pretrain loader
    with pytest.raises(ValueError, match="pretrain_dataloader"):
        trainer.fit(1, 1, 1, loader(assets, tok))


# ---- the loop ------------------------------------------------------------------------------------
def test_hook_order_metrics_and_checkpoints_without_critic(assets, tok, tmp_path):
    recorder = Recorder()
    trainer = build(assets, tok, save_dir=str(tmp_path), callbacks=[recorder], train_batch_size=8, save_interval=4, kl_coef=0.05)
    trainer.fit(2, 1, 2, loader(assets, tok))
    episode = lambda e, s: [  # noqa: E731 - 4 prompts x 4 = 16 rollouts: 2 passes of 2 minibatches of 8
        f"episode_start({e})", "make_start", "make_end(16)",
        "learn_epoch_start(0)", "batch_start", "batch_end(8)", f"step_end({s + 1})", "batch_start", "batch_end(8)", f"step_end({s + 2})", "learn_epoch_end(0)",
        "learn_epoch_start(1)", "batch_start", "batch_end(8)", f"step_end({s + 3})", "batch_start", "batch_end(8)", f"step_end({s + 4})", "learn_epoch_end(1)",
        f"episode_end({e})", f"checkpoint(step_{s + 4})",
    ]
    assert recorder.events == ["train_start(0)", "fit_start", *episode(0, 0), *episode(1, 4), "checkpoint(final)", "fit_end", "train_end"]
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 9))
    for name in ("rollout/reward_mean", "rollout/group_reward_std", "rollout/kl", "rollout/response_length", "rollout/reward/varied_reward",
                 "perf/tokens_per_s", "time/make_experience"):  # once per episode, on its first step's row (docs/runs.md)
        assert name in rows[4] and name not in rows[-1], name
    for name in ("train/policy_loss", "train/kl_loss", "train/clipfrac", "train/clipfrac_high", "train/approx_kl", "train/entropy",
                 "train/ratio_max", "train/actor_grad_norm", "time/learn"):
        assert name in rows[-1], name
    assert "train/value_loss" not in rows[-1]
    final = tmp_path / "checkpoints" / "final"
    assert (final / "actor" / "model.safetensors").exists() and not (final / "critic").exists()
    assert not any("critic" in p.name for p in final.iterdir())


def test_one_update_per_batch_skips_the_old_log_prob_forward(assets, tok, monkeypatch):
    trainer = build(assets, tok, train_batch_size=16)
    calls = []
    original = trainer.experience_maker._log_probs
    monkeypatch.setattr(trainer.experience_maker, "_log_probs", lambda model, *a: calls.append(model) or original(model, *a))
    trainer.fit(1, 1, 1, loader(assets, tok))  # 16 rollouts, one step of 16: pi_old is the policy itself
    assert calls == [] and trainer.experience_maker.needs_old_log_probs is False
    trainer = build(assets, tok, train_batch_size=16)
    trainer.fit(1, 1, 2, loader(assets, tok))  # mu = 2: the second pass needs pi_old
    assert trainer.experience_maker.needs_old_log_probs is True
    trainer = build(assets, tok, train_batch_size=16)
    trainer.fit(1, 2, 1, loader(assets, tok))  # two collect steps: two optimizer steps on one buffer
    assert trainer.experience_maker.needs_old_log_probs is True


def learn(assets, tok, aggregation, train_batch_size, accumulation_steps):
    torch.manual_seed(11)
    trainer = build(assets, tok, train_batch_size=train_batch_size, accumulation_steps=accumulation_steps, kl_coef=0.05,
                    loss_config=GRPOLossConfig(aggregation=aggregation, eps_high=0.28))
    trainer.fit(2, 1, 2, loader(assets, tok, batch_size=2))  # 2 prompts x 4 = 8 rollouts; mu 2 -> 4 steps
    assert trainer.state.step == 4
    return trainer.actor.state_dict()


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_batch_8_equals_batch_2_times_accumulation_4(assets, tok, aggregation):
    big, small = learn(assets, tok, aggregation, 8, 1), learn(assets, tok, aggregation, 2, 4)
    for name, value in big.items():
        torch.testing.assert_close(small[name], value, atol=1e-5, rtol=1e-5, msg=name)
    start = load_causal_lm(str(assets.model_dir)).state_dict()
    assert any(not torch.equal(big[k], v) for k, v in start.items()), "training changed nothing"


def test_dynamic_sampling_keeps_only_groups_with_signal(assets, tok):
    trainer = build(assets, tok, train_batch_size=64, experience_config=GroupExperienceConfig(dynamic_sampling=True, max_resample_rounds=2))
    trainer.fit(1, 1, 1, loader(assets, tok))
    info = trainer._episode_rollout[0]
    assert 1 <= info["dynamic_sampling/rounds"] <= 3
    assert info["dynamic_sampling/kept_groups"] <= 4
    kept = int(info["dynamic_sampling/kept_groups"])
    assert kept > 0, "the varied reward should leave groups with signal"


def test_checkpoint_restores_the_policy_and_prompt_position(assets, tok, tmp_path):
    trainer = build(assets, tok, save_dir=str(tmp_path), train_batch_size=8)
    trainer.fit(1, 1, 1, loader(assets, tok))
    saved = {k: v.clone() for k, v in trainer.actor.state_dict().items()}
    fresh = build(assets, tok, seed=1, train_batch_size=8)
    fresh.load_checkpoint(tmp_path / "checkpoints" / "final")
    for k, v in saved.items():
        assert torch.equal(fresh.actor.state_dict()[k], v), k
    assert fresh.state.step == trainer.state.step and fresh.start_episode == 1
    assert fresh._pending_loader_states["prompts"] == trainer.prompts.state_dict()


# ---- the CLI: kill and resume --------------------------------------------------------------------
def grpo_args(tmp_path, name, assets, extra=()):
    return [
        "grpo", f"run.output_dir={tmp_path}", f"run.name={name}", "logging.progress=false", f"model.actor={assets.model_dir}",
        "loop.episodes=6", "loop.rollout_batch_size=4", "loop.train_batch_size=8", "loop.update_steps=1", "loop.save_interval=2",
        "experience.num_generations=4", "experience.kl_coef=0.05", "generation.max_new_tokens=4", "actor_optim.lr=1e-3",
        "data.eval_prompts=[]", "reward.functions={tests.test_grpo:varied_reward: 1.0}", *extra,
    ]


def without_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in rows]


@pytest.mark.slow
def test_grpo_kill_and_resume_equals_an_uninterrupted_run(tmp_path, assets):
    env = {**os.environ, "PYTHONPATH": str(os.getcwd())}
    subprocess.run(olingo_cmd(*grpo_args(tmp_path, "straight", assets)), check=True, capture_output=True, timeout=300, env=env)
    straight = tmp_path / "straight"
    assert len(read_jsonl(straight / "metrics.jsonl")) == 12
    kill_at = random.Random(os.getpid()).randint(3, 10)
    killed = tmp_path / "killed"
    kill_when_logged(olingo_cmd(*grpo_args(tmp_path, "killed", assets)), killed / "metrics.jsonl", kill_at, env, timeout=240)
    subprocess.run(olingo_cmd(*grpo_args(tmp_path, "killed", assets, ["run.resume=last"])), check=True, capture_output=True, timeout=300, env=env)
    a, b = load_file(straight / "checkpoints/final/actor/model.safetensors"), load_file(killed / "checkpoints/final/actor/model.safetensors")
    for key, value in a.items():
        assert torch.equal(value, b[key]), key
    assert without_time(read_jsonl(killed / "metrics.jsonl")) == without_time(read_jsonl(straight / "metrics.jsonl"))
    assert read_jsonl(killed / "samples.jsonl") == read_jsonl(straight / "samples.jsonl")


@pytest.mark.slow
def test_cli_overlong_buffer_beyond_the_limit_is_one_line(tmp_path, assets):
    out = subprocess.run(olingo_cmd("grpo", f"run.output_dir={tmp_path}", f"model.actor={assets.model_dir}",
                                    "experience.overlong_buffer=16", "generation.max_new_tokens=8"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "experience.overlong_buffer (16) is longer than generation.max_new_tokens (8)" in out.stderr
    assert not list(tmp_path.iterdir())


# ---- where responses end ------------------------------------------------------------------------
def test_stop_token_ids_add_the_eos_ids_the_generation_config_names(assets, tok, tmp_path):
    from transformers import GenerationConfig

    from olingo.models import stop_token_ids

    eos = tok.eos_token_id
    assert stop_token_ids(tok, str(assets.model_dir)) == [eos]  # its generation_config names the same eos
    for named, expected in ((eos, [eos]), ([eos, 7, 9], [eos, 7, 9]), ([9, eos], [eos, 9])):
        GenerationConfig(eos_token_id=named).save_pretrained(tmp_path / str(named))
        assert stop_token_ids(tok, str(tmp_path / str(named))) == expected
    assert stop_token_ids(tok, str(tmp_path)) == [eos]  # no generation_config.json
    no_eos = load_tokenizer(str(assets.model_dir))  # its own copy: the module's `tok` stays as it is
    no_eos.eos_token = None
    no_eos.chat_template = None  # its template ends turns with `</s>`, which would still stop responses
    with pytest.raises(ModelLoadError, match="neither the tokenizer nor .* names an eos token, so no response would ever end"):
        stop_token_ids(no_eos, str(tmp_path))


def rigged_policy(assets, tok, out, extra_eos: list[int]) -> str:
    """The tiny model rewired so that greedy decoding always picks one of two tokens (the sign of
    one hidden unit chooses), never its eos; `extra_eos` lands in its generation_config.json."""
    from olingo.tasks import save_pretrained_pair

    model = load_causal_lm(str(assets.model_dir))
    first, second = tok.convert_tokens_to_ids(["7", "9"])
    with torch.no_grad():
        model.model.norm.weight.zero_()[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[first, 0], model.lm_head.weight[second, 0] = 10.0, -10.0
    model.generation_config.eos_token_id = [tok.eos_token_id, *extra_eos]
    return str(save_pretrained_pair(model, tok, out))


@pytest.mark.parametrize("ends_at_turn_token", [True, False])
def test_grpo_rollouts_end_at_every_eos_the_policy_names(assets, tok, tmp_path, ends_at_turn_token):
    """An instruct model whose end-of-turn token is not its tokenizer's eos (Gemma, some Llama-3
    exports) names it in generation_config.json; rollouts must stop there, as transformers'
    generate and vLLM do, or they run on to max_new_tokens."""
    from olingo.recipes.grpo import GRPOConfig, run_grpo

    extra = tok.convert_tokens_to_ids(["7", "9"]) if ends_at_turn_token else []
    policy = rigged_policy(assets, tok, tmp_path / "policy", extra)
    cfg = GRPOConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": "stops"}, "model": {"actor": policy},
        "loop": {"episodes": 1, "rollout_batch_size": 2, "train_batch_size": 4, "eval_interval": 0, "save_interval": 0},
        "data": {"eval_prompts": []}, "experience": {"num_generations": 2, "kl_coef": 0.0},
        "generation": {"max_new_tokens": 6, "do_sample": False}, "reward": {"functions": {"tests.test_grpo:varied_reward": 1.0}},
        "logging": {"progress": False},
    })
    run_grpo(cfg)
    (row,) = read_jsonl(tmp_path / "stops" / "metrics.jsonl")
    assert row["rollout/response_length"] == (1.0 if ends_at_turn_token else 6.0)


def test_grpo_keywords_and_sections_are_one_setting_each(assets, tok):
    """The adapter rule: a ColossalChat keyword left at its default defers to the section passed
    beside it; one that disagrees with a field the section set raises, never silently wins."""
    assert build(assets, tok, experience_config=GroupExperienceConfig(kl_coef=0.0)).experience_maker.config.kl_coef == 0.0
    with pytest.raises(ValueError, match=r"kl_coef=0.3 \(keyword\) disagrees with experience_config.kl_coef=0.0"):
        build(assets, tok, kl_coef=0.3, experience_config=GroupExperienceConfig(kl_coef=0.0))
    with pytest.raises(ValueError, match=r"eps_low=0.1 \(keyword\) disagrees with loss_config.eps_low=0.2"):
        build(assets, tok, eps_clip=0.1, loss_config=GRPOLossConfig(eps_low=0.2))
    trainer = build(assets, tok, eps_clip=0.1, loss_config=GRPOLossConfig(aggregation="seq_mean_token_mean"))
    assert (trainer.learner.loss.eps_low, trainer.learner.loss.eps_high, trainer.learner.loss.aggregation) == (0.1, 0.1, "seq_mean_token_mean")
