"""A language model as the reward (olingo/rewards/judge.py): grades read robustly, failures
counted and never fatal, the cache, groups judged together, and a real engine behind it."""

from __future__ import annotations

import pytest

from olingo.engines import HFEngine
from olingo.models import load_causal_lm, load_tokenizer
from olingo.rewards import CompositeReward
from olingo.rewards.judge import JudgeReward, engine_chat, judge_counters, parse_ranking, parse_score


class ScriptedJudge:
    """Answers each request with the next scripted reply; remembers the requests."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.requests = list(replies), []

    def __call__(self, texts: list[str]) -> list[str]:
        self.requests.append(list(texts))
        return [self.replies.pop(0) for _ in texts]


def test_scores_are_read_after_the_last_score_label_else_the_last_number() -> None:
    assert parse_score("Reasoning: 3 errors.\nScore: 7", 0, 10) == 7.0
    assert parse_score("I give it **Score: 8.5**", 0, 10) == 8.5
    assert parse_score("an 9", 0, 10) == 9.0
    assert parse_score("Score: 11", 0, 10) is None  # out of range is unreadable, not clipped
    assert parse_score("no grade here", 0, 10) is None
    assert parse_ranking("Response 2: 4\nResponse 1: 9\n3) 12", 3, 0, 10) == [9.0, 4.0, None]


def test_malformed_replies_are_counted_not_fatal_and_the_cache_skips_the_judge() -> None:
    chat = ScriptedJudge(["Score: 10", "I cannot grade this.", "Score: 5"])
    judge = JudgeReward(chat, failure_score=0.25)
    values = judge(["p", "p", "q"], ["a", "b", "a"], ["1", "1", None])
    assert values == [1.0, 0.25, 0.5]
    assert judge.counters() == {"judge_calls": 1, "judge_cache_hits": 0, "judge_parse_failures": 1}
    assert "Response: b" in chat.requests[0][1] and "Reference answer (may be empty): \n" in chat.requests[0][2]
    assert judge(["q", "p"], ["a", "a"], [None, "1"]) == [0.5, 1.0]  # both cached: no new request
    assert len(chat.requests) == 1 and judge.counters()["judge_cache_hits"] == 2


def test_rank_mode_judges_each_group_in_one_request() -> None:
    chat = ScriptedJudge(["Response 1: 2\nResponse 2: 8", "1: 10\n2: oops"])
    judge = JudgeReward(chat, mode="rank")
    values = judge(["p", "p", "q", "q"], ["x", "y", "z", "w"], ["g", "g", "h", "h"])
    assert values == [0.2, 0.8, 1.0, 0.0]
    assert [len(r) for r in chat.requests] == [1, 1] and "Response 2: y" in chat.requests[0][0]
    assert judge.counters()["judge_parse_failures"] == 1


def test_bad_settings_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match=r"names \['answer'\]"):
        JudgeReward(ScriptedJudge([]), template="{prompt} {response} {answer}")
    with pytest.raises(ValueError, match=r"must contain \{responses\}"):
        JudgeReward(ScriptedJudge([]), mode="rank", template="{prompt}")
    with pytest.raises(ValueError, match="mode must be 'score' or 'rank'"):
        JudgeReward(ScriptedJudge([]), mode="pairwise")


def test_a_model_on_an_olingo_engine_judges_inside_a_composite_reward(assets) -> None:
    tokenizer = load_tokenizer(str(assets.model_dir), padding_side="left")
    model = load_causal_lm(str(assets.model_dir))
    judge = JudgeReward(engine_chat(HFEngine(model, tokenizer), tokenizer, max_new_tokens=8), batch_size=2)
    reward = CompositeReward([(judge, 1.0)])
    scores = reward.score(["1+1=", "2+2=", "3+3="], ["2", "4", "6"], ["2", "4", "6"])
    # The tiny model writes digits, not a rubric's grade: whatever it wrote, every value is a
    # grade in [0, 1] or the failure score, and the three requests took two batched calls.
    assert scores.terms["judge_score"].shape == (3,) and all(0.0 <= v <= 1.0 for v in scores.total.tolist())
    assert judge.counters()["judge_calls"] == 2


def test_judge_counters_report_the_growth_since_last_asked() -> None:
    judge = JudgeReward(ScriptedJudge(["Score: 4", "no grade", "Score: 9"]))
    reward = CompositeReward([("exact_match", 1.0), (judge, 0.5)])
    assert judge_counters(reward) == {"judge_calls": 0.0, "judge_cache_hits": 0.0, "judge_parse_failures": 0.0}
    reward.score(["p", "q"], ["a", "b"], ["a", None])
    assert judge_counters(reward) == {"judge_calls": 1.0, "judge_cache_hits": 0.0, "judge_parse_failures": 1.0}
    reward.score(["p", "r"], ["a", "c"], ["a", None])  # p/a cached, r/c asked
    assert judge_counters(reward) == {"judge_calls": 1.0, "judge_cache_hits": 1.0, "judge_parse_failures": 0.0}
    assert judge_counters(CompositeReward([("exact_match", 1.0)])) == {}


def test_a_reward_judge_section_validates_at_config_time(tmp_path) -> None:
    from pydantic import ValidationError

    from olingo.recipes.grpo_config import GRPOConfig
    from olingo.recipes.ppo_config import PPOConfig

    cfg = GRPOConfig.model_validate({"reward": {"judge": {"model": "builtin:tiny-llama", "mode": "rank"}}})
    assert cfg.reward.judge.mode == "rank" and cfg.reward.judge.template_text() is None
    assert not GRPOConfig().reward.judge.enabled  # no judge.model: no judge
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Grade {response} for {prompt}. Score: <0-10>")
    ppo = PPOConfig.model_validate({"reward": {"functions": {"math_verify": 1.0}, "judge": {"model": "builtin:tiny-llama", "template": str(rubric)}}})
    assert ppo.reward.judge.template_text() == rubric.read_text()
    for judge, message in [
        ({"template": "{prompt} {answer}"}, r"reward.judge.template: judge template \(score mode\) names \['answer'\]"),
        ({"template": "{prompt}", "mode": "rank"}, r"must contain \{responses\}"),
        ({"template": str(tmp_path / "missing.txt")}, "neither a file nor a template"),
        ({"min_score": 5, "max_score": 5}, "must be above reward.judge.min_score"),
        ({"mode": "pairwise"}, "mode"),
    ]:
        with pytest.raises(ValidationError, match=message):
            GRPOConfig.model_validate({"reward": {"judge": {"model": "builtin:tiny-llama", **judge}}})


def test_a_grpo_run_trains_on_a_judge_term(assets, tmp_path, monkeypatch) -> None:
    from olingo.recipes import grpo as recipe
    from olingo.recipes import rewards
    from olingo.recipes.grpo import GRPOConfig, run_grpo
    from tests.conftest import read_jsonl

    made, loaded = [], []
    for module in (recipe, rewards):
        real = module.load_causal_lm
        monkeypatch.setattr(module, "load_causal_lm", lambda path, real=real, **kw: loaded.append(real(path, **kw)) or loaded[-1])
    monkeypatch.setattr(rewards, "judge_term", lambda *a, real=rewards.judge_term: made.append(real(*a)) or made[-1])
    cfg = GRPOConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": "judged"}, "model": {"actor": str(assets.model_dir)},
        "loop": {"episodes": 1, "rollout_batch_size": 2, "train_batch_size": 4, "eval_interval": 0, "save_interval": 0},
        "data": {"eval_prompts": []}, "experience": {"num_generations": 2, "kl_coef": 0.0}, "generation": {"max_new_tokens": 3},
        "reward": {"functions": {"arithmetic_exact": 1.0},
                   "judge": {"model": str(assets.model_dir), "mode": "rank", "max_new_tokens": 6, "failure_score": 0.25}},
        "logging": {"progress": False},
    })
    run_grpo(cfg)
    (judge, weight), = made
    (row,) = read_jsonl(tmp_path / "judged" / "metrics.jsonl")
    # The tiny judge writes digits, not "Response k: <grade>" lines: each of the 2 groups took one
    # call, all 4 responses were counted as unreadable and got failure_score, which the logged
    # term shows (a mean of four 0.25s: exact in float32).
    assert weight == 1.0 and judge.counters() == {"judge_calls": 2, "judge_cache_hits": 0, "judge_parse_failures": 4}
    assert row["rollout/reward/judge_rank"] == 0.25
    assert (row["rollout/judge_calls"], row["rollout/judge_cache_hits"], row["rollout/judge_parse_failures"]) == (2, 0, 4)  # logged per step
    actor, judge_model = loaded  # the judge is its own frozen copy of the same checkpoint
    assert judge_model is not actor and not judge_model.training and not any(p.requires_grad for p in judge_model.parameters())


def test_ray_makers_build_the_judge_from_a_resolved_section(assets, tmp_path) -> None:
    from olingo.recipes import grpo_ray, ppo_ray
    from olingo.recipes.grpo_config import GRPOConfig
    from olingo.recipes.ppo_config import PPOConfig

    rubric = tmp_path / "rubric.txt"
    rubric.write_text("{prompt} / {response} / Score: <0-10>")
    section = {"model": "builtin:tiny-llama", "template": str(rubric)}
    grpo = grpo_ray.maker_models(GRPOConfig.model_validate({"model": {"actor": str(assets.model_dir)}, "reward": {"judge": section}}))
    ppo = ppo_ray.maker_models(PPOConfig.model_validate({"model": {"actor": str(assets.model_dir)}, "reward": {"judge": section}}))
    # What ships to the actors carries a loadable path and the rubric's text, not the driver's file or builtin: name.
    for shipped in (grpo.reward.judge, ppo.judge):
        assert shipped.template == rubric.read_text() and not shipped.model.startswith("builtin:")
    _, reward, _ = grpo()
    assert [f.name for f in reward.functions] == ["arithmetic_exact", "judge_score"]
    assert [f.name for f in ppo()[2].functions] == ["arithmetic_exact", "judge_score"]
