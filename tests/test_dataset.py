"""Preference data: formats, sources, tokenisation, truncation, collation and bad input.

Token ids are checked against a hand-written vocabulary table (`expected_ids`), not
against the tokenizer under test, so each expectation can be read off by hand.
"""

from __future__ import annotations

import json
import logging
import pickle
import string
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from olingo.dataset import (
    DataError,
    PreferenceCollator,
    PreferenceDataset,
    PreferenceExample,
    build_preference_dataset,
    load_raw_rows,
    parse_preference_row,
    tokenize_preference,
)
from olingo.dataset.chat_tokens import split_prompt_response
from olingo.dataset.preference import implicit_prompt_length

# ----------------------------------------------------------------------------------------
# A tiny character-level tokenizer with a readable chat template:
#   <s>S:system\nU:user\nA:assistant</s>      generation prompt: "A:"
# ids: <pad>=0 <unk>=1 <s>=2 </s>=3, then the characters of CHARS from 4 on.
# ----------------------------------------------------------------------------------------
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
CHARS = "\n :." + string.ascii_letters + string.digits
VOCAB = {token: i for i, token in enumerate((*SPECIALS, *CHARS))}
PAD, BOS, EOS = 0, 2, 3
TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}A:{{ m['content'] }}{{ eos_token }}"
    "{% elif m['role'] == 'user' %}U:{{ m['content'] }}\n"
    "{% else %}S:{{ m['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def make_tokenizer(template: str = TEMPLATE) -> PreTrainedTokenizerFast:
    """The test tokenizer: every character one token, specials whole."""
    backend = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        chat_template=template,
    )


def expected_ids(*pieces: str) -> list[int]:
    """Hand-side oracle: a special token is its id, any other piece one id per character."""
    ids: list[int] = []
    for piece in pieces:
        ids.extend([VOCAB[piece]] if piece in SPECIALS else [VOCAB[c] for c in piece])
    return ids


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return make_tokenizer()


@pytest.fixture
def hf_local(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep `datasets` off the network and its cache inside the test's tmp dir."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def write_jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def data_error(excinfo: pytest.ExceptionInfo[DataError]) -> DataError:
    return excinfo.value


def assert_names(err: DataError, source: str, row: int | None, field: str | None) -> None:
    """The error's attributes and its message both point at source, row and field."""
    assert (err.source, err.row, err.field) == (source, row, field)
    where = [source] + ([f"row {row}"] if row is not None else [])
    where += [f"field '{field}'"] if field is not None else []
    assert str(err) == f"{', '.join(where)}: {err.reason}"


STRING_ROW = {"prompt": "hi", "chosen": "yo", "rejected": "no"}
STRING_ROW_IDS = {
    "chosen_input_ids": expected_ids("<s>", "U:hi\nA:yo", "</s>"),
    "rejected_input_ids": expected_ids("<s>", "U:hi\nA:no", "</s>"),
    "chosen_loss_mask": [0] * 8 + [1, 1, 1],  # <s>U:hi\nA: | yo</s>
    "rejected_loss_mask": [0] * 8 + [1, 1, 1],
}


# ---------------------------------------------------------------------------- errors ----
def test_data_error_message_format_and_pickling() -> None:
    err = DataError(
        "data/pref.jsonl", 7, "chosen", "expected a string or a list of messages, got int"
    )
    assert str(err) == (
        "data/pref.jsonl, row 7, field 'chosen': expected a string or a list of messages, got int"
    )
    assert isinstance(err, ValueError)
    assert str(DataError("x.json", None, None, "no such file")) == "x.json: no such file"
    back = pickle.loads(pickle.dumps(err))
    assert (back.source, back.row, back.field, back.reason) == (err.source, 7, "chosen", err.reason)


# --------------------------------------------------------------------------- formats ----
def test_string_format_tokens(tok: PreTrainedTokenizerFast) -> None:
    example = parse_preference_row(STRING_ROW)
    assert example == PreferenceExample(
        prompt=[{"role": "user", "content": "hi"}],
        chosen=[{"role": "assistant", "content": "yo"}],
        rejected=[{"role": "assistant", "content": "no"}],
    )
    assert tokenize_preference(example, tok, max_length=64) == STRING_ROW_IDS


def test_conversational_format_tokens(tok: PreTrainedTokenizerFast) -> None:
    row = {
        "prompt": [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}],
        "chosen": [{"role": "assistant", "content": "yo"}],
        "rejected": [{"role": "assistant", "content": "go"}],
    }
    example = parse_preference_row(row)
    assert example.prompt == row["prompt"]
    ids = tokenize_preference(example, tok, max_length=64)
    assert ids["chosen_input_ids"] == expected_ids("<s>", "S:be kind\nU:hi\nA:yo", "</s>")
    assert ids["rejected_input_ids"] == expected_ids("<s>", "S:be kind\nU:hi\nA:go", "</s>")


