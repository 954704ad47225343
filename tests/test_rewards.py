"""Pluggable rewards: registry and import paths, both function forms, row fields, weighted sums,
validation messages, a neural term, and row fields through the prompt dataset and collator."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.errors import OlingoError
from olingo.rewards.functions import CompositeReward, RewardScores, reward_function
from olingo.rewards.registry import (
    REWARD_FUNCTIONS,
    RewardError,
    batched,
    register_reward,
    resolve_reward,
)
from olingo.rewards.rlvr import RLVRRewardModel, get_reward_function

PROMPTS = ["1+1=", "2+3=", "7-4="]
RESPONSES = ["2", "5 ", "9"]
ANSWERS = ["2", "5", "3"]


def exact(prompt: str, response: str, gt_answer: str | None) -> float:
    return float(response.strip() == gt_answer)


@batched
def lengths(texts, outputs, answers):  # plural names, yet batched only through @batched
    return [float(len(o)) for o in outputs]


def batched_by_name(prompts: list[str], responses: list[str], gt_answers: list[str | None]) -> list[float]:
    return [10.0 * i for i in range(len(prompts))]


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of the user's own on sys.path: `user_rewards_mod`."""
    (tmp_path / "user_rewards_mod.py").write_text(textwrap.dedent("""
        from olingo.rewards import register_reward

        def contains_answer(prompt, response, gt_answer):
            return 1.0 if gt_answer in response else 0.0

        def by_difficulty(prompts, responses, gt_answers, difficulty):
            return [float(d) for d in difficulty]

        @register_reward("user_registered_reward")
        def registered(prompt, response, gt_answer):
            return 0.5

        NOT_CALLABLE = 3
    """))
    (tmp_path / "broken_rewards_mod.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_rewards_mod"
    for name in ("user_rewards_mod", "broken_rewards_mod"):
        sys.modules.pop(name, None)
    REWARD_FUNCTIONS.pop("user_registered_reward", None)


# ---- registry and import paths -----------------------------------------------------------------
def test_builtins_by_name_and_the_old_api() -> None:
    assert get_reward_function("arithmetic_exact") is REWARD_FUNCTIONS["arithmetic_exact"]
    model = RLVRRewardModel(["arithmetic_exact", "arithmetic_format"], [1.0, 0.1])
    scores = model.score_texts(PROMPTS, RESPONSES, ANSWERS)
    # exact: 2==2, 5==5, 9!=3; format: "2" yes, "5 " no (trailing space), "9" yes
    assert scores.dtype == torch.float32
    # Exact: a float64 sum of two terms, rounded once to float32 (no CPU-dependent kernel).
    assert torch.equal(scores, torch.tensor([1.1, 1.0, 0.1], dtype=torch.float32))
    assert model.to("cpu") is model and model.eval() is model
    assert model.weights == [1.0, 0.1] and model.reward_fns == [REWARD_FUNCTIONS["arithmetic_exact"], REWARD_FUNCTIONS["arithmetic_format"]]
    assert torch.equal(RLVRRewardModel.from_weights({"arithmetic_exact": 2.0}).score_texts(PROMPTS, RESPONSES, ANSWERS), torch.tensor([2.0, 2.0, 0.0]))


def test_register_reward_and_name_clashes() -> None:
    @register_reward("test_rewards_constant")
    def constant(prompt: str, response: str, gt_answer: str | None) -> float:
        return 0.25

    try:
        scores = CompositeReward({"test_rewards_constant": 2.0}).score(PROMPTS, RESPONSES, ANSWERS)
        assert scores.total.tolist() == [0.5, 0.5, 0.5]
        with pytest.raises(RewardError, match="'test_rewards_constant' is taken by .*constant"):
            register_reward("test_rewards_constant")(exact)
        with pytest.raises(RewardError, match="without ':'"):
            register_reward("a:b")
    finally:
        REWARD_FUNCTIONS.pop("test_rewards_constant")


def test_import_path_and_registration_by_import(user_module: str) -> None:
    fn = resolve_reward(f"{user_module}:contains_answer")
    assert fn("q", "it is 42", "42") == 1.0
    reward = CompositeReward({f"{user_module}:contains_answer": 1.0, "user_registered_reward": 1.0})
    scores = reward.score(["a", "b"], ["x 42", "nope"], ["42", "42"])
    assert scores.total.tolist() == [1.5, 0.5]
    assert list(scores.terms) == [f"{user_module}:contains_answer", "user_registered_reward"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_pkg_xyz.rewards:fn",
         r"^reward function 'no_such_pkg_xyz.rewards:fn': no module named 'no_such_pkg_xyz'; is the directory that holds it on PYTHONPATH\?"),
        ("broken_rewards_mod:fn",
         r"^reward function 'broken_rewards_mod:fn': importing 'broken_rewards_mod' failed: ModuleNotFoundError: No module named 'no_such_dependency_xyz'$"),
        ("user_rewards_mod:contains_answr",
         r"^reward function 'user_rewards_mod:contains_answr': 'user_rewards_mod' has no attribute 'contains_answr' \(did you mean 'contains_answer'\?\)$"),
        ("user_rewards_mod:NOT_CALLABLE", r"^reward function 'user_rewards_mod:NOT_CALLABLE' is int, not a function$"),
        ("user_rewards_mod:", r"expected an import path 'package.module:function'"),
    ],
)
def test_import_path_errors_name_the_spec(user_module: str, spec: str, message: str) -> None:
    with pytest.raises(RewardError, match=message) as info:
        CompositeReward({spec: 1.0})
    assert isinstance(info.value, OlingoError)  # the CLI prints it as one line, exit 2


