"""Multi-turn episodes (olingo/rollout/multi_turn.py): a trajectory holds exactly the ids the
engine sampled, with the environment's replies as their chat-template deltas in between; the
masks, the limits, environment failures, the prompt-major layout, and a run on a real model."""

from __future__ import annotations

import asyncio
import copy
import os
import time

import pytest
import torch

from olingo.dataset.prompts import PromptCollator
from olingo.engines import GenerationSettings, HFEngine, rollout_from_responses
from olingo.models import load_causal_lm, load_tokenizer
from olingo.rollout import (
    Environment,
    EnvStep,
    EpisodeLimits,
    MultiTurnSource,
    PromptBatch,
    register_environment,
    resolve_environment,
)
from olingo.rollout.environment import ENVIRONMENTS, EnvironmentSpecError
from tests.test_engines import tok  # noqa: F401 - the module's tokenizer fixture

ALLOWED = EpisodeLimits(max_turns=8, max_new_tokens=64, max_episode_tokens=4096)


# ---- helpers ------------------------------------------------------------------------------
def ids_of(tok, text: str, stop: bool = True) -> list[int]:  # noqa: F811 - the imported fixture
    """`text` tokenized canonically, then the end-of-turn token."""
    return tok.encode(text, add_special_tokens=False) + ([stop_id(tok)] if stop else [])


def stop_id(tok) -> int:  # noqa: F811 - the imported fixture
    return tok.eos_token_id


def char_ids(tok, text: str) -> list[int]:  # noqa: F811 - the imported fixture
    """`text` as one token per character: a split the tokenizer would not make itself."""
    ids = [tok.encode(c, add_special_tokens=False) for c in text]
    assert all(len(i) == 1 for i in ids)
    return [i[0] for i in ids]


def batch_of(tok, prompts: list[str], fields: dict | None = None) -> PromptBatch:  # noqa: F811 - the imported fixture
    items = [
        {"input_ids": tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=False), "gt_answer": f"answer {i}"}
        for i, p in enumerate(prompts)
    ]
    batch = PromptBatch.from_collated(PromptCollator(tok.pad_token_id)(items))
    return PromptBatch(batch.input_ids, batch.attention_mask, batch.gt_answers, fields or {})


class EpisodeEngine:
    """Answers each context with the next scripted turn of the episode it continues. An episode
    is recognised by its prompt and its first turn (unique among the episodes of one prompt);
    contexts that are a bare prompt go to that prompt's first episodes in order. Log-probs are
    -token/1000, so a test can tell where they went."""

    shares_weights, can_sleep = True, False

    def __init__(self, tok, prompts: list[list[int]], scripts: list[list[list[int]]], log_probs: bool = True) -> None:  # noqa: F811
        self.tok, self.prompts, self.scripts, self.with_log_probs = tok, prompts, scripts, log_probs
        self.turns: list[list[list[int]]] = [[] for _ in scripts]
        self.calls: list[dict] = []

    def episode_of(self, context: list[int], taken: set[int]) -> int:
        for k, prompt in enumerate(self.prompts):
            if k in taken or context[: len(prompt)] != prompt:
                continue
            rest = context[len(prompt):]
            first = self.turns[k][0] if self.turns[k] else None
            if (first is None and not rest) or (first is not None and rest[: len(first)] == first):
                return k
        raise AssertionError(f"no episode continues {context}")

    def generate(self, input_ids, attention_mask, settings, n=1):
        assert n == 1
        rows, taken = [], set()
        for ids, mask in zip(input_ids, attention_mask, strict=True):
            k = self.episode_of(ids[mask.bool()].tolist(), taken)
            taken.add(k)
            turn = self.scripts[k][len(self.turns[k])]
            self.turns[k].append(turn)
            rows.append(turn[: settings.max_new_tokens])
        self.calls.append({"episodes": sorted(taken), "max_new_tokens": settings.max_new_tokens})
        width = max(len(r) for r in rows)
        responses = torch.tensor([r + [self.tok.pad_token_id] * (width - len(r)) for r in rows])
        log_probs = -responses.float() / 1000 if self.with_log_probs else None
        return rollout_from_responses(input_ids, attention_mask, responses, self.tok, settings, log_probs)