def test_implicit_prompt_is_the_shared_opening(tok: PreTrainedTokenizerFast) -> None:
    user, hello = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}
    ask = {"role": "user", "content": "sum"}
    row = {
        "chosen": [user, hello, ask, {"role": "assistant", "content": "4"}],
        "rejected": [user, hello, ask, {"role": "assistant", "content": "5"}],
    }
    example = parse_preference_row(row)
    assert example.prompt == [user, hello, ask]
    assert example.chosen == [{"role": "assistant", "content": "4"}]
    assert example.rejected == [{"role": "assistant", "content": "5"}]
    ids = tokenize_preference(example, tok, max_length=64)
    assert ids["chosen_input_ids"] == expected_ids(
        "<s>", "U:hi\nA:hello", "</s>", "U:sum\nA:4", "</s>"
    )


def test_implicit_prompt_never_ends_on_an_assistant_turn() -> None:
    user, hello = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}
    # The conversations differ only in a later user turn: the shared assistant turn goes
    # back into both responses so each response opens with an assistant turn.
    chosen = [user, hello, {"role": "user", "content": "a"}]
    rejected = [user, hello, {"role": "user", "content": "b"}]
    assert implicit_prompt_length(chosen, rejected) == 1
    assert implicit_prompt_length([hello], [hello]) == 0


def test_colossal_format_maps_speakers(tok: PreTrainedTokenizerFast) -> None:
    row = {
        "context": [
            {"from": "human", "content": "hi"},
            {"from": "gpt", "content": "hello"},
            {"from": "user", "content": "sum"},
        ],
        "chosen": [{"from": "assistant", "content": "4"}],
        "rejected": [{"from": "assistant", "content": "5"}],
    }
    example = parse_preference_row(row)
    assert [m["role"] for m in example.prompt] == ["user", "assistant", "user"]
    assert example.chosen == [{"role": "assistant", "content": "4"}]
    ids = tokenize_preference(example, tok, max_length=64)
    assert ids["rejected_input_ids"] == expected_ids(
        "<s>", "U:hi\nA:hello", "</s>", "U:sum\nA:5", "</s>"
    )


# --------------------------------------------------------------------------- sources ----
def test_jsonl_row_numbers_are_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "pref.jsonl"
    path.write_text(json.dumps(STRING_ROW) + "\n\n   \n" + json.dumps(STRING_ROW) + "\n")
    assert [row for row, _ in load_raw_rows(str(path))] == [1, 4]


def test_jsonl_source(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "pref.jsonl", [STRING_ROW, STRING_ROW])
    dataset = build_preference_dataset(source, tok, max_length=64)
    assert isinstance(dataset, PreferenceDataset)
    assert len(dataset) == 2 and dataset.num_skipped == 0
    assert dataset[1] == STRING_ROW_IDS


@pytest.mark.parametrize("wrap", [lambda rows: rows, lambda rows: {"data": rows}])
def test_json_source(tok: PreTrainedTokenizerFast, tmp_path: Path, wrap: Any) -> None:
    path = tmp_path / "pref.json"
    path.write_text(json.dumps(wrap([STRING_ROW])))
    assert build_preference_dataset(str(path), tok, max_length=64)[0] == STRING_ROW_IDS


