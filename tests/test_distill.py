"""On-policy distillation in `olingo grpo`: the per-token term by hand, a teacher equal to the
student gives nothing to learn, the tokenizer and config checks, a run that moves the student
toward its teacher, and an exact resume."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from olingo.config import ConfigError, load_config, packaged_config
from olingo.experience_maker.group import GroupExperienceConfig, GroupExperienceMaker
from olingo.models import load_causal_lm, load_tokenizer
from olingo.recipes.grpo import check_teacher_tokenizer, run_grpo
from olingo.recipes.grpo_config import GRPOConfig
from olingo.recipes.grpo_ray import check_ray_config
from olingo.rewards.functions import CompositeReward
from olingo.rl.advantages import distill_advantages
from olingo.tasks.tiny_model import build_tiny_llama, save_pretrained_pair
from olingo.trainer.callbacks import Callback
from tests.conftest import read_jsonl
from tests.test_ppo import prompt_batch


def test_distill_advantages_by_hand():
    advantages = torch.tensor([[0.5, 0.5, 0.0], [-1.0, 0.0, 0.0]])
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    teacher = torch.tensor([[-0.5, -3.0, -1.0], [-1.5, -0.25, -1.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    # 0.5 + 2 (-0.5 + 1) = 1.5; 0.5 + 2 (-3 + 2) = -1.5; -1 + 2 (-1.5 + 0.5) = -3; 0 + 2 (-0.25 + 0.5) = 0.5; masked: unchanged
    expected = torch.tensor([[1.5, -1.5, 0.0], [-3.0, 0.5, 0.0]])
    assert torch.equal(distill_advantages(advantages, old, teacher, mask, 2.0), expected)  # dyadic values: exact in float32
    assert distill_advantages(advantages, old, teacher, mask, 0.0) is advantages


def test_a_teacher_equal_to_the_student_gives_zero_advantages(assets):
    tok = load_tokenizer(str(assets.model_dir), padding_side="left")
    actor, teacher = load_causal_lm(str(assets.model_dir)), load_causal_lm(str(assets.model_dir))
    config = GroupExperienceConfig(num_generations=2, distill_coef=1.0)
    maker = GroupExperienceMaker(actor, CompositeReward((), allow_empty=True), None, tok, config=config, teacher=teacher, needs_old_log_probs=False)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())  # frozen by the maker
    batch = prompt_batch(tok)
    experience = maker.finish(maker.sample(batch["input_ids"], batch["attention_mask"]))
    # the same weights run the same forward on the same tokens: log pi_old and log pi_teacher are bit-identical,
    # so with no reward term every advantage, hence the policy gradient, is exactly 0
    assert experience.info["teacher_kl"] == 0.0 and torch.equal(experience.advantages, torch.zeros_like(experience.advantages))
    assert experience.teacher_log_probs is not None and experience.action_mask.any()
    assert experience.action_log_probs is None  # one update per batch: the learner gets no pi_old, as without a teacher
    with pytest.raises(ValueError, match="needs a teacher model"):
        GroupExperienceMaker(actor, CompositeReward((), allow_empty=True), None, tok, config=config)


def test_a_teacher_with_another_vocabulary_is_one_line_naming_model_teacher():
    vocab = {"a": 0, "b": 1, "c": 2}
    check_teacher_tokenizer(SimpleNamespace(get_vocab=lambda: dict(vocab)), SimpleNamespace(get_vocab=lambda: vocab))
    with pytest.raises(ConfigError, match=r"^model.teacher .*: 3 vs 3 tokens; id 1 is 'x' for the teacher, 'b' for the actor$"):
        check_teacher_tokenizer(SimpleNamespace(get_vocab=lambda: {"a": 0, "x": 1, "c": 2}), SimpleNamespace(get_vocab=lambda: vocab))
    with pytest.raises(ConfigError, match=r"4 vs 3 tokens; one vocabulary extends the other$"):
        check_teacher_tokenizer(SimpleNamespace(get_vocab=lambda: {**vocab, "d": 3}), SimpleNamespace(get_vocab=lambda: vocab))


@pytest.mark.parametrize(("overrides", "message"), [
    ({"experience": {"distill_coef": 1.0}}, "model.teacher and experience.distill_coef > 0 come together"),
    ({"model": {"teacher": "t"}}, "model.teacher and experience.distill_coef > 0 come together"),
    ({"model": {"teacher": "t"}, "experience": {"distill_coef": 1.0, "dynamic_sampling": True}, "reward": {"functions": {}}},
     "experience.dynamic_sampling drops groups"),
    *[({"model": {"teacher": "t", "teacher_engine": "vllm"}, "experience": {"distill_coef": 1.0}, **extra}, message) for extra, message in [
        ({"generation": {"engine": "vllm"}}, "teacher_engine=vllm needs generation.engine=hf: two in-process vLLM engines"),
        ({"ray": {"enabled": True}}, "teacher_engine=vllm runs in one process"),
        ({"generation": {"temperature": 0.7}}, r"scores at temperature 1 only .*: generation.temperature=0.7, loop.eval_temperature=None"),
        ({"loop": {"eval_temperature": 0.5}}, r"scores at temperature 1 only .*: generation.temperature=1.0, loop.eval_temperature=0.5"),
    ]],
])
def test_distillation_config_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig.model_validate(overrides)


def test_a_teacher_engine_takes_greedy_decoding_at_any_temperature():
    """Greedy log-probs are taken at temperature 1 whatever the temperature says (`log_prob_temperature`)."""
    cfg = GRPOConfig.model_validate({"model": {"teacher": "t", "teacher_engine": "vllm"}, "experience": {"distill_coef": 1.0},
                                     "generation": {"do_sample": False, "temperature": 0.7}, "loop": {"eval_temperature": 0.5}})
    assert cfg.model.teacher_engine == "vllm"


def test_distillation_alone_needs_no_reward_and_ray_takes_a_teacher():
    cfg = GRPOConfig.model_validate({"model": {"teacher": "t"}, "experience": {"distill_coef": 1.0}, "reward": {"functions": {}}, "ray": {"enabled": True}})
    check_ray_config(cfg)  # each maker loads the teacher (tests/test_ray_grpo.py)


# ---- through the recipe --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(assets, tmp_path_factory):
    """A student and a teacher of the same architecture and tokenizer, initialised with different seeds;
    the teacher's output layer is scaled up so its next-token distributions are peaked (a random tiny
    model's are nearly uniform, and so close to another's that there would be little to distil)."""
    tok = load_tokenizer(str(assets.model_dir))
    root = tmp_path_factory.mktemp("distill")
    teacher = build_tiny_llama(tok, seed=1)
    with torch.no_grad():
        teacher.lm_head.weight.mul_(20.0)
    return save_pretrained_pair(build_tiny_llama(tok, seed=0), tok, root / "student"), save_pretrained_pair(teacher, tok, root / "teacher")


def distill_config(out, name, pair, assets, *extra) -> GRPOConfig:
    student, teacher = pair
    return load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), [
        f"run.output_dir={out}", f"run.name={name}", f"model.actor={student}", f"model.teacher={teacher}", "experience.distill_coef=1.0",
        "reward.functions={}", "loop.accuracy_function=null", "experience.num_generations=4", "loop.rollout_batch_size=4",
        "loop.train_batch_size=16", "loop.update_steps=1", "generation.max_new_tokens=6", "actor_optim.lr=1e-2", "loop.eval_interval=0",
        f"data.eval_prompts=[{assets.prompts_eval}]", "loop.eval_batch_size=64", "logging.progress=false", *extra,
    ])


def test_distillation_moves_the_student_toward_its_teacher(tmp_path, pair, assets):
    """20 steps with no reward but the teacher's: the held-out summed KL(student || teacher) falls (22.9 -> 17.9 when
    measured; both evaluations draw the same sampling noise, so the fall is training's); 0.9 leaves room for another
    machine's rounding."""
    result = run_grpo(distill_config(tmp_path, "distil", pair, assets, "loop.episodes=20", "loop.save_interval=0"))
    before, after = result["eval_before"]["eval/teacher_kl"], result["eval"]["eval/teacher_kl"]
    assert after < 0.9 * before, (before, after)
    rollout = [r["rollout/teacher_kl"] for r in read_jsonl(tmp_path / "distil" / "metrics.jsonl") if "rollout/teacher_kl" in r]
    assert len(rollout) == 20 and sum(rollout[-5:]) < sum(rollout[:5])  # the training batches' KL falls too


