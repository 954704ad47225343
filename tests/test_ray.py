"""Ray detached mode on a local Ray instance with 2 CPUs: ColossalChat's example, learning, weight
sync, a killed maker, a failing maker, hooks on both sides, resume, and no process left behind.

Every remote wait is bounded: the trainer's own call/experience timeouts, and `ray.get(...,
timeout=...)` here.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from olingo.experience_maker import Experience, RewardShaping  # noqa: E402
from olingo.models import load_causal_lm  # noqa: E402
from olingo.ray.detached_replay_buffer import ACCEPTED, CLOSED, FULL, DetachedReplayBuffer  # noqa: E402
from olingo.ray.detached_trainer_base import DetachedTrainer  # noqa: E402
from olingo.ray.detached_trainer_ppo import DetachedPPOTrainer  # noqa: E402
from olingo.ray.experience_maker_holder import ExperienceMakerHolder  # noqa: E402
from olingo.ray.weights import load_synced_state, state_dict_for_sync  # noqa: E402
from olingo.recipes.ppo_ray import PPOModelsFn, PromptLoaderFn, TokenizerFn  # noqa: E402
from olingo.rewards.rlvr import RLVRRewardModel  # noqa: E402
from olingo.trainer.callbacks import Callback  # noqa: E402
from tests.conftest import read_jsonl  # noqa: E402

# Actor classes and reward functions defined here travel to the workers by value (the workers
# cannot import this test module).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

WAIT_S = 240  # the longest any test waits for a fit


@pytest.fixture(scope="module")
def ray_instance():
    # address="local": always a fresh instance of our own, even if `ray start` runs on this machine
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="olingo-tests")
    node = ray._private.worker._global_node
    pids = [p.process.pid for infos in node.all_processes.values() for p in infos]
    yield
    ray.shutdown()
    deadline = time.time() + 30
    while time.time() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.5)
    left = [pid for pid in pids if _alive(pid)]
    assert not left, f"Ray processes left behind after shutdown: {left}"


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "zombie" not in status


@pytest.fixture()
def actors(ray_instance):
    """Actors a test creates; all killed afterwards so the next test gets the CPUs back."""
    created: list = []
    yield created
    for actor in created:
        ray.kill(actor)


# ---- pieces ---------------------------------------------------------------------------------------
def digit_share(prompt: str, response: str, gt_answer: str | None) -> float:
    """A rule reward the untrained model can learn quickly: the share of digits in the response."""
    return sum(c.isdigit() for c in response) / max(len(response), 1)


def make_maker(assets, name, trainers, *, reward=None, callbacks=(), batch_size=32, max_restarts=0, seed=0, **gen):
    tok = str(assets.model_dir)
    models = PPOModelsFn(tok, tok, tok, reference=tok, reward=reward or RLVRRewardModel([digit_share]))
    loader = PromptLoaderFn([str(assets.prompts_train)], tok, 64, batch_size, seed=seed)
    generation = {"max_new_tokens": 4, "temperature": 1.0, **gen}
    return ExperienceMakerHolder.options(name=name, num_cpus=1, max_restarts=max_restarts).remote(
        trainers, models, TokenizerFn(tok), loader, 0.05, callbacks, seed=seed, call_timeout_s=60,
        reward_shaping=RewardShaping(clip=None), **generation,
    )


def make_trainer(assets, name, makers, tmp_path, *, callbacks=(), **kwargs):
    tok = str(assets.model_dir)
    options = dict(train_batch_size=16, actor_lr=3e-3, critic_lr=3e-3, max_staleness=1, call_timeout_s=60, experience_timeout_s=120,
                   log_dir=str(tmp_path), save_dir=str(tmp_path), tokenizer_fn=TokenizerFn(tok))
    options.update(kwargs)
    return DetachedPPOTrainer.options(name=name, num_cpus=1).remote(makers, PPOModelsFn(tok, tok, tok), callbacks=callbacks, **options)


class FileRecorder(Callback):
    """Appends every hook it sees to a file (callbacks run inside the actors)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _log(self, event: str) -> None:
        with open(self.path, "a") as f:
            f.write(event + "\n")

    def on_fit_start(self): self._log("fit_start")  # noqa: E704
    def on_fit_end(self): self._log("fit_end")  # noqa: E704
    def on_episode_start(self, episode): self._log(f"episode_start({episode})")  # noqa: E704
    def on_episode_end(self, episode): self._log(f"episode_end({episode})")  # noqa: E704
    def on_learn_epoch_start(self, epoch): self._log(f"epoch_start({epoch})")  # noqa: E704
    def on_learn_epoch_end(self, epoch): self._log(f"epoch_end({epoch})")  # noqa: E704
    def on_learn_batch_start(self): self._log("batch_start")  # noqa: E704
    def on_learn_batch_end(self, experience): self._log("batch_end")  # noqa: E704
    def on_update_start(self): self._log("update_start")  # noqa: E704
    def on_update_end(self): self._log("update_end")  # noqa: E704
    def on_train_start(self, state): self._log("train_start")  # noqa: E704
    def on_train_end(self, state, artifacts): self._log("train_end")  # noqa: E704
    def on_step_end(self, state, step_idx, batch, metrics): self._log(f"step({step_idx})")  # noqa: E704
    def on_checkpoint(self, state, row): self._log(f"checkpoint({row.name})")  # noqa: E704
    def on_loop_start(self): self._log("loop_start")  # noqa: E704
    def on_loop_end(self): self._log("loop_end")  # noqa: E704
    def on_batch_start(self): self._log("maker_batch_start")  # noqa: E704
    def on_batch_end(self): self._log("maker_batch_end")  # noqa: E704
    def on_make_experience_start(self): self._log("make_start")  # noqa: E704
    def on_make_experience_end(self, experience): self._log("make_end")  # noqa: E704
    def on_send_start(self): self._log("send_start")  # noqa: E704
    def on_send_end(self): self._log("send_end")  # noqa: E704