class ScriptedEnv:
    """Answers its turns with the scripted steps in order; remembers what it was given."""

    def __init__(self, steps: list[EnvStep]) -> None:
        self.steps, self.seen, self.row = steps, [], None

    def reset(self, row: dict) -> None:
        self.row = row

    def step(self, assistant: str) -> EnvStep:
        self.seen.append(assistant)
        return self.steps[len(self.seen) - 1]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def source(tok, engine, envs: list, limits: EpisodeLimits = ALLOWED, timeout: float = 30.0) -> MultiTurnSource:  # noqa: F811
    return MultiTurnSource(engine, tok, iter(envs).__next__, limits, tok.pad_token_id, step_timeout_s=timeout)


def run(tok, prompts: list[str], scripts, envs, n: int = 1, limits: EpisodeLimits = ALLOWED, timeout: float = 30.0, **settings):  # noqa: F811
    batch = batch_of(tok, prompts)
    prompt_ids = [batch.input_ids[i][batch.attention_mask[i].bool()].tolist() for i in range(batch.size) for _ in range(n)]
    engine = EpisodeEngine(tok, prompt_ids, scripts)
    sampled = source(tok, engine, envs, limits, timeout).sample(batch, GenerationSettings(max_new_tokens=settings.pop("max_new_tokens", 64), **settings), n=n)
    return sampled, engine, batch


def trajectory(sampled, row: int) -> list[int]:
    """Row `row`'s response part, without the right padding."""
    rollout = sampled.rollout
    return rollout.sequences[row, rollout.num_prompt_tokens :][rollout.attention_mask[row, rollout.num_prompt_tokens :].bool()].tolist()


def expected_delta(tok, conversation: list[dict], reply: list[dict]) -> list[int]:  # noqa: F811
    """The oracle for an environment reply's tokens: render the whole conversation with the
    reply and the next assistant header, and tokenize what follows the last sampled turn (its
    text and its end-of-turn token)."""
    full = tok.apply_chat_template(conversation + reply, add_generation_prompt=True, tokenize=False)
    last = conversation[-1]["content"] + tok.decode([stop_id(tok)], skip_special_tokens=False)
    return tok.encode(full[full.rfind(last) + len(last):], add_special_tokens=False)


@pytest.fixture(scope="module")
def smol():
    """SmolLM2's tokenizer (ChatML), converted into the session's OLINGO_HOME as tests/test_smollm2.py does."""
    from olingo.recipes.common import resolve_model_path

    try:
        return load_tokenizer(resolve_model_path("builtin:smollm2"), padding_side="left")
    except Exception as err:  # the packaged model is not installed
        pytest.skip(f"SmolLM2's tokenizer does not load: {err}")


# ---- token identity -------------------------------------------------------------------------
def check_token_identity(tok, odd_text: str) -> None:  # noqa: F811 - the imported fixture
    odd = char_ids(tok, odd_text)  # one id per character: the tokenizer encodes the decoded text otherwise
    assert tok.encode(tok.decode(odd), add_special_tokens=False) != odd
    turns = [ids_of(tok, "Let me look it up."), odd + [stop_id(tok)], ids_of(tok, "The answer is 4.")]
    replies = [user("Result: 4"), user("And again?")]
    env = ScriptedEnv([EnvStep(replies[0], reward=0.25), EnvStep(replies[1]), EnvStep([], reward=1.0, done=True)])
    sampled, _, _ = run(tok, ["What is 2+2?"], [turns], [env])
    conversation = user("What is 2+2?")
    expected = []
    for t, turn in enumerate(turns):
        expected += turn
        conversation = conversation + [{"role": "assistant", "content": tok.decode(turn, skip_special_tokens=True)}]
        if t < len(replies):
            expected += expected_delta(tok, conversation, replies[t])
            conversation = conversation + replies[t]
    assert trajectory(sampled, 0) == expected  # the sampled ids as sampled, the deltas as rendered
    assert env.seen == [tok.decode(turn, skip_special_tokens=True) for turn in turns]
    assert sampled.env_rewards.tolist() == [1.25] and sampled.info["turns_per_episode"] == 3
    # each step reward sits on the last sampled token of the turn it answered (PPO places it there)
    placed = sampled.turn_rewards[0]
    assert (placed[len(turns[0]) - 1].item(), placed[len(expected) - 1].item(), placed.sum().item()) == (0.25, 1.0, 1.25)


