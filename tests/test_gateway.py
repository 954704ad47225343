"""The agent gateway (olingo/gateway): agents written against the official `openai` client, their
requests turned into training rows token for token, history rewrites split and counted, keys
that isolate episodes, bodies that never crash the server, failed episodes dropped and counted,
and nothing left running after a rollout."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
import torch

from olingo.dataset.prompts import PromptCollator
from olingo.engines import GenerationSettings, rollout_from_responses
from olingo.gateway import AgentFailureRate, GatewayLimits, GatewaySource
from olingo.rollout import PromptBatch
from olingo.rollout.multi_turn import EnvDelta
from tests.test_engines import tok  # noqa: F401 - the module's tokenizer fixture


class ScriptEngine:
    """Answers each context with `reply(context text)` (a list of token ids, the stop token
    appended); log-probs are -token/1000. Remembers every call's contexts."""

    shares_weights, can_sleep = True, False

    def __init__(self, tok, reply) -> None:  # noqa: F811 - the imported fixture
        self.tok, self.reply, self.calls = tok, reply, []

    def generate(self, input_ids, attention_mask, settings, n=1):
        contexts = [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask, strict=True)]
        self.calls.append(contexts)
        rows = [(self.reply(self.tok.decode(c)) + [self.tok.eos_token_id])[: settings.max_new_tokens] for c in contexts]
        width = max(len(r) for r in rows)
        responses = torch.tensor([r + [self.tok.pad_token_id] * (width - len(r)) for r in rows])
        return rollout_from_responses(input_ids, attention_mask, responses, self.tok, settings, -responses.float() / 1000)


def batch_of(tok, questions: list[str], answers: list[str]) -> PromptBatch:  # noqa: F811 - the imported fixture
    messages = [[{"role": "user", "content": q}] for q in questions]
    items = [
        {"input_ids": tok.apply_chat_template(m, add_generation_prompt=True, return_dict=False), "gt_answer": a, "messages": m}
        for m, a in zip(messages, answers, strict=True)
    ]
    return PromptBatch.from_collated(PromptCollator(tok.pad_token_id)(items))


def words(tok, text: str) -> list[int]:  # noqa: F811 - the imported fixture
    return tok.encode(text, add_special_tokens=False)


def chars(tok, text: str) -> list[int]:  # noqa: F811 - the imported fixture
    """One id per character: a split the tokenizer would not make itself."""
    return [tok.encode(c, add_special_tokens=False)[0] for c in text]


SETTINGS = GenerationSettings(max_new_tokens=16)


def sample(tok, agent, reply, questions=("1+1=",), answers=("2",), n=1, split_rows=True, **limits):  # noqa: F811
    engine = ScriptEngine(tok, reply)
    source = GatewaySource(engine, tok, agent, GatewayLimits(**limits), split_rows=split_rows)
    settings = GenerationSettings(max_new_tokens=16, stop_token_ids=[tok.eos_token_id])
    return source.sample(batch_of(tok, list(questions), list(answers)), settings, n=n), engine, source


def row(sampled, k: int) -> tuple[list[int], list[int], list[bool]]:
    """Row k's prompt ids, its response ids and their action mask (padding removed)."""
    r, width = sampled.rollout, sampled.rollout.num_prompt_tokens
    real = r.attention_mask[k].bool()
    prompt = r.sequences[k, :width][real[:width]].tolist()
    length = int(real[width:].sum())
    return prompt, r.sequences[k, width : width + length].tolist(), r.action_mask[k, :length].tolist()


# ---- token identity --------------------------------------------------------------------------
async def three_turns(task, client):
    messages = list(task["messages"])
    for follow_up in ("next", "and again"):
        reply = await client.chat.completions.create(model="any", messages=messages, logprobs=True)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": follow_up}]
    last = await client.chat.completions.create(model="any", messages=messages)
    return {"reward": float(last.choices[0].message.content == "done"), "turns": 3}


