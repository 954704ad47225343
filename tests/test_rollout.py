"""Rollout generation: the [left-padded prompt | response, right-padded] layout and stop rules."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from olingo.engines import GenerationSettings, Rollout, action_mask_from_responses, generate_rollout
from olingo.engines.hf import build_generation_config
from olingo.tasks import build_char_tokenizer, build_tiny_llama

PROMPTS = ["1+1=", "12+17=", "3+45="]
EOS, PAD = 3, 0


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = build_char_tokenizer()
    tokenizer.padding_side = "left"
    return tokenizer


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_llama(tokenizer)


def encode(tokenizer, prompts=PROMPTS):
    """Chat-rendered prompts, left-padded."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        for p in prompts
    ]
    return tokenizer(texts, return_tensors="pt", padding=True)


def rollout(model, tokenizer, prompts=PROMPTS, **settings) -> Rollout:
    batch = encode(tokenizer, prompts)
    return generate_rollout(
        model, batch.input_ids, batch.attention_mask, tokenizer, GenerationSettings(**settings)
    )


def responses(r: Rollout) -> torch.Tensor:
    return r.sequences[:, r.num_prompt_tokens :]


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def assert_layout(r: Rollout, batch) -> None:
    """The documented layout: prompt block = the input, response block masked and padded."""
    P, A = r.num_prompt_tokens, r.num_actions
    assert P == batch.input_ids.shape[1]
    assert r.sequences.shape == r.attention_mask.shape == (len(batch.input_ids), P + A)
    assert r.action_mask.dtype == torch.bool and r.truncated.shape == (len(batch.input_ids),)
    assert torch.equal(r.sequences[:, :P], batch.input_ids)
    assert torch.equal(r.attention_mask[:, :P], batch.attention_mask)
    assert torch.equal(r.attention_mask[:, P:], r.action_mask.long())
    assert (responses(r)[~r.action_mask] == PAD).all()
    # The mask is a prefix of each row: no hole, nothing after the end.
    assert (r.action_mask[:, 1:] <= r.action_mask[:, :-1]).all()


def ends_in(row: list[int], stop_ids: set[int]) -> int | None:
    return next((k for k, t in enumerate(row) if t in stop_ids), None)


# ---- layout ---------------------------------------------------------------------------------


def test_prompts_of_different_lengths_give_the_documented_layout(model, tokenizer):
    batch = encode(tokenizer, ["1+1=", "12+17="])
    assert batch.attention_mask[0, 0] == 0 and batch.attention_mask[1].all()
    assert tokenizer.decode(batch.input_ids[1]) == "<s><|user|>12+17=<|end|><|assistant|>"
    r = generate_rollout(
        model,
        batch.input_ids,
        batch.attention_mask,
        tokenizer,
        GenerationSettings(do_sample=False, max_new_tokens=5),
    )
    assert_layout(r, batch)
    assert r.num_actions == 5 and r.action_mask[:, 0].all()


# ---- action_mask_from_responses on hand-made responses ---------------------------------------


def test_action_mask_stops_at_the_first_stop_token_inclusive():
    responses = torch.tensor(
        [
            [10, 11, EOS, 12, 13],  # stop at step 2, tokens after it excluded
            [EOS, 10, 11, 12, 13],  # stop at the first column
            [10, 11, 12, 13, 14],  # no stop: truncated, all columns
            [10, EOS, EOS, 12, PAD],  # only the first stop counts
            [10, 11, 12, 13, EOS],  # stop in the last column is not a truncation
        ]
    )
    mask, truncated = action_mask_from_responses(responses, [EOS])
    expected = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    ).bool()
    assert torch.equal(mask, expected)
    assert truncated.tolist() == [False, False, True, False, False]


def test_action_mask_with_two_stop_ids_ends_at_whichever_comes_first():
    responses = torch.tensor([[10, 12, EOS, 11], [10, EOS, 12, 11], [10, 11, 11, 11]])
    mask, truncated = action_mask_from_responses(responses, [EOS, 12])
    assert mask.sum(dim=1).tolist() == [2, 2, 4]
    assert truncated.tolist() == [False, False, True]


def test_action_mask_stop_string_spanning_two_tokens(tokenizer):
    rows = ["ab##cd", "a#b#c#", "ab</s>c##", "a##b</s>x", "ab\n\ncd"]
    responses = torch.tensor([ids(tokenizer, text) for text in rows])
    mask, truncated = action_mask_from_responses(responses, [EOS], ["##", "\n\n"], tokenizer)
    # Ends at the token completing the string; a stop id that comes first wins.
    assert mask.sum(dim=1).tolist() == [4, 6, 3, 3, 4]
    assert truncated.tolist() == [False, True, False, False, False]