def test_the_trajectory_is_the_sampled_ids_and_the_template_deltas(tok):  # noqa: F811 - the imported fixture
    check_token_identity(tok, "<|end|>")  # seven characters the tokenizer reads back as one special token


@pytest.mark.slow  # converting SmolLM2 takes ~25 s once per session
def test_the_trajectory_is_exact_with_a_real_chatml_template(smol):
    check_token_identity(smol, "hello")
    # ChatML writes "\n" after <|im_end|>: the delta starts with it, the sampled turn does not hold it.
    sampled, _, _ = run(smol, ["Hi"], [[ids_of(smol, "a"), ids_of(smol, "b")]], [ScriptedEnv([EnvStep(user("c")), EnvStep([], done=True)])])
    delta = trajectory(sampled, 0)[len(ids_of(smol, "a")) : -len(ids_of(smol, "b"))]
    assert smol.decode(delta, skip_special_tokens=False) == "\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n"



# ---- masks ----------------------------------------------------------------------------------
def test_the_action_mask_is_exactly_the_sampled_tokens_and_attention_covers_the_replies(tok):  # noqa: F811
    turns = [ids_of(tok, "ab"), ids_of(tok, "cde")]
    env = ScriptedEnv([EnvStep(user("obs")), EnvStep([], done=True)])
    sampled, _, batch = run(tok, ["q", "a longer prompt"], [turns, [ids_of(tok, "z")]], [env, ScriptedEnv([EnvStep([], done=True)])])
    rollout, width = sampled.rollout, batch.input_ids.shape[1]
    delta = len(trajectory(sampled, 0)) - sum(map(len, turns))
    assert delta > 0
    row0 = [True] * len(turns[0]) + [False] * delta + [True] * len(turns[1])
    assert rollout.action_mask[0, : len(row0)].tolist() == row0 and not rollout.action_mask[0, len(row0):].any()
    assert rollout.attention_mask[0, width:].tolist() == [1] * len(row0) + [0] * (rollout.num_actions - len(row0))
    assert rollout.action_mask[1].tolist() == [True] * 2 + [False] * (rollout.num_actions - 2)
    assert torch.equal(rollout.attention_mask[:, :width], batch.attention_mask)
    # the engine's log-probs on sampled tokens, 0 on the environment's and on padding
    expected = torch.where(rollout.action_mask, -rollout.sequences[:, width:].float() / 1000, torch.zeros(()))
    assert torch.allclose(rollout.log_probs, expected)
    assert rollout.finish_reasons == ["stop", "stop"] and not rollout.truncated.any()
    assert sampled.info["sampled_tokens_per_episode"] == (sum(map(len, turns)) + 2) / 2 and sampled.info["env_tokens_per_episode"] == delta / 2
    assert {"env_seconds", "generation_seconds", "env_errors", "template_splits", "budget_ends", "truncated_episodes"} <= set(sampled.info)


# ---- limits ---------------------------------------------------------------------------------
def test_max_turns_ends_the_episode_after_the_environment_graded_the_last_turn(tok):  # noqa: F811
    turns = [ids_of(tok, "a"), ids_of(tok, "b"), ids_of(tok, "c")]
    env = ScriptedEnv([EnvStep(user("1"), reward=1.0), EnvStep(user("2"), reward=2.0), EnvStep(user("3"))])
    sampled, engine, _ = run(tok, ["q"], [turns], [env], limits=EpisodeLimits(max_turns=2, max_new_tokens=8, max_episode_tokens=512))
    assert len(engine.calls) == 2 and len(env.seen) == 2  # the second turn is graded, its reply dropped
    assert trajectory(sampled, 0)[-len(turns[1]):] == turns[1]
    assert sampled.env_rewards.tolist() == [3.0] and sampled.info["max_turns_ends"] == 1 and not sampled.rollout.truncated.any()