def test_unknown_names_get_a_did_you_mean() -> None:
    with pytest.raises(RewardError) as info:
        get_reward_function("arithmetic_exat")
    assert str(info.value).startswith(
        "unknown reward function 'arithmetic_exat' (did you mean 'arithmetic_exact'?); registered: arithmetic_exact, arithmetic_format"
    )
    assert isinstance(info.value, ValueError)  # as before: pydantic validators turn it into a config error
    with pytest.raises(RewardError, match=r"unknown reward function 'my_pkg.rewards.exact' \(did you mean 'my_pkg.rewards:exact'\?\)"):
        RLVRRewardModel(["my_pkg.rewards.exact"])


# ---- the two forms, weights and row fields ------------------------------------------------------
def test_form_detection() -> None:
    assert not reward_function(exact).batched
    assert reward_function(batched_by_name).batched  # first parameter named 'prompts'
    assert reward_function(lengths).batched  # @batched, whatever the names

    def kwargs_only_single(prompt, response, gt_answer, **fields):
        return 0.0

    assert not reward_function(kwargs_only_single).batched  # **kwargs says nothing about the form
    with pytest.raises(RewardError, match=r"reward function 'two' takes \(a, b\); a reward function takes \(prompt, response, gt_answer\)"):
        reward_function(lambda a, b: 0.0, "two")


def test_both_forms_weighted_sum_and_terms() -> None:
    reward = CompositeReward([(exact, 1.0), (lengths, 0.5), (batched_by_name, -0.1), ("arithmetic_format", 0.0)])
    scores = reward.score(PROMPTS, RESPONSES, ANSWERS)
    assert isinstance(scores, RewardScores)
    assert scores.terms["exact"].tolist() == [1.0, 1.0, 0.0]
    assert scores.terms["lengths"].tolist() == [1.0, 2.0, 1.0]
    assert scores.terms["batched_by_name"].tolist() == [0.0, 10.0, 20.0]
    assert scores.terms["arithmetic_format"].tolist() == [1.0, 0.0, 1.0]  # weight 0: reported, not summed
    expected = [1.0 + 0.5 * 1 - 0.0, 1.0 + 0.5 * 2 - 1.0, 0.0 + 0.5 * 1 - 2.0]
    assert scores.total.dtype == torch.float32
    assert torch.allclose(scores.total, torch.tensor(expected), atol=1e-6)
    assert scores.weights == {"exact": 1.0, "lengths": 0.5, "batched_by_name": -0.1, "arithmetic_format": 0.0}


