"""PPO: experience layout and alignment, the buffer, the trainer's hooks, invariance and resume."""

from __future__ import annotations

import copy
import os
import random
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from olingo.booster import Booster
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset, parse_prompt_row
from olingo.dataset.sampler import ResumableSampler
from olingo.experience_buffer import NaiveExperienceBuffer
from olingo.experience_maker import (
    ExperienceConfig,
    GenerationSettings,
    NaiveExperienceMaker,
    RewardShaping,
    action_log_probs,
    action_values,
    make_experience_batch,
    split_experience_batch,
)
from olingo.models import RewardModel, load_causal_lm, load_tokenizer
from olingo.models.critic import Critic
from olingo.rewards.rlvr import RLVRRewardModel
from olingo.trainer.callbacks import Callback
from olingo.trainer.ppo import PPOTrainer
from olingo.trainer.rm import score_pairs
from tests.conftest import kill_when_logged, olingo_cmd, read_jsonl

PROMPTS = ["1+1=", "12+17=", "20-3=", "5-5=", "7+13=", "19-11=", "3+4=", "10+10="]


@pytest.fixture(scope="module")
def tok(assets):
    return load_tokenizer(str(assets.model_dir), padding_side="left")


def prompt_batch(tok, prompts=PROMPTS, answers=None):
    rows = [{"prompt": p, "gt_answer": a} for p, a in zip(prompts, answers or ["0"] * len(prompts), strict=True)]
    items = [
        {
            "input_ids": tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, return_dict=False),
            "gt_answer": r["gt_answer"],
        }
        for r in rows
    ]
    return PromptCollator(tok.pad_token_id)(items)


def models(assets, tok, seed=0):
    torch.manual_seed(seed)
    actor = load_causal_lm(str(assets.model_dir))
    reference = load_causal_lm(str(assets.model_dir)).eval()
    critic = Critic.from_pretrained(str(assets.model_dir), pad_token_id=tok.pad_token_id)
    reward = RewardModel.from_pretrained(str(assets.model_dir), pad_token_id=tok.pad_token_id).eval()
    return actor, reference, critic, reward


def make_maker(assets, tok, **experience):
    actor, reference, critic, reward = models(assets, tok)
    # The untrained model samples nearly uniformly from 104 tokens: half of them as stop ids make
    # responses end at different steps, and some run to max_new_tokens.
    gen = GenerationSettings(max_new_tokens=6, stop_token_ids=list(range(3, 40)))
    return NaiveExperienceMaker(actor, critic, reward, reference, tok, kl_coef=0.1, config=ExperienceConfig(**experience), generation=gen)


