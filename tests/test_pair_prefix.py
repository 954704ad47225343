"""A preference pair's shared opening runs once (olingo/models/pair_prefix.py): the same scores and
gradients as the full forward, the layout by hand, and the cases that fall back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import olingo.models.reward_model as reward_model
from olingo.config import load_config
from olingo.models import RewardModel, load_tokenizer
from olingo.models.pair_prefix import can_share, common_prefix_length, pair_layout, worth_sharing
from olingo.recipes.common import resolve_path
from olingo.recipes.rm import RMConfig, run_rm
from olingo.trainer.utils import seed_everything

PACKAGED = Path(__file__).resolve().parents[1] / "olingo" / "configs" / "rm_tiny.yaml"
# Scores and gradients of the same tokens at the same positions, summed in another order (a cache
# and two forwards instead of one): fp32 rounding, relative to each value's size. Measured on the
# tiny model: scores 2.2e-8 apart, gradients 3.8e-6 at most (on values up to 28, a relative 1.4e-7).
TOLERANCE, RELATIVE = 1e-5, 1e-5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir() -> str:
    return resolve_path("builtin:tiny-llama")


def test_common_prefix_leaves_each_row_a_token_of_its_own():
    assert common_prefix_length([1, 2, 3, 4], [1, 2, 5]) == 2
    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 2  # one row is the other's start
    assert common_prefix_length([1, 2], [1, 2]) == 1
    assert common_prefix_length([7], [7, 8]) == 0
    assert common_prefix_length([1, 2], [3, 4]) == 0


def test_the_layout_by_hand():
    pad = 0
    ids = torch.tensor([[5, 6, 7, 8, 0], [5, 9, 0, 0, 0], [5, 6, 3, 0, 0], [5, 4, 4, 4, 4]])  # right-padded; pairs (0, 2), (1, 3)
    mask = (ids != pad).long()
    layout = pair_layout(ids, mask, pad)
    assert layout.opening_ids.tolist() == [[5, 6], [0, 5]] and layout.opening_mask.tolist() == [[1, 1], [0, 1]]
    assert layout.own_ids.tolist() == [[7, 8, 0, 0], [9, 0, 0, 0], [3, 0, 0, 0], [4, 4, 4, 4]]
    assert layout.own_mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert layout.own_positions.tolist() == [[2, 3, 4, 5], [1, 2, 3, 4], [2, 3, 4, 5], [1, 2, 3, 4]]
    # 2 x 2 + 4 x 4 = 20 token slots against 14 attended tokens packed, 20 padded: not worth it either way
    assert not worth_sharing(layout, mask, packing=True) and not worth_sharing(layout, mask, packing=False)


def pairs_batch(tokenizer, prompt_lengths, own_lengths, seed=0):
    """(2B, L) right-padded rows: pair i is a random prompt of prompt_lengths[i] tokens, then two
    different continuations of own_lengths[i] and own_lengths[i] + 2 tokens."""
    g = torch.Generator().manual_seed(seed)
    low, high = 10, len(tokenizer) - 1
    chosen, rejected = [], []
    for p, s in zip(prompt_lengths, own_lengths, strict=True):
        prompt = torch.randint(low, high, (p,), generator=g).tolist()
        chosen.append(prompt + torch.randint(low, high, (s,), generator=g).tolist())
        rejected.append(prompt + [high] + torch.randint(low, high, (s + 1,), generator=g).tolist())
    rows = chosen + rejected
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return ids, mask


@pytest.mark.parametrize("packing", [True, False])
def test_shared_openings_give_the_full_forwards_scores_and_gradients(model_dir, packing, monkeypatch):
    tokenizer = load_tokenizer(model_dir)
    seed_everything(0)
    model = RewardModel.from_pretrained(model_dir, pad_token_id=tokenizer.pad_token_id)
    ids, mask = pairs_batch(tokenizer, [40, 25, 33], [6, 9, 4])
    shared_calls = []
    real = reward_model.pair_layout
    monkeypatch.setattr(reward_model, "pair_layout", lambda *a: shared_calls.append(1) or real(*a))

    def scores_and_grads(pairs):
        model.zero_grad()
        scores = model(ids, mask, packing=packing, pairs=pairs)
        (scores * torch.arange(1.0, 7.0)).sum().backward()
        return scores.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    shared, shared_grads = scores_and_grads(True)
    assert shared_calls == [1]
    full, full_grads = scores_and_grads(False)
    torch.testing.assert_close(shared, full, atol=TOLERANCE, rtol=0)
    for name, grad in full_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=TOLERANCE, rtol=RELATIVE, msg=name)


def test_where_sharing_is_not_exact_or_not_cheaper_the_full_forward_runs(model_dir, monkeypatch):
    tokenizer = load_tokenizer(model_dir)
    model = RewardModel.from_pretrained(model_dir, pad_token_id=tokenizer.pad_token_id)
    opened = []
    real = model.model.model.forward
    monkeypatch.setattr(model.model.model, "forward", lambda *a, **k: opened.append(k.get("use_cache")) or real(*a, **k))
    ids, mask = pairs_batch(tokenizer, [1, 2], [30, 30])  # almost nothing shared
    with torch.no_grad():
        model(ids, mask, packing=True, pairs=True)
    assert opened == [False]  # one plain forward
    ids, mask = pairs_batch(tokenizer, [30, 30], [2, 2])  # worth sharing, but checkpointed layers keep no cache
    model.activation_checkpointing_enable()
    model.train()
    model(ids, mask, packing=True, pairs=True).sum().backward()
    assert opened == [False, False]
    config = model.config
    assert can_share(config, gradient_checkpointing=False)
    assert not can_share(config, gradient_checkpointing=True)
    for attribute, value in (("sliding_window", 16), ("layer_types", ["full_attention", "sliding_attention"]), ("_attn_implementation", "flash_attention_2")):
        other = type(config).from_dict(config.to_dict())
        setattr(other, attribute, value)
        assert not can_share(other, gradient_checkpointing=False), attribute


def test_a_reward_model_trains_the_same_with_and_without_shared_prompts(tmp_path, small_pref_file, monkeypatch):
    """Several optimizer steps on the embedded task (its pairs share their prompt): the weights
    agree within 1e-5 (lr 1e-4, as the accumulation-invariance test: Adam's scaling of rounding noise)."""
    shared_batches, real = [], reward_model.worth_sharing
    monkeypatch.setattr(reward_model, "worth_sharing", lambda *a: (lambda worth: shared_batches.append(worth) or worth)(real(*a)))

    def run(name, share):
        config = load_config(RMConfig, PACKAGED, [
            f"run.output_dir={tmp_path}", f"run.name={name}", f"data.train=[{small_pref_file}]", "data.eval=[]", "logging.progress=false",
            "train.epochs=1", "train.batch_size=8", "train.lr=1e-4", "model.packing=false", f"train.share_prompt={str(share).lower()}",
        ])
        result = run_rm(config)
        return load_file(str(Path(result["run_dir"]) / "checkpoints" / "final" / "model" / "model.safetensors"))

    shared = run("shared", True)
    assert len(shared_batches) == 8 and all(shared_batches)  # 64 pairs in batches of 8, every one shared
    full = run("full", False)
    assert len(shared_batches) == 8
    for key in full:
        torch.testing.assert_close(shared[key], full[key], atol=1e-5, rtol=0, msg=key)
