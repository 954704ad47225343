"""The embedded arithmetic task, character tokenizer, tiny Llama and on-disk assets."""

from __future__ import annotations

import json
import operator
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from olingo.tasks import (
    CHAT_TEMPLATE,
    STOP_TOKEN,
    ArithmeticTask,
    Problem,
    TaskAssets,
    build_char_tokenizer,
    build_tiny_llama,
    extract_answer,
    is_correct,
    prepare_assets,
)
from olingo.tasks.tokenizer import SPECIAL_TOKENS

SPLITS = ("train", "eval")


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_llama(tokenizer, seed=0).eval()


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> TaskAssets:
    return prepare_assets(
        tmp_path_factory.mktemp("assets"), seed=0, n_pref_train=300, n_pref_eval=50
    )


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _solve(prompt: str) -> int:
    """Work out "12+7=" independently of the task's own arithmetic."""
    left, op, right = re.fullmatch(r"(\d+)([-+*])(\d+)=", prompt).groups()
    return {"+": operator.add, "-": operator.sub, "*": operator.mul}[op](int(left), int(right))


# --- arithmetic task -------------------------------------------------------------------


def test_same_seed_gives_identical_rows_and_another_seed_does_not():
    a, b, c = ArithmeticTask(seed=3), ArithmeticTask(seed=3), ArithmeticTask(seed=4)
    for split in SPLITS:
        assert a.problems(split) == b.problems(split)
        assert a.sft_rows(split) == b.sft_rows(split)
        assert a.prompt_rows(split, 50) == b.prompt_rows(split, 50)
        assert a.preference_rows(split, 500) == b.preference_rows(split, 500)
        assert a.problems(split) != c.problems(split)
    assert {p.prompt for p in a.problems("eval")} != {p.prompt for p in c.problems("eval")}


def test_splits_are_disjoint_and_cover_every_problem():
    task = ArithmeticTask(max_operand=20, ops=("+", "-"), eval_fraction=0.1)
    train = {p.prompt for p in task.problems("train")}
    held_out = {p.prompt for p in task.problems("eval")}
    assert not train & held_out
    # 21*21 additions plus the 231 subtractions with a non-negative result.
    assert len(train) + len(held_out) == 441 + 231
    assert len(held_out) == round(0.1 * 672)


def test_problem_format_is_equation_then_bare_digits():
    task = ArithmeticTask(max_operand=9, ops=("+", "-", "*"))
    problems = task.problems("train") + task.problems("eval")
    assert Problem("3+4=", "7") in problems and Problem("9-2=", "7") in problems
    assert Problem("3*4=", "12") in problems
    for problem in problems:
        assert problem.prompt.endswith("=") and len(problem.prompt) <= 20
        assert problem.answer.isdigit() and str(int(problem.answer)) == problem.answer
        assert _solve(problem.prompt) == int(problem.answer)


def test_rows_have_the_trainer_columns_and_cycle_past_the_split():
    task = ArithmeticTask()
    n_eval = len(task.problems("eval"))
    sft = task.sft_rows("eval", 2 * n_eval + 1)
    assert len(sft) == 2 * n_eval + 1 and sft[n_eval] == sft[0]
    assert set(sft[0]) == {"prompt", "completion"}
    assert set(task.prompt_rows("eval")[0]) == {"prompt", "gt_answer"}
    assert len(task.preference_rows("eval")) == n_eval


@pytest.mark.parametrize("split", SPLITS)
def test_every_pair_prefers_the_right_answer_to_a_plausible_wrong_one(split):
    task = ArithmeticTask()
    rows = task.preference_rows(split, 5 * len(task.problems(split)))
    for row in rows:
        assert set(row) == {"prompt", "chosen", "rejected"}
        gt = str(_solve(row["prompt"]))
        assert is_correct(row["chosen"], gt)
        assert not is_correct(row["rejected"], gt)
        assert row["rejected"].isdigit()  # no sign that would give the answer away
    # Repeated pairs per problem use different wrong answers while they last.
    by_prompt: dict[str, set[str]] = {}
    for row in rows:
        by_prompt.setdefault(row["prompt"], set()).add(row["rejected"])
    assert min(len(wrong) for wrong in by_prompt.values()) >= 3


@pytest.mark.parametrize(
    "kwargs", [{"max_operand": 0}, {"ops": ()}, {"ops": ("/",)}, {"eval_fraction": 0.0}]
)
def test_bad_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        ArithmeticTask(**kwargs)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("19", "19"),
        ("  19 ", "19"),
        ("The answer is 19.", "19"),
        ("019", "19"),
        ("-3", "-3"),
        ("19 20", "19"),
        ("x=7</s>", "7"),
        ("", None),
        ("nineteen", None),
        ("-", None),
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


def test_is_correct():
    assert is_correct(" 19", "19")
    assert is_correct("answer: 19!", "19")
    assert not is_correct("18", "19")
    assert not is_correct("", "19")
    assert not is_correct("1 9", "19")


# --- tokenizer and chat template -----------------------------------------------------


@pytest.mark.parametrize("text", ["12+7=19", "Hello,  world . it's  a test ! ", " a\nb ", "~{}|"])
def test_tokenizer_round_trips_text_one_token_per_character(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no bos/eos added
    assert tokenizer.decode(ids) == text


def test_tokenizer_special_tokens(tokenizer):
    assert len(tokenizer) == 104
    assert tokenizer.convert_ids_to_tokens(list(range(8))) == list(SPECIAL_TOKENS)
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id) == (0, 1)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (2, 3)
    assert tokenizer.convert_tokens_to_ids(STOP_TOKEN) == tokenizer.eos_token_id
    assert tokenizer.padding_side == "right" and tokenizer.model_max_length == 256
    assert tokenizer("<|user|>é")["input_ids"] == [5, tokenizer.unk_token_id]
    one = tokenizer.convert_tokens_to_ids("1")
    assert tokenizer.decode([2, 5, one, 3], skip_special_tokens=True) == "1"