def test_repeated_functions_get_distinct_term_names() -> None:
    scores = RLVRRewardModel([exact, exact], [1.0, 2.0]).score(PROMPTS, RESPONSES, ANSWERS)
    assert list(scores.terms) == ["exact", "exact#2"] and scores.total.tolist() == [3.0, 3.0, 0.0]


def test_row_fields_reach_the_functions_that_ask_for_them(user_module: str) -> None:
    seen: dict[str, object] = {}

    def single_named(prompt, response, gt_answer, tests, bonus=0.5):
        return float(response.strip() in tests) + bonus

    def single_kwargs(prompt, response, gt_answer, **fields):
        seen.setdefault("single", []).append(fields)
        return 0.0

    def batched_kwargs(prompts, responses, gt_answers, **fields):
        seen["batched"] = fields
        return [0.0] * len(prompts)

    fields = {"tests": [["2"], ["4", "6"], ["9"]], "difficulty": [1, 2, 0], "response": ["r1", "r2", "r3"]}
    reward = CompositeReward([(single_named, 1.0), (exact, 1.0), (single_kwargs, 1.0), (batched_kwargs, 1.0), (f"{user_module}:by_difficulty", 10.0)])
    scores = reward.score(PROMPTS, RESPONSES, ANSWERS, fields)
    assert scores.terms["single_named"].tolist() == [1.5, 0.5, 1.5]
    assert scores.terms[f"{user_module}:by_difficulty"].tolist() == [1.0, 2.0, 0.0]
    # 'response' clashes with the positional parameter of the same name: never passed by keyword
    assert seen["single"] == [{"tests": ["2"], "difficulty": 1}, {"tests": ["4", "6"], "difficulty": 2}, {"tests": ["9"], "difficulty": 0}]
    assert seen["batched"] == {"tests": [["2"], ["4", "6"], ["9"]], "difficulty": [1, 2, 0], "response": ["r1", "r2", "r3"]}
    assert scores.total.tolist() == [1.5 + 1 + 10, 0.5 + 1 + 20, 1.5 + 0 + 0]
    match = r"reward function 'single_named' needs the row field\(s\) tests, which the prompt rows lack \(their extra fields: difficulty\)"
    with pytest.raises(RewardError, match=match):
        reward.score(PROMPTS, RESPONSES, ANSWERS, {"difficulty": [1, 2, 3]})


# ---- validation: never a silent zero ---------------------------------------------------------
def raises_on_seven(prompt: str, response: str, gt_answer: str | None) -> float:
    if prompt.startswith("7"):
        raise KeyError("no verifier for '-'")
    return 1.0


def test_a_raising_function_names_function_row_and_prompt() -> None:
    long_prompt = "7-4=" + "x" * 100 + " the question?"
    with pytest.raises(RewardError) as info:
        CompositeReward([(raises_on_seven, 1.0)]).score([*PROMPTS[:2], long_prompt], RESPONSES, ANSWERS)
    shortened = "'7-4=" + "x" * 23 + " ... " + "x" * 13 + " the question?'"  # 27 + 27 characters kept
    assert str(info.value) == f"reward function 'raises_on_seven' raised on row 2 (prompt {shortened}): KeyError: \"no verifier for '-'\""
    assert isinstance(info.value.__cause__, KeyError)  # --debug shows the function's own traceback

    def boom(prompts, responses, gt_answers):
        raise ValueError("boom")

    with pytest.raises(RewardError, match=r"^reward function 'boom' raised on a batch of 3 rows \(first prompt '1\+1='\): ValueError: boom$"):
        CompositeReward([(boom, 1.0)]).score(PROMPTS, RESPONSES, ANSWERS)


