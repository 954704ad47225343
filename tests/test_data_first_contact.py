"""Data a new user brings: over-long rows, dataset splits, TRL's text and implicit-prompt rows,
and tool turns (docs/data.md).

A character-level tokenizer makes every character one token, so lengths and masks are checked
by hand against its template:
    <s>U:user\\nA:assistant[<call>name({"x": 1})]</s>T:tool\\n      generation prompt: "A:"
"""

from __future__ import annotations

import json
import logging
import string
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from olingo.dataset import (
    DataError,
    build_preference_dataset,
    build_sft_dataset,
    build_unpaired_dataset,
    parse_preference_row,
)
from olingo.dataset.preference import extract_text_prompt
from olingo.dataset.prompts import build_prompt_dataset

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
VOCAB = {token: i for i, token in enumerate((*SPECIALS, *dict.fromkeys(string.printable)))}
EOS = VOCAB["</s>"]
TOOL_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}A:{{ m['content'] }}"
    "{% for c in m.tool_calls or [] %}<call>{{ c['function']['name'] }}({{ c['function']['arguments'] | tojson }}){% endfor %}"
    "{{ eos_token }}"
    "{% elif m['role'] == 'tool' %}T:{{ m['content'] }}\n"
    "{% elif m['role'] == 'user' %}U:{{ m['content'] }}\n"
    "{% else %}S:{{ m['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)
# SmolLM2's kind of template: it writes content only, so tool calls vanish from the text.
CONTENT_ONLY_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'][0] | upper }}:{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% else %}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def make_tokenizer(template: str | None = TOOL_TEMPLATE) -> PreTrainedTokenizerFast:
    """Every printable character one token; <s> </s> <pad> <unk> whole."""
    backend = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>", chat_template=template,
    )


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return make_tokenizer()


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def masked(tok: PreTrainedTokenizerFast, item: dict) -> str:
    """The text of the tokens an SFT item trains on."""
    return tok.decode([t for t, m in zip(item["input_ids"], item["loss_mask"], strict=True) if m])


# ---- over-long rows: an error naming file, row, length and key, or an explicit option ----------
SHORT = {"prompt": "1+1="}  # <s>U:1+1=\nA: = 10 tokens
LONG = {"prompt": "what is " * 5 + "1+1="}  # 40 characters more: 50 tokens


def test_an_overlong_prompt_is_an_error_naming_file_row_length_and_key(tok, tmp_path):
    source = write_jsonl(tmp_path / "prompts.jsonl", [SHORT, LONG])
    with pytest.raises(DataError) as err:
        build_prompt_dataset(source, tok, 20, length_key="data.max_prompt_length")
    assert str(err.value).startswith(
        f"{source}, row 2, field 'prompt': the prompt (chat template and generation prompt included) is 50 tokens, "
        "more than data.max_prompt_length=20: raise data.max_prompt_length"
    )
    assert "data.overlong=truncate" in str(err.value)


def test_truncating_prompts_is_explicit_keeps_their_end_and_is_counted(tok, tmp_path, caplog):
    source = write_jsonl(tmp_path / "prompts.jsonl", [SHORT, LONG, LONG])
    with caplog.at_level(logging.WARNING, logger="olingo.dataset"):
        dataset = build_prompt_dataset(source, tok, 20, overlong="truncate", length_key="data.max_prompt_length")
    assert [len(item["input_ids"]) for item in dataset.items] == [10, 20, 20]
    assert tok.decode(dataset.items[1]["input_ids"]) == "t is what is 1+1=\nA:"  # the question and the generation prompt stay
    assert "prompt data: truncated 2 rows longer than data.max_prompt_length=20 (data.overlong=truncate)" in caplog.text


def test_skipping_overlong_rows_is_explicit_and_counted(tok, tmp_path, caplog):
    source = write_jsonl(tmp_path / "prompts.jsonl", [SHORT, LONG, SHORT])
    with caplog.at_level(logging.WARNING, logger="olingo.dataset"):
        dataset = build_prompt_dataset(source, tok, 20, overlong="skip", length_key="data.max_prompt_length")
    assert len(dataset) == 2 and dataset.num_skipped == 1
    assert "prompt data: skipped 1 rows longer than data.max_prompt_length=20 (data.overlong=skip)" in caplog.text


def test_an_overlong_sft_row_is_an_error_unless_truncation_is_asked_for(tok, tmp_path):
    row = {"prompt": "1+1=", "completion": "two, " * 6}  # <s>U:1+1=\nA: + 30 + </s> = 41 tokens
    source = write_jsonl(tmp_path / "sft.jsonl", [row])
    with pytest.raises(DataError, match=r"row 1, field 'messages': the conversation \(chat template included\) is 41 tokens, more than data.max_length=30"):
        build_sft_dataset(source, tok, 30, length_key="data.max_length")
    item = build_sft_dataset(source, tok, 30, overlong="truncate").items[0]
    assert tok.decode(item["input_ids"]) == "<s>U:1+1=\nA:two, two, two, two, "  # SFT rows keep their beginning