def test_a_turn_is_cut_at_the_smallest_of_the_per_turn_limits(tok):  # noqa: F811
    long_turn = ids_of(tok, "abcdefghij", stop=False)
    for limits, settings_cap in ((EpisodeLimits(max_turns=3, max_new_tokens=4), 64), (ALLOWED, 3)):
        env = ScriptedEnv([EnvStep(user("never"))])
        sampled, engine, _ = run(tok, ["q"], [[long_turn]], [env], limits=limits, max_new_tokens=settings_cap)
        cap = min(limits.max_new_tokens, settings_cap)
        assert engine.calls[0]["max_new_tokens"] == cap and trajectory(sampled, 0) == long_turn[:cap]
        assert env.seen == [] and sampled.rollout.truncated.tolist() == [True] and sampled.rollout.finish_reasons == ["length"]
        assert sampled.info["truncated_episodes"] == 1 and sampled.info["budget_ends"] == 0


def test_the_episode_budget_caps_turns_and_refuses_replies_that_do_not_fit(tok):  # noqa: F811
    first, second = ids_of(tok, "abc"), ids_of(tok, "defghijklmnop")
    reply = user("obs")
    steps = [EnvStep(reply), EnvStep([], done=True)]
    full, _, _ = run(tok, ["q"], [[first, second]], [ScriptedEnv(steps)])
    delta = len(trajectory(full, 0)) - len(first) - len(second)
    # room for the first turn, the reply and 5 sampled tokens: the second turn is cut there
    limits = EpisodeLimits(max_turns=4, max_new_tokens=64, max_episode_tokens=len(first) + delta + 5)
    cut, engine, _ = run(tok, ["q"], [[first, second]], [ScriptedEnv(steps)], limits=limits)
    assert engine.calls[1]["max_new_tokens"] == 5 and trajectory(cut, 0) == trajectory(full, 0)[: limits.max_episode_tokens]
    assert cut.info["budget_ends"] == 1 and cut.rollout.truncated.tolist() == [True]
    # room for the first turn and the reply but no sampled token after it: the reply is not appended
    limits = EpisodeLimits(max_turns=4, max_new_tokens=64, max_episode_tokens=len(first) + delta)
    refused, engine, _ = run(tok, ["q"], [[first, second]], [ScriptedEnv(steps)], limits=limits)
    assert len(engine.calls) == 1 and trajectory(refused, 0) == first
    assert refused.info["budget_ends"] == 1 and refused.rollout.truncated.tolist() == [True]


class RaisingEnv(ScriptedEnv):
    def step(self, assistant: str) -> EnvStep:
        raise RuntimeError("the sandbox crashed")


class SleepingEnv(ScriptedEnv):
    def step(self, assistant: str) -> EnvStep:
        time.sleep(3.0)
        return EnvStep([], reward=5.0, done=True)


class AsyncEnv:
    """Both methods async; a reply per turn until the third, which it grades."""

    def __init__(self, sleep_s: float = 0.0) -> None:
        self.sleep_s, self.turns, self.row = sleep_s, 0, None

    async def reset(self, row: dict) -> None:
        await asyncio.sleep(0)
        self.row = row

    async def step(self, assistant: str) -> EnvStep:
        await asyncio.sleep(self.sleep_s)
        self.turns += 1
        return EnvStep([], reward=1.0, done=True) if self.turns == 3 else EnvStep(user(f"turn {self.turns}"), reward=0.5)


def test_a_step_that_raises_or_times_out_ends_only_its_episode(tok):  # noqa: F811
    scripts = [[ids_of(tok, "a"), ids_of(tok, "x")], [ids_of(tok, "b")], [ids_of(tok, "c"), ids_of(tok, "d")], [ids_of(tok, "e")]]
    envs = [ScriptedEnv([EnvStep(user("o"), reward=1.0), EnvStep([], reward=1.0, done=True)]), RaisingEnv([]), SleepingEnv([]), AsyncEnv(sleep_s=5.0)]
    started = time.perf_counter()
    sampled, _, _ = run(tok, ["p0", "p1", "p2", "p3"], scripts, envs, timeout=0.3)
    assert time.perf_counter() - started < 2.5  # neither the sleeping thread nor the slow coroutine was waited for
    assert sampled.env_rewards.tolist() == [2.0, 0.0, 0.0, 0.0]
    assert sampled.info["env_errors"] == 3 and sampled.info["done_episodes"] == 1
    assert trajectory(sampled, 0)[-2:] == ids_of(tok, "x")  # the healthy episode went on


