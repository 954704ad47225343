"""A chat template that is not append-only splits a multi-turn episode into segments of one row
(olingo/rollout/multi_turn.py): the conversation is rendered again as the next turn's context,
its positions restart at 0, and a packed forward scores each turn in the context it was sampled
from (olingo/models/packing.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from olingo.dataset.prompts import PromptCollator
from olingo.engines import GenerationSettings, rollout_from_responses
from olingo.experience_buffer.rows import merge_batches
from olingo.experience_maker import action_log_probs, make_experience_batch, split_experience_batch
from olingo.experience_maker.group import GroupExperienceConfig, GroupExperienceMaker
from olingo.models.packing import lm_logits
from olingo.rewards import CompositeReward
from olingo.rollout import EnvStep, EpisodeLimits, MultiTurnSource, PromptBatch
from tests.test_engines import tok  # noqa: F401 - the module's tokenizer fixture
from tests.test_multi_turn import ScriptedEnv, ids_of, user

# Closes the last assistant turn unlike the earlier ones, as Qwen3's drops an earlier turn's
# empty think block: the stand-in conversation is no prefix of the longer one.
SPLITTING = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% if m['role'] == 'assistant' and not loop.last %}<|end|>{% else %}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class InOrderEngine:
    """Answers the i-th call with the i-th scripted turn, remembering each context it was given."""

    shares_weights, can_sleep = True, False

    def __init__(self, tok, turns: list[list[int]]) -> None:  # noqa: F811
        self.tok, self.turns, self.contexts = tok, turns, []

    def generate(self, input_ids, attention_mask, settings, n=1):
        self.contexts.append(input_ids[0][attention_mask[0].bool()].tolist())
        responses = torch.tensor([self.turns[len(self.contexts) - 1]] * len(input_ids))  # every episode alike
        return rollout_from_responses(input_ids, attention_mask, responses, self.tok, settings, -responses.float() / 1000)


def split_source(tok, split_rows: bool):  # noqa: F811
    """A source whose episodes answer "a", are told "o", answer "b" and end, under a template
    that splits there; and a one-prompt batch that carries its messages."""
    splitting = copy.deepcopy(tok)
    splitting.chat_template = SPLITTING
    prompt = user("p")
    item = {"input_ids": splitting.apply_chat_template(prompt, add_generation_prompt=True, return_dict=False), "gt_answer": None, "messages": prompt}
    batch = PromptBatch.from_collated(PromptCollator(tok.pad_token_id)([item]))
    engine = InOrderEngine(splitting, [ids_of(tok, "a"), ids_of(tok, "b")])

    def environment():
        return ScriptedEnv([EnvStep(user("o"), reward=0.5), EnvStep([], reward=1.0, done=True)])

    limits = EpisodeLimits(max_turns=4, max_new_tokens=16, max_episode_tokens=256)
    return MultiTurnSource(engine, splitting, environment, limits, tok.pad_token_id, split_rows=split_rows), batch, engine, splitting


def split_episode(tok, split_rows: bool):  # noqa: F811
    source, batch, engine, splitting = split_source(tok, split_rows)
    return source.sample(batch, GenerationSettings(max_new_tokens=16)), engine, splitting


def test_a_split_goes_on_in_a_new_segment_rendered_from_the_messages(tok):  # noqa: F811
    sampled, engine, splitting = split_episode(tok, split_rows=True)
    a, b = ids_of(tok, "a"), ids_of(tok, "b")
    conversation = [*user("p"), {"role": "assistant", "content": "a"}, *user("o")]
    context = splitting.apply_chat_template(conversation, add_generation_prompt=True, return_dict=False)
    assert engine.contexts[1] == context  # the second turn was sampled from the conversation rendered again
    rollout, start = sampled.rollout, sampled.rollout.num_prompt_tokens
    row = rollout.sequences[0, start:][rollout.attention_mask[0, start:].bool()].tolist()
    assert row == a + context + b
    assert rollout.action_mask[0, : len(row)].tolist() == [True] * len(a) + [False] * len(context) + [True] * len(b)
    prompt_length = int(rollout.attention_mask[0, :start].sum())
    positions = rollout.position_ids[0, start : start + len(row)].tolist()
    assert positions == list(range(prompt_length, prompt_length + len(a))) + list(range(len(context) + len(b)))
    assert sampled.info["template_splits"] == 1 and sampled.env_rewards.tolist() == [1.5]


def test_without_split_rows_or_messages_a_split_ends_the_episode(tok):  # noqa: F811
    sampled, engine, _ = split_episode(tok, split_rows=False)
    assert len(engine.contexts) == 1 and sampled.info["template_splits"] == 1 and sampled.rollout.position_ids is None


def test_a_packed_forward_scores_each_segment_in_its_own_context(tok):  # noqa: F811
    sampled, _, _ = split_episode(tok, split_rows=True)
    rollout = sampled.rollout
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2))
    ids, mask, positions = rollout.sequences, rollout.attention_mask, rollout.position_ids
    split = lm_logits(model, ids, mask, packing=True, position_ids=positions)
    # The second segment alone, as its own row: the context the engine sampled the last turn from.
    segment = ids[0][mask[0].bool()][positions[0][mask[0].bool()].tolist().index(0, 1) :][None]
    alone = model(input_ids=segment).logits
    tail = len(ids_of(tok, "b")) + 1  # the last turn's tokens and the position predicting its first
    row_tail = split[0][mask[0].bool()][-tail:]
    # Same tokens, same positions, one as a segment of a packed row: rounding only (1e-5).
    assert (row_tail - alone[0, -tail:]).abs().max() < 1e-5
    with pytest.raises(ValueError, match="need model.packing: true"):
        lm_logits(model, ids, mask, packing=False, position_ids=positions)


def test_split_rows_keep_their_positions_through_the_maker_and_the_buffer(tok):  # noqa: F811
    source, batch, _, splitting = split_source(tok, split_rows=True)
    torch.manual_seed(0)
    actor = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2))
    maker = GroupExperienceMaker(
        actor, CompositeReward((), allow_empty=True), None, splitting, config=GroupExperienceConfig(num_generations=2),
        generation=GenerationSettings(max_new_tokens=16), source=source, needs_old_log_probs=True, packing=True,
    )
    experience = maker.sample(batch.input_ids, batch.attention_mask, None, messages=batch.messages)
    assert experience.position_ids is not None
    # The trainer's log-probs of the last turn are those of its segment run alone (rounding only, 1e-5).
    mask, positions = experience.attention_mask[0].bool(), experience.position_ids[0]
    segment = experience.sequences[0][mask][positions[mask].tolist().index(0, 1) :][None]
    b = len(ids_of(tok, "b"))
    alone = torch.log_softmax(actor(input_ids=segment).logits[0, -b - 1 : -1], -1).gather(-1, segment[0, -b:, None]).squeeze(-1)
    # what the learner computes (`policy_logits`): packed, with the batch's position ids
    trainer = action_log_probs(
        actor, experience.sequences, experience.attention_mask, experience.num_actions, packing=True, position_ids=experience.position_ids,
    )
    last_turn = trainer[0][experience.action_mask[0]][-b:]
    assert (last_turn - alone).abs().max() < 1e-5
    # Through the buffer: split into items and padded again, or merged and selected, the positions stay.
    again = make_experience_batch(split_experience_batch(experience), tok.pad_token_id)
    selected = merge_batches([experience], tok.pad_token_id).select([1, 0])
    for rebuilt, order in ((again, [0, 1]), (selected, [1, 0])):
        for row, original in enumerate(order):
            keep = rebuilt.attention_mask[row].bool()
            assert rebuilt.position_ids[row][keep].tolist() == experience.position_ids[original][experience.attention_mask[original].bool()].tolist()
