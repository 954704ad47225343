"""Padding-free forwards (olingo.models.packing): packing rules by hand, and packed equals padded.

Tolerances: packed and padded forwards run differently shaped matmuls, so float32 results
differ by rounding only (measured ~1e-7 on these models); 1e-5 leaves room for other CPUs.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

from olingo.models.critic import Critic
from olingo.models.packing import PackingUnsupported, check_packing, first_fit_decreasing, lm_logits, pack_batch, packed_shape, unpack
from olingo.models.reward_model import RewardModel
from olingo.models.utils import position_ids_from_mask

CONFIG = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2)


def uneven_batch(lengths: list[int], width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of these lengths padded to `width`, odd rows on the left (as RL prompts are)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, CONFIG["vocab_size"], (len(lengths), width), generator=generator)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        if i % 2:
            mask[i, width - n :] = 1
        else:
            mask[i, :n] = 1
    return ids, mask


def test_first_fit_decreasing_by_hand() -> None:
    # Longest first: 8 opens bin 0 (full); 5 opens bin 1 (room 3); 3 fills bin 1; 2 opens bin 2; 2 joins it.
    assert first_fit_decreasing([5, 3, 8, 2, 2], 8) == [[2], [0, 1], [3, 4]]
    assert first_fit_decreasing([4, 4, 4], 12) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="9 tokens"):
        first_fit_decreasing([9], 8)
    assert packed_shape([5, 3, 8, 2, 2]) == (3, 8)


def test_pack_batch_places_attended_tokens_with_restarting_positions() -> None:
    ids = torch.tensor([[11, 12, 0, 0], [0, 0, 0, 21], [31, 32, 33, 0]])
    mask = (ids != 0).long()
    packed = pack_batch(ids, mask)
    # Capacity 3 (the longest row): [31 32 33] alone, then [11 12] with [21] after it.
    assert packed.input_ids.tolist() == [[31, 32, 33], [11, 12, 21]]
    assert packed.position_ids.tolist() == [[0, 1, 2], [0, 1, 0]]
    assert packed.padding_fraction == 0.0
    values = packed.input_ids.float()
    assert unpack(values, packed).tolist() == ids.float().tolist()


@pytest.mark.parametrize("last", [0, 3])
def test_packed_logits_equal_padded_with_gradients(last: int) -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    ids, mask = uneven_batch([9, 2, 6, 1, 7], 10)
    padded = lm_logits(model, ids, mask, packing=False, last=last)
    packed = lm_logits(model, ids, mask, packing=True, last=last)
    kept = mask[:, -padded.shape[1] :].bool()
    assert (packed - padded)[kept].abs().max() < 1e-5
    assert packed[~kept].abs().max() == 0  # padding positions read nothing
    weight = model.model.layers[0].mlp.up_proj.weight
    grad_padded = torch.autograd.grad(padded[kept].pow(2).sum(), weight)[0]
    grad_packed = torch.autograd.grad(packed[kept].pow(2).sum(), weight)[0]
    assert torch.allclose(grad_packed, grad_padded, atol=1e-5, rtol=1e-4)


def test_reward_model_and_critic_read_their_positions_packed() -> None:
    torch.manual_seed(0)
    body = LlamaForSequenceClassification(LlamaConfig(**CONFIG, num_labels=1, pad_token_id=0))
    ids, mask = uneven_batch([9, 2, 6, 1, 7], 10)
    reward = RewardModel(body)
    assert torch.allclose(reward(ids, mask, packing=True), reward(ids, mask), atol=1e-5)
    critic = Critic(body)
    values, expected = critic(ids, mask, packing=True), critic(ids, mask)
    assert (values - expected)[mask.bool()].abs().max() < 1e-5


class IgnoresPositions(torch.nn.Module):
    """A model whose attention never sees packed position ids: rows would leak into each other."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = LlamaForCausalLM(LlamaConfig(**CONFIG))
        self.config = self.inner.config

    def forward(self, input_ids, position_ids=None, use_cache=False, **kwargs):
        return self.inner(input_ids=input_ids, use_cache=use_cache)


def test_a_model_that_mixes_packed_rows_is_refused() -> None:
    with pytest.raises(PackingUnsupported, match="IgnoresPositions.*model.packing: false"):
        check_packing(IgnoresPositions())
    check_packing(LlamaForCausalLM(LlamaConfig(**CONFIG)))  # a transformers Llama keeps them apart


def test_padded_forward_counts_positions_over_attended_tokens() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    ids, mask = uneven_batch([3, 5], 6)
    expected = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    assert torch.equal(lm_logits(model, ids, mask, packing=False), expected)