def test_call_all_keeps_its_threads_nests_and_retires_a_pool_a_call_is_stuck_in():
    """Calls run on kept pool threads, a call that makes its own `call_all` (a step calling its
    tools) gets the next depth's pool, a pool with a call past its timeout is replaced, so the
    next calls run at once instead of queueing behind the stuck one, and a forked child starts
    pools of its own (it would otherwise queue its calls on the copies, which have no threads)."""
    import threading

    from olingo.rollout.environment import _POOLS, EnvFailure, call_all

    def name() -> str:
        return threading.current_thread().name

    def nested() -> list[str]:
        return [name(), *call_all([(name, ())], 5.0)]

    first, again = call_all([(name, ())], 5.0), call_all([(name, ())], 5.0)
    assert first == again and first[0].startswith("olingo-env0")  # the same kept thread, not a new one per call
    outer, inner = call_all([(nested, ())], 5.0)[0]
    assert outer.startswith("olingo-env0") and inner.startswith("olingo-env1")
    release = threading.Event()
    pool = _POOLS.get(0)
    stuck = call_all([(release.wait, (10.0,)), (name, ())], 0.2)
    assert isinstance(stuck[0], EnvFailure) and isinstance(stuck[0].error, TimeoutError) and stuck[1].startswith("olingo-env0")
    started = time.perf_counter()
    assert call_all([(name, ())], 5.0)[0].startswith("olingo-env0") and time.perf_counter() - started < 1.0
    assert _POOLS.get(0) is not pool  # retired: its stuck thread is not in the way
    release.set()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a forked child's copies of the pools have no threads: it makes its own
        os.write(write, call_all([(name, ())], 5.0)[0].encode())
        os._exit(0)
    os.waitpid(child, 0)
    assert os.read(read, 100).decode().startswith("olingo-env0")


def test_a_step_that_returns_something_else_stops_the_run_naming_the_environment_and_row(tok):  # noqa: F811
    class DictEnv(ScriptedEnv):
        def step(self, assistant: str):
            return {"messages": [], "done": True}

    class BadMessagesEnv(ScriptedEnv):
        def step(self, assistant: str):
            return EnvStep(["just a string"])

    for bad, match in ((DictEnv([]), r"DictEnv \(row 1\).*EnvStep, got dict"), (BadMessagesEnv([]), r"BadMessagesEnv \(row 1\).*'role', 'content'")):
        with pytest.raises(ValueError, match=match):
            run(tok, ["p0", "p1"], [[ids_of(tok, "a")], [ids_of(tok, "b")]], [ScriptedEnv([EnvStep([], done=True)]), bad])


def test_a_reply_the_template_cannot_render_stops_the_run(tok):  # noqa: F811 - the tiny template knows no "tool" role
    env = ScriptedEnv([EnvStep([{"role": "tool", "content": "42"}])])
    with pytest.raises(ValueError, match=r"ScriptedEnv \(row 0\): the chat template cannot render its reply.*unknown role tool"):
        run(tok, ["p"], [[ids_of(tok, "a"), ids_of(tok, "b")]], [env])


def test_a_template_that_rewrites_earlier_turns_ends_the_episode_counted(tok):  # noqa: F811
    splitting = copy.deepcopy(tok)  # closes the last assistant turn unlike the earlier ones
    splitting.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
        "{% if m['role'] == 'assistant' and not loop.last %}<|end|>{% else %}</s>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    env = ScriptedEnv([EnvStep(user("o"), reward=0.5)])
    sampled, _, _ = run(splitting, ["p"], [[ids_of(tok, "a"), ids_of(tok, "b")]], [env])
    assert trajectory(sampled, 0) == ids_of(tok, "a") and sampled.info["template_splits"] == 1
    assert sampled.env_rewards.tolist() == [0.5] and not sampled.rollout.truncated.any()


def test_an_async_environment_runs(tok):  # noqa: F811
    scripts = [[ids_of(tok, "a"), ids_of(tok, "b"), ids_of(tok, "c")], [ids_of(tok, "d"), ids_of(tok, "e"), ids_of(tok, "f")]]
    envs = [AsyncEnv(), AsyncEnv()]
    sampled, engine, _ = run(tok, ["p0", "p1"], scripts, envs)
    assert len(engine.calls) == 3 and sampled.env_rewards.tolist() == [2.0, 2.0]
    assert envs[1].row == {"gt_answer": "answer 1"}

    async def from_async_code():  # inside a running event loop (a notebook, an async actor)
        return run(tok, ["p0"], scripts[:1], [AsyncEnv()])[0]

    assert asyncio.run(from_async_code()).env_rewards.tolist() == [2.0]