# ---- ColossalChat's usage example -----------------------------------------------------------------
@pytest.mark.slow
def test_colossalchat_usage_example_runs_as_written(assets, actors):
    actors.append(make_maker(assets, "maker_0", ["trainer_0"], batch_size=64))

    # --- ColossalChat's Ray example, with olingo imports ---
    from olingo.experience_maker import Experience  # noqa: F401 - the example's imports, as written
    from olingo.ray.detached_trainer_base import DetachedTrainer  # noqa: F401

    @ray.remote(concurrency_groups={
        "buffer_length": 1, "buffer_append": 1,
        "buffer_sample": 1, "compute": 1
    })
    class MyTrainer(DetachedTrainer):
        def training_step(self, experience: Experience):
            # Implement training logic
            return {"loss": 0.0}

        def _update_remote_makers(self, fully_update=False, **kwargs):
            # Implement model sync to remote makers
            pass

    trainer = MyTrainer.options(name="trainer_0").remote(
        experience_maker_holder_name_list=["maker_0"],
        train_batch_size=8,
    )
    summary = ray.get(trainer.fit.remote(total_steps=1000, update_steps=100, train_epochs=2))
    # --- end of the example ---
    actors.append(trainer)
    assert summary["steps"] == 2000 and summary["episodes"] == 10  # 10 episodes x 100 batches x 2 epochs
    buffer, maker = summary["buffer"], summary["makers"]["maker_0"]
    assert buffer["sampled"] == 1000 * 8
    # every rollout is accounted for: made = trained on + left in the buffer + discarded at the end
    assert maker["made"] == buffer["sampled"] + summary["leftover_rollouts"] + maker["discarded"]


# ---- PPO on Ray -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_one_maker_one_trainer_raises_the_mean_reward_and_syncs_weights(assets, actors, tmp_path):
    actors.append(make_maker(assets, "learn-maker", ["learn-trainer"]))
    trainer = make_trainer(assets, "learn-trainer", ["learn-maker"], tmp_path)
    actors.append(trainer)
    summary = ray.get(trainer.fit.remote(total_steps=30, update_steps=2, train_epochs=2), timeout=WAIT_S)
    assert summary["steps"] == 60
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in rows] == list(range(1, 61))
    first, last = rows[:12], rows[-12:]
    mean = lambda rs: sum(r["rollout/reward_mean"] for r in rs) / len(rs)  # noqa: E731
    assert mean(last) > mean(first) + 0.15, (mean(first), mean(last))
    assert all(r["ray/staleness"] <= 1 for r in rows)
    assert rows[-1]["perf/weight_sync_s"] > 0 and rows[-1]["perf/weight_sync_gbps"] > 0

    # After the last sync the maker generates with exactly the trainer's final weights.
    maker = ray.get_actor("learn-maker")
    final = load_causal_lm(str(tmp_path / "checkpoints" / "final" / "actor")).eval()
    ids = torch.tensor([[5, 17, 30, 41, 12, 9]])
    with torch.no_grad():
        expected = final(input_ids=ids).logits
    torch.testing.assert_close(ray.get(maker.actor_fingerprint.remote(ids), timeout=60), expected, atol=1e-5, rtol=0)
    assert ray.get(maker.ready.remote(), timeout=60)["policy_version"] == 60