# ---- experience layout -----------------------------------------------------------------------
def test_experience_alignment_per_row_equals_unpadded_forward(assets, tok):
    """Log-probs, values and the score of each row equal a forward of that row alone, unpadded:
    column j is response token j, whatever the prompt length or where the response ended."""
    torch.manual_seed(1)
    maker = make_maker(assets, tok)
    batch = prompt_batch(tok)
    exp = maker.make_experience(batch["input_ids"], batch["attention_mask"])
    lengths = exp.action_mask.sum(-1)
    assert len(set(lengths.tolist())) > 1, "responses should end at different steps"
    assert len(set(batch["attention_mask"].sum(-1).tolist())) > 1, "prompts should differ in length"
    for i in range(exp.batch_size):
        real = exp.attention_mask[i].bool()
        seq = exp.sequences[i][real].unsqueeze(0)  # prompt + response up to and including the stop
        mask = torch.ones_like(seq)
        a = int(lengths[i])
        assert (exp.action_mask[i, :a]).all() and not exp.action_mask[i, a:].any()
        with torch.no_grad():
            lp = action_log_probs(maker.actor, seq, mask, a)[0]
            ref = action_log_probs(maker.initial_model, seq, mask, a)[0]
            values = action_values(maker.critic, seq, mask, a)[0]
            score = maker.reward_model(seq, mask)[0]
        torch.testing.assert_close(exp.action_log_probs[i, :a], lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(exp.base_action_log_probs[i, :a], ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(exp.values[i, :a], values, atol=1e-5, rtol=0)
        torch.testing.assert_close(exp.raw_score[i], score, atol=1e-5, rtol=0)
        assert (exp.values[i, a:] == 0).all() and (exp.advantages[i, a:] == 0).all() and (exp.returns[i, a:] == 0).all()
        stop_ids = maker.generation.stop_token_ids
        assert exp.truncated[i] == (int(seq[0, -1]) not in stop_ids)


def test_reward_read_position_is_the_same_in_rm_training_and_ppo(assets, tok):
    """The score PPO gives a rollout equals the score RM training gives the same conversation."""
    from olingo.dataset import PreferenceCollator, parse_preference_row, tokenize_preference

    torch.manual_seed(2)
    maker = make_maker(assets, tok)
    maker.generation = GenerationSettings(max_new_tokens=6)  # stop on eos only
    batch = prompt_batch(tok)
    scored = maker.rollout_and_score(batch["input_ids"], batch["attention_mask"])
    tok_right = load_tokenizer(str(assets.model_dir))
    for i in range(len(PROMPTS)):
        if bool(scored.rollout.truncated[i]):
            continue  # RM data always ends with eos; compare rows that stopped
        row = parse_preference_row({"prompt": PROMPTS[i], "chosen": scored.responses[i], "rejected": "0"})
        pair = PreferenceCollator(tok.pad_token_id)([tokenize_preference(row, tok_right, 64)])
        with torch.no_grad():
            chosen, _ = score_pairs(maker.reward_model, pair)
        torch.testing.assert_close(scored.raw_score[i], chosen[0], atol=1e-5, rtol=0)


def test_split_and_make_batch_round_trip(assets, tok):
    torch.manual_seed(3)
    maker = make_maker(assets, tok)
    batch = prompt_batch(tok)
    exp = maker.make_experience(batch["input_ids"], batch["attention_mask"], policy_version=7)
    items = split_experience_batch(exp)
    again = make_experience_batch(items, tok.pad_token_id)
    # Columns shrink to the longest prompt and response present; the rows are the same.
    assert again.num_actions == int(exp.action_mask.sum(-1).max())
    assert again.num_prompt_tokens == int(exp.attention_mask[:, : exp.num_prompt_tokens].sum(-1).max())
    for a, b in zip(items, split_experience_batch(again), strict=True):
        assert torch.equal(a.prompt, b.prompt) and torch.equal(a.response, b.response)
        assert all(torch.equal(a.per_token[k], b.per_token[k]) for k in a.per_token)
        assert torch.equal(a.score, b.score) and torch.equal(a.truncated, b.truncated)
    assert again.policy_version == 7


def test_reused_rollout_log_probs_equal_the_scoring_forward(assets, tok):
    """reuse_rollout_log_probs: the same experience as a separate actor forward, to rounding."""
    batch = prompt_batch(tok)
    experiences = []
    for reuse in (False, True):
        torch.manual_seed(5)
        maker = make_maker(assets, tok, reuse_rollout_log_probs=reuse)
        experiences.append(maker.make_experience(batch["input_ids"], batch["attention_mask"]))
    plain, reused = experiences
    assert torch.equal(plain.sequences, reused.sequences)
    mask = plain.action_mask
    torch.testing.assert_close(reused.action_log_probs[mask], plain.action_log_probs[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reused.advantages, plain.advantages, atol=1e-4, rtol=1e-4)


def test_reference_forward_is_skipped_only_when_kl_cannot_matter(assets, tok, monkeypatch):
    """kl_coef 0 (fixed) + skip_reference_when_kl_zero: no reference forward, KL reads 0."""
    batch = prompt_batch(tok)
    for kl_coef, kl_target, expect_calls in ((0.0, None, 0), (0.1, None, 1), (0.0, 6.0, 1)):
        maker = make_maker(assets, tok, skip_reference_when_kl_zero=True, kl_target=kl_target)
        maker.kl_ctl.value = kl_coef
        calls = []
        maker.initial_model.register_forward_hook(lambda *args, calls=calls: calls.append(1))
        exp = maker.make_experience(batch["input_ids"], batch["attention_mask"])
        assert len(calls) == expect_calls, (kl_coef, kl_target)
        if expect_calls == 0:
            assert torch.equal(exp.kl, torch.zeros_like(exp.kl))


def test_buffer_smaller_than_a_batch_is_an_error(assets, tok):
    torch.manual_seed(4)
    maker = make_maker(assets, tok)
    batch = prompt_batch(tok, PROMPTS[:3], ["2", "29", "17"])
    buffer = NaiveExperienceBuffer(sample_batch_size=4)
    buffer.append(maker.make_experience(batch["input_ids"], batch["attention_mask"], batch["gt_answer"]))
    assert len(buffer) == 3
    with pytest.raises(ValueError, match="fewer than one training batch"):
        buffer.dataloader()
    with pytest.raises(ValueError, match="fewer than one training batch"):
        buffer.sample()
    buffer.sample_batch_size = 2
    sizes = [exp.batch_size for exp in buffer.dataloader()]
    assert sizes == [2, 1]  # the last minibatch is kept, never dropped
    buffer.clear()
    assert len(buffer) == 0


def test_buffer_limit_keeps_the_newest(assets, tok):
    torch.manual_seed(5)
    maker = make_maker(assets, tok)
    batch = prompt_batch(tok)
    buffer = NaiveExperienceBuffer(sample_batch_size=2, limit=5)
    buffer.append(maker.make_experience(batch["input_ids"], batch["attention_mask"], policy_version=1))
    buffer.append(maker.make_experience(batch["input_ids"], batch["attention_mask"], policy_version=2))
    assert len(buffer) == 5 and all(item.policy_version == 2 for item in buffer.items)


def test_prompt_rows_and_errors(tmp_path):
    from olingo.dataset import DataError

    messages, answer = parse_prompt_row({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}], "answer": 3})
    assert messages == [{"role": "user", "content": "hi"}] and answer == "3"
    with pytest.raises(DataError, match=r"row 4, field 'prompt'"):
        parse_prompt_row({"question": "x"}, "p.jsonl", 4)
    with pytest.raises(DataError, match=r"field 'gt_answer'"):
        parse_prompt_row({"prompt": "x", "gt_answer": ["a"]}, "p.jsonl", 1)


# ---- the trainer ---------------------------------------------------------------------------
class Recorder(Callback):
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_fit_start(self):
        self.events.append("fit_start")

    def on_fit_end(self):
        self.events.append("fit_end")

    def on_episode_start(self, episode):
        self.events.append(f"episode_start({episode})")

    def on_episode_end(self, episode):
        self.events.append(f"episode_end({episode})")

    def on_make_experience_start(self):
        self.events.append("make_start")

    def on_make_experience_end(self, experience):
        self.events.append(f"make_end({experience.batch_size})")

    def on_learn_epoch_start(self, epoch):
        self.events.append(f"learn_epoch_start({epoch})")

    def on_learn_epoch_end(self, epoch):
        self.events.append(f"learn_epoch_end({epoch})")

    def on_learn_batch_start(self):
        self.events.append("batch_start")

    def on_learn_batch_end(self, experience):
        self.events.append(f"batch_end({experience.batch_size})")

    def on_train_start(self, state):
        self.events.append(f"train_start({state.step})")

    def on_step_end(self, state, step_idx, batch, metrics):
        self.events.append(f"step_end({step_idx})")

    def on_checkpoint(self, state, row):
        self.events.append(f"checkpoint({row.name})")

    def on_eval(self, state, step_idx, eval_name, metrics):
        self.events.append(f"eval({step_idx})")

    def on_train_end(self, state, artifacts):
        self.events.append("train_end" + ("(error)" if artifacts.error else ""))


def build_trainer(assets, tok, *, train_batch_size=4, accumulation_steps=1, save_dir=None, callbacks=(), lr=1e-3, seed=0, **kwargs):
    actor, reference, critic, _ = models(assets, tok, seed)
    reward = RLVRRewardModel(["arithmetic_exact"])
    actor_booster, critic_booster = Booster(), Booster()
    actor_optim = torch.optim.AdamW(actor.parameters(), lr=lr)
    critic_optim = torch.optim.AdamW(critic.parameters(), lr=lr)
    actor, actor_optim, *_ = actor_booster.boost(actor, actor_optim)
    critic, critic_optim, *_ = critic_booster.boost(critic, critic_optim)
    return PPOTrainer(
        actor_booster, critic_booster, actor, critic, reward, reference, actor_optim, critic_optim, None, None, tok,
        kl_coef=0.05, ptx_coef=0.0, train_batch_size=train_batch_size, accumulation_steps=accumulation_steps,
        save_dir=save_dir, callbacks=list(callbacks), max_new_tokens=4, **kwargs,
    )


def prompt_loader(assets, tok, batch_size=8, n=None):
    data = build_prompt_dataset(str(assets.prompts_train), tok, 64)
    if n is not None:
        data.items = data.items[:n]
    return Booster().plugin.prepare_dataloader(data, batch_size, shuffle=True, seed=0, collate_fn=PromptCollator(tok.pad_token_id), drop_last=True)


def test_hook_order_of_one_ppo_run(assets, tok, tmp_path):
    recorder = Recorder()
    trainer = build_trainer(assets, tok, save_dir=str(tmp_path), callbacks=[recorder], save_interval=4)
    trainer.show_progress = False
    trainer.fit(2, 1, 2, prompt_loader(assets, tok))
    episode = lambda e, s: [  # noqa: E731 - one episode: 8 rollouts, 2 epochs of 2 minibatches of 4
        f"episode_start({e})", "make_start", "make_end(8)",
        "learn_epoch_start(0)", "batch_start", "batch_end(4)", f"step_end({s + 1})", "batch_start", "batch_end(4)", f"step_end({s + 2})", "learn_epoch_end(0)",
        "learn_epoch_start(1)", "batch_start", "batch_end(4)", f"step_end({s + 3})", "batch_start", "batch_end(4)", f"step_end({s + 4})", "learn_epoch_end(1)",
        f"episode_end({e})", f"checkpoint(step_{s + 4})",
    ]
    assert recorder.events == ["train_start(0)", "fit_start", *episode(0, 0), *episode(1, 4), "checkpoint(final)", "fit_end", "train_end"]
    assert [r["name"] for r in read_jsonl(tmp_path / "checkpoints.jsonl")] == ["step_4", "step_8", "final"]
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 9))
    for name in ("rollout/reward_mean", "rollout/reward_std", "rollout/kl", "rollout/response_length", "perf/tokens_per_s",
                 "time/make_experience"):  # once per episode, on its first step's row (docs/runs.md)
        assert name in rows[4] and name not in rows[-1], name
    for name in ("train/policy_loss", "train/value_loss", "train/ptx_loss", "train/clipfrac", "train/approx_kl", "train/entropy",
                 "train/explained_variance", "train/ratio_max", "train/skip_ratio", "time/learn"):
        assert name in rows[-1], name