def test_a_failed_reset_still_samples_the_first_turn_then_ends(tok):  # noqa: F811
    class BadReset(ScriptedEnv):
        def reset(self, row: dict) -> None:
            raise KeyError("no such task")

    sampled, engine, _ = run(tok, ["p0", "p1"], [[ids_of(tok, "a")], [ids_of(tok, "b")]], [BadReset([]), ScriptedEnv([EnvStep([], 1.0, True)])])
    assert trajectory(sampled, 0) == ids_of(tok, "a") and sampled.info["env_errors"] == 1
    assert sampled.env_rewards.tolist() == [0.0, 1.0]


# ---- layout ---------------------------------------------------------------------------------
def test_episodes_are_prompt_major_and_right_padded_with_nothing_lost(tok):  # noqa: F811
    scripts = [
        [ids_of(tok, "one")],
        [ids_of(tok, "two"), ids_of(tok, "more text")],
        [ids_of(tok, "3"), ids_of(tok, "4"), ids_of(tok, "5")],
        [ids_of(tok, "six")],
    ]
    lengths = [1, 2, 3, 1]  # turns per episode
    envs = [ScriptedEnv([EnvStep(user("o"), reward=1.0)] * (t - 1) + [EnvStep([], reward=1.0, done=True)]) for t in lengths]
    batch = batch_of(tok, ["short", "a much longer prompt"])
    batch = PromptBatch(batch.input_ids, batch.attention_mask, ["x", "y"], {"level": [1, 2]})
    prompt_ids = [batch.input_ids[i][batch.attention_mask[i].bool()].tolist() for i in (0, 0, 1, 1)]
    engine = EpisodeEngine(tok, prompt_ids, scripts, log_probs=False)
    sampled = source(tok, engine, envs).sample(batch, GenerationSettings(max_new_tokens=16), n=2)
    rollout, width = sampled.rollout, batch.input_ids.shape[1]
    assert torch.equal(rollout.sequences[:, :width], batch.input_ids.repeat_interleave(2, dim=0)) and rollout.log_probs is None
    assert sampled.prompts.gt_answers == ["x", "x", "y", "y"] and sampled.prompts.row_fields == {"level": [1, 1, 2, 2]}
    assert [e.row for e in envs] == [{"gt_answer": "x", "level": 1}] * 2 + [{"gt_answer": "y", "level": 2}] * 2
    assert sampled.env_rewards.tolist() == [1.0, 2.0, 3.0, 1.0]
    for row, turns in enumerate(scripts):
        traj = trajectory(sampled, row)
        assert traj[: len(turns[0])] == turns[0] and traj[-len(turns[-1]):] == turns[-1]
        assert int(rollout.action_mask[row].sum()) == sum(map(len, turns))
        assert (rollout.sequences[row, width + len(traj):] == tok.pad_token_id).all()  # right-padded
    assert rollout.num_actions == max(len(trajectory(sampled, r)) for r in range(4))
    assert sampled.info["turns_per_episode"] == sum(lengths) / 4


# ---- the registry ---------------------------------------------------------------------------
def test_environments_resolve_by_name_and_by_path_with_a_did_you_mean():
    register_environment("test-scripted")(ScriptedEnv)
    try:
        assert resolve_environment("test-scripted") is ScriptedEnv
        assert resolve_environment("tests.test_multi_turn:AsyncEnv") is AsyncEnv
        assert isinstance(ScriptedEnv([]), Environment)
        with pytest.raises(EnvironmentSpecError, match="did you mean 'test-scripted'"):
            resolve_environment("test-scriptd")
        with pytest.raises(EnvironmentSpecError, match="did you mean 'AsyncEnv'"):
            resolve_environment("tests.test_multi_turn:AsyncEnvv")
        with pytest.raises(EnvironmentSpecError, match="is taken by"):
            register_environment("test-scripted")(AsyncEnv)
    finally:
        ENVIRONMENTS.pop("test-scripted", None)