def test_action_mask_stop_strings_need_a_tokenizer():
    with pytest.raises(ValueError, match="tokenizer"):
        action_mask_from_responses(torch.tensor([[10, 11]]), [EOS], ["##"])


# ---- generate_rollout: stops, determinism, sampling -----------------------------------------


def test_rollout_responses_end_at_different_steps(model, tokenizer):
    """Greedy decoding is deterministic, so tokens of its free-running output serve as stops.

    With the seeded tiny model one token first appears at two different steps in two rows
    and not at all in the third; adding a second stop id then ends every row.
    """
    free = responses(rollout(model, tokenizer, do_sample=False, max_new_tokens=6)).tolist()
    candidates = [t for t in dict.fromkeys(sum(free, [])) if t != EOS]
    stop = max(candidates, key=lambda t: len({ends_in(row, {t}) for row in free}))
    assert len({ends_in(row, {stop}) for row in free}) == 3  # two stop steps + a truncation
    second = next(t for t in candidates if all(ends_in(row, {stop, t}) is not None for row in free))

    for stop_ids in ([stop], [stop, second]):
        batch = encode(tokenizer)
        r = generate_rollout(
            model,
            batch.input_ids,
            batch.attention_mask,
            tokenizer,
            GenerationSettings(do_sample=False, max_new_tokens=6, stop_token_ids=stop_ids),
        )
        assert_layout(r, batch)
        ends = [ends_in(row, set(stop_ids)) for row in free]
        assert r.truncated.tolist() == [end is None for end in ends]
        lengths = [6 if end is None else end + 1 for end in ends]
        assert r.action_mask.sum(dim=1).tolist() == lengths
        assert r.num_actions == max(lengths)  # generate stops once every row has stopped
        for row, free_row, length in zip(responses(r).tolist(), free, lengths, strict=True):
            assert row[:length] == free_row[:length]
    assert not r.truncated.any() and r.num_actions < 6


def test_tokens_after_the_stop_become_pad_even_if_the_model_continued(
    model, tokenizer, monkeypatch
):
    """The layout comes from the tokens, not from where generate happened to stop."""
    free = responses(rollout(model, tokenizer, do_sample=False, max_new_tokens=6)).tolist()
    stop = free[0][1]
    generate = model.generate

    def generate_ignoring_stops(*args, generation_config, **kwargs):
        generation_config.eos_token_id = [EOS]  # never produced by this model here
        return generate(*args, generation_config=generation_config, **kwargs)

    monkeypatch.setattr(model, "generate", generate_ignoring_stops)
    r = rollout(model, tokenizer, do_sample=False, max_new_tokens=6, stop_token_ids=[stop])
    assert r.num_actions == 6 and r.action_mask[0].sum() == 2 and not r.truncated[0]
    assert responses(r)[0].tolist() == free[0][:2] + [PAD] * 4
    assert r.attention_mask[0, r.num_prompt_tokens :].tolist() == [1, 1, 0, 0, 0, 0]


def test_rollout_stops_on_a_stop_string(model, tokenizer):
    free = responses(rollout(model, tokenizer, do_sample=False, max_new_tokens=6)).tolist()
    stop_string = tokenizer.decode(free[1][1:3])  # two tokens of row 1
    r = rollout(model, tokenizer, do_sample=False, max_new_tokens=6, stop_strings=[stop_string])
    assert_layout(r, encode(tokenizer))
    for row, free_row, length in zip(
        responses(r).tolist(), free, r.action_mask.sum(1), strict=True
    ):
        # Reference: the shortest prefix whose decoded text contains the string.
        end = next((k for k in range(6) if stop_string in tokenizer.decode(free_row[: k + 1])), 5)
        assert length == end + 1
        assert row[:length] == free_row[:length]
    assert r.action_mask[1].sum() == 3 and not r.truncated[1]


def test_greedy_is_deterministic_and_equals_a_manual_argmax_loop(model, tokenizer):
    first = rollout(model, tokenizer, do_sample=False, max_new_tokens=4)
    second = rollout(model, tokenizer, do_sample=False, max_new_tokens=4)
    assert torch.equal(first.sequences, second.sequences)
    for prompt, row in zip(PROMPTS, responses(first), strict=True):
        sequence = encode(tokenizer, [prompt]).input_ids  # unpadded
        for _ in range(3):
            next_token = model(sequence).logits[:, -1].argmax(dim=-1, keepdim=True)
            sequence = torch.cat([sequence, next_token], dim=1)
        assert sequence[0, -3:].tolist() == row[:3].tolist()


