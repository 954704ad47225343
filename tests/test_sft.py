"""SFT: data formats and loss mask, token-normalised accumulation, CLI smoke."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from olingo.config import load_config
from olingo.dataset import DataError, build_sft_dataset, parse_sft_row, tokenize_sft
from olingo.dataset.sft import SFTCollator
from olingo.recipes.sft import SFTConfig, run_sft
from olingo.rl.logprobs import GPTLMLoss, token_nll
from olingo.tasks import build_char_tokenizer
from tests.conftest import read_jsonl

PACKAGED = Path(__file__).resolve().parents[1] / "olingo" / "configs" / "sft_tiny.yaml"


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def masked_text(tok, item) -> str:
    return "".join(tok.convert_ids_to_tokens([i for i, m in zip(item["input_ids"], item["loss_mask"], strict=True) if m]))


@pytest.mark.parametrize(
    "row",
    [
        {"prompt": "12+7=", "completion": "19"},
        {"messages": [{"role": "user", "content": "12+7="}, {"role": "assistant", "content": "19"}]},
        {"messages": [{"from": "human", "content": "12+7="}, {"from": "assistant", "content": "19"}]},
    ],
)
def test_each_format_masks_exactly_the_assistant_answer_and_stop_token(tok, row):
    item = tokenize_sft(parse_sft_row(row), tok, 64)
    assert tok.decode(item["input_ids"]) == "<s><|user|>12+7=<|end|><|assistant|>19</s>"
    assert masked_text(tok, item) == "19</s>"


def test_multi_turn_masks_every_assistant_turn(tok):
    row = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
                        {"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]}
    assert masked_text(tok, tokenize_sft(parse_sft_row(row), tok, 64)) == "2</s>4</s>"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"prompt": "1+1="}', "row 2, field 'completion': missing"),
        ('{"messages": [{"role": "assistant", "content": "2"}]}', "row 2, field 'messages[0].role': a conversation must open"),
        ('{"messages": [{"role": "user", "content": "1+1="}]}', "row 2, field 'messages': no assistant turn"),
        ('{"prompt": "1+1=", "completion": " "}', "row 2, field 'messages[1].content': empty response"),
        ('{"prompt": "' + "1" * 80 + '", "completion": "2"}', "row 2, field 'messages': no assistant token fits in max_length=64"),
        ('{"prompt": 5, "completion": "2"}', "row 2, field 'prompt': expected a string or a list of messages, got int"),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path, tok, line, expected):
    path = tmp_path / "sft.jsonl"
    path.write_text('{"prompt": "1+1=", "completion": "2"}\n' + line + "\n")
    with pytest.raises(DataError) as err:
        build_sft_dataset(str(path), tok, 64)
    assert f"{path}, {expected}" in str(err.value)


def test_collator_right_pads_to_the_longest_row():
    batch = SFTCollator(pad_token_id=0)([{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, {"input_ids": [8], "loss_mask": [1]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]


def test_token_nll_and_gptlm_loss_hand_values():
    # vocab 2, uniform logits -> every token costs log 2; only positions 1..L-1 with mask count
    logits = torch.zeros(1, 3, 2)
    ids = torch.tensor([[0, 1, 0]])
    total, count = token_nll(logits, ids, torch.tensor([[0, 1, 0]]))
    assert count.item() == 1 and abs(total.item() - torch.log(torch.tensor(2.0)).item()) < 1e-6
    logits = torch.tensor([[[0.0, 2.0], [0.0, 0.0], [5.0, 5.0]]])  # predicts token 1 with p = e^2/(1+e^2)
    expected = (torch.log1p(torch.exp(torch.tensor(-2.0))) + torch.log(torch.tensor(2.0))) / 2
    assert abs(GPTLMLoss()(logits, ids).item() - expected.item()) < 1e-6


def sft_config(tmp: Path, name: str, *overrides: str) -> SFTConfig:
    base = [f"run.output_dir={tmp}", f"run.name={name}", "data.eval=[]", "logging.progress=false", "train.epochs=1"]
    return load_config(SFTConfig, PACKAGED, base + list(overrides))


@pytest.fixture(scope="module")
def sft_rows(tmp_path_factory, assets):
    """64 conversations of very different lengths, so micro-batches hold different token counts."""
    rows = [json.loads(line) for line in assets.sft_train.read_text().splitlines()[:64]]
    for i, row in enumerate(rows):
        row["completion"] = row["completion"] + " ok" * (i % 5)
    path = tmp_path_factory.mktemp("sft") / "sft64.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_accumulation_invariance_with_token_normalisation(tmp_path, sft_rows):
    """batch 8 x 1 == batch 2 x 4: the step's loss is the mean over all its assistant tokens."""
    lr = "train.lr=1e-4"  # see the reward-model test: Adam magnifies float noise at large lr
    a = run_sft(sft_config(tmp_path, "b8", f"data.train=[{sft_rows}]", "train.batch_size=8", lr))
    b = run_sft(sft_config(tmp_path, "b2a4", f"data.train=[{sft_rows}]", "train.batch_size=2", "train.accumulation_steps=4", lr))
    wa = load_file(str(Path(a["final_model"]) / "model.safetensors"))
    wb = load_file(str(Path(b["final_model"]) / "model.safetensors"))
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=1e-5, rtol=0, msg=key)
    la = [r["train/loss"] for r in read_jsonl(Path(a["run_dir"]) / "metrics.jsonl")]
    lb = [r["train/loss"] for r in read_jsonl(Path(b["run_dir"]) / "metrics.jsonl")]
    assert len(la) == len(lb) == 8 and max(abs(x - y) for x, y in zip(la, lb, strict=True)) < 1e-5