def test_parquet_source(tok: PreTrainedTokenizerFast, tmp_path: Path, hf_local: None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    conversational = {
        "prompt": [{"role": "user", "content": "hi"}],
        "chosen": [{"role": "assistant", "content": "yo"}],
        "rejected": [{"role": "assistant", "content": "no"}],
    }
    path = tmp_path / "pref.parquet"
    pq.write_table(pa.Table.from_pylist([conversational]), path)
    dataset = build_preference_dataset(str(path), tok, max_length=64)
    assert list(dataset) == [STRING_ROW_IDS]


def test_save_to_disk_sources(tok: PreTrainedTokenizerFast, tmp_path: Path, hf_local: None) -> None:
    import datasets

    other = {"prompt": "hi", "chosen": "ok", "rejected": "no"}
    datasets.Dataset.from_list([STRING_ROW]).save_to_disk(str(tmp_path / "one"))
    splits = {"train": [STRING_ROW], "test": [other]}
    datasets.DatasetDict(
        {k: datasets.Dataset.from_list(v) for k, v in splits.items()}
    ).save_to_disk(str(tmp_path / "dict"))
    assert list(build_preference_dataset(str(tmp_path / "one"), tok, 64)) == [STRING_ROW_IDS]
    assert list(build_preference_dataset(str(tmp_path / "dict"), tok, 64, split="train")) == [STRING_ROW_IDS]
    test_split = build_preference_dataset(str(tmp_path / "dict"), tok, 64, split="test")
    assert test_split[0]["chosen_input_ids"] == expected_ids("<s>", "U:hi\nA:ok", "</s>")
    with pytest.raises(DataError, match=r"no split 'dev'; the splits are \['test', 'train'\]"):
        build_preference_dataset(str(tmp_path / "dict"), tok, 64, split="dev")


def test_several_sources_are_concatenated(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    first = write_jsonl(tmp_path / "a.jsonl", [STRING_ROW])
    second = write_jsonl(tmp_path / "b.jsonl", [STRING_ROW, STRING_ROW])
    assert len(build_preference_dataset([first, second], tok, max_length=64)) == 3


def test_unknown_hub_dataset_names_the_source(hf_local: None) -> None:
    with pytest.raises(DataError) as excinfo:
        list(load_raw_rows("no-such-user/no-such-preference-data"))
    assert_names(data_error(excinfo), "no-such-user/no-such-preference-data", None, None)
    assert "datasets.load_dataset could not load it" in str(excinfo.value)


def test_missing_local_file(tmp_path: Path) -> None:
    source = str(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match="no such file") as excinfo:
        load_raw_rows(source)
    assert_names(data_error(excinfo), source, None, None)


# ---------------------------------------------------------------------- tokenisation ----
def test_truncation_keeps_the_end_of_the_response(tok: PreTrainedTokenizerFast) -> None:
    example = parse_preference_row({"prompt": "abcdefghij", "chosen": "yo", "rejected": "n"})
    ids = tokenize_preference(example, tok, max_length=8)
    # Full chosen: <s> U:abcdefghij\n A:yo </s> is 19 tokens; the last 8 remain.
    assert ids["chosen_input_ids"] == expected_ids("ij\nA:yo", "</s>")
    assert ids["rejected_input_ids"] == expected_ids("hij\nA:n", "</s>")


def test_response_that_exactly_fills_max_length_is_kept(tok: PreTrainedTokenizerFast) -> None:
    example = parse_preference_row({"prompt": "hi", "chosen": "abc", "rejected": "x"})
    ids = tokenize_preference(example, tok, max_length=4)
    assert ids["chosen_input_ids"] == expected_ids("abc", "</s>")


def test_prompt_tokens_not_a_prefix_falls_back_to_first_difference() -> None:
    # This template's generation prompt ("B:") differs from an assistant turn's opening.
    odd = make_tokenizer(
        TEMPLATE.replace("{% if add_generation_prompt %}A:", "{% if add_generation_prompt %}B:")
    )
    prompt = [{"role": "user", "content": "hi"}]
    prompt_ids, response_ids = split_prompt_response(
        odd, prompt, [{"role": "assistant", "content": "yo"}]
    )
    assert prompt_ids == expected_ids("<s>", "U:hi\n")
    assert response_ids == expected_ids("A:yo", "</s>")


def test_tokenizer_without_chat_template_is_refused(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "pref.jsonl", [STRING_ROW])
    tokenizer = make_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        build_preference_dataset(source, tokenizer, max_length=64)


# -------------------------------------------------------------------------- collator ----
ITEMS = [
    {"chosen_input_ids": [5, 6, 7], "rejected_input_ids": [5, 8]},
    {"chosen_input_ids": [9], "rejected_input_ids": [9, 10, 11, 12]},
]


def test_collator_pads_right_to_the_longest_row_of_the_batch() -> None:
    batch = PreferenceCollator(pad_token_id=0)(ITEMS)
    expected = {
        "chosen_input_ids": [[5, 6, 7, 0], [9, 0, 0, 0]],
        "chosen_attention_mask": [[1, 1, 1, 0], [1, 0, 0, 0]],
        "rejected_input_ids": [[5, 8, 0, 0], [9, 10, 11, 12]],
        "rejected_attention_mask": [[1, 1, 0, 0], [1, 1, 1, 1]],
    }
    assert set(batch) == set(expected)
    for key, value in expected.items():
        assert batch[key].dtype == torch.long
        assert torch.equal(batch[key], torch.tensor(value)), key


def test_collator_pads_left() -> None:
    batch = PreferenceCollator(pad_token_id=-1, padding_side="left")(ITEMS)
    assert torch.equal(batch["chosen_input_ids"], torch.tensor([[-1, 5, 6, 7], [-1, -1, -1, 9]]))
    assert torch.equal(batch["chosen_attention_mask"], torch.tensor([[0, 1, 1, 1], [0, 0, 0, 1]]))
    assert torch.equal(batch["rejected_input_ids"], torch.tensor([[-1, -1, 5, 8], [9, 10, 11, 12]]))
    assert torch.equal(batch["rejected_attention_mask"], torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]))