@pytest.mark.parametrize("build", [build_preference_dataset, build_unpaired_dataset])
def test_an_overlong_preference_row_is_an_error_unless_truncation_is_asked_for(tok, tmp_path, build):
    rows = [{"prompt": "say something long: " * 2, "chosen": "ok", "rejected": "no"}, {"prompt": "2+2=", "chosen": "4", "rejected": "5"}]
    source = write_jsonl(tmp_path / "pref.jsonl", rows)  # row 1, chosen: <s>U: + 40 + \nA:ok</s> = 49 tokens
    with pytest.raises(DataError, match=r"row 1, field 'chosen': the prompt \+ chosen \(chat template included\) is 49 tokens, more than data.max_length=32"):
        build(source, tok, 32, length_key="data.max_length")
    assert len(build(source, tok, 32, overlong="truncate")) == (2 if build is build_preference_dataset else 4)


def test_every_stage_has_the_option_and_defaults_sized_for_chat_prompts():
    from olingo.recipes.dpo import DPOConfig, KTOConfig, ORPOConfig
    from olingo.recipes.grpo_config import GRPOConfig
    from olingo.recipes.ppo_config import PPOConfig
    from olingo.recipes.rm import RMConfig
    from olingo.recipes.sft import SFTConfig

    for config in (SFTConfig, RMConfig, DPOConfig, ORPOConfig, KTOConfig, PPOConfig, GRPOConfig):
        assert config().data.overlong == "error", config
    # A chat template's system prompt alone is ~30 tokens (SmolLM2's); TRL's defaults are 512 / 1024.
    assert PPOConfig().data.max_prompt_length >= 512 and GRPOConfig().data.max_prompt_length >= 512
    assert min(SFTConfig().data.max_length, RMConfig().data.max_length, DPOConfig().data.max_length) >= 1024


def test_grpo_data_stops_on_a_long_eval_prompt_and_names_the_key_the_user_sets(tok, tmp_path):
    from olingo.config import load_config
    from olingo.recipes.grpo_config import GRPOConfig
    from olingo.recipes.online import load_prompt_data

    train = write_jsonl(tmp_path / "train.jsonl", [SHORT])
    held_out = write_jsonl(tmp_path / "eval.jsonl", [SHORT, LONG])
    overrides = [f"data.prompts=[{train}]", f"data.eval_prompts=[{held_out}]", "data.max_prompt_length=20"]
    match = rf"{held_out}, row 2, field 'prompt': .* is 50 tokens, more than data.max_prompt_length=20: raise data.max_prompt_length"
    with pytest.raises(DataError, match=match):
        load_prompt_data(load_config(GRPOConfig, None, overrides), tok, plugin=None)  # the data fails before any loader is made


# ---- splits: `source@split`, and no silent 'train' ---------------------------------------------
def save_dict(path: Path, splits: dict[str, list[dict]]) -> str:
    import datasets

    datasets.DatasetDict({name: datasets.Dataset.from_list(rows) for name, rows in splits.items()}).save_to_disk(str(path))
    return str(path)


TRAIN_ROW = {"prompt": "1+1=", "completion": "2"}
TEST_ROW = {"prompt": "3+3=", "completion": "6"}


def test_a_split_of_a_saved_datasetdict_is_picked_with_an_at_suffix(tok, tmp_path):
    source = save_dict(tmp_path / "saved", {"train": [TRAIN_ROW], "test": [TEST_ROW]})
    item = build_sft_dataset(f"{source}@test", tok, 64).items[0]
    assert tok.decode(item["input_ids"]) == "<s>U:3+3=\nA:6</s>"
    with pytest.raises(DataError) as err:
        build_sft_dataset(source, tok, 64)
    assert str(err.value) == f"{source}: has several splits, ['test', 'train']: pick one, e.g. '{source}@test' or '{source}@train' (docs/data.md)"
    with pytest.raises(DataError, match=r"no split 'dev'; the splits are \['test', 'train'\]"):
        build_sft_dataset(f"{source}@dev", tok, 64)


def test_a_datasetdict_with_one_split_needs_no_suffix(tok, tmp_path):
    source = save_dict(tmp_path / "saved", {"validation": [TEST_ROW]})
    assert tok.decode(build_sft_dataset(source, tok, 64).items[0]["input_ids"]) == "<s>U:3+3=\nA:6</s>"