def test_sampling_with_top_k_1_equals_greedy(model, tokenizer):
    greedy = rollout(model, tokenizer, do_sample=False, max_new_tokens=6)
    torch.manual_seed(7)
    top1 = rollout(model, tokenizer, do_sample=True, top_k=1, temperature=0.7, max_new_tokens=6)
    assert torch.equal(greedy.sequences, top1.sequences)


def test_same_seed_gives_the_same_rollout(model, tokenizer):
    def sample(seed: int) -> Rollout:
        torch.manual_seed(seed)
        return rollout(model, tokenizer, max_new_tokens=8)

    first, again, other = sample(11), sample(11), sample(12)
    assert torch.equal(first.sequences, again.sequences)
    assert torch.equal(first.action_mask, again.action_mask)
    assert not torch.equal(first.sequences, other.sequences)


def test_model_generation_config_does_not_leak_into_sampling(tokenizer):
    """top_k=0 means off even when the model's generation_config says top_k=1."""
    plain, biased = build_tiny_llama(tokenizer), build_tiny_llama(tokenizer)
    biased.generation_config.top_k = 1
    biased.generation_config.temperature = 0.1
    samples = []
    for model in (plain, biased):
        torch.manual_seed(5)
        samples.append(rollout(model, tokenizer, max_new_tokens=8).sequences)
    assert torch.equal(samples[0], samples[1])
    assert not torch.equal(
        samples[0], rollout(plain, tokenizer, do_sample=False, max_new_tokens=8).sequences
    )


def test_no_stop_ids_reach_generate_as_none_only_where_the_model_names_no_eos(tokenizer, monkeypatch):
    """stop_token_ids=[]: generate gets eos None (no empty stop check per step) only when None
    cannot let a model's own eos in; the rollouts are the same and run to max_new_tokens."""
    with_eos, without_eos = build_tiny_llama(tokenizer), build_tiny_llama(tokenizer)
    without_eos.generation_config.eos_token_id = None
    seen, rollouts = [], []
    for model in (with_eos, without_eos):
        def spy(*args, generation_config, original=model.generate, **kwargs):
            seen.append(generation_config.eos_token_id)
            return original(*args, generation_config=generation_config, **kwargs)

        monkeypatch.setattr(model, "generate", spy)
        torch.manual_seed(3)
        rollouts.append(rollout(model, tokenizer, max_new_tokens=12, stop_token_ids=[]))
    assert seen == [[], None]
    assert torch.equal(rollouts[0].sequences, rollouts[1].sequences)
    assert all(r.num_actions == 12 and r.action_mask.all() for r in rollouts)
    assert (responses(rollouts[0]) == EOS).any()  # the model's eos came and did not stop it


def test_generation_config_is_explicit(tokenizer):
    sample = build_generation_config(GenerationSettings(top_k=0, top_p=0.9), tokenizer)
    assert (sample.do_sample, sample.top_k, sample.top_p, sample.temperature) == (True, 0, 0.9, 1.0)
    assert (sample.pad_token_id, sample.eos_token_id, sample.use_cache) == (PAD, [EOS], True)
    greedy = build_generation_config(
        GenerationSettings(do_sample=False, stop_token_ids=[3, 9], max_new_tokens=7), tokenizer
    )
    assert (greedy.do_sample, greedy.eos_token_id, greedy.max_new_tokens) == (False, [3, 9], 7)


def test_greedy_does_not_warn_about_the_models_sampling_defaults(tokenizer, monkeypatch):
    model = build_tiny_llama(tokenizer)
    model.generation_config.update(do_sample=True, temperature=0.6, top_p=0.9, top_k=20)
    logged = []
    for module in (transformers.generation.configuration_utils, transformers.generation.utils):
        for method in ("warning", "warning_once"):
            monkeypatch.setattr(module.logger, method, lambda msg, *a, **k: logged.append(msg))
    rollout(model, tokenizer, do_sample=False, max_new_tokens=2)
    assert logged == []


def test_model_settings_that_cannot_be_switched_off_are_warned_about(tokenizer):
    model = build_tiny_llama(tokenizer)
    model.generation_config.suppress_tokens = [10]
    with pytest.warns(UserWarning, match="suppress_tokens"):
        rollout(model, tokenizer, do_sample=False, max_new_tokens=2)