def test_a_multi_turn_agent_trains_on_the_sampled_ids_and_the_template_deltas(tok):  # noqa: F811
    odd = chars(tok, "<|end|>")  # decodes to text the tokenizer reads back as one special token
    assert words(tok, tok.decode(odd)) != odd
    turns = {"next": words(tok, "fine"), "and again": words(tok, "done")}
    reply = lambda text: next((ids for cue, ids in turns.items() if text.endswith(f"{cue}<|end|><|assistant|>")), odd)  # noqa: E731
    sampled, engine, _ = sample(tok, three_turns, reply)
    prompt, response, mask = row(sampled, 0)
    delta = EnvDelta(tok, [tok.eos_token_id])
    eos = tok.eos_token_id
    expected = [*odd, eos, *delta.ids([{"role": "user", "content": "next"}], eos), *turns["next"], eos]
    expected += [*delta.ids([{"role": "user", "content": "and again"}], eos), *turns["and again"], eos]
    assert prompt == tok.apply_chat_template([{"role": "user", "content": "1+1="}], add_generation_prompt=True, return_dict=False)
    assert response == expected  # the odd turn as sampled, never re-tokenized
    sampled_ids = [odd + [eos], turns["next"] + [eos], turns["and again"] + [eos]]
    assert [i for i, m in zip(response, mask, strict=True) if m] == sum(sampled_ids, [])
    assert engine.calls[0][0] == prompt and engine.calls[1][0] == prompt + expected[: expected.index(turns["next"][0])]
    assert engine.calls[2][0] == prompt + response[: -len(sampled_ids[2])]  # each prompt extends the last token for token
    log_probs = sampled.rollout.log_probs[0, : len(response)]
    assert torch.equal(log_probs[torch.tensor(mask)], -torch.tensor(sum(sampled_ids, [])).float() / 1000)  # the engine's, where sampled
    assert sampled.env_rewards.tolist() == [1.0] and sampled.info["history_rewrites"] == 0 and sampled.info["requests_per_episode"] == 3
    assert sampled.info["agent/turns"] == 3 and sampled.turn_rewards[0, len(response) - 1] == 1.0


def test_a_sync_agent_that_rewrites_its_history_gets_a_new_segment_counted(tok):  # noqa: F811
    def rewriting(task, client):  # a plain function: an openai.OpenAI client, run in a thread
        first = client.chat.completions.create(model="m", messages=task["messages"])
        second = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "summary: " + first.choices[0].message.content}])
        return float(second.choices[0].message.content == "ok")

    reply = lambda text: words(tok, "ok" if "summary" in text else "four")  # noqa: E731
    sampled, engine, _ = sample(tok, rewriting, reply)
    prompt, response, mask = row(sampled, 0)
    second_prompt = engine.calls[1][0]
    assert response == [*words(tok, "four"), tok.eos_token_id, *second_prompt, *words(tok, "ok"), tok.eos_token_id]
    assert sampled.info["history_rewrites"] == 1 and sampled.env_rewards.tolist() == [1.0]
    positions = sampled.rollout.position_ids[0, sampled.rollout.num_prompt_tokens :]
    start = len(words(tok, "four")) + 1
    assert positions[start : start + 3].tolist() == [0, 1, 2]  # the new segment starts again at position 0
    assert positions[0].item() == len(prompt)  # the first segment goes on from its prompt

    unpacked, _, _ = sample(tok, rewriting, reply, split_rows=False)  # without packed forwards: answered, not trained
    assert unpacked.info["untrained_requests"] == 1 and row(unpacked, 0)[1] == [*words(tok, "four"), tok.eos_token_id]


def test_text_completions_extend_by_text_and_by_token_ids(tok):  # noqa: F811
    async def completing(task, client):
        first = await client.completions.create(model="m", prompt="12+17=", max_tokens=4)
        await client.completions.create(model="m", prompt="12+17=" + first.choices[0].text + " so", max_tokens=4)
        return 0.5

    sampled, engine, _ = sample(tok, completing, lambda text: chars(tok, "29"))
    prompt, response, mask = row(sampled, 0)
    assert prompt == words(tok, "12+17=") and engine.calls[1][0] == prompt + response[: len(response) - 3]
    assert response == [*chars(tok, "29"), tok.eos_token_id, *words(tok, " so"), *chars(tok, "29"), tok.eos_token_id][: len(response)]
    assert sampled.info["history_rewrites"] == 0 and sum(mask) == 6


# ---- keys, bodies, failures ---------------------------------------------------------------------
SEEN: dict = {}
VALUES = [None, 0, -1, 2, 1.5, True, "", "x", [], {}, [1], ["a"], [{}], [{"role": "user"}], {"type": "text"}, [[["deep"]]], "9" * 50]
FIELDS = ["messages", "tools", "max_tokens", "max_completion_tokens", "stop", "n", "temperature", "top_p", "logprobs", "top_logprobs",
          "tool_choice", "response_format", "stream", "presence_penalty", "logit_bias"]


def fuzzed_bodies(good: dict, count: int) -> list[dict]:
    """A valid body with one to three fields set to values of the wrong kind (seeded)."""
    import random

    rng = random.Random(0)
    return [{**good, **{rng.choice(FIELDS): rng.choice(VALUES) for _ in range(rng.randint(1, 3))}} for _ in range(count)]



