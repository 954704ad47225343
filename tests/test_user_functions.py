"""User functions (reward terms, `loop.accuracy_function`) are called one way in training and in
evaluation, row fields and the batched form included, and each is called once on a real prompt
row at start-up, before any model loads, so that a signature mismatch is one line in the first
seconds of a run instead of a traceback at its first evaluation."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from olingo.cli.main import main
from olingo.dataset.prompts import PromptCollator
from olingo.engines.settings import GenerationSettings, Rollout
from olingo.experience_maker.scoring import ScoredRollout
from olingo.rewards.functions import ProbeRow, probe, reward_function
from olingo.rewards.registry import RewardError
from olingo.tasks.arithmetic import is_correct
from olingo.trainer.online_eval import evaluate_policy
from tests.conftest import read_jsonl, user_package

USER_FUNCTIONS = '''
from olingo.rewards import batched
from olingo.tasks.arithmetic import is_correct

CALLS = []  # (prompt, rg_entry) of every call, to see which rows a function was called on


def rg_score(prompt, response, gt_answer, rg_entry):
    """reasoning-gym's way: the row's own entry holds the answer to score against."""
    CALLS.append((prompt, rg_entry))
    if rg_entry["answer"] != gt_answer:
        raise ValueError(f"row field of another row: {rg_entry} for gt_answer {gt_answer!r}")
    return 1.0 if is_correct(response, rg_entry["answer"]) else 0.0


@batched
def batch_exact(prompts, responses, gt_answers):
    return [1.0 if is_correct(r, g) else 0.0 for r, g in zip(responses, gt_answers)]


def two_args(response, gt_answer):
    return 1.0


def unmarked_batch(texts, responses, answers):
    return [0.0 for _ in texts]


def positional_only(prompt, response, gt_answer, extra, /):
    return 0.0
'''


@pytest.fixture()
def user_pkg(tmp_path, monkeypatch):
    """The module `user_pkg.fns`, importable as a user's own reward module is (PYTHONPATH)."""
    user_package(tmp_path, "user_pkg", "fns", textwrap.dedent(USER_FUNCTIONS), monkeypatch)
    importlib.invalidate_caches()
    yield importlib.import_module("user_pkg.fns")
    for name in ("user_pkg.fns", "user_pkg"):  # each test gets a fresh module (its own CALLS)
        sys.modules.pop(name, None)