def test_sft_trains_every_parameter_and_the_model_loads_in_transformers(tmp_path, assets):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = run_sft(sft_config(tmp_path, "smoke", f"data.eval=[{assets.sft_eval}]", "train.batch_size=32"))
    trained = load_file(str(Path(result["final_model"]) / "model.safetensors"))
    base = load_file(str(assets.model_dir / "model.safetensors"))
    assert not [k for k in base if torch.equal(base[k], trained[k])]
    model = AutoModelForCausalLM.from_pretrained(result["final_model"])
    tokenizer = AutoTokenizer.from_pretrained(result["final_model"])
    assert model.config.vocab_size == len(tokenizer)
    assert result["eval"]["eval/loss"] > 0 and result["eval"]["eval/tokens"] > 0


@pytest.mark.slow
def test_two_process_ddp_sft_equals_one_process(tmp_path, sft_rows):
    """2 gloo ranks x batch 4 == 1 process x batch 8 although ranks hold different token counts."""
    import os
    import subprocess
    import sys

    from tests.conftest import olingo_cmd

    args = ["sft", f"run.output_dir={tmp_path}", f"data.train=[{sft_rows}]", "data.eval=[]", "logging.progress=false",
            "train.epochs=1", "train.lr=1e-4"]
    single = subprocess.run(olingo_cmd(*args, "run.name=single", "train.batch_size=8"), capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "olingo.cli.main",
           *args, "run.name=ddp", "train.batch_size=4", "plugin.name=ddp"]
    ddp = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    wa = load_file(str(tmp_path / "single" / "checkpoints" / "final" / "model" / "model.safetensors"))
    wb = load_file(str(tmp_path / "ddp" / "checkpoints" / "final" / "model" / "model.safetensors"))
    for key in wa:
        torch.testing.assert_close(wb[key], wa[key], atol=1e-5, rtol=0, msg=key)
    la = [r["train/loss"] for r in read_jsonl(tmp_path / "single" / "metrics.jsonl")]
    lb = [r["train/loss"] for r in read_jsonl(tmp_path / "ddp" / "metrics.jsonl")]
    assert max(abs(x - y) for x, y in zip(la, lb, strict=True)) < 1e-5
