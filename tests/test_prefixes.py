"""Prefix reuse in `HFEngine`: a turn continues from the previous turn's KV cache and samples
what a full prefill samples (olingo/engines/prefixes.py)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from olingo.engines import GenerationSettings, HFEngine
from olingo.engines.base import keeping_prefixes, left_pad
from olingo.engines.prefixes import can_keep, match_rows
from olingo.tasks import build_char_tokenizer, build_tiny_llama

# log-probs of the same tokens from a cache built one token at a time vs in one pass: the same
# maths in another summation order, fp32 rounding (measured <= 1.2e-5 on a 2-layer model).
LOG_PROB_TOLERANCE = 1e-4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = build_char_tokenizer()
    tokenizer.padding_side = "left"
    return tokenizer


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_llama(tokenizer)


def test_match_rows_pairs_each_context_with_the_row_it_extends_in_order():
    kept = [[1, 2], [1, 2], [3], [4, 5]]
    assert match_rows(kept, [[1, 2, 9], [1, 2, 8], [4, 5, 6]]) == [0, 1, 3]  # row 2 left the batch
    assert match_rows(kept, [[1, 2, 9], [3, 7]]) == [0, 2]
    assert match_rows(kept, [[4, 5, 6], [1, 2, 9]]) is None  # another order: prefill again
    assert match_rows(kept, [[1, 2]]) is None  # nothing new to feed
    assert match_rows(kept, [[1, 3, 3]]) is None  # a different conversation
    assert match_rows(kept, [[1, 2, 9], [1, 2, 9], [1, 2, 9]]) is None  # each kept row serves one context


def test_only_attention_that_honours_holes_keeps_a_cache(model):
    assert can_keep(model)  # sdpa
    config = type("Config", (), {"_attn_implementation": "flash_attention_2"})()
    assert not can_keep(type("Model", (), {"config": config})())


def turns(engine, tokenizer, settings, contexts, count, *, seed=0, leave_at=1):
    """`count` turns over `contexts`: each row gets its sampled tokens and a reply of 1-5 tokens;
    the last row leaves after turn `leave_at`. Returns every call's rollout."""
    rollouts = []
    for turn in range(count):
        ids, mask = left_pad(contexts, tokenizer.pad_token_id)
        torch.manual_seed(seed + turn)
        rollout = engine.generate(ids, mask, settings)
        rollouts.append(rollout)
        replies = ["=+1"[: 1 + (j + turn) % 3] + "7" * ((j * 3 + turn) % 3) for j in range(len(contexts))]
        sampled = [rollout.sequences[j, rollout.num_prompt_tokens:][rollout.action_mask[j]].tolist() for j in range(len(contexts))]
        contexts = [c + s + tokenizer.encode(r) for c, s, r in zip(contexts, sampled, replies, strict=True)]
        contexts = contexts[:-1] if turn == leave_at else contexts
    return rollouts


@pytest.mark.parametrize("do_sample", [False, True])
def test_continued_turns_sample_what_a_full_prefill_samples(model, tokenizer, continued, do_sample):
    stops = [tokenizer.eos_token_id] + list(range(8, len(tokenizer), 3))  # a third of the vocabulary: some rows stop early
    settings = GenerationSettings(max_new_tokens=8, do_sample=do_sample, stop_token_ids=stops)
    prompts = [tokenizer.encode(p) for p in ("1+1=", "12+17=", "3+45=", "9=")]
    keeping = HFEngine(model, tokenizer, with_log_probs=True)
    with keeping.keep_prefixes():
        mine = turns(keeping, tokenizer, settings, prompts, 4)
    assert continued == [True, True, True] and keeping._kept is None  # freed on exit
    full = turns(HFEngine(model, tokenizer, with_log_probs=True), tokenizer, settings, prompts, 4)
    assert len(continued) == 3  # the engine outside the block kept nothing
    stopped_early = 0
    for a, b in zip(mine, full, strict=True):
        assert torch.equal(a.sequences, b.sequences) and torch.equal(a.action_mask, b.action_mask)
        assert (a.log_probs - b.log_probs)[a.action_mask].abs().max() < LOG_PROB_TOLERANCE
        stopped_early += int((a.action_mask.sum(1) < a.num_actions).sum())
    assert stopped_early > 0  # holes after a stop were in the kept cache


def test_a_batch_that_extends_nothing_is_prefilled_again(model, tokenizer, continued):
    settings = GenerationSettings(max_new_tokens=5, do_sample=False)
    engine, fresh = HFEngine(model, tokenizer), HFEngine(model, tokenizer)
    first, second = [tokenizer.encode("1+1="), tokenizer.encode("2+2=")], [tokenizer.encode("3+3="), tokenizer.encode("12+7=")]
    with engine.keep_prefixes():
        engine.generate(*left_pad(first, tokenizer.pad_token_id), settings)
        again = engine.generate(*left_pad(second, tokenizer.pad_token_id), settings)
    assert continued == [False]
    assert torch.equal(again.sequences, fresh.generate(*left_pad(second, tokenizer.pad_token_id), settings).sequences)


def test_new_weights_drop_the_kept_cache(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    with engine.keep_prefixes():
        engine.generate(*left_pad([tokenizer.encode("1+1=")], tokenizer.pad_token_id), GenerationSettings(max_new_tokens=3))
        assert engine._kept is not None
        engine.update_weights(model.state_dict().items())
        assert engine._kept is None


def test_keeping_prefixes_enters_the_engines_block_or_none(model, tokenizer):
    class Plain:  # an engine without keep_prefixes (vLLM caches prefixes itself)
        pass

    assert isinstance(keeping_prefixes(Plain()), contextlib.nullcontext)
    engine = HFEngine(model, tokenizer)
    with keeping_prefixes(engine):
        assert engine._keeping
    assert not engine._keeping