def test_a_raising_training_step_still_ends_episode_and_fit(assets, tok, monkeypatch):
    recorder = Recorder()
    trainer = build_trainer(assets, tok, callbacks=[recorder])
    trainer.show_progress = False
    calls = {"n": 0}
    original = trainer.learner.training_step

    def failing(experience, share, temperature, ptx_batch=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")
        return original(experience, share, temperature, ptx_batch)

    monkeypatch.setattr(trainer.learner, "training_step", failing)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(2, 1, 2, prompt_loader(assets, tok))
    assert recorder.events[-4:] == ["batch_start", "episode_end(0)", "fit_end", "train_end(error)"]


def test_ptx_without_pretrain_loader_is_a_clear_error(assets, tok):
    trainer = build_trainer(assets, tok)
    trainer.ptx_coef = 0.9
    with pytest.raises(ValueError, match="pretrain_dataloader"):
        trainer.fit(1, 1, 1, prompt_loader(assets, tok))


def test_unknown_generate_kwarg_and_use_tp_are_errors(assets, tok):
    with pytest.raises(TypeError, match="max_new_token"):
        build_trainer(assets, tok, max_new_token=3)
    with pytest.raises(ValueError, match="tensor parallelism"):
        build_trainer(assets, tok, use_tp=True)


def learn_once(assets, tok, train_batch_size, accumulation_steps):
    """One episode on the same 8 rollouts; returns the actor and critic parameters after it."""
    torch.manual_seed(11)
    trainer = build_trainer(assets, tok, train_batch_size=train_batch_size, accumulation_steps=accumulation_steps, lr=1e-3)
    trainer.show_progress = False
    trainer.fit(1, 1, 1, prompt_loader(assets, tok))
    assert trainer.state.step == 8 // (train_batch_size * accumulation_steps)
    return {**{f"actor.{k}": v for k, v in trainer.actor.state_dict().items()}, **{f"critic.{k}": v for k, v in trainer.critic.state_dict().items()}}


def test_learn_phase_batch_8_equals_batch_2_times_accumulation_4(assets, tok):
    big = learn_once(assets, tok, 8, 1)
    small = learn_once(assets, tok, 2, 4)
    for name, value in big.items():
        torch.testing.assert_close(small[name], value, atol=2e-6, rtol=1e-5, msg=name)
    start = models(assets, tok)[0].state_dict()
    assert any(not torch.equal(big[f"actor.{k}"], v) for k, v in start.items()), "training changed nothing"


def test_checkpoint_restores_each_piece_to_its_owner(assets, tok, tmp_path):
    trainer = build_trainer(assets, tok, save_dir=str(tmp_path), experience_config=ExperienceConfig(kl_target=0.5, kl_horizon=100),
                            reward_shaping=RewardShaping(normalize=True))
    trainer.show_progress = False
    trainer.fit(1, 1, 1, prompt_loader(assets, tok))
    saved_actor = copy.deepcopy(trainer.actor.state_dict())
    saved_critic_optim = copy.deepcopy(trainer.critic_optim.state_dict())
    maker_state = trainer.experience_maker.state_dict()
    assert maker_state["kl_ctl"]["value"] != 0.05 and maker_state["reward_moments"]["count"] == 8

    fresh = build_trainer(assets, tok, seed=1, experience_config=ExperienceConfig(kl_target=0.5, kl_horizon=100), reward_shaping=RewardShaping(normalize=True))
    reference_before = copy.deepcopy(fresh.initial_model.state_dict())
    fresh.load_checkpoint(tmp_path / "checkpoints" / "final")
    for k, v in saved_actor.items():
        assert torch.equal(fresh.actor.state_dict()[k], v), k
    for k, v in reference_before.items():  # the frozen reference is never overwritten
        assert torch.equal(fresh.initial_model.state_dict()[k], v), k
    assert fresh.critic_optim.state_dict()["state"].keys() == saved_critic_optim["state"].keys()
    for idx, st in saved_critic_optim["state"].items():
        assert torch.equal(fresh.critic_optim.state_dict()["state"][idx]["exp_avg"], st["exp_avg"])
    assert fresh.experience_maker.state_dict() == maker_state
    assert fresh.state.step == trainer.state.step and fresh.start_episode == 1


# ---- the CLI: kill and resume, smoke run, shortened demo -----------------------------------
def ppo_args(tmp_path, name, assets, extra=()):
    return [
        "ppo", f"run.output_dir={tmp_path}", f"run.name={name}", "logging.progress=false",
        f"model.actor={assets.model_dir}", "loop.episodes=6", "loop.rollout_batch_size=8", "loop.train_batch_size=4",
        "loop.update_steps=1", "loop.save_interval=2", "generation.max_new_tokens=4", "actor_optim.lr=1e-3",
        "critic_optim.lr=1e-3", "data.eval_prompts=[]", *extra,
    ]


def weights(run_dir):
    final = run_dir / "checkpoints" / "final"
    return {**load_file(final / "actor" / "model.safetensors"), **{f"critic.{k}": v for k, v in load_file(final / "critic" / "model.safetensors").items()}}


def without_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in rows]