def test_chat_template_renders_the_documented_text(tokenizer):
    assert tokenizer.chat_template == CHAT_TEMPLATE
    chat = [
        {"role": "system", "content": "Add."},
        {"role": "user", "content": "12+7="},
        {"role": "assistant", "content": "19"},
    ]
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    assert text == "<s><|system|>Add.<|end|><|user|>12+7=<|end|><|assistant|>19</s>"
    prompt = tokenizer.apply_chat_template(chat[1:2], tokenize=False, add_generation_prompt=True)
    assert prompt == "<s><|user|>12+7=<|end|><|assistant|>"
    with pytest.raises(Exception, match="unknown role"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_prompt_tokens_are_a_prefix_of_the_full_conversation(tokenizer):
    for row in ArithmeticTask().sft_rows("eval"):
        user = [{"role": "user", "content": row["prompt"]}]
        full = user + [{"role": "assistant", "content": row["completion"]}]
        prompt_ids = tokenizer.apply_chat_template(user, add_generation_prompt=True)["input_ids"]
        full_ids = tokenizer.apply_chat_template(full)["input_ids"]
        assert full_ids[: len(prompt_ids)] == prompt_ids
        response = tokenizer.decode(full_ids[len(prompt_ids) :])
        assert response == row["completion"] + STOP_TOKEN


def test_assistant_mask_covers_exactly_the_answers_and_their_stop_token(tokenizer):
    chat = [
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "10-3="},
        {"role": "assistant", "content": "7"},
    ]
    out = tokenizer.apply_chat_template(chat, return_dict=True, return_assistant_tokens_mask=True)
    masked = [t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tokenizer.convert_ids_to_tokens(masked) == ["2", "</s>", "7", "</s>"]
    assert masked[-1] == tokenizer.eos_token_id


# --- tiny model and assets -----------------------------------------------------------


def test_tiny_llama_is_seeded_and_leaves_the_global_rng_alone(tokenizer, model):
    state = torch.random.get_rng_state()
    again = build_tiny_llama(tokenizer, seed=0)
    other = build_tiny_llama(tokenizer, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    weights = model.model.embed_tokens.weight
    assert torch.equal(weights, again.model.embed_tokens.weight)
    assert not torch.equal(weights, other.model.embed_tokens.weight)
    config = model.config
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (104, 64, 2)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (0, 2, 3)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_saved_directory_loads_with_auto_classes_and_matches(assets, tokenizer):
    loaded_tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    loaded_model = AutoModelForCausalLM.from_pretrained(assets.model_dir).eval()
    chat = [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"}]
    ids = tokenizer.apply_chat_template(chat, return_tensors="pt")["input_ids"]
    assert torch.equal(
        loaded_tokenizer.apply_chat_template(chat, return_tensors="pt")["input_ids"], ids
    )
    assert loaded_tokenizer.chat_template == CHAT_TEMPLATE
    assert loaded_tokenizer.decode(ids[0]) == tokenizer.decode(ids[0])
    in_memory = build_tiny_llama(tokenizer, seed=0).eval()
    with torch.no_grad():
        assert torch.equal(loaded_model(ids).logits, in_memory(ids).logits)  # exact: same class, weights and input, so the same kernels


def test_model_generates_a_batch_of_prompts(tokenizer, model):
    chats = [[{"role": "user", "content": p}] for p in ("1+2=", "20-13=")]
    tokenizer.padding_side = "left"  # generation continues from the last column
    try:
        batch = tokenizer.apply_chat_template(
            chats, add_generation_prompt=True, padding=True, return_tensors="pt"
        )
    finally:
        tokenizer.padding_side = "right"
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=5, do_sample=False)
    assert (
        out.shape[0] == 2
        and batch["input_ids"].shape[1] < out.shape[1] <= batch["input_ids"].shape[1] + 5
    )
    assert torch.equal(out[:, : batch["input_ids"].shape[1]], batch["input_ids"])


def test_prepare_assets_writes_the_task_rows(assets):
    task = ArithmeticTask(seed=0)
    assert _read_jsonl(assets.sft_train) == task.sft_rows("train")
    assert _read_jsonl(assets.sft_eval) == task.sft_rows("eval")
    assert _read_jsonl(assets.prompts_eval) == task.prompt_rows("eval")
    assert len(_read_jsonl(assets.preference_train)) == 300
    assert _read_jsonl(assets.preference_eval) == task.preference_rows("eval", 50)
    assert not list(assets.root.glob(".*tmp"))  # no temporary leftovers


def test_prepare_assets_is_idempotent_and_refills_what_is_missing(assets):
    files = sorted(p for p in assets.root.rglob("*") if p.is_file())
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files}
    assets.prompts_train.unlink()
    again = prepare_assets(assets.root, seed=0, n_pref_train=300, n_pref_eval=50)
    assert again == assets
    for path, (mtime, data) in before.items():
        assert path.read_bytes() == data
        if path != assets.prompts_train:
            assert path.stat().st_mtime_ns == mtime  # skipped, not rewritten


def test_prepare_assets_refuses_a_root_made_from_other_arguments(assets):
    with pytest.raises(ValueError, match="another root"):
        prepare_assets(assets.root, seed=1, n_pref_train=300, n_pref_eval=50)