# ---- evaluation calls the accuracy function as training calls reward functions --------------------
class AnsweringMaker:
    """A stand-in experience maker: prompt i is 'q<i>', its response the text in `answers[i]`,
    scored 0 (the metrics under test are about the accuracy function, not the reward)."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers

    def rollout_and_score(self, input_ids, attention_mask, gt_answers, generation, row_fields=None, *, messages=None):
        ids = input_ids[:, -1].tolist()  # each prompt is one token: its row number
        b = len(ids)
        rollout = Rollout(
            sequences=torch.zeros(b, 2, dtype=torch.long), attention_mask=torch.ones(b, 2, dtype=torch.long),
            action_mask=torch.ones(b, 1, dtype=torch.bool), truncated=torch.zeros(b, dtype=torch.bool), num_prompt_tokens=1,
        )
        return ScoredRollout(rollout, None, None, torch.zeros(b), [f"q{i}" for i in ids], [self.answers[i] for i in ids], list(gt_answers))


def eval_loader(rows: list[dict]) -> DataLoader:
    """Prompt items as `build_prompt_dataset` makes them (row fields travel with each item),
    batched by the real collator, 3 per batch so that batches are uneven."""
    items = [{"input_ids": [i], "gt_answer": r.get("gt_answer"), "row_fields": {k: v for k, v in r.items() if k != "gt_answer"}} for i, r in enumerate(rows)]
    return DataLoader(items, batch_size=3, collate_fn=PromptCollator(pad_token_id=0))


EVAL_ROWS = [
    {"gt_answer": "2", "rg_entry": {"answer": "2"}},
    {"gt_answer": "7", "rg_entry": {"answer": "7"}},
    {"gt_answer": None, "rg_entry": {"answer": None}},  # no ground truth: not scored
    {"gt_answer": "12", "rg_entry": {"answer": "12"}},
    {"gt_answer": "5", "rg_entry": {"answer": "5"}},
]
ANSWERS = ["2", "8", "whatever", "12", "5 apples"]  # right, wrong, unscored, right, right


def test_an_accuracy_function_taking_a_row_field_gets_each_rows_own_value_in_evaluation(user_pkg):
    metrics, samples = evaluate_policy(AnsweringMaker(ANSWERS), eval_loader(EVAL_ROWS), GenerationSettings(), accuracy_fn=user_pkg.rg_score)
    assert metrics["accuracy"] == 3 / 4  # 3 of the 4 rows with a gt_answer: a count, exact
    assert [s.get("correct") for s in samples] == [True, False, None, True, True]
    assert sorted(user_pkg.CALLS, key=lambda call: call[0]) == [(f"q{i}", EVAL_ROWS[i]["rg_entry"]) for i in (0, 1, 3, 4)]


def test_a_batched_accuracy_function_gets_whole_batches_in_evaluation(user_pkg):
    seen = []

    def spy(prompts, responses, gt_answers):  # batched by its first parameter's name
        seen.append(list(prompts))
        return user_pkg.batch_exact(prompts, responses, gt_answers)

    metrics, samples = evaluate_policy(AnsweringMaker(ANSWERS), eval_loader(EVAL_ROWS), GenerationSettings(), accuracy_fn=spy)
    assert metrics["accuracy"] == 3 / 4
    assert seen == [["q0", "q1"], ["q3", "q4"]]  # one call per batch, over the rows with a gt_answer
    metrics, _ = evaluate_policy(AnsweringMaker(ANSWERS), eval_loader(EVAL_ROWS), GenerationSettings(), accuracy_fn=user_pkg.batch_exact)
    assert metrics["accuracy"] == 3 / 4


# ---- the start-up probe -----------------------------------------------------------------------------
ROW = ProbeRow("prompts.jsonl, row 1", "14-12=", "2", {"difficulty": 3})


@pytest.mark.parametrize(
    "name, fragments",
    [
        ("rg_score", ["reward function 'user_pkg.fns:rg_score' needs the row field(s) rg_entry", "their extra fields: difficulty"]),
        ("unmarked_batch", ["reward function 'user_pkg.fns:unmarked_batch' returned list [0.0, 0.0", "a batched function names its first parameter 'prompts'"]),
        ("positional_only", ["reward function 'user_pkg.fns:positional_only' cannot be called as olingo calls it", "missing a required argument: 'extra'"]),
    ],
)
def test_probe_names_the_function_the_key_the_row_and_what_was_wrong(user_pkg, name, fragments):
    with pytest.raises(RewardError) as caught:
        probe(reward_function(f"user_pkg.fns:{name}"), "loop.accuracy_function", ROW)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in [*fragments, "found at start-up by calling loop.accuracy_function on prompts.jsonl, row 1, with its gt_answer as the response"]:
        assert fragment in message, message


def test_probe_passes_a_function_the_row_can_feed(user_pkg):
    probe(reward_function("user_pkg.fns:rg_score"), "reward.functions", ProbeRow("p.jsonl, row 3", "14-12=", "2", {"rg_entry": {"answer": "2"}}))
    probe(reward_function("user_pkg.fns:batch_exact"), "reward.functions", ROW)
    assert user_pkg.CALLS == [("14-12=", {"answer": "2"})]


def rl_args(command: str, out: Path, *extra: str) -> list[str]:
    return [
        command, f"run.output_dir={out}", "run.name=probe", "logging.progress=false", "loop.episodes=1",
        "loop.rollout_batch_size=4", "loop.train_batch_size=4", "generation.max_new_tokens=2", *extra,
    ]


@pytest.mark.parametrize("command", ["ppo", "grpo"])
@pytest.mark.parametrize(
    "setting, fragments",
    [
        ("loop.accuracy_function=user_pkg.fns:rg_score",
         ["reward function 'user_pkg.fns:rg_score' needs the row field(s) rg_entry", "calling loop.accuracy_function on builtin:prompts_eval, row 1"]),
        ("loop.accuracy_function=user_pkg.fns:two_args",
         ["reward function 'user_pkg.fns:two_args' takes (response, gt_answer)", "(set in loop.accuracy_function)"]),
        ("reward.functions={user_pkg.fns:unmarked_batch: 1.0}",
         ["reward function 'user_pkg.fns:unmarked_batch' returned list", "calling reward.functions on builtin:prompts_train, row 1"]),
    ],
)
def test_a_mismatched_function_stops_the_cli_before_any_model_loads(user_pkg, tmp_path, monkeypatch, capsys, command, setting, fragments):
    def no_models(*args, **kwargs):
        raise AssertionError("a model was loaded before the user functions were checked")

    monkeypatch.setattr(f"olingo.recipes.{command}.load_models", no_models)
    assert main(rl_args(command, tmp_path, "data.eval_prompts=[builtin:prompts_eval]", setting)) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("olingo: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not (tmp_path / "probe").exists()  # nothing written


def test_the_ray_recipes_probe_before_any_actor_starts(user_pkg, tmp_path):
    from olingo.recipes.grpo import GRPOConfig
    from olingo.recipes.ray_run import open_run

    cfg = GRPOConfig.model_validate({"run": {"output_dir": str(tmp_path)}, "loop": {"accuracy_function": "user_pkg.fns:rg_score"}, "ray": {"enabled": True}})
    with pytest.raises(RewardError, match="needs the row field.s. rg_entry.*calling loop.accuracy_function"):
        open_run(cfg, {"model.actor": cfg.model.actor})


# ---- one function, training and evaluation alike ------------------------------------------------------
@pytest.mark.slow
def test_one_function_with_a_row_field_is_the_reward_and_the_accuracy(user_pkg, assets, tmp_path):
    """GRPO on prompts whose rows carry `rg_entry`: the same function is the reward term in
    training and the accuracy in evaluation, each call with its own row's entry (it raises on
    another row's), and the logged accuracy is what that function says of the saved samples."""
    data = {}
    for split, source in (("train", assets.prompts_train), ("eval", assets.prompts_eval)):
        rows = [json.loads(line) for line in Path(source).read_text().splitlines()][:8]
        data[split] = tmp_path / f"{split}.jsonl"
        data[split].write_text("".join(json.dumps({**r, "rg_entry": {"answer": r["gt_answer"]}}) + "\n" for r in rows))
    args = rl_args(
        "grpo", tmp_path, f"model.actor={assets.model_dir}", f"data.prompts=[{data['train']}]", f"data.eval_prompts=[{data['eval']}]",
        "experience.num_generations=2", "loop.episodes=2", "loop.eval_interval=1", "loop.eval_batch_size=8",
        "reward.functions={user_pkg.fns:rg_score: 1.0}", "loop.accuracy_function=user_pkg.fns:rg_score",
    )
    assert main(args) == 0
    rows = read_jsonl(tmp_path / "probe" / "metrics.jsonl")
    assert [r for r in rows if r["split"] == "train" and "rollout/reward/user_pkg.fns:rg_score" in r]
    evals = [r for r in rows if r["split"] == "eval" and "eval/accuracy" in r]
    assert evals
    records = [json.loads(path.read_text()) for path in sorted((tmp_path / "probe" / "eval").glob("step_*.json"))]
    assert len(records) == len(evals)
    for record in records:
        samples = record["samples"]
        assert len(samples) == 8 and all(s["correct"] == is_correct(s["response"], s["gt_answer"]) for s in samples)
        assert record["metrics"]["accuracy"] == pytest.approx(sum(s["correct"] for s in samples) / 8, abs=1e-12)  # a share of 8: exact up to float64 division
    prompts_called = {prompt for prompt, _ in user_pkg.CALLS}
    eval_prompts = [json.loads(line)["prompt"] for line in data["eval"].read_text().splitlines()]
    assert all(any(p in called for called in prompts_called) for p in eval_prompts)  # evaluation called it on every eval row