class StopAfter(Callback):
    """Stops the run at once, as Ctrl-C would, when the episode `episode` starts."""

    def __init__(self, episode: int) -> None:
        self.episode = episode

    def on_episode_start(self, episode: int) -> None:
        if episode == self.episode:
            raise KeyboardInterrupt


def test_a_distillation_run_resumes_exactly(tmp_path, pair, assets):
    """The teacher is frozen and adds no resume state: a run stopped after its step-2 checkpoint and
    resumed ends with the uninterrupted run's weights and metrics (`torch.equal`, `==`: the same
    computation on the same machine, so any difference is a resume bug, not rounding)."""
    extra = ("loop.episodes=3", "loop.save_interval=1", "data.eval_prompts=[]")
    run_grpo(distill_config(tmp_path, "straight", pair, assets, *extra))
    with pytest.raises(KeyboardInterrupt):
        run_grpo(distill_config(tmp_path, "stopped", pair, assets, *extra), callbacks=[StopAfter(2)])
    assert [r["name"] for r in read_jsonl(tmp_path / "stopped" / "checkpoints.jsonl")] == ["step_1", "step_2"]
    checkpoint = tmp_path / "stopped" / "checkpoints" / "step_2"
    assert not [p for p in checkpoint.rglob("*") if "teacher" in p.name]  # the frozen teacher is loaded again, never saved
    run_grpo(distill_config(tmp_path, "stopped", pair, assets, *extra, "run.resume=last"))
    a, b = (load_file(tmp_path / name / "checkpoints/final/actor/model.safetensors") for name in ("straight", "stopped"))
    assert a.keys() == b.keys() and all(torch.equal(value, b[key]) for key, value in a.items())
    timeless = lambda rows: [{k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in rows]  # noqa: E731
    assert timeless(read_jsonl(tmp_path / "stopped" / "metrics.jsonl")) == timeless(read_jsonl(tmp_path / "straight" / "metrics.jsonl"))