def test_collator_length_follows_the_batch_not_a_fixed_maximum() -> None:
    batch = PreferenceCollator(pad_token_id=0)(ITEMS[:1])
    assert batch["chosen_input_ids"].shape == batch["rejected_input_ids"].shape == (1, 3)


def test_collator_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="padding_side"):
        PreferenceCollator(pad_token_id=0, padding_side="middle")
    with pytest.raises(ValueError, match="pad_token_id"):
        PreferenceCollator(pad_token_id=None)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- bad input ----
def build_error(tok: PreTrainedTokenizerFast, source: str, max_length: int = 64) -> DataError:
    """The DataError that building a dataset from ``source`` raises."""
    with pytest.raises(DataError) as excinfo:
        build_preference_dataset(source, tok, max_length=max_length)
    return excinfo.value


def test_invalid_json_names_the_line(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    path = tmp_path / "pref.jsonl"
    path.write_text(json.dumps(STRING_ROW) + "\n\n" + '{"prompt": "hi", "chosen": \n')
    err = build_error(tok, str(path))
    assert_names(err, str(path), 3, None)
    assert err.reason.startswith("invalid JSON: ")


def test_invalid_json_document(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    path = tmp_path / "pref.json"
    path.write_text('[\n{"prompt": "hi"},\n{oops}\n]')
    err = build_error(tok, str(path))
    assert_names(err, str(path), None, None)
    assert "invalid JSON" in err.reason and "line 3" in err.reason


def test_row_that_is_not_an_object(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "pref.jsonl", [STRING_ROW, ["hi", "yo"]])
    err = build_error(tok, source)
    assert_names(err, source, 2, None)
    assert err.reason == "expected a JSON object, got list"


def test_missing_field(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "pref.jsonl", [STRING_ROW, {"prompt": "hi", "chosen": "yo"}])
    err = build_error(tok, source)
    assert_names(err, source, 2, "rejected")
    assert err.reason == "missing (present keys: chosen, prompt)"


def test_missing_prompt_with_string_responses(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "pref.jsonl", [{"chosen": "yo", "rejected": "no"}])
    assert_names(build_error(tok, source), source, 1, "prompt")


def test_missing_message_content(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    row = {"prompt": [{"role": "user"}], "chosen": "yo", "rejected": "no"}
    source = write_jsonl(tmp_path / "pref.jsonl", [row])
    assert_names(build_error(tok, source), source, 1, "prompt[0].content")


def test_wrong_type(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    source = write_jsonl(
        tmp_path / "pref.jsonl",
        [STRING_ROW] * 6 + [{"prompt": "hi", "chosen": 3, "rejected": "no"}],
    )
    err = build_error(tok, source)
    assert (
        str(err)
        == f"{source}, row 7, field 'chosen': expected a string or a list of messages, got int"
    )


def test_wrong_type_inside_a_message_of_a_json_array(
    tok: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    bad = {"prompt": "hi", "chosen": [{"role": "assistant", "content": ["yo"]}], "rejected": "no"}
    path = tmp_path / "pref.json"
    path.write_text(json.dumps([STRING_ROW, bad]))
    err = build_error(tok, str(path))
    assert_names(err, str(path), 2, "chosen[0].content")
    assert err.reason == "expected a string, got list"


@pytest.mark.parametrize(
    ("chosen", "field"),
    [("   ", "chosen"), ([{"role": "assistant", "content": "\n\t"}], "chosen[0].content")],
)
def test_empty_response(
    tok: PreTrainedTokenizerFast, tmp_path: Path, chosen: Any, field: str
) -> None:
    source = write_jsonl(
        tmp_path / "pref.jsonl", [{"prompt": "hi", "chosen": chosen, "rejected": "no"}]
    )
    err = build_error(tok, source)
    assert_names(err, source, 1, field)
    assert "empty response" in err.reason


def test_empty_implicit_response(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    user = {"role": "user", "content": "hi"}
    row = {"chosen": [user], "rejected": [user, {"role": "assistant", "content": "yo"}]}
    source = write_jsonl(tmp_path / "pref.jsonl", [row])
    assert_names(build_error(tok, source), source, 1, "chosen")


def test_unknown_role(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    row = {"prompt": [{"role": "robot", "content": "hi"}], "chosen": "yo", "rejected": "no"}
    source = write_jsonl(tmp_path / "pref.jsonl", [row])
    err = build_error(tok, source)
    assert_names(err, source, 1, "prompt[0].role")
    assert err.reason == "unknown role 'robot' (expected one of: assistant, system, tool, user)"


def test_unknown_colossal_speaker(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    row = {
        "context": [{"from": "human", "content": "hi"}],
        "chosen": [{"from": "assistant", "content": "yo"}],
        "rejected": [{"from": "bot", "content": "no"}],
    }
    source = write_jsonl(tmp_path / "pref.jsonl", [row])
    assert_names(build_error(tok, source), source, 1, "rejected[0].from")


def test_response_must_open_with_an_assistant_turn(
    tok: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    row = {"prompt": "hi", "chosen": [{"role": "user", "content": "yo"}], "rejected": "no"}
    source = write_jsonl(tmp_path / "pref.jsonl", [row])
    assert_names(build_error(tok, source), source, 1, "chosen[0].role")


def test_too_long_to_fit(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    rows = [STRING_ROW, {"prompt": "hi", "chosen": "yo", "rejected": "abcdefgh"}]
    source = write_jsonl(tmp_path / "pref.jsonl", rows)
    with pytest.raises(DataError) as info:  # row 1 would fit if cut; row 2's response cannot
        build_preference_dataset(source, tok, max_length=8, overlong="truncate")
    err = info.value
    assert_names(err, source, 2, "rejected")
    # Response tokens: "abcdefgh" + </s> = 9; prompt: <s> U : h i \n A : = 8.
    assert err.reason.startswith("the response alone is 9 tokens, more than max_length=8")
    assert "the prompt before it is 8 tokens" in err.reason


def test_parquet_row_number_is_index_plus_one(
    tok: PreTrainedTokenizerFast, tmp_path: Path, hf_local: None
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "pref.parquet"
    rows = [STRING_ROW, STRING_ROW, {"prompt": "hi", "chosen": "yo", "rejected": ""}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert_names(build_error(tok, str(path)), str(path), 3, "rejected")


# ---------------------------------------------------------------------- skip_invalid ----
def test_skip_invalid_skips_and_logs_the_count(
    tok: PreTrainedTokenizerFast, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "pref.jsonl"
    bad_type = json.dumps({"prompt": "hi", "chosen": 3, "rejected": "no"})
    good = json.dumps(STRING_ROW)
    path.write_text("\n".join([good, "{not json", bad_type, good]) + "\n")
    with caplog.at_level(logging.WARNING, logger="olingo.dataset"):
        dataset = build_preference_dataset(str(path), tok, max_length=64, skip_invalid=True)
    assert len(dataset) == 2 and dataset.num_skipped == 2
    assert list(dataset) == [STRING_ROW_IDS, STRING_ROW_IDS]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert f"{path}: skipped 2 invalid rows, kept 2" in message
    assert "row 2: invalid JSON" in message and "row 3, field 'chosen'" in message


def test_skip_invalid_with_nothing_left_raises(
    tok: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "pref.jsonl", [{"prompt": "hi"}, {"prompt": "ho"}])
    with pytest.raises(DataError, match="no usable preference rows: all 2 rows are invalid"):
        build_preference_dataset(source, tok, max_length=64, skip_invalid=True)


def test_empty_source_raises(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    path = tmp_path / "pref.jsonl"
    path.write_text("\n")
    with pytest.raises(DataError, match="the data is empty"):
        build_preference_dataset(str(path), tok, max_length=64)


# --------------------------------------------------- the project's own char tokenizer ----
def test_with_the_embedded_char_tokenizer(tmp_path: Path) -> None:
    tasks = pytest.importorskip("olingo.tasks")
    if not hasattr(tasks, "build_char_tokenizer"):
        pytest.skip("olingo.tasks.build_char_tokenizer is not there yet")
    tokenizer = tasks.build_char_tokenizer()
    source = write_jsonl(
        tmp_path / "pref.jsonl", [{"prompt": "12+7=", "chosen": "19", "rejected": "18"}]
    )
    dataset = build_preference_dataset(source, tokenizer, max_length=64)
    chosen = tokenizer.decode(dataset[0]["chosen_input_ids"])
    assert chosen == "<s><|user|>12+7=<|end|><|assistant|>19</s>"
    assert dataset[0]["chosen_input_ids"].count(tokenizer.bos_token_id) == 1
    batch = PreferenceCollator(pad_token_id=tokenizer.pad_token_id)([dataset[0]])
    assert batch["chosen_input_ids"].shape == (1, len(dataset[0]["chosen_input_ids"]))