def test_a_directory_of_split_files_is_picked_the_same_way(tok, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    folder = tmp_path / "files"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [TRAIN_ROW])
    write_jsonl(folder / "test.jsonl", [TEST_ROW])
    assert tok.decode(build_sft_dataset(f"{folder}@test", tok, 64).items[0]["input_ids"]) == "<s>U:3+3=\nA:6</s>"
    with pytest.raises(DataError, match=r"has several splits, \['test', 'train'\]"):
        build_sft_dataset(str(folder), tok, 64)


def test_a_split_suffix_on_a_single_file_is_an_error_and_an_existing_name_is_taken_whole(tok, tmp_path):
    source = write_jsonl(tmp_path / "rows.jsonl", [TRAIN_ROW])
    with pytest.raises(DataError, match=r"a \.jsonl file has no splits \(drop '@test'\)"):
        build_sft_dataset(f"{source}@test", tok, 64)
    named = write_jsonl(tmp_path / "me@home.jsonl", [TRAIN_ROW])  # 'home.jsonl' could be a split name
    assert len(build_sft_dataset(named, tok, 64)) == 1


# ---- TRL's formats -----------------------------------------------------------------------------
def test_text_rows_are_plain_language_modelling_with_the_loss_on_every_token(tmp_path):
    no_template = make_tokenizer(template=None)  # a base model: text rows need no chat template
    source = write_jsonl(tmp_path / "text.jsonl", [{"text": "The sky is blue."}, {"text": "Ends with eos</s>"}])
    items = build_sft_dataset(source, no_template, 64).items
    assert items[0]["input_ids"] == [VOCAB[c] for c in "The sky is blue."] + [EOS]  # eos appended, as TRL does
    assert items[0]["loss_mask"] == [1] * len(items[0]["input_ids"])
    assert items[1]["input_ids"].count(EOS) == 1  # not doubled


def test_an_empty_text_row_names_its_field(tok, tmp_path):
    source = write_jsonl(tmp_path / "text.jsonl", [{"text": "  "}])
    with pytest.raises(DataError, match=r"row 1, field 'text': empty text"):
        build_sft_dataset(source, tok, 64)


@pytest.mark.parametrize(
    ("chosen", "rejected", "expected"),
    [
        ("The sky is blue.", "The sky is green.", ("The sky is", " blue.", " green.")),  # TRL's documented example
        ("Q: 12+7=? A: 19", "Q: 12+7=? A: 18", ("Q: 12+7=? A: 1", "9", "8")),  # the cut is per character, as in TRL
    ],
)
def test_the_implicit_text_prompt_is_trls_longest_common_prefix(chosen, rejected, expected):
    assert extract_text_prompt(chosen, rejected) == expected


def test_implicit_prompt_text_pairs_are_accepted_by_preference_and_kto_data(tok, tmp_path):
    row = {"chosen": "The sky is blue.", "rejected": "The sky is green."}
    example = parse_preference_row(row)
    assert example.prompt == [{"role": "user", "content": "The sky is"}]
    assert example.chosen == [{"role": "assistant", "content": " blue."}]
    assert example.rejected == [{"role": "assistant", "content": " green."}]
    source = write_jsonl(tmp_path / "pairs.jsonl", [row, {"chosen": "2+2=4", "rejected": "2+2=5"}])
    item = build_preference_dataset(source, tok, 64).items[0]
    assert tok.decode(item["chosen_input_ids"]) == "<s>U:The sky is\nA: blue.</s>"
    assert len(build_unpaired_dataset(source, tok, 64)) == 4


def test_identical_or_unrelated_text_pairs_are_refused(tmp_path, tok):
    source = write_jsonl(tmp_path / "pairs.jsonl", [{"chosen": "same", "rejected": "same"}, {"chosen": "yes", "rejected": "no"}])
    with pytest.raises(DataError, match=r"row 1, field 'rejected': the same text as chosen"):
        build_preference_dataset(source, tok, 64)
    with pytest.raises(DataError, match=r"row 2, field 'prompt': missing, and chosen and rejected share no opening text"):
        parse_preference_row({"chosen": "yes", "rejected": "no"}, source, 2)


# ---- tool turns --------------------------------------------------------------------------------
CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}
TOOL_CHAT = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "tool_calls": [CALL]},
    {"role": "tool", "name": "add", "content": "4"},
    {"role": "assistant", "content": "It is 4."},
]


