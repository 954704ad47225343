"""The experience buffer: minibatches cut from whole batches equal the split-and-re-pad of their
items, in the order a shuffling DataLoader visits them, with the same draws from the RNGs."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import DataLoader

from olingo.experience_buffer import NaiveExperienceBuffer, loader_order
from olingo.experience_maker.experience import (
    PER_TOKEN,
    Experience,
    make_experience_batch,
    split_experience_batch,
)

PAD = 0


def batch(rows: int, prompt: int, response: int, version: int = 0, seed: int = 0, critic: bool = True, holes: bool = False) -> Experience:
    """Left-padded prompts and right-padded responses of random lengths; garbage (not 0, not pad)
    wherever a field lies outside its row, as a real batch may hold there."""
    g = torch.Generator().manual_seed(seed)
    p = torch.randint(1, prompt + 1, (rows,), generator=g)
    a = torch.randint(1, response + 1, (rows,), generator=g)
    cols = torch.arange(prompt + response)
    prompt_mask = (cols[:prompt] >= prompt - p[:, None])
    if holes:  # an unattended token inside row 0's prompt
        prompt_mask[0] = True
        prompt_mask[0, 1] = False
    action_mask = torch.arange(response) < a[:, None]
    fields = {name: torch.randn(rows, response, generator=g) for name in PER_TOKEN if critic or name not in ("values", "returns")}
    return Experience(
        sequences=torch.randint(5, 100, (rows, prompt + response), generator=g),
        attention_mask=torch.cat([prompt_mask, action_mask], dim=1).long(),
        action_mask=action_mask,
        score=torch.randn(rows, generator=g), raw_score=torch.randn(rows, generator=g), truncated=torch.rand(rows, generator=g) > 0.5,
        policy_version=version, **{name: fields.get(name) for name in PER_TOKEN},
    )


def assert_same(a: Experience, b: Experience) -> None:
    for name in ("sequences", "attention_mask", "action_mask", "score", "raw_score", "truncated", *PER_TOKEN):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
            assert x.is_contiguous(), name
    assert a.policy_version == b.policy_version


def reference(batches: list[Experience], limit: int = 0) -> list:
    items = [item for b in batches for item in split_experience_batch(b)]
    return items[-limit:] if limit else items


@pytest.mark.parametrize("critic", [True, False])
@pytest.mark.parametrize("holes", [False, True])
def test_minibatches_equal_the_items_re_padded(critic, holes):
    batches = [batch(6, 5, 7, version=1, seed=1, critic=critic, holes=holes), batch(5, 8, 4, version=3, seed=2, critic=critic)]
    buffer = NaiveExperienceBuffer(sample_batch_size=4, cpu_offload=False, pad_token_id=PAD)
    for b in batches:
        buffer.append(b)
    items = reference(batches)
    assert len(buffer) == 11
    for indices in ([0, 1, 2, 3], [10, 2, 7], [5], [6, 7], list(range(11))[::-1]):
        assert_same(buffer.minibatch(indices), make_experience_batch([items[i] for i in indices], PAD))


def test_limit_keeps_the_newest_rollouts():
    batches = [batch(6, 5, 7, version=v, seed=v) for v in range(4)]
    buffer = NaiveExperienceBuffer(sample_batch_size=2, limit=9, cpu_offload=False)
    for b in batches:
        buffer.append(b)
    items = reference(batches, limit=9)
    assert len(buffer) == 9 and len(buffer.batches) == 2  # the two oldest batches are gone
    assert [i.policy_version for i in buffer.items] == [2, 2, 2, 3, 3, 3, 3, 3, 3]
    assert_same(buffer.minibatch(list(range(9))), make_experience_batch(items, PAD))


def test_a_pass_equals_a_shuffling_dataloader_and_draws_the_same_random_numbers():
    """Same minibatches in the same order as DataLoader(shuffle=True) over the items, and the
    global RNG left in the same state (the next rollouts sample the same tokens)."""
    batches = [batch(7, 5, 6, seed=3), batch(6, 4, 6, seed=4)]
    buffer = NaiveExperienceBuffer(sample_batch_size=4, cpu_offload=False)
    for b in batches:
        buffer.append(b)
    items = reference(batches)
    torch.manual_seed(11)
    expected = list(DataLoader(items, batch_size=4, shuffle=True, collate_fn=buffer.collate_fn))
    after_loader = torch.rand(3)
    torch.manual_seed(11)
    passes = buffer.dataloader(shuffle=True)
    got = list(passes)
    assert torch.equal(torch.rand(3), after_loader)
    assert len(passes) == len(got) == 4 and [b.batch_size for b in got] == [4, 4, 4, 1]
    for a, b in zip(got, expected, strict=True):
        assert_same(a, b)


@pytest.mark.parametrize("shuffle", [True, False])
def test_loader_order_matches_dataloader(shuffle):
    torch.manual_seed(5)
    expected = [i for chunk in DataLoader(range(10), batch_size=3, shuffle=shuffle) for i in chunk.tolist()]
    state = torch.get_rng_state()
    torch.manual_seed(5)
    assert loader_order(10, shuffle).tolist() == expected
    assert torch.equal(torch.get_rng_state(), state)


def test_sample_draws_as_random_sample_over_the_items():
    batches = [batch(9, 5, 6, seed=6)]
    buffer = NaiveExperienceBuffer(sample_batch_size=4, cpu_offload=False)
    buffer.append(batches[0])
    items = reference(batches)
    random.seed(2)
    expected = make_experience_batch(random.sample(items, 4), PAD)
    random.seed(2)
    assert_same(buffer.sample(), expected)


def test_mixed_per_token_fields_are_refused():
    buffer = NaiveExperienceBuffer(sample_batch_size=2, cpu_offload=False)
    buffer.append(batch(3, 4, 4, critic=True))
    buffer.append(batch(3, 4, 4, critic=False))
    with pytest.raises(ValueError, match="different per-token fields"):
        buffer.minibatch([0, 1])


def test_append_and_clear_start_afresh():
    buffer = NaiveExperienceBuffer(sample_batch_size=2, cpu_offload=False)
    buffer.append(batch(3, 4, 4, seed=7))
    first = buffer.minibatch([0, 1, 2])
    buffer.append(batch(2, 6, 5, seed=8))  # a wider batch: the merged rows are rebuilt
    assert len(buffer) == 5 and buffer.minibatch([3, 4]).batch_size == 2
    assert_same(buffer.minibatch([0, 1, 2]), first)
    buffer.clear()
    assert len(buffer) == 0 and buffer.items == [] and len(buffer.minibatches()) == 0