def test_missing_gt_answer_is_an_error_naming_the_row() -> None:
    match = r"^reward function 'arithmetic_exact' raised on row 1 \(prompt '2\+3='\): ValueError: arithmetic_exact needs a gt_answer"
    with pytest.raises(RewardError, match=match):
        RLVRRewardModel(["arithmetic_exact"]).score_texts(PROMPTS, RESPONSES, ["2", None, "3"])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_are_errors(bad: float) -> None:
    def single(prompt, response, gt_answer):
        return bad if prompt == "2+3=" else 1.0

    def many(prompts, responses, gt_answers):
        return torch.tensor([0.0, 0.0, bad])

    with pytest.raises(RewardError, match=rf"^reward function 'single' returned {bad} for row 1 \(prompt '2\+3='\); rewards must be finite$"):
        CompositeReward([(single, 1.0)]).score(PROMPTS, RESPONSES, ANSWERS)
    with pytest.raises(RewardError, match=rf"^reward function 'many' returned {bad} for row 2 \(prompt '7-4='\)"):
        CompositeReward([(many, 1.0)]).score(PROMPTS, RESPONSES, ANSWERS)


def test_wrong_length_and_non_numbers_are_errors() -> None:
    def short(prompts, responses, gt_answers):
        return [1.0, 1.0]

    def scalar(prompts, responses, gt_answers):
        return 1.0

    def words(prompts, responses, gt_answers):
        return [1.0, "yes", 0.0]

    def forgot_return(prompt, response, gt_answer):
        pass

    def meant_batched(queries, responses, gt_answers):
        return [1.0] * len(queries)

    cases = {
        short: r"^reward function 'short' returned 2 values for 3 rows; a batched reward function returns one number per row$",
        scalar: r"^reward function 'scalar' returned float 1.0 for 3 rows, expected a list of 3 numbers, one per row \(it is called batched\)$",
        words: r"^reward function 'words' returned str 'yes' for row 1 \(prompt '2\+3='\), expected a number$",
        forgot_return: r"^reward function 'forgot_return' returned None for row 0 \(prompt '1\+1='\), expected a number$",
        meant_batched: r"returned list \[1.0, 1.0, 1.0, 1.0\] for row 0 .*; a batched function names its first parameter 'prompts' or is marked @batched$",
    }
    for fn, message in cases.items():
        with pytest.raises(RewardError, match=message):
            CompositeReward([(fn, 1.0)]).score(PROMPTS, RESPONSES, ANSWERS)
    # numbers of other kinds are numbers: bools, numpy scalars, 0-d tensors, a 1-D array
    np = pytest.importorskip("numpy")
    odd = CompositeReward([(lambda p, r, g: True, 1.0), (lambda p, r, g: torch.tensor(0.5), 1.0), (lambda p, r, g: np.float32(0.25), 1.0)])
    assert odd.score(PROMPTS, RESPONSES, ANSWERS).total.tolist() == [1.75] * 3
    assert CompositeReward([(batched(lambda *a: np.arange(3)), 1.0)]).score(PROMPTS, RESPONSES, ANSWERS).total.tolist() == [0.0, 1.0, 2.0]


def test_bad_weights_and_no_terms() -> None:
    with pytest.raises(RewardError, match=r"the weight of reward 'exact' must be a finite number, got nan"):
        CompositeReward([(exact, math.nan)])
    with pytest.raises(RewardError, match="no reward terms"):
        CompositeReward({})
    with pytest.raises(ValueError, match=r"reward scoring got 3 prompts but responses: 2, row field 'tests': 1"):
        CompositeReward([(exact, 1.0)]).score(PROMPTS, RESPONSES[:2], ANSWERS, {"tests": [1]})