@pytest.mark.slow
def test_hooks_fire_on_both_sides_in_order(assets, actors, tmp_path):
    trainer_log, maker_log = tmp_path / "trainer.log", tmp_path / "maker.log"
    actors.append(make_maker(assets, "hook-maker", ["hook-trainer"], callbacks=[FileRecorder(str(maker_log))]))
    trainer = make_trainer(assets, "hook-trainer", ["hook-maker"], tmp_path, callbacks=[FileRecorder(str(trainer_log))], save_interval=2)
    actors.append(trainer)
    ray.get(trainer.fit.remote(total_steps=2, update_steps=1, train_epochs=2), timeout=WAIT_S)
    events = trainer_log.read_text().split()
    episode = lambda e, s: [f"episode_start({e})", "epoch_start(0)", "batch_start", "batch_end", f"step({s})", "epoch_end(0)",  # noqa: E731
                            "epoch_start(1)", "batch_start", "batch_end", f"step({s + 1})", "epoch_end(1)",
                            "update_start", "update_end", f"episode_end({e})"]
    assert events == [
        "train_start", "fit_start", "update_start", "update_end",
        *episode(0, 1), "checkpoint(step_2)", *episode(1, 3), "checkpoint(step_4)", "checkpoint(final)",
        "fit_end", "train_end",
    ]
    made = maker_log.read_text().split()
    assert made[0] == "loop_start" and made[-1] == "loop_end"
    batch = ["maker_batch_start", "make_start", "make_end", "send_start", "send_end", "maker_batch_end"]
    body = made[1:-1]
    assert len(body) >= 2 * len(batch) and body == batch * (len(body) // len(batch))


@pytest.mark.slow
def test_a_killed_maker_is_restarted_gets_the_weights_and_training_finishes(assets, actors, tmp_path):
    maker = make_maker(assets, "kill-maker", ["kill-trainer"], max_restarts=2)
    actors.append(maker)
    trainer = make_trainer(assets, "kill-trainer", ["kill-maker"], tmp_path)
    actors.append(trainer)
    fit = trainer.fit.remote(total_steps=24, update_steps=2, train_epochs=1)
    deadline = time.time() + WAIT_S
    while not _steps_logged(tmp_path) >= 6:
        assert time.time() < deadline, "training never reached step 6"
        time.sleep(0.2)
    pid = ray.get(maker.ready.remote(), timeout=60)["pid"]
    ray.kill(maker, no_restart=False)  # dies now; Ray restarts it
    summary = ray.get(fit, timeout=WAIT_S)
    assert summary["steps"] == 24 and summary["maker_restarts"] == 1
    state = ray.get(maker.ready.remote(), timeout=60)
    assert state["pid"] != pid, "the maker should be a new process"
    assert state["policy_version"] == 24, "the restarted maker must hold the trainer's latest weights"


def _steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def failing_reward(prompt: str, response: str, gt_answer: str | None) -> float:
    raise ArithmeticError(f"reward exploded on {prompt!r}")


@pytest.mark.slow
def test_an_exception_in_a_maker_reaches_the_driver_with_its_traceback(assets, actors, tmp_path):
    actors.append(make_maker(assets, "bad-maker", ["bad-trainer"], reward=RLVRRewardModel([failing_reward])))
    trainer = make_trainer(assets, "bad-trainer", ["bad-maker"], tmp_path)
    actors.append(trainer)
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(trainer.fit.remote(total_steps=4, update_steps=2), timeout=WAIT_S)
    message = str(info.value)
    assert "experience maker 'bad-maker' failed" in message
    # the maker's own frames, down to the line that raised
    assert "ExperienceMakerHolder.workingloop" in message and "in failing_reward" in message and "ArithmeticError: reward exploded" in message


@pytest.mark.slow
def test_resume_from_a_trainer_checkpoint_continues_the_run(assets, actors, tmp_path):
    actors.append(make_maker(assets, "resume-maker", ["resume-trainer", "resume-trainer-2"]))
    first = make_trainer(assets, "resume-trainer", ["resume-maker"], tmp_path / "a", save_interval=4)
    actors.append(first)
    ray.get(first.fit.remote(total_steps=4, update_steps=2), timeout=WAIT_S)  # checkpoints step_4 and final
    ray.kill(first)
    second = make_trainer(assets, "resume-trainer-2", ["resume-maker"], tmp_path / "b")
    actors.append(second)
    assert ray.get(second.load_checkpoint.remote(str(tmp_path / "a" / "checkpoints" / "step_4")), timeout=60) == 4
    summary = ray.get(second.fit.remote(total_steps=8, update_steps=2), timeout=WAIT_S)
    assert summary["steps"] == 8 and summary["episodes"] == 4
    steps = [r["step"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl")]
    assert steps == [5, 6, 7, 8]


# ---- no Ray needed: buffer and weight-sync rules ---------------------------------------------------
def _experience(batch: int, version: int) -> Experience:
    seq = torch.ones(batch, 5, dtype=torch.long)
    per_token = {name: torch.zeros(batch, 2) for name in ("action_log_probs", "base_action_log_probs", "values", "kl", "rewards", "advantages", "returns")}
    return Experience(sequences=seq, attention_mask=torch.ones_like(seq), action_mask=torch.ones(batch, 2, dtype=torch.bool),
                      score=torch.zeros(batch), raw_score=torch.zeros(batch), truncated=torch.zeros(batch, dtype=torch.bool),
                      policy_version=version, **per_token)


def test_buffer_batches_backpressure_staleness_and_close():
    buffer = DetachedReplayBuffer(sample_batch_size=4, limit=2)
    assert buffer.append(_experience(6, version=0)) == ACCEPTED  # one batch of 4, 2 items waiting
    assert buffer.get_length() == 1
    assert buffer.append(_experience(6, version=3)) == ACCEPTED  # 8 more items: 3 batches
    assert buffer.get_length() == 3
    assert buffer.append(_experience(4, version=3)) == FULL and buffer.counts.received == 12
    stale = buffer.sample(timeout=0, min_version=3)  # batch 1 (v0) and batch 2 (v0 items + v3) are stale
    assert stale.policy_version == 3 and buffer.counts.dropped_stale == 8
    assert buffer.sample(timeout=0.01) is None
    assert buffer.append(_experience(2, version=3)) == ACCEPTED
    assert buffer.close() == 2  # two rollouts never reached a full batch
    assert buffer.append(_experience(4, version=3)) == CLOSED and buffer.counts.refused_closed == 4
    assert buffer.sample(timeout=None) is None  # a closed buffer never blocks


def test_weight_sync_refuses_mismatched_keys(assets):
    model = load_causal_lm(str(assets.model_dir))
    state = state_dict_for_sync(model)
    prefixed = {f"module.{k}": v for k, v in state.items()}  # a DDP-wrapped sender
    with pytest.raises(ValueError, match="do not match"):
        load_synced_state(model, prefixed, "actor")
    partial = dict(list(state.items())[:3])
    with pytest.raises(ValueError, match="missing"):
        load_synced_state(model, partial, "actor")
    assert load_synced_state(model, partial, "actor", fully_update=False) == 3
    assert load_synced_state(model, state, "actor") == len(state)


def test_trainer_needs_maker_names():
    class Bare(DetachedTrainer):
        def training_step(self, experience):
            return {}

        def _update_remote_makers(self, fully_update=False, **kwargs):
            pass

    with pytest.raises(ValueError, match="empty"):
        Bare([])


@pytest.mark.slow
def test_readme_ray_example_runs(assets, actors, tmp_path, monkeypatch):
    """The Ray Python example of docs/ray.md, with local paths, a short run, and this module's Ray."""
    import re

    from olingo.models import RewardModel

    rm_dir = tmp_path / "rm"
    RewardModel.from_pretrained(str(assets.model_dir), pad_token_id=0).save_pretrained(rm_dir)
    readme = (Path(__file__).resolve().parents[1] / "docs" / "ray.md").read_text()
    example = next(b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "DetachedPPOTrainer.options(" in b)
    example = (
        example.replace('"path/to/sft"', repr(str(assets.model_dir))).replace('"path/to/rm"', repr(str(rm_dir)))
        .replace('"prompts.jsonl"', repr(str(assets.prompts_eval))).replace("./runs/ppo-ray", str(tmp_path / "run"))
        .replace("ray.init()\n", "").replace("max_new_tokens=64", "max_new_tokens=4")
        .replace("total_steps=200", "total_steps=8")
    )
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(example, "docs/ray.md", "exec"), namespace)
    assert namespace["summary"]["steps"] == 8
    assert set(namespace["summary"]["makers"]) == {"maker_0", "maker_1"}
    assert (tmp_path / "run" / "checkpoints" / "final" / "actor" / "config.json").exists()


# ---- no Ray needed: the trainer's buffer methods on a plain instance ------------------
class _PlainTrainer(DetachedTrainer):
    """A concrete `DetachedTrainer` used without Ray: its buffer methods are ordinary methods."""

    def training_step(self, experience):
        return {}

    def _update_remote_makers(self, fully_update=False, **kwargs):
        pass


def _numbered_items(first: int, count: int, version: int) -> list:
    """`count` unpadded rollouts whose score is their number, `first` onwards."""
    from olingo.experience_maker import split_experience_batch

    items = split_experience_batch(_experience(count, version))
    for offset, item in enumerate(items):
        item.score = torch.tensor(float(first + offset))
    return items


def test_buffer_extend_groups_rollouts_into_batches_in_arrival_order():
    trainer = _PlainTrainer(["maker_0"], train_batch_size=4, buffer_limit=2)
    assert trainer.buffer_extend(_numbered_items(0, 3, version=0)) == ACCEPTED
    assert trainer.buffer_get_length() == 0  # 3 rollouts wait for a full batch of 4
    assert trainer.buffer_extend(_numbered_items(3, 6, version=1)) == ACCEPTED
    assert trainer.buffer_get_length() == 2 and len(trainer.detached_replay_buffer.batch_collector) == 1
    assert trainer.buffer_extend(_numbered_items(9, 1, version=1)) == FULL  # limit of 2 batches reached
    assert trainer.detached_replay_buffer.counts.received == 9 and trainer.detached_replay_buffer.counts.refused_full == 1
    first, second = trainer.detached_replay_buffer.batches
    assert first.score.tolist() == [0.0, 1.0, 2.0, 3.0] and second.score.tolist() == [4.0, 5.0, 6.0, 7.0]
    assert (first.policy_version, second.policy_version) == (0, 1)  # a batch carries its oldest rollout's version
    assert first.sequences.shape == (4, 5) and first.action_mask.shape == (4, 2)
    trainer.detached_replay_buffer.close()
    assert trainer.buffer_extend(_numbered_items(9, 2, version=1)) == CLOSED


def test_buffer_sample_pops_batches_oldest_first_and_drops_stale_ones():
    trainer = _PlainTrainer(["maker_0"], train_batch_size=4, max_staleness=0, experience_timeout_s=5)
    trainer.buffer_extend(_numbered_items(0, 4, version=0))
    trainer.buffer_extend(_numbered_items(4, 8, version=2))
    batch = trainer._buffer_sample()  # no sync yet: every version is fresh
    assert batch.batch_size == 4 and batch.policy_version == 0 and batch.score.tolist() == [0.0, 1.0, 2.0, 3.0]
    trainer.detached_replay_buffer.extend(_numbered_items(12, 4, version=0))  # a slow maker's old batch, last in line
    trainer.sync_steps = [0, 2]  # with max_staleness=0 only weights of step 2 are fresh
    assert [trainer._buffer_sample().score[0].item() for _ in range(2)] == [4.0, 8.0]
    counts = trainer.detached_replay_buffer.counts
    assert (counts.sampled, counts.dropped_stale) == (12, 0)
    with pytest.raises(RuntimeError, match="every experience maker has stopped"):
        trainer._buffer_sample()  # only the stale batch is left and no maker is running
    assert counts.dropped_stale == 4 and trainer.buffer_get_length() == 0