@pytest.mark.parametrize("training", [True, False])
def test_generation_runs_in_eval_mode_and_restores_the_mode(tokenizer, training):
    model = build_tiny_llama(tokenizer).train(training)
    model.lm_head.train(not training)  # a mixed state comes back as it was
    modes = []
    model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    rollout(model, tokenizer, do_sample=False, max_new_tokens=2)
    assert modes and not any(modes)
    assert model.lm_head.training is not training
    assert all(m.training == training for m in model.modules() if m is not model.lm_head)


# ---- bad input --------------------------------------------------------------------------------


def test_unknown_generation_kwargs_raise_a_type_error_naming_the_key():
    with pytest.raises(TypeError, match=r"max_new_token'.*did you mean 'max_new_tokens'"):
        GenerationSettings.from_kwargs(max_new_token=8)
    settings = GenerationSettings.from_kwargs(max_new_tokens=8, top_p=0.5)
    assert dataclasses.astuple(settings)[:5] == (8, True, 1.0, 0, 0.5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_new_tokens": 0},
        {"temperature": 0.0},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"stop_strings": []},
        {"stop_strings": [""]},
    ],
)
def test_invalid_generation_values_raise(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        GenerationSettings.from_kwargs(**kwargs)


def test_a_bare_stop_string_is_refused():
    with pytest.raises(TypeError, match="stop_strings must be a list"):
        GenerationSettings(stop_strings="##")


def test_right_padded_prompts_raise(model, tokenizer):
    right = build_char_tokenizer()  # pads on the right
    batch = encode(right)
    with pytest.raises(ValueError, match=r'left-padded.*padding_side = "left"'):
        generate_rollout(
            model, batch.input_ids, batch.attention_mask, tokenizer, GenerationSettings()
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rollout_on_cuda_returns_tensors_on_the_model_device(tokenizer):
    model = build_tiny_llama(tokenizer).cuda()
    cpu = rollout(build_tiny_llama(tokenizer), tokenizer, do_sample=False, max_new_tokens=4)
    r = rollout(model, tokenizer, do_sample=False, max_new_tokens=4)  # CPU inputs are moved
    for tensor in (r.sequences, r.attention_mask, r.action_mask, r.truncated):
        assert tensor.device.type == "cuda"
    assert r.sequences.shape == cpu.sequences.shape


def test_no_stop_token_runs_every_response_to_max_new_tokens(model, tokenizer):
    """stop_token_ids=[]: eos is an ordinary token, nothing is masked, nothing is truncated."""
    torch.manual_seed(0)
    out = rollout(model, tokenizer, PROMPTS * 8, max_new_tokens=40, stop_token_ids=[])
    assert out.num_actions == 40
    assert out.action_mask.all() and not out.truncated.any()
    responses = out.sequences[:, -40:]
    # the untrained model samples eos now and then; generation must go on past it
    rows_with_eos = (responses == EOS).any(dim=1)
    assert rows_with_eos.any()
    eos_col = (responses == EOS).int().argmax(dim=1)
    assert (eos_col[rows_with_eos] < 39).any()


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 5, 0.9)])
def test_log_probs_from_generate_equal_a_scoring_forward(model, tokenizer, temperature, top_k, top_p):
    """with_log_probs reads pi_old from generate's raw logits, step by step; a full forward gives the
    same (the temperature applied, top-k and top-p not: they shape sampling, not the policy)."""
    from olingo.experience_maker import action_log_probs

    batch = encode(tokenizer, PROMPTS)
    torch.manual_seed(0)
    settings = GenerationSettings(max_new_tokens=12, temperature=temperature, top_k=top_k, top_p=top_p)
    out = generate_rollout(model, batch.input_ids, batch.attention_mask, tokenizer, settings, with_log_probs=True)
    expected = action_log_probs(model, out.sequences, out.attention_mask, out.num_actions, temperature)
    mask = out.action_mask
    assert out.log_probs.shape == expected.shape
    torch.testing.assert_close(out.log_probs[mask], expected[mask], atol=1e-5, rtol=1e-5)
    torch.manual_seed(0)  # the same draws: asking for log-probs does not change the samples
    plain = generate_rollout(model, batch.input_ids, batch.attention_mask, tokenizer, settings)
    assert torch.equal(plain.sequences, out.sequences) and plain.log_probs is None