@pytest.mark.slow
def test_ppo_kill_and_resume_equals_an_uninterrupted_run(tmp_path, assets):
    subprocess.run(olingo_cmd(*ppo_args(tmp_path, "straight", assets)), check=True, capture_output=True, timeout=300)
    straight = tmp_path / "straight"
    assert len(read_jsonl(straight / "metrics.jsonl")) == 12

    kill_at = random.Random(os.getpid()).randint(3, 10)
    killed = tmp_path / "killed"
    kill_when_logged(olingo_cmd(*ppo_args(tmp_path, "killed", assets)), killed / "metrics.jsonl", kill_at, timeout=240)
    subprocess.run(olingo_cmd(*ppo_args(tmp_path, "killed", assets, ["run.resume=last"])), check=True, capture_output=True, timeout=300)
    for key, value in weights(straight).items():
        assert torch.equal(value, weights(killed)[key]), key
    assert without_time(read_jsonl(killed / "metrics.jsonl")) == without_time(read_jsonl(straight / "metrics.jsonl"))
    assert read_jsonl(killed / "samples.jsonl") == read_jsonl(straight / "samples.jsonl")


@pytest.mark.slow
def test_ppo_cli_with_a_reward_model_writes_loadable_artifacts_and_report(tmp_path, assets):
    from transformers import AutoModelForCausalLM

    rm_dir = tmp_path / "rm"
    RewardModel.from_pretrained(str(assets.model_dir), pad_token_id=0).save_pretrained(rm_dir)
    args = ppo_args(tmp_path, "neural", assets, [f"reward.model={rm_dir}", "reward.functions={}", "loop.episodes=2", "loop.eval_batch_size=32",
                                               "data.eval_prompts=[builtin:prompts_eval]", "loop.accuracy_function=arithmetic_exact",
                                               "callbacks=[{kind: csv_metrics}]"])
    out = subprocess.run(olingo_cmd(*args), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "neural"
    assert "held-out eval/accuracy" in out.stdout
    actor = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "final" / "actor")
    start = AutoModelForCausalLM.from_pretrained(assets.model_dir)
    changed = [n for n, p in actor.named_parameters() if not torch.equal(p, start.get_parameter(n))]
    assert len(changed) == len(list(start.parameters())), "every actor parameter should move"
    critic = Critic.from_pretrained(str(run_dir / "checkpoints" / "final" / "critic"))
    assert critic(torch.tensor([[2, 5, 20]]), torch.ones(1, 3, dtype=torch.long)).shape == (1, 3)
    assert (run_dir / "metrics.csv").exists() and (run_dir / "perf.json").exists()
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] == "eval"] == [0, 4]  # before training, and the final policy
    report = subprocess.run(olingo_cmd("report", str(run_dir)), capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert {p.name for p in (run_dir / "plots").glob("*.png")} >= {"reward.png", "kl.png", "loss.png"}


@pytest.mark.slow
def test_ppo_cli_bad_config_is_exit_2(tmp_path, assets):
    out = subprocess.run(olingo_cmd("ppo", "reward.model=/x", f"run.output_dir={tmp_path}"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "reward.model '/x' does not exist" in out.stderr


@pytest.mark.slow
def test_the_demo_reaches_its_documented_conclusions(tmp_path):
    """`olingo demo` as a user runs it (about 5 minutes on 2 idle cores), checked for its
    conclusions, not its digits: those are exact only on the same CPU kind, torch build and thread
    count. Each margin sits below the smallest value measured over seeds and kernel paths
    (docs/demo.md: several seeds, 1 and 2 threads, ATEN_CPU_CAPABILITY=default, an Intel Xeon).

    `.ci/run` has just run `make demo` and names its output in OLINGO_DEMO_DIR: those runs are
    checked here rather than made a second time. Without it the test runs the demo itself."""
    from olingo.cli.demo import DemoResult, run_demo

    given = os.environ.get("OLINGO_DEMO_DIR")
    if given:
        tmp_path = Path(given)
        r = DemoResult.load(tmp_path)
    else:
        r = run_demo(str(tmp_path), print_table=False)
        assert DemoResult.load(tmp_path) == r  # the file a check of `make demo`'s runs reads
    # SFT teaches the task: greedy accuracy 0.69-0.87 measured, from 0.
    assert r.base_greedy < 0.05 and r.sft_greedy > r.base_greedy + 0.5, (r.base_greedy, r.sft_greedy)
    # The reward model ranks held-out pairs: 0.87-0.95 measured.
    assert r.rm_pair_accuracy > 0.8, r.rm_pair_accuracy
    # GRPO, rewarded by the checker, raises sampled accuracy in every run (+0.17 to +0.27 measured).
    # PPO raises the score of the reward model it is trained on (+0.8 to +2.3 measured), but not
    # always the checked accuracy (-0.06 to +0.18: it can exploit the reward model's mistakes), so
    # no PPO accuracy gain is asserted; both move away from the SFT model (KL 0.24 and up).
    assert r.grpo["accuracy"] > r.before["accuracy"] + 0.1, (r.before["accuracy"], r.grpo["accuracy"])
    assert r.after["reward"] > r.before["reward"] + 0.5, (r.before["reward"], r.after["reward"])
    # The SFT row compares the SFT model with itself through the same call: no divergence at all
    # (a tolerance, not == 0, so an engine that reports its own log-probs would still pass).
    assert abs(r.before["kl"]) < 1e-6 and r.after["kl"] > 0.05 and r.grpo["kl"] > 0.05, (r.before["kl"], r.after["kl"], r.grpo["kl"])
    rows = [x for x in read_jsonl(tmp_path / "demo-ppo" / "metrics.jsonl") if "rollout/reward_mean" in x]  # one row per rollout
    first, last = rows[: len(rows) // 4], rows[-len(rows) // 4:]
    mean = lambda rs: sum(x["rollout/reward_mean"] for x in rs) / len(rs)  # noqa: E731
    assert mean(last) > mean(first) + 0.5, (mean(first), mean(last))  # PPO's rollout reward: +0.9 to +2.5 measured, first to last quarter
    assert (tmp_path / "demo-ppo" / "plots" / "reward.png").exists() and r.run_dirs["grpo"].endswith("demo-grpo")


def test_resumable_sampler_is_used_for_prompts(assets, tok):
    assert isinstance(prompt_loader(assets, tok).sampler, ResumableSampler)


def test_a_kl_coef_keyword_defers_to_the_section_or_disagrees_loudly(assets, tok):
    """`kl_coef` (ColossalChat's keyword) and `experience_config.kl_coef` are one setting: the
    keyword at its default defers to the section, and two different values are an error."""
    actor, reference, critic, _ = models(assets, tok)
    actor_booster, critic_booster = Booster(), Booster()
    actor, actor_optim, *_ = actor_booster.boost(actor, torch.optim.AdamW(actor.parameters(), lr=1e-3))
    critic, critic_optim, *_ = critic_booster.boost(critic, torch.optim.AdamW(critic.parameters(), lr=1e-3))

    def trainer(**kwargs):
        return PPOTrainer(
            actor_booster, critic_booster, actor, critic, RLVRRewardModel(["arithmetic_exact"]), reference, actor_optim, critic_optim, None, None, tok,
            ptx_coef=0.0, max_new_tokens=4, **kwargs,
        )

    assert trainer(experience_config=ExperienceConfig(kl_coef=0.05)).experience_maker.kl_ctl.value == 0.05
    assert trainer(kl_coef=0.2).experience_maker.kl_ctl.value == 0.2
    with pytest.raises(ValueError, match="kl_coef=0.2 .* disagrees with experience_config.kl_coef=0.05"):
        trainer(kl_coef=0.2, experience_config=ExperienceConfig(kl_coef=0.05))
    # A field the section set is the user's choice even when it equals the field's default.
    with pytest.raises(ValueError, match="kl_coef=0.2 .* disagrees with experience_config.kl_coef=0.1"):
        trainer(kl_coef=0.2, experience_config=ExperienceConfig(kl_coef=0.1))
    # A field the section left unset is filled by the keyword: one value, no disagreement.
    assert trainer(kl_coef=0.2, experience_config=ExperienceConfig(advantage="gae")).experience_maker.kl_ctl.value == 0.2