def test_tool_calls_are_trained_on_and_tool_results_are_not(tok, tmp_path):
    item = build_sft_dataset(write_jsonl(tmp_path / "tools.jsonl", [{"messages": TOOL_CHAT}]), tok, 128).items[0]
    assert tok.decode(item["input_ids"]) == '<s>U:2+2?\nA:<call>add({"a": 2, "b": 2})</s>T:4\nA:It is 4.</s>'
    assert masked(tok, item) == '<call>add({"a": 2, "b": 2})</s>It is 4.</s>'


def test_prompt_rows_may_end_with_a_tool_result(tok, tmp_path):
    source = write_jsonl(tmp_path / "prompts.jsonl", [{"messages": TOOL_CHAT[:3], "gt_answer": "4"}])
    item = build_prompt_dataset(source, tok, 128).items[0]
    assert tok.decode(item["input_ids"]) == '<s>U:2+2?\nA:<call>add({"a": 2, "b": 2})</s>T:4\nA:'
    assert item["gt_answer"] == "4"


def test_a_template_that_drops_tool_calls_is_refused_rather_than_training_an_empty_turn(tmp_path):
    source = write_jsonl(tmp_path / "tools.jsonl", [{"messages": TOOL_CHAT}])
    with pytest.raises(DataError, match=r"row 1, field 'messages\[1\]\.tool_calls': the chat template does not render tool calls"):
        build_sft_dataset(source, make_tokenizer(CONTENT_ONLY_TEMPLATE), 128)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"role": "user", "content": "hi", "tool_calls": [CALL]}, "field 'messages[1].tool_calls': only an assistant turn makes tool calls"),
        ({"role": "assistant", "tool_calls": [{"name": "add"}]}, "field 'messages[1].tool_calls[0]': expected {\"type\": \"function\""),
        ({"role": "assistant", "tool_calls": []}, "field 'messages[1].tool_calls': expected a non-empty list of tool calls"),
        ({"role": "tool", "content": "4", "tool_call_id": 7}, "field 'messages[1].tool_call_id': expected a string, got int"),
    ],
)
def test_bad_tool_turns_name_their_field(tok, tmp_path, message, expected):
    row = {"messages": [{"role": "user", "content": "2+2?"}, message, {"role": "assistant", "content": "4"}]}
    with pytest.raises(DataError) as err:
        build_sft_dataset(write_jsonl(tmp_path / "bad.jsonl", [row]), tok, 128)
    assert expected in str(err.value)


# ---- through the CLI: one line, exit 2, no run directory (docs/errors.md) ----------------------
@pytest.mark.slow
def test_the_cli_stops_on_an_overlong_row_and_on_an_unnamed_split_with_one_line(tmp_path, capsys):
    from olingo.cli.main import main

    long_row = {"prompt": "what is " * 30 + "1+1=", "chosen": "2", "rejected": "3"}
    source = write_jsonl(tmp_path / "pref.jsonl", [long_row] * 4)
    saved = save_dict(tmp_path / "saved", {"train": [long_row], "test": [long_row]})
    capsys.readouterr()  # save_to_disk's progress bar
    base = ["rm", f"run.output_dir={tmp_path / 'runs'}", "data.eval=[]", "logging.progress=false", "train.epochs=1", "train.batch_size=2"]
    cases = [
        ([f"data.train=[{source}]", "data.max_length=64"],
         f"olingo: {source}, row 1, field 'chosen': the prompt + chosen (chat template included) is 250 tokens, more than data.max_length=64: "
         "raise data.max_length"),
        ([f"data.train=[{saved}]"], f"olingo: {saved}: has several splits, ['test', 'train']: pick one"),
    ]
    for overrides, message in cases:
        assert main([*base, *overrides]) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()
    # the explicit option trains on the cut rows and says how many it cut
    assert main([*base, f"data.train=[{source}]", "data.max_length=64", "data.overlong=truncate", "run.name=cut"]) == 0


@pytest.mark.slow
def test_olingo_sft_trains_a_base_model_on_text_rows(tmp_path, capsys):
    import shutil

    from olingo.cli.main import main
    from olingo.recipes.common import resolve_path

    base = tmp_path / "base"  # the tiny model without its chat template: a base model
    shutil.copytree(resolve_path("builtin:tiny-llama"), base)
    (base / "chat_template.jinja").unlink()
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    source = write_jsonl(tmp_path / "text.jsonl", [{"text": f"{a}+{b}={a + b}"} for a in range(4) for b in range(2)])
    argv = ["sft", f"run.output_dir={tmp_path / 'runs'}", f"model.path={base}", f"data.train=[{source}]", "data.eval=[]",
            "logging.progress=false", "train.epochs=1", "train.batch_size=4"]
    assert main(argv) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in next((tmp_path / "runs").glob("*/metrics.jsonl")).read_text().splitlines()]
    assert any("train/loss" in row for row in rows)
