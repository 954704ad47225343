"""RewardModel: read position for left/right padding, save/reload, transformers export."""

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from olingo.models import RewardModel, last_attended_index
from olingo.tasks import build_char_tokenizer, build_tiny_llama, save_pretrained_pair


def test_last_attended_index_hand_values():
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert last_attended_index(right).tolist() == [2, 4, 0]
    assert last_attended_index(left).tolist() == [4, 4, 4]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    tokenizer = build_char_tokenizer()
    lm = build_tiny_llama(tokenizer, hidden_size=32, num_layers=1, seed=1)
    path = tmp_path_factory.mktemp("lm")
    save_pretrained_pair(lm, tokenizer, path)
    torch.manual_seed(0)
    return path, tokenizer, RewardModel.from_pretrained(str(path), pad_token_id=tokenizer.pad_token_id)


def _pad(rows, pad_id, side):
    width = max(len(r) for r in rows)
    ids, mask = [], []
    for r in rows:
        fill = [pad_id] * (width - len(r))
        ids.append(r + fill if side == "right" else fill + r)
        mask.append([1] * len(r) + [0] * len(fill) if side == "right" else [0] * len(fill) + [1] * len(r))
    return torch.tensor(ids), torch.tensor(mask)


def test_score_is_read_at_last_real_token_for_both_padding_sides(rm_dir):
    _, tokenizer, model = rm_dir
    rows = [tokenizer.encode("12+3=15"), tokenizer.encode("1+1=2"), tokenizer.encode("20-7=13!!")]
    model.eval()
    with torch.no_grad():
        alone = torch.stack([model(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long))[0] for r in rows])
        right = model(*_pad(rows, tokenizer.pad_token_id, "right"))
        left = model(*_pad(rows, tokenizer.pad_token_id, "left"))
        per_token = model.values(torch.tensor([rows[0]]), torch.ones(1, len(rows[0]), dtype=torch.long))
    torch.testing.assert_close(right, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(left, alone, atol=1e-5, rtol=0)
    assert abs(per_token[0, -1].item() - alone[0].item()) < 1e-6  # the last token's value


def test_saved_reward_model_reloads_with_identical_scores(rm_dir, tmp_path):
    _, tokenizer, model = rm_dir
    ids, mask = _pad([tokenizer.encode("3+4=7"), tokenizer.encode("10-2=9")], tokenizer.pad_token_id, "right")
    model.save_pretrained(tmp_path)
    reloaded = RewardModel.from_pretrained(str(tmp_path))
    with torch.no_grad():
        assert torch.equal(model(ids, mask), reloaded(ids, mask))  # exact: the same computation on the saved weights


def test_export_loads_in_transformers_with_the_same_scores(rm_dir, tmp_path):
    _, tokenizer, model = rm_dir
    ids, mask = _pad([tokenizer.encode("3+4=7"), tokenizer.encode("10-2=9"), tokenizer.encode("0+0=0")], tokenizer.pad_token_id, "right")
    model.save_pretrained(tmp_path)
    hf = AutoModelForSequenceClassification.from_pretrained(str(tmp_path))
    with torch.no_grad():
        ours = model(ids, mask)
        theirs = hf(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)


def test_new_value_head_is_seeded(rm_dir):
    path, tokenizer, _ = rm_dir
    torch.manual_seed(5)
    a = RewardModel.from_pretrained(str(path)).model.score.weight
    torch.manual_seed(5)
    b = RewardModel.from_pretrained(str(path)).model.score.weight
    assert torch.equal(a, b) and a.abs().sum() > 0