def probing(task, base_url, api_key):
    """Episode 0 probes the server with foreign keys and broken bodies, then asks properly;
    episode 1 asks with episode 0's key after that episode ended."""
    def post(body, key=api_key, **kw):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(f"{base_url}/chat/completions", headers=headers, timeout=30, **({"json": body} if body is not None else kw))

    good = {"model": "m", "messages": task["messages"]}
    if task["gt_answer"] == "2":
        SEEN["key0"] = api_key
        SEEN["codes"] = [post(good, key=None).status_code, post(good, key="olingo-ep-forged").status_code]
        for body in ([], {"messages": "hi"}, {"messages": [{"role": "robot", "content": "x"}]}, {**good, "n": 2}, {**good, "stream": True},
                     {**good, "temperature": 0.3}, {**good, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
                     {**good, "tools": [{"type": "function"}]}, {**good, "max_tokens": -1}):
            SEEN["codes"].append(post(body).status_code)
        SEEN["fuzzed"] = [post(body).status_code for body in fuzzed_bodies(good, 60)]
        SEEN["codes"] += [post(None, content=b"{not json").status_code, post(None, content=b"[" * 3000).status_code]
        SEEN["codes"].append(post(None, content=b'{"messages": "' + b"x" * 5000 + b'"}').status_code)
        SEEN["models"] = httpx.get(f"{base_url}/models", headers={"Authorization": f"Bearer {api_key}"}).json()
        SEEN["finishing"] = True
        return 1.0 if post(good).status_code == 200 else -1.0
    while "key0" not in SEEN or not SEEN.get("done0"):
        time.sleep(0.01)
    for _ in range(200):  # episode 0 ends right after its last request is served
        if (late := post(good, key=SEEN["key0"]).status_code) == 401:
            break
        time.sleep(0.05)
    SEEN["late"] = late
    return 1.0 if post(good).status_code == 200 else -1.0


def test_keys_isolate_episodes_and_broken_bodies_get_4xx_without_crashing(tok):  # noqa: F811
    SEEN.clear()

    def reply(text):
        SEEN["done0"] = SEEN.get("finishing", False)  # episode 0's last request is being served: it ends next
        return words(tok, "2")

    sampled, _, source = sample(
        tok, probing, reply, questions=("1+1=", "2+2="), answers=("2", "4"), max_body_bytes=4096, max_failure_rate=1.0, timeout_s=60, lockstep=False,
    )  # window batching: episode 1 waits for episode 0's request to be served, which lockstep would wait for in turn
    assert SEEN["codes"][:2] == [401, 401]  # no key, an unknown key
    assert all(400 <= c < 500 for c in SEEN["codes"][2:]) and SEEN["codes"][-1] == 413, SEEN["codes"]
    assert set(SEEN["fuzzed"]) <= {200, 400} and 400 in SEEN["fuzzed"], SEEN["fuzzed"]  # answered or refused, never a server error
    assert SEEN["late"] == 401  # a finished episode's key
    assert SEEN["models"]["data"][0]["id"] == "policy"
    assert sampled.info["agent_bad_requests"] == 1 and sampled.dropped.tolist() == [True, False]  # the prober sent bad bodies
    assert sampled.info["bad_requests"] == len(SEEN["codes"]) - 2 + SEEN["fuzzed"].count(400)  # every 4xx but the unattributable 401s
    assert source.base_url is None


def test_failed_episodes_are_dropped_counted_and_past_the_limit_stop_the_run(tok):  # noqa: F811
    async def flaky(task, client):
        kind = task["gt_answer"]
        if kind == "raise":
            raise RuntimeError("tool server down")
        if kind == "slow":
            await asyncio.sleep(30)
        if kind == "silent":
            return 1.0
        await client.chat.completions.create(model="m", messages=task["messages"])
        return "great" if kind == "bad" else 1.0

    kinds = ("raise", "slow", "silent", "bad", "ok")
    run = dict(questions=kinds, answers=kinds, timeout_s=3.0, lockstep=False)  # lockstep would hold every request until "slow" times out
    sampled, _, _ = sample(tok, flaky, lambda t: words(tok, "x"), max_failure_rate=0.8, **run)
    assert sampled.dropped.tolist() == [True, True, True, True, False]
    counts = [sampled.info[k] for k in ("agent_errors", "agent_timeouts", "agent_silent", "agent_bad_returns", "failed_episodes")]
    assert counts == [1, 1, 1, 1, 4]
    with pytest.raises(AgentFailureRate, match=r"4 of 5 agent episodes failed .*error 1, timeout 1.*RuntimeError: tool server down"):
        sample(tok, flaky, lambda t: words(tok, "x"), max_failure_rate=0.5, **run)


def test_request_rewards_land_on_their_requests_last_sampled_token(tok):  # noqa: F811
    async def graded(task, client):
        first = await client.chat.completions.create(model="m", messages=task["messages"])
        messages = [*task["messages"], {"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "more"}]
        await client.chat.completions.create(model="m", messages=messages)
        return {"reward": 1.0, "request_rewards": {first.id: 0.25}}

    sampled, _, _ = sample(tok, graded, lambda t: words(tok, "ab"))
    _, response, _ = row(sampled, 0)
    first_end = len(words(tok, "ab"))  # its stop token
    placed = sampled.turn_rewards[0]
    assert (placed[first_end].item(), placed[len(response) - 1].item(), sampled.env_rewards.item()) == (0.25, 1.0, 1.25)


def test_nothing_is_left_listening_or_running_after_a_rollout_or_an_engine_failure(tok):  # noqa: F811
    urls = []

    async def ask(task, client):
        urls.append(str(client.base_url))
        await client.chat.completions.create(model="m", messages=task["messages"])
        return 1.0

    sample(tok, ask, lambda t: words(tok, "x"))

    def broken(text):
        raise RuntimeError("device lost")

    with pytest.raises(RuntimeError, match="device lost"):
        sample(tok, ask, broken)
    for url in urls:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0  # refused: nothing listens
    assert not [t for t in threading.enumerate() if t.name.startswith("olingo-gateway")]


def test_a_json_body_round_trips_through_the_protocol(tok):  # noqa: F811
    """logprobs in the OpenAI format: one entry per sampled token, the engine's values."""
    got = {}

    async def asking(task, client):
        reply = await client.chat.completions.create(model="m", messages=task["messages"], logprobs=True, max_tokens=3, stop=["zz"])
        got["reply"] = json.loads(reply.model_dump_json())
        return 0.0

    sample(tok, asking, lambda t: words(tok, "abcdef"))
    choice = got["reply"]["choices"][0]
    assert choice["finish_reason"] == "length" and got["reply"]["usage"]["completion_tokens"] == 3
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == pytest.approx([-t / 1000 for t in words(tok, "abcdef")[:3]])


def test_log_probs_recomputed_on_the_rows_match_the_engines(tok, assets, continued):  # noqa: F811
    """A real model through the real `openai` client: every sampled token's log-prob, recomputed by
    a packed forward over the training rows, matches the one the engine sampled it with. 1e-4:
    the same weights and contexts, batched and padded differently, later requests continuing from
    the KV cache of the ones before (float rounding only)."""
    from olingo.engines import HFEngine
    from olingo.experience_maker.scoring import action_log_probs
    from olingo.models import load_causal_lm

    torch.manual_seed(0)
    model = load_causal_lm(str(assets.model_dir))
    source = GatewaySource(HFEngine(model, tok, with_log_probs=True), tok, three_turns, GatewayLimits(max_new_tokens=6), split_rows=True)
    settings = GenerationSettings(max_new_tokens=6, stop_token_ids=[tok.eos_token_id])
    sampled = source.sample(batch_of(tok, ["1+1=", "12+17="], ["2", "29"]), settings, n=2)
    r = sampled.rollout
    assert sampled.info["requests_per_episode"] == 3.0  # each episode asks three times, whether or not a reply was cut
    recomputed = action_log_probs(model, r.sequences, r.attention_mask, r.num_actions, 1.0, packing=True, position_ids=r.position_ids)
    assert torch.allclose(recomputed[r.action_mask], r.log_probs[r.action_mask], atol=1e-4)
    assert any(continued), continued  # the second and third requests reused the first's prefill


# ---- pure parts ------------------------------------------------------------------------------
def test_requests_are_normalised_and_what_cannot_be_honoured_is_refused_by_name():
    from olingo.gateway.protocol import RequestError, Sampling, parse_chat

    run = Sampling(temperature=1.0, top_p=1.0)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                         {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "2"}], "temperature": 1.0, "max_completion_tokens": 5, "stop": "\n"}
    request = parse_chat(body, run)
    assert request.messages[0]["content"] == "ab" and request.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    assert (request.max_tokens, request.stop, request.tools) == (5, ["\n"], None)
    for change, refused in (({"temperature": 0.7}, "'temperature' is 0.7, but this run samples at temperature=1.0"), ({"n": 3}, "'n' must be 1"),
                            ({"tool_choice": "required"}, "'tool_choice'"), ({"messages": body["messages"][:2]}, "the last message is the assistant's")):
        with pytest.raises(RequestError, match=refused):
            parse_chat({**body, **change}, run)


def test_a_group_with_a_failed_episode_leaves_whole_and_ranks_keep_the_fewest():
    from olingo.experience_maker.scoring import RolloutFailure, kept_rows

    dropped = torch.tensor([False] * 4 + [False, True, False, False] + [False] * 4)
    assert kept_rows(dropped, 4, lambda kept, groups: kept) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert kept_rows(dropped, 4, lambda kept, groups: 1) == [0, 1, 2, 3]  # another rank kept one group only
    with pytest.raises(RolloutFailure, match="every group of this batch holds a failed episode"):
        kept_rows(torch.ones(8, dtype=torch.bool), 4, lambda kept, groups: kept)
