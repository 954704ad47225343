"""Ray detached mode for the GRPO family: group makers, `DetachedGRPOTrainer` sharing the learn
code of `GRPOTrainer`, no critic anywhere, no reference at kl_coef 0, resume, the CLI, and on-policy
distillation with a teacher each maker loads (its tokenizer checked on the driver first).

The learn-step proof runs the trainer actor's own class in this process (fast); the Ray runs
(a local instance of 2 CPUs, every wait bounded) and the CLI are slow.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

ray = pytest.importorskip("ray")

from olingo.booster import Booster, SingleProcessPlugin  # noqa: E402
from olingo.config import ConfigError, load_config, packaged_config  # noqa: E402
from olingo.engines import GenerationSettings  # noqa: E402
from olingo.experience_maker import make_experience_batch, split_experience_batch  # noqa: E402
from olingo.experience_maker.group import (  # noqa: E402
    GroupExperienceConfig,
    GroupExperienceMaker,
    groups_with_signal,
)
from olingo.models import load_causal_lm, load_tokenizer  # noqa: E402
from olingo.ray import launch  # noqa: E402
from olingo.ray.detached_trainer_grpo import DetachedGRPOTrainer  # noqa: E402
from olingo.ray.experience_maker_holder import ExperienceMakerHolder  # noqa: E402
from olingo.ray.making import GroupMaking  # noqa: E402
from olingo.recipes.grpo import run_grpo  # noqa: E402
from olingo.recipes.grpo_config import GRPOConfig  # noqa: E402
from olingo.recipes.grpo_ray import (  # noqa: E402
    GRPOModelsFn,
    check_ray_config,
    episode_batches,
    maker_models,
    needs_old_log_probs,
)
from olingo.recipes.ppo_ray import PromptLoaderFn, TokenizerFn  # noqa: E402
from olingo.rewards.functions import CompositeReward  # noqa: E402
from olingo.tasks.tiny_model import build_tiny_llama, save_pretrained_pair  # noqa: E402
from olingo.trainer.grpo import GRPOTrainer  # noqa: E402
from olingo.trainer.grpo_learner import GRPOLossConfig  # noqa: E402
from olingo.trainer.learner import learn_step  # noqa: E402
from tests.conftest import olingo_cmd, read_jsonl  # noqa: E402
from tests.test_ppo import prompt_batch  # noqa: E402
from tests.test_ray import actors, ray_instance  # noqa: E402, F401 - the module's Ray fixtures
from tests.test_ray_cli import ray_pids, wait_gone  # noqa: E402

# Reward functions defined here travel to the workers by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

WAIT_S = 240
G = 4


def varied_reward(prompt: str, response: str, gt_answer: str | None) -> float:
    """Differs inside most groups, so advantages are not all zero."""
    return float(sum(map(ord, response)) % 5) / 4


def nines_only(prompt: str, response: str, gt_answer: str | None) -> float:
    """No signal at all for prompts without a 9: dynamic sampling must drop their groups."""
    return varied_reward(prompt, response, gt_answer) if "9" in prompt else 0.0


@pytest.fixture(scope="module")
def tok(assets):
    return load_tokenizer(str(assets.model_dir), padding_side="left")


def fixed_batch(assets, tok, kl_coef: float):
    """16 rollouts (4 prompts x G=4) with old and reference log-probs and group advantages."""
    torch.manual_seed(5)
    model = str(assets.model_dir)
    config = GroupExperienceConfig(num_generations=G, kl_coef=kl_coef)
    maker = GroupExperienceMaker(load_causal_lm(model).eval(), CompositeReward([(varied_reward, 1.0)]), load_causal_lm(model).eval(), tok,
                                 config=config, generation=GenerationSettings(max_new_tokens=4, temperature=0.7))
    batch = prompt_batch(tok, ["1+2=", "3+4=", "10+5=", "7+7="])
    return maker.finish(maker.sample(batch["input_ids"], batch["attention_mask"])), config


# ---- the learn step is GRPOTrainer's -----------------------------------------------------------------
@pytest.mark.parametrize(("aggregation", "micro"), [("token_mean", 8), ("seq_mean_token_sum_norm", None)])
def test_detached_learn_step_equals_grpo_trainer_learn_step(assets, tok, aggregation, micro):
    experience, config = fixed_batch(assets, tok, kl_coef=0.05)
    assert experience.action_log_probs is not None and experience.base_action_log_probs is not None
    loss = GRPOLossConfig(aggregation=aggregation, eps_high=0.28)
    model = str(assets.model_dir)

    # single process: the minibatches of one optimizer step, through the learn step GRPOTrainer runs.
    # Plain SGD without clipping: the update is the gradient itself, so a wrong scale shows.
    actor = load_causal_lm(model)
    booster = Booster(SingleProcessPlugin(None))
    actor, optim, *_ = booster.boost(actor, torch.optim.SGD(actor.parameters(), lr=0.5))
    single = GRPOTrainer(booster, actor, CompositeReward([(varied_reward, 1.0)]), load_causal_lm(model).eval(), optim, None, tok,
                         kl_coef=0.05, ptx_coef=0.0, num_generation=G, experience_config=config, loss_config=loss,
                         max_new_tokens=4, temperature=0.7)
    items = split_experience_batch(experience)
    group = [make_experience_batch(items[i : i + micro], tok.pad_token_id) for i in range(0, 16, micro)] if micro else [experience]
    expected_metrics = learn_step(single.learner, group, single.experience_maker.temperature)

    # detached: the actor's own class in this process, one buffer batch = one optimizer step
    local = DetachedGRPOTrainer.__ray_actor_class__(
        ["unused-maker"], lambda: load_causal_lm(model), train_batch_size=16, micro_batch_size=micro, experience_config=config,
        loss_config=loss, max_new_tokens=4, temperature=0.7, optim_fn=lambda a: (torch.optim.SGD(a.parameters(), lr=0.5), None),
        max_grad_norm=None, pad_token_id=tok.pad_token_id,
    )
    metrics = local.training_step(experience)

    got, want, start = local.learner.actor.state_dict(), single.actor.state_dict(), load_causal_lm(model).state_dict()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=1e-6, rtol=0, msg=name)
    assert any(not torch.equal(want[k], v) for k, v in start.items()), "the step changed nothing"
    assert metrics.keys() == expected_metrics.keys() and "train/kl_loss" in metrics
    for name, value in expected_metrics.items():
        if name != "perf/learn_tokens_per_s":  # a rate over wall time: two runs never agree
            assert metrics[name] == pytest.approx(value, abs=1e-6), name


# ---- group makers --------------------------------------------------------------------------------------
def test_group_making_sends_whole_groups_with_advantages_and_no_reference_at_kl_zero(assets, tok):
    model = str(assets.model_dir)
    torch.manual_seed(0)
    making = GroupMaking(GroupExperienceConfig(num_generations=G, kl_coef=0.0), needs_old_log_probs=False)
    maker = making.build(
        (load_causal_lm(model), CompositeReward([(varied_reward, 1.0)]), load_causal_lm(model)), tok, GenerationSettings(max_new_tokens=4), None
    )
    assert maker.reference is None, "kl_coef 0: a reference handed over is dropped, never run"
    batch = prompt_batch(tok, ["1+2=", "3+4=", "10+5="])
    experience = making.make(maker, batch, lambda: pytest.fail("no resampling without dynamic sampling"), policy_version=3)
    assert experience.batch_size == 3 * G and experience.policy_version == 3
    prompts = experience.sequences[:, : experience.num_prompt_tokens]
    assert all(torch.equal(prompts[g * G], prompts[g * G + i]) for g in range(3) for i in range(G))  # groups contiguous
    torch.testing.assert_close(experience.advantages[:, 0].view(3, G).sum(-1), torch.zeros(3), atol=1e-5, rtol=0)
    assert experience.values is None and experience.kl is None and experience.action_log_probs is None
    assert making.state_dict(maker) == {}

    # kl_coef 0: the recipe's maker builds no reference at all; with a KL term it does
    cfg = GRPOConfig.model_validate({"model": {"actor": model}, "experience": {"num_generations": G}})
    models = maker_models(cfg)
    assert models.reference is None and models()[2] is None
    assert maker_models(cfg.model_copy(update={"experience": GroupExperienceConfig(num_generations=G, kl_coef=0.1)})).reference == model


def test_dynamic_sampling_in_a_maker_keeps_only_groups_with_signal(assets, tok):
    torch.manual_seed(1)
    making = GroupMaking(GroupExperienceConfig(num_generations=G, dynamic_sampling=True, max_resample_rounds=2))
    maker = making.build((load_causal_lm(str(assets.model_dir)), CompositeReward([(nines_only, 1.0)]), None), tok, GenerationSettings(max_new_tokens=4), None)
    signal, flat = ["19+5=", "1+29=", "9+7="], ["1+2=", "3+4=", "13+14="]
    draws = iter([prompt_batch(tok, signal), prompt_batch(tok, signal)])
    experience = making.make(maker, prompt_batch(tok, flat), lambda: next(draws), policy_version=0)
    assert experience.batch_size % G == 0 and 0 < experience.batch_size <= 3 * G
    assert bool(groups_with_signal(experience.score, G).all()), "only groups whose scores differ are sent"
    assert experience.advantages is not None and experience.action_log_probs is not None
    counts = making.counts
    assert counts["kept_groups"] == experience.batch_size // G and counts["sampled_groups"] >= 6
    assert experience.info["dynamic_sampling/rounds"] >= 2


def test_group_making_with_a_teacher_scores_the_rollouts_with_it(assets, tok):
    """The recipe's maker factory loads the frozen teacher (as `load_teacher` does in one process) and
    `GroupMaking` hands it to the maker: a teacher equal to the actor gives teacher_kl 0 (the same forward)."""
    model = str(assets.model_dir)
    torch.manual_seed(2)
    cfg = GRPOConfig.model_validate({
        "model": {"actor": model, "teacher": model}, "experience": {"num_generations": G, "distill_coef": 1.0}, "reward": {"functions": {}},
    })
    factory = maker_models(cfg)
    assert factory.teacher == model and factory.reference is None
    models = factory()
    assert len(models) == 4 and not models[3].training and not any(p.requires_grad for p in models[3].parameters())
    making = GroupMaking(cfg.experience, needs_old_log_probs=False)
    maker = making.build(models, tok, GenerationSettings(max_new_tokens=4), None)
    assert maker.teacher is models[3]
    experience = making.make(maker, prompt_batch(tok, ["1+2=", "3+4="]), lambda: pytest.fail("no resampling"), policy_version=0)
    assert experience.teacher_log_probs is not None and experience.info["teacher_kl"] == pytest.approx(0.0, abs=1e-6)
    assert maker_models(cfg.model_copy(update={"model": cfg.model.model_copy(update={"teacher": None})})).teacher is None


# ---- the recipe's checks -------------------------------------------------------------------------------
def test_ray_config_says_what_ray_mode_cannot_do(caplog):
    cfg = GRPOConfig.model_validate({"ray": {"enabled": True}, "loop": {"accumulation_steps": 2}, "experience": {"num_generations": 4}})
    check_ray_config(cfg)  # accumulation is micro-batching inside one buffer batch: supported
    bad = GRPOConfig.model_validate({
        "ray": {"enabled": True}, "loss": {"ptx_coef": 0.5}, "data": {"pretrain": ["x.jsonl"]},
        "loop": {"sample_buffer": True, "buffer_limit": 64}, "plugin": {"name": "ddp"},
    })
    with pytest.raises(ConfigError) as info:
        check_ray_config(bad)
    for key in ("loss.ptx_coef", "loop.sample_buffer", "loop.buffer_limit", "plugin.name"):
        assert key in str(info.value)
    check_ray_config(cfg.model_copy(update={"loop": cfg.loop.model_copy(update={"eval_interval": 50})}))  # the packaged config's: said, not refused
    assert "loop.eval_interval=50 is not used" in caplog.text
    # 2 prompts x 4 answers per collect step, steps of 4 x 2 rollouts: one step per episode
    one = GRPOConfig.model_validate({
        "loop": {"rollout_batch_size": 2, "train_batch_size": 4, "accumulation_steps": 2},
        "experience": {"num_generations": 4},
        "ray": {"max_staleness": 0},
    })
    assert episode_batches(one) == 1 and not needs_old_log_probs(one)  # pi_old is the policy learnt on
    assert needs_old_log_probs(one.model_copy(update={"ray": one.ray.model_copy(update={"max_staleness": 1})}))
    assert needs_old_log_probs(one.model_copy(update={"loop": one.loop.model_copy(update={"update_steps": 2})}))


def test_a_teacher_with_another_tokenizer_is_refused_before_ray_starts(assets, tmp_path, monkeypatch):
    """The teacher's tokenizer is checked on the driver: one line naming model.teacher, and no Ray
    instance (so no actor) is ever started."""
    tok = load_tokenizer(str(assets.model_dir))
    tok.add_tokens(["<only-the-teacher-has-this>"])
    teacher = save_pretrained_pair(build_tiny_llama(tok, seed=1), tok, tmp_path / "teacher")
    monkeypatch.setattr(launch, "start_ray", lambda rc: pytest.fail("Ray started before the teacher's tokenizer was checked"))
    cfg = load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), [
        f"run.output_dir={tmp_path}", "run.name=mismatch", f"model.actor={assets.model_dir}", f"model.teacher={teacher}",
        "experience.distill_coef=1.0", "reward.functions={}", "loop.accuracy_function=null", "ray.enabled=true", "loop.eval_interval=0",
    ])
    with pytest.raises(ConfigError) as info:
        run_grpo(cfg)
    message = str(info.value)
    assert message.startswith("model.teacher must share the actor's tokenizer: ") and "one vocabulary extends the other" in message
    assert "\n" not in message and not (tmp_path / "mismatch").exists()


# ---- the CLI (before this module's own Ray instance exists) --------------------------------------------
@pytest.mark.slow
def test_grpo_cli_with_ray_enabled(tmp_path, assets):
    before = ray_pids()
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "PYTHONPATH": os.getcwd()}  # workers import tests.test_grpo
    args = [
        "grpo", f"run.output_dir={tmp_path}", "run.name=grpo-ray", "logging.progress=false", f"model.actor={assets.model_dir}",
        "ray.enabled=true", "ray.num_cpus=2", "loop.episodes=2", "loop.update_steps=1", "loop.rollout_batch_size=4", "loop.train_batch_size=4",
        "loop.accumulation_steps=2", "experience.num_generations=4", "experience.dynamic_sampling=true", "generation.max_new_tokens=4",
        "reward.functions={tests.test_grpo:varied_reward: 1.0}", "actor_optim.lr=1e-3", "loop.eval_batch_size=64",
        "loop.accuracy_function=arithmetic_exact", "ray.call_timeout_s=120", "ray.experience_timeout_s=120",
    ]
    out = subprocess.run(olingo_cmd(*args), capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    run_dir = tmp_path / "grpo-ray"
    summary = json.loads((run_dir / "ray_summary.json").read_text())
    assert summary["steps"] == 4  # 2 episodes x (4 prompts x 4 answers / (4 x 2) per step)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all("train/policy_loss" in r and "train/value_loss" not in r and r["perf/weight_sync_gbps"] > 0 for r in train)
    assert [r["step"] for r in rows if r["split"] == "eval"] == [0, 4] and "held-out eval/accuracy" in out.stdout
    assert summary["ray"]["buffer"]["sampled"] == 4 * 8
    maker = next(iter(summary["ray"]["makers"].values()))
    assert maker["kept_groups"] <= maker["sampled_groups"]
    final = run_dir / "checkpoints" / "final"
    assert (final / "actor" / "config.json").exists() and not any("critic" in p.name for p in final.iterdir())
    assert not wait_gone(ray_pids() - before), "the CLI must shut down the Ray instance it started"


@pytest.mark.slow
def test_grpo_cli_with_ray_distils_from_a_teacher(tmp_path, assets):
    """`olingo grpo ray.enabled=true model.teacher=... experience.distill_coef=1` with no reward: the
    makers load the teacher and the trainer logs its KL, as one process does (`rollout/teacher_kl`)."""
    tok = load_tokenizer(str(assets.model_dir))
    teacher = build_tiny_llama(tok, seed=1)
    with torch.no_grad():
        teacher.lm_head.weight.mul_(20.0)  # peaked, far from the student: a KL clearly above 0
    teacher_dir = save_pretrained_pair(teacher, tok, tmp_path / "teacher")
    before = ray_pids()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    args = [
        "grpo", f"run.output_dir={tmp_path}", "run.name=distil-ray", "logging.progress=false", f"model.actor={assets.model_dir}",
        f"model.teacher={teacher_dir}", "experience.distill_coef=1", "reward.functions={}", "loop.accuracy_function=null",
        "ray.enabled=true", "ray.num_cpus=2", "loop.episodes=1", "loop.update_steps=1", "loop.rollout_batch_size=4", "loop.train_batch_size=8",
        "experience.num_generations=4", "generation.max_new_tokens=4", "actor_optim.lr=1e-3", "loop.eval_batch_size=64",
        "ray.call_timeout_s=120", "ray.experience_timeout_s=120",
    ]
    out = subprocess.run(olingo_cmd(*args), capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    run_dir = tmp_path / "distil-ray"
    assert json.loads((run_dir / "ray_summary.json").read_text())["steps"] == 2  # 4 prompts x 4 answers / 8 per step
    assert str(teacher_dir) in (run_dir / "config.yaml").read_text()
    rows = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(math.isfinite(r["rollout/teacher_kl"]) and r["rollout/teacher_kl"] > 0 for r in train), train
    evals = [r for r in rows if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2] and all(math.isfinite(r["eval/teacher_kl"]) for r in evals)
    assert not wait_gone(ray_pids() - before), "the CLI must shut down the Ray instance it started"


# ---- a detached run on Ray -------------------------------------------------------------------------
def make_group_maker(assets, name, trainers, config):
    model = str(assets.model_dir)
    models = GRPOModelsFn(model, model, CompositeReward([(varied_reward, 1.0)]), model if config.kl_coef > 0 else None)
    return ExperienceMakerHolder.options(name=name, num_cpus=1).remote(
        trainers, models, TokenizerFn(model), PromptLoaderFn([str(assets.prompts_train)], model, 64, 4), making=GroupMaking(config),
        seed=0, call_timeout_s=60, max_new_tokens=4, temperature=1.0,
    )


def make_group_trainer(assets, name, makers, run_dir, config, **kwargs):
    model = str(assets.model_dir)
    return DetachedGRPOTrainer.options(name=name, num_cpus=1).remote(
        makers, GRPOModelsFn(model, model), train_batch_size=16, micro_batch_size=8, experience_config=config, max_new_tokens=4,
        actor_lr=3e-3, max_staleness=1, call_timeout_s=60, experience_timeout_s=120, log_dir=str(run_dir), save_dir=str(run_dir),
        tokenizer_fn=TokenizerFn(model), **kwargs,
    )


@pytest.mark.slow
def test_detached_grpo_trains_checkpoints_without_critic_and_resumes(assets, actors, tmp_path):  # noqa: F811 - a fixture
    config = GroupExperienceConfig(num_generations=G, kl_coef=0.05)
    actors.append(make_group_maker(assets, "grpo-maker", ["grpo-trainer", "grpo-trainer-2"], config))
    trainer = make_group_trainer(assets, "grpo-trainer", ["grpo-maker"], tmp_path / "a", config, save_interval=2)
    actors.append(trainer)
    summary = ray.get(trainer.fit.remote(total_steps=4, update_steps=2), timeout=WAIT_S)  # 2 episodes x 2 batches of 16
    assert summary["steps"] == 4 and summary["buffer"]["sampled"] == 4 * 16
    rows = [r for r in read_jsonl(tmp_path / "a" / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all("train/kl_loss" in r and "rollout/kl" in r and "train/value_loss" not in r and r["ray/staleness"] <= 1 for r in rows)
    final = load_causal_lm(str(tmp_path / "a" / "checkpoints" / "final" / "actor")).eval()
    assert rows[-1]["perf/weight_sync_tensors"] == len(final.state_dict())  # the actor's tensors only
    for name in ("step_2", "step_4", "final"):
        files = {p.name for p in (tmp_path / "a" / "checkpoints" / name).iterdir()}
        assert {"actor", "trainer_state.json", "rng_rank0.pt"} <= files and not any("critic" in f for f in files), files

    # the maker generates with exactly the trainer's final weights, which moved
    ids = torch.tensor([[5, 17, 30, 41, 12, 9]])
    with torch.no_grad():
        expected, start = final(input_ids=ids).logits, load_causal_lm(str(assets.model_dir))(input_ids=ids).logits
    got = ray.get(ray.get_actor("grpo-maker").actor_fingerprint.remote(ids), timeout=60)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert (got - start).abs().max() > 1e-4

    # resume from step 2 in a new trainer: steps 3 and 4 follow
    ray.kill(trainer)
    second = make_group_trainer(assets, "grpo-trainer-2", ["grpo-maker"], tmp_path / "b", config)
    actors.append(second)
    assert ray.get(second.load_checkpoint.remote(str(tmp_path / "a" / "checkpoints" / "step_2")), timeout=60) == 2
    assert ray.get(second.fit.remote(total_steps=4, update_steps=2), timeout=WAIT_S)["steps"] == 4
    assert [r["step"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl")] == [3, 4]
