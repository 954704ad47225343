"""Data for offline preference optimisation: loss masks on pairs, collation, unpaired (KTO) rows.

Expectations are written as text: the embedded character tokenizer makes every character one
token, so "the masked tokens decode to 'yo</s>'" can be checked by eye against the template
    <s><|user|>hi<|end|><|assistant|>yo</s>
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from olingo.dataset import (
    DataError,
    PreferenceCollator,
    UnpairedCollator,
    UnpairedExample,
    build_preference_dataset,
    build_unpaired_dataset,
    parse_preference_row,
    parse_unpaired_row,
    tokenize_preference,
    tokenize_unpaired,
)
from olingo.dataset.chat_tokens import assistant_token_mask, encode_chat
from olingo.dataset.unpaired import kl_partners
from olingo.tasks import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def text(tok, ids: list[int]) -> str:
    return "".join(tok.convert_ids_to_tokens(ids))


def masked(tok, ids: list[int], mask: list[int]) -> str:
    """The tokens under the mask, joined: what the loss is computed on."""
    assert len(ids) == len(mask) and set(mask) <= {0, 1}
    return text(tok, [token for token, keep in zip(ids, mask, strict=True) if keep])


def write_jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


def bot(content: str) -> dict[str, str]:
    return {"role": "assistant", "content": content}


# ------------------------------------------------------------------ pair loss masks ----
def test_pair_masks_cover_each_response_and_its_end_token(tok) -> None:
    item = tokenize_preference(parse_preference_row({"prompt": "hi", "chosen": "yo", "rejected": "no"}), tok, 64)
    assert list(item) == ["chosen_input_ids", "chosen_loss_mask", "rejected_input_ids", "rejected_loss_mask"]
    assert text(tok, item["chosen_input_ids"]) == "<s><|user|>hi<|end|><|assistant|>yo</s>"
    assert item["chosen_loss_mask"] == [0] * 6 + [1, 1, 1]  # <s>,<|user|>,h,i,<|end|>,<|assistant|>
    assert masked(tok, item["rejected_input_ids"], item["rejected_loss_mask"]) == "no</s>"


@pytest.mark.parametrize(
    "row",
    [
        # the prompt holds an earlier assistant turn: it is context, never trained on
        {"prompt": [user("hi"), bot("hello"), user("sum")], "chosen": "4", "rejected": "5"},
        # TRL's implicit prompt: the shared opening turns
        {"chosen": [user("hi"), bot("hello"), user("sum"), bot("4")],
         "rejected": [user("hi"), bot("hello"), user("sum"), bot("5")]},
        # ColossalChat
        {"context": [{"from": "human", "content": "hi"}, {"from": "gpt", "content": "hello"},
                     {"from": "human", "content": "sum"}],
         "chosen": [{"from": "gpt", "content": "4"}], "rejected": [{"from": "gpt", "content": "5"}]},
    ],
)
def test_prompt_assistant_turns_are_not_masked_in_any_format(tok, row) -> None:
    item = tokenize_preference(parse_preference_row(row), tok, 64)
    assert text(tok, item["chosen_input_ids"]).endswith("<|assistant|>hello</s><|user|>sum<|end|><|assistant|>4</s>")
    assert masked(tok, item["chosen_input_ids"], item["chosen_loss_mask"]) == "4</s>"
    assert masked(tok, item["rejected_input_ids"], item["rejected_loss_mask"]) == "5</s>"


def test_multi_turn_response_masks_only_its_assistant_turns(tok) -> None:
    row = {"prompt": "1+1=", "chosen": [bot("2"), user("sure?"), bot("yes")], "rejected": "3"}
    item = tokenize_preference(parse_preference_row(row), tok, 64)
    assert masked(tok, item["chosen_input_ids"], item["chosen_loss_mask"]) == "2</s>yes</s>"
    assert masked(tok, item["rejected_input_ids"], item["rejected_loss_mask"]) == "3</s>"


def test_left_truncation_cuts_ids_and_mask_together(tok) -> None:
    example = parse_preference_row({"prompt": "abcdefghij", "chosen": [bot("yo"), user("ok"), bot("z")], "rejected": "n"})
    full = tokenize_preference(example, tok, 64)
    cut = tokenize_preference(example, tok, 12)
    # <s><|user|>abcdefghij<|end|><|assistant|>yo</s><|user|>ok<|end|><|assistant|>z</s>: 24 tokens
    assert len(full["chosen_input_ids"]) == 24
    assert text(tok, cut["chosen_input_ids"]) == "<|end|><|assistant|>yo</s><|user|>ok<|end|><|assistant|>z</s>"
    assert cut["chosen_loss_mask"] == [0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1]
    assert text(tok, cut["rejected_input_ids"]) == "cdefghij<|end|><|assistant|>n</s>"
    for side in ("chosen", "rejected"):
        n = len(cut[f"{side}_input_ids"])
        assert n <= 12 and cut[f"{side}_loss_mask"] == full[f"{side}_loss_mask"][-n:]


def test_assistant_token_mask_skips_turns_before_first_turn(tok) -> None:
    messages = [user("a"), bot("b"), user("c"), bot("d")]
    ids = encode_chat(tok, messages)
    assert masked(tok, ids, assistant_token_mask(tok, messages, ids)) == "b</s>d</s>"
    assert masked(tok, ids, assistant_token_mask(tok, messages, ids, first_turn=2)) == "d</s>"


def test_preference_dataset_items_carry_masks_and_collate(tok, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "pref.jsonl", [{"prompt": "hi", "chosen": "yo", "rejected": "no way"}])
    dataset = build_preference_dataset(source, tok, max_length=64)
    batch = PreferenceCollator(tok.pad_token_id)([dataset[0]])
    assert batch["chosen_loss_mask"].shape == batch["chosen_input_ids"].shape == (1, 13)
    assert batch["chosen_loss_mask"].sum() == 3 and batch["rejected_loss_mask"].sum() == 7


# ------------------------------------------------------------------------ collator ----
PAIRS = [
    {"chosen_input_ids": [5, 6, 7], "chosen_loss_mask": [0, 1, 1],
     "rejected_input_ids": [5, 8], "rejected_loss_mask": [0, 1],
     "ref_chosen_logps": -1.5, "ref_rejected_logps": -2.0, "ref_note": [1.0], "score": 0.5},
    {"chosen_input_ids": [9], "chosen_loss_mask": [1],
     "rejected_input_ids": [9, 10, 11, 12], "rejected_loss_mask": [0, 0, 1, 1],
     "ref_chosen_logps": -0.25, "ref_rejected_logps": -3.0, "ref_note": [2.0], "score": 0.1},
]


def test_collator_pads_masks_like_the_ids_and_stacks_ref_floats() -> None:
    batch = PreferenceCollator(pad_token_id=0)(PAIRS)
    assert batch["chosen_loss_mask"].tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]
    assert batch["rejected_loss_mask"].tolist() == [[0, 1, 0, 0], [0, 0, 1, 1]]
    assert batch["chosen_loss_mask"].dtype == torch.long
    # only ref_* fields holding a float are stacked; other extra fields are left out
    assert set(batch) == {
        "chosen_input_ids", "chosen_attention_mask", "chosen_loss_mask",
        "rejected_input_ids", "rejected_attention_mask", "rejected_loss_mask",
        "ref_chosen_logps", "ref_rejected_logps",
    }
    assert batch["ref_chosen_logps"].dtype == torch.float32
    assert batch["ref_chosen_logps"].tolist() == [-1.5, -0.25]
    assert batch["ref_rejected_logps"].shape == (2,)


def test_collator_left_padding_applies_to_masks_too() -> None:
    batch = PreferenceCollator(pad_token_id=-1, padding_side="left")(PAIRS)
    assert batch["chosen_input_ids"].tolist() == [[-1, 5, 6, 7], [-1, -1, -1, 9]]
    assert batch["chosen_loss_mask"].tolist() == [[0, 0, 1, 1], [0, 0, 0, 1]]
    assert batch["rejected_loss_mask"].tolist() == [[0, 0, 0, 1], [0, 0, 1, 1]]


def test_collator_without_masks_returns_only_ids_and_attention() -> None:
    items = [{"chosen_input_ids": [5], "rejected_input_ids": [6, 7]}]
    assert set(PreferenceCollator(pad_token_id=0)(items)) == {
        "chosen_input_ids", "chosen_attention_mask", "rejected_input_ids", "rejected_attention_mask",
    }


# -------------------------------------------------------------------- unpaired rows ----
def test_unpaired_row_formats(tok) -> None:
    plain = parse_unpaired_row({"prompt": "hi", "completion": "yo", "label": True}, "d.jsonl", 3)
    chat = parse_unpaired_row({"prompt": [user("hi")], "completion": [bot("yo")], "label": True})
    assert plain == chat == [UnpairedExample([user("hi")], [bot("yo")], True)]
    assert (plain[0].source, plain[0].row) == ("d.jsonl", 3)
    bad = parse_unpaired_row({"prompt": "hi", "completion": "no", "label": False})
    assert bad[0].label is False


@pytest.mark.parametrize(
    "row",
    [
        {"prompt": "hi", "chosen": "yo", "rejected": "no"},
        {"chosen": [user("hi"), bot("yo")], "rejected": [user("hi"), bot("no")]},
    ],
)
def test_a_preference_pair_gives_a_desirable_and_an_undesirable_example(tok, row) -> None:
    examples = parse_unpaired_row(row)
    assert [(e.completion, e.label) for e in examples] == [([bot("yo")], True), ([bot("no")], False)]
    assert examples[0].prompt == examples[1].prompt == [user("hi")]


def test_tokenize_unpaired_splits_prompt_and_masked_completion(tok) -> None:
    example = parse_unpaired_row({"prompt": "hi", "completion": [bot("a"), user("b"), bot("c")], "label": False})[0]
    item = tokenize_unpaired(example, tok, 64)
    assert text(tok, item["prompt_ids"]) == "<s><|user|>hi<|end|><|assistant|>"
    assert text(tok, item["completion_ids"]) == "a</s><|user|>b<|end|><|assistant|>c</s>"
    assert masked(tok, item["completion_ids"], item["completion_mask"]) == "a</s>c</s>"
    assert item["label"] is False


def test_tokenize_unpaired_cuts_the_prompt_start_to_fit(tok) -> None:
    example = parse_unpaired_row({"prompt": "abcdefghij", "completion": "yo", "label": True})[0]
    item = tokenize_unpaired(example, tok, 8)
    assert text(tok, item["prompt_ids"]) == "hij<|end|><|assistant|>"
    assert text(tok, item["completion_ids"]) == "yo</s>" and item["completion_mask"] == [1, 1, 1]


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"prompt": "hi", "completion": "yo"},
         "row 2, field 'label': missing (present keys: completion, prompt)"),
        ({"prompt": "hi", "completion": "yo", "label": 1},
         "row 2, field 'label': expected true or false (a JSON boolean), got int 1"),
        ({"prompt": "hi", "completion": "yo", "label": "true"},
         "row 2, field 'label': expected true or false (a JSON boolean), got string 'true'"),
        ({"prompt": "hi", "completion": " ", "label": True},
         "row 2, field 'completion': empty response (blank or whitespace only)"),
        ({"prompt": "hi", "completion": [bot("")], "label": True},
         "row 2, field 'completion[0].content': empty response"),
        ({"prompt": "hi", "label": True},
         "row 2, field 'completion': missing (present keys: label, prompt)"),
        ({"prompt": "hi", "completion": [user("x"), bot("y")], "label": True},
         "row 2, field 'completion[0].role': a response must start with an assistant turn, got 'user'"),
        ({"completion": "yo", "label": True},
         "row 2, field 'prompt': missing (present keys: completion, label); expected 'prompt'"),
        ({"prompt": "hi", "rejected": "no"},
         "row 2, field 'chosen': missing (present keys: prompt, rejected)"),
        ({"prompt": "hi", "completion": "y" * 70, "label": True},
         "row 2, field 'completion': the response alone is 71 tokens, more than max_length=64"),
        ({"prompt": "hi", "chosen": "yo", "rejected": "n" * 70},
         "row 2, field 'rejected': the response alone is 71 tokens"),
    ],
)
def test_bad_unpaired_rows_name_file_row_and_field(tok, tmp_path: Path, row, expected) -> None:
    source = write_jsonl(tmp_path / "kto.jsonl", [{"prompt": "a", "completion": "b", "label": True}, row])
    with pytest.raises(DataError) as err:
        build_unpaired_dataset(source, tok, 64)
    assert str(err.value).startswith(f"{source}, {expected}")


def test_skip_invalid_drops_bad_rows(tok, tmp_path: Path) -> None:
    rows = [{"prompt": "a", "completion": "b", "label": True}, {"prompt": "c", "completion": "d", "label": 0},
            {"prompt": "e", "chosen": "f", "rejected": "g"}]
    dataset = build_unpaired_dataset(write_jsonl(tmp_path / "kto.jsonl", rows), tok, 64, skip_invalid=True)
    assert (len(dataset), dataset.num_skipped, dataset.num_desirable, dataset.num_undesirable) == (3, 1, 2, 1)


# ---------------------------------------------------------------------- KL partners ----
def walk_partners(prompts: list[Any]) -> list[int]:
    """The rule as stated, step by step: start half-way round, move on past equal prompts."""
    n = len(prompts)
    partners = []
    for i in range(n):
        j = (i + n // 2) % n
        while prompts[j] == prompts[i]:
            j = (j + 1) % n
        partners.append(j)
    return partners


def test_kl_partners_hand_cases() -> None:
    assert kl_partners([[1], [1], [2], [2]], "d") == [2, 3, 0, 1]
    # i=0 lands on 2 (same prompt), moves on to 3; i=2 lands on 0 (same), moves on past 1, 2 to 3
    assert kl_partners([[1], [1], [1], [2]], "d") == [3, 3, 3, 1]
    assert kl_partners([[1], [2]], "d") == [1, 0]


def test_kl_partners_follow_the_stated_rule_on_random_prompts() -> None:
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(2, 12)
        prompts = [[rng.randint(0, rng.randint(1, 3))] for _ in range(n)]
        if all(p == prompts[0] for p in prompts):
            continue
        partners = kl_partners(prompts, "d")
        assert partners == walk_partners(prompts)
        assert all(prompts[i] != prompts[j] for i, j in enumerate(partners))


def test_dataset_kl_completion_is_the_partners_and_deterministic(tok, tmp_path: Path) -> None:
    rows = [{"prompt": "p1", "chosen": "a", "rejected": "bb"},
            {"prompt": "p2", "completion": "ccc", "label": True},
            {"prompt": "p3", "chosen": "dddd", "rejected": "e"}]
    source = write_jsonl(tmp_path / "kto.jsonl", rows)
    dataset = build_unpaired_dataset(source, tok, 64)
    items = dataset.items
    assert [masked(tok, it["completion_ids"], it["completion_mask"]) for it in items] == [
        "a</s>", "bb</s>", "ccc</s>", "dddd</s>", "e</s>"]
    assert [it["label"] for it in items] == [True, False, True, True, False]
    # prompts p1 p1 p2 p3 p3, N//2 = 2: each item lands on i+2 mod 5, already another prompt
    assert [text(tok, it["kl_completion_ids"]) for it in items] == ["ccc</s>", "dddd</s>", "e</s>", "a</s>", "bb</s>"]
    for it in items:
        partner = next(other for other in items if other["completion_ids"] == it["kl_completion_ids"])
        assert partner["prompt_ids"] != it["prompt_ids"]
        assert it["kl_completion_mask"] == partner["completion_mask"]
    assert build_unpaired_dataset(source, tok, 64).items == items


def test_every_item_sharing_one_prompt_is_an_error(tok, tmp_path: Path) -> None:
    rows = [{"prompt": "same", "chosen": "a", "rejected": "b"}, {"prompt": "same", "completion": "c", "label": True}]
    source = write_jsonl(tmp_path / "kto.jsonl", rows)
    with pytest.raises(DataError, match="KTO needs at least two different prompts to estimate its reference point"):
        build_unpaired_dataset(source, tok, 64)


def test_one_sided_labels_are_allowed_and_logged(tok, tmp_path: Path, caplog) -> None:
    rows = [{"prompt": "a", "completion": "b", "label": True}, {"prompt": "c", "completion": "d", "label": True}]
    with caplog.at_level(logging.INFO, logger="olingo.dataset"):
        dataset = build_unpaired_dataset(write_jsonl(tmp_path / "kto.jsonl", rows), tok, 64)
    assert (dataset.num_desirable, dataset.num_undesirable) == (2, 0)
    assert "2 desirable and 0 undesirable" in caplog.text


# ------------------------------------------------------------------ unpaired collator ----
UNPAIRED = [
    {"prompt_ids": [5, 6], "completion_ids": [7, 8, 9], "completion_mask": [1, 0, 1], "label": True,
     "kl_completion_ids": [10], "kl_completion_mask": [1], "ref_logps": -1.0, "ref_kl_logps": -4.0},
    {"prompt_ids": [11, 12, 13, 14, 15], "completion_ids": [16], "completion_mask": [1], "label": False,
     "kl_completion_ids": [17, 18, 19, 20], "kl_completion_mask": [1, 1, 1, 1], "ref_logps": -2.0,
     "ref_kl_logps": -0.5},
]


def test_unpaired_collator_pads_right_and_places_the_mask_on_the_completion() -> None:
    batch = UnpairedCollator(pad_token_id=0)(UNPAIRED)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0], [11, 12, 13, 14, 15, 16]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 1]]
    assert batch["label"].dtype == torch.bool and batch["label"].tolist() == [True, False]
    assert batch["kl_input_ids"].tolist() == [[5, 6, 10, 0, 0, 0, 0, 0, 0], [11, 12, 13, 14, 15, 17, 18, 19, 20]]
    assert batch["kl_attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0, 0], [1] * 9]
    assert batch["kl_loss_mask"].tolist() == [[0, 0, 1, 0, 0, 0, 0, 0, 0], [0] * 5 + [1] * 4]
    assert batch["ref_logps"].dtype == torch.float32 and batch["ref_kl_logps"].tolist() == [-4.0, -0.5]
    assert all(batch[k].dtype == torch.long for k in batch if "ids" in k or "mask" in k)


def test_unpaired_collator_left_truncates_the_kl_pair_to_max_length() -> None:
    batch = UnpairedCollator(pad_token_id=0, max_length=6)(UNPAIRED)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0], [11, 12, 13, 14, 15, 16]]
    assert batch["kl_input_ids"].tolist() == [[5, 6, 10, 0, 0, 0], [14, 15, 17, 18, 19, 20]]
    assert batch["kl_loss_mask"].tolist() == [[0, 0, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1]]


def test_unpaired_collator_on_a_built_dataset(tok, tmp_path: Path) -> None:
    rows = [{"prompt": "a long prompt", "completion": "x", "label": True},
            {"prompt": "b", "completion": "a long answer", "label": False}]
    dataset = build_unpaired_dataset(write_jsonl(tmp_path / "kto.jsonl", rows), tok, 20)
    batch = UnpairedCollator(tok.pad_token_id, max_length=20)(dataset.items)
    assert batch["input_ids"].shape[1] <= 20 and batch["kl_input_ids"].shape[1] == 20
    # row 0's KL pair is its (cut) prompt + row 1's answer, whose tokens are all kept
    kl = batch["kl_input_ids"][0][batch["kl_loss_mask"][0].bool()].tolist()
    assert text(tok, kl) == "a long answer</s>"


def test_unpaired_collator_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="pad_token_id"):
        UnpairedCollator(pad_token_id=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_length"):
        UnpairedCollator(pad_token_id=0, max_length=0)