# ---- a neural term ---------------------------------------------------------------------------
def test_neural_term_combined_with_functions() -> None:
    sequences = torch.tensor([[1, 2, 3], [4, 5, 0], [6, 0, 0]])
    mask = (sequences != 0).long()

    def last_token(seq: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return seq.gather(1, (attention_mask.sum(1, keepdim=True) - 1)).squeeze(1).float()

    reward = CompositeReward({"arithmetic_exact": 1.0}, neural=last_token, neural_weight=0.5)
    scores = reward.score(PROMPTS, RESPONSES, ANSWERS, model_inputs=(sequences, mask))
    assert scores.terms["model"].tolist() == [3.0, 5.0, 6.0]
    assert scores.total.tolist() == [1.0 + 1.5, 1.0 + 2.5, 0.0 + 3.0]
    assert scores.weights == {"arithmetic_exact": 1.0, "model": 0.5}

    class Scorer:  # not callable: its score method is used
        def score(self, seq: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return torch.tensor([0.0, math.nan, 1.0])

    only_neural = CompositeReward(neural=Scorer(), neural_name="rm")
    with pytest.raises(RewardError, match=r"^neural reward 'rm' returned nan for row 1 \(prompt '2\+3='\); rewards must be finite$"):
        only_neural.score(PROMPTS, RESPONSES, ANSWERS, model_inputs=(sequences, mask))
    with pytest.raises(RewardError, match=r"^neural reward 'model' returned shape \(3, 1\) for 3 rows, expected \(3,\)$"):
        CompositeReward(neural=lambda s, m: torch.zeros(3, 1)).score(PROMPTS, RESPONSES, ANSWERS, model_inputs=(sequences, mask))
    with pytest.raises(ValueError, match="needs model_inputs"):
        reward.score(PROMPTS, RESPONSES, ANSWERS)


def test_neural_module_follows_to_and_eval() -> None:
    head = torch.nn.Linear(1, 1).train()
    reward = CompositeReward(neural=head)
    assert reward.eval() is reward and not head.training
    assert reward.to(torch.float64) is reward and head.weight.dtype == torch.float64


# ---- row fields through the prompt dataset and collator -------------------------------------------
def test_prompt_dataset_and_collator_pass_extra_fields(assets, tmp_path: Path) -> None:
    from olingo.models import load_tokenizer

    tok = load_tokenizer(str(assets.model_dir), padding_side="left")
    rows = [
        {"prompt": "1+1=", "gt_answer": 2, "tests": ["2"], "meta": {"src": "a"}, "difficulty": 1},
        {"messages": [{"role": "user", "content": "2+3="}], "answer": "5", "difficulty": 2.5, "flag": True},
        {"prompt": "7-4=", "tests": None},
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = build_prompt_dataset(str(path), tok, 64)
    assert data[0]["row_fields"] == {"tests": ["2"], "meta": {"src": "a"}, "difficulty": 1}
    assert data[1]["row_fields"] == {"difficulty": 2.5, "flag": True}
    batch = PromptCollator(tok.pad_token_id)([data[i] for i in range(3)])
    assert set(batch) == {"input_ids", "attention_mask", "gt_answer", "row_fields", "messages"}
    assert batch["gt_answer"] == ["2", "5", None]
    # the messages each prompt was rendered from (a multi-turn episode renders them again at a template split)
    assert batch["messages"] == [[{"role": "user", "content": "1+1="}], [{"role": "user", "content": "2+3="}], [{"role": "user", "content": "7-4="}]]
    assert batch["row_fields"] == {
        "tests": [["2"], None, None],
        "meta": [{"src": "a"}, None, None],
        "difficulty": [1, 2.5, None],
        "flag": [None, True, None],
    }
    seen = {}

    def uses_tests(prompts, responses, gt_answers, tests, flag):
        seen.update(tests=tests, flag=flag)
        return [0.0] * len(prompts)

    CompositeReward([(uses_tests, 1.0)]).score(["a", "b", "c"], ["", "", ""], batch["gt_answer"], batch["row_fields"])
    assert seen == {"tests": [["2"], None, None], "flag": [None, True, None]}


def test_builtin_prompts_and_hand_made_items_have_no_row_fields(assets) -> None:
    from olingo.models import load_tokenizer

    tok = load_tokenizer(str(assets.model_dir), padding_side="left")
    data = build_prompt_dataset(str(assets.prompts_train), tok, 64)
    assert data[0]["row_fields"] == {}
    assert PromptCollator(tok.pad_token_id)([data[0], data[1]])["row_fields"] == {}
    items = [{"input_ids": [5, 6], "gt_answer": "1"}, {"input_ids": [7], "gt_answer": None}]
    batch = PromptCollator(tok.pad_token_id)(items)
    assert batch["row_fields"] == {} and batch["input_ids"].tolist() == [[5, 6], [tok.pad_token_id, 7]]