# ---- a real engine --------------------------------------------------------------------------
def test_a_real_engine_runs_episodes_of_sampled_tokens(tok, assets):  # noqa: F811
    torch.manual_seed(0)
    model = load_causal_lm(str(assets.model_dir))
    calls: list[tuple[list[list[int]], list[list[int]], list[list[float]]]] = []

    class Recording(HFEngine):
        def generate(self, input_ids, attention_mask, settings, n=1):
            rollout = super().generate(input_ids, attention_mask, settings, n)
            mask, width = rollout.action_mask, rollout.num_prompt_tokens
            calls.append((
                [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask, strict=True)],
                [rollout.sequences[j, width : width + int(mask[j].sum())].tolist() for j in range(len(mask))],
                [rollout.log_probs[j, : int(mask[j].sum())].tolist() for j in range(len(mask))],
            ))
            return rollout

    envs = [ScriptedEnv([EnvStep(user("r1"), 0.1), EnvStep(user("r2"), 0.1), EnvStep([], 1.0, True)]) for _ in range(4)]
    batch = batch_of(tok, ["1+1=", "12+17="])
    settings = GenerationSettings(max_new_tokens=6, stop_token_ids=[tok.eos_token_id] + list(range(8, 80)))
    sampled = source(tok, Recording(model, tok, with_log_probs=True), envs).sample(batch, settings, n=2)
    rollout, width = sampled.rollout, batch.input_ids.shape[1]
    assert rollout.sequences.shape == (4, width + rollout.num_actions) and rollout.log_probs.shape == rollout.action_mask.shape
    trajectories = [trajectory(sampled, r) for r in range(4)]
    prompts = [batch.input_ids[i][batch.attention_mask[i].bool()].tolist() for i in (0, 0, 1, 1)]
    turns = [runs_of(rollout.action_mask[r]) for r in range(4)]  # the (start, end) of each sampled turn
    for c, (contexts, returned, log_probs) in enumerate(calls):
        live = [r for r in range(4) if len(turns[r]) > c]
        assert len(live) == len(contexts)
        for j, r in enumerate(live):
            start, end = turns[r][c]
            assert contexts[j] == prompts[r] + trajectories[r][:start]  # the context is the episode so far
            assert trajectories[r][start:end] == returned[j]  # the turn, exactly as the engine returned it
            assert torch.allclose(rollout.log_probs[r, start:end], torch.tensor(log_probs[j]))
    for r in range(4):
        ended_with_stop = [trajectories[r][end - 1] in settings.stop_token_ids for _, end in turns[r]]
        assert all(ended_with_stop[:-1])  # only the last turn of an episode may run out of tokens
        for t, ((_, end), (start, _)) in enumerate(zip(turns[r], turns[r][1:], strict=False)):
            closing = "" if trajectories[r][end - 1] == tok.eos_token_id else "</s>"
            assert tok.decode(trajectories[r][end:start], skip_special_tokens=False) == f"{closing}<|user|>r{t + 1}<|end|><|assistant|>"
        assert rollout.attention_mask[r, width : width + len(trajectories[r])].all()
    assert sum(len(t) for t in turns) == sum(len(c[0]) for c in calls) and sampled.info["turns_per_episode"] > 1


def runs_of(mask: torch.Tensor) -> list[tuple[int, int]]:
    """The (start, end) of each run of True in a 1-d bool mask."""
    runs, start = [], None
    for i, on in enumerate(mask.tolist() + [False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_the_environments_rewards_enter_the_score_with_the_sections_weight(tok):  # noqa: F811 - the imported fixture
    from olingo.recipes.online_config import EnvironmentConfig

    batch = batch_of(tok, ["q"])
    prompt = batch.input_ids[0][batch.attention_mask[0].bool()].tolist()
    turns = [ids_of(tok, "a"), ids_of(tok, "b")]
    env = ScriptedEnv([EnvStep(user("again"), reward=0.5), EnvStep([], reward=1.0, done=True)])
    section = EnvironmentConfig(name="arithmetic_retry", reward_weight=0.25)
    weighted = section.source(EpisodeEngine(tok, [prompt], [turns]), tok)
    weighted.environment_factory = lambda: env
    sampled = weighted.sample(batch, GenerationSettings(max_new_tokens=8))
    assert sampled.env_rewards.tolist() == [0.375] and sampled.turn_rewards.sum().item() == 0.375  # 0.25 x (0.5 + 1.0)
    assert sampled.info["env_reward"] == 1.5  # the metric is the environment's own sum
