"""The agent gateway's guards (docs/agents.md, "Train an existing agent"): a hung plain-function
agent does not hold the process's exit; a prompt past the model's context gets a 400
`context_length_exceeded` with the lengths, and a tool prompt too long for it is warned of; tool
results rendered in `agent.result_role`; a non-loopback `agent.host` refused unless allowed; an
`agent.function` naming nothing says so; the first failure of each kind is logged with its row."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
import time
from types import SimpleNamespace

import openai
import pytest

from olingo.engines import GenerationSettings
from olingo.gateway import AgentSection, AgentSpecError, GatewayLimits, GatewaySource
from tests.conftest import olingo_cmd, read_jsonl
from tests.test_engines import tok  # noqa: F401 - the module's tokenizer fixture
from tests.test_gateway import ScriptEngine, batch_of, sample, words

LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "look a word up", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
LOG = "olingo.gateway.source"


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG and r.levelno == logging.WARNING]


def tiny_args(tmp_path, name: str, actor: str, *extra: str) -> list[str]:
    return [
        "grpo", "--config", "grpo_tiny.yaml", f"run.output_dir={tmp_path}", f"run.name={name}", "logging.progress=false", f"model.actor={actor}",
        "loop.episodes=1", "loop.rollout_batch_size=4", "loop.train_batch_size=16", "loop.update_steps=1", "loop.save_interval=0",
        "loop.eval_interval=0", "data.eval_prompts=[]", "experience.num_generations=4", "reward.functions={}", "agent.max_new_tokens=4", *extra,
    ]


# ---- a hung plain-function agent -------------------------------------------------------------
_HANG = {"lock": threading.Lock(), "hung": False}


def hanging_once(task, client):
    """A plain-function agent whose first episode in the process hangs far past any timeout."""
    client.chat.completions.create(model="m", messages=task["messages"], max_tokens=4)
    with _HANG["lock"]:
        hang, _HANG["hung"] = not _HANG["hung"], True
    if hang:
        time.sleep(600)
    return 1.0


@pytest.mark.slow
def test_a_run_whose_sync_agent_hangs_exits_within_seconds_of_training_end(tmp_path, assets):
    """The hung episode times out after 3 s and is dropped with its group; the run trains on the
    rest and the process exits: at most 30 s (generous: a loaded 2-core machine) after the
    last file of the run directory is written, never the 600 s the agent sleeps."""
    args = tiny_args(tmp_path, "hung", str(assets.model_dir), "agent.function=tests.test_gateway_robust:hanging_once", "agent.timeout_s=3",
                     "agent.max_failure_rate=1.0")
    out = subprocess.run(olingo_cmd(*args), capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONPATH": os.getcwd()})
    ended = time.time()
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "hung"
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] == "train"]
    assert rows and rows[0]["rollout/agent_timeouts"] == 1
    last_write = max(p.stat().st_mtime for p in run_dir.rglob("*") if p.is_file())
    assert ended - last_write < 30, f"the process exited {ended - last_write:.0f} s after its last write"


# ---- the model's context ---------------------------------------------------------------------
def test_a_prompt_past_the_context_gets_a_400_with_its_lengths_and_a_long_tool_prompt_is_warned_of(tok, caplog):  # noqa: F811
    got = {}

    async def agent(task, client):
        try:
            await client.chat.completions.create(model="m", messages=task["messages"], tools=[LOOKUP])
        except openai.BadRequestError as err:
            got["tools"] = err
        long = [{"role": "user", "content": "9" * 245}]  # 249 tokens rendered, of the tiny model's 256
        try:
            await client.chat.completions.create(model="m", messages=long, max_tokens=12)
        except openai.BadRequestError as err:
            got["max_tokens"] = err
        got["fits"] = (await client.chat.completions.create(model="m", messages=long)).usage  # no max_tokens: sampled within the context
        return 1.0

    caplog.set_level(logging.WARNING, logger=LOG)
    sampled, engine, source = sample(tok, agent, lambda text: words(tok, "abcdefghijklmnop"))
    assert source.context == tok.model_max_length == 256
    for err in (got["tools"], got["max_tokens"]):
        assert err.status_code == 400 and err.code == "context_length_exceeded", err
    rendered = int(re.search(r"maximum context length is 256 tokens, but the request needs \d+: (\d+) in the rendered prompt", got["tools"].message)[1])
    assert rendered > 256
    assert "needs 261: 249 in the rendered prompt (chat template and tools included) and 12 to sample (max_tokens)" in got["max_tokens"].message
    assert (got["fits"].prompt_tokens, got["fits"].completion_tokens) == (249, 7)  # cut to the 7 tokens the context leaves
    assert len(engine.calls) == 1 and len(engine.calls[0][0]) == 249
    assert sampled.info["context_refusals"] == 2 and sampled.dropped.tolist() == [False]  # a refusal the agent handled: no failure
    warned = warnings_of(caplog)
    assert any(re.search(r"the tool prompt of a single empty tool renders to \d+ tokens .* more than the model's context of 256", w) for w in warned)
    assert sum("the tools [lookup] renders to" in w and "will be refused (400 context_length_exceeded)" in w for w in warned) == 1


def test_the_context_is_the_engines_then_the_models_then_the_tokenizers(tok):  # noqa: F811
    from olingo.gateway.source import context_limit

    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512))
    assert context_limit(SimpleNamespace(_max_model_len=128, model=model), tok) == 128  # vLLM's max_model_len
    assert context_limit(SimpleNamespace(model=SimpleNamespace(module=model)), tok) == 512  # a wrapped policy's positions
    assert context_limit(object(), tok) == 256
    assert context_limit(object(), SimpleNamespace(model_max_length=int(1e30))) is None  # transformers' "unlimited"


# ---- the result role -------------------------------------------------------------------------
class LongContextEngine(ScriptEngine):
    max_model_len = 4096


def test_tool_results_are_rendered_in_the_result_role_and_the_tool_prompt_names_it(tok):  # noqa: F811
    async def with_a_tool_result(task, client):
        call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
        messages = [*task["messages"], {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "RESULT-42"}]
        await client.chat.completions.create(model="m", messages=messages, tools=[LOOKUP])
        return 1.0

    engine = LongContextEngine(tok, lambda text: words(tok, "ok"))
    source = GatewaySource(engine, tok, with_a_tool_result, GatewayLimits(), split_rows=True)  # result_role auto: user on this template
    settings = GenerationSettings(max_new_tokens=8, stop_token_ids=[tok.eos_token_id])
    sampled = source.sample(batch_of(tok, ["1+1="], ["2"]), settings)
    assert source.result_role == "user" and sampled.dropped.tolist() == [False]
    context = tok.decode(engine.calls[0][0])
    assert "<|user|>RESULT-42<|end|><|assistant|>" in context
    assert "Each result comes back in a user message." in context and "tool message" not in context

    with pytest.raises(AgentSpecError, match=r"^agent.result_role=tool, but the policy's chat template has no tool role .*set agent.result_role: user"):
        GatewaySource(engine, tok, with_a_tool_result, GatewayLimits(result_role="tool"))
    assert AgentSection(result_role="auto").check_tokenizer(tok) == "user"


def test_result_role_tool_on_a_template_without_one_exits_2_in_one_line(tmp_path, assets, capsys):
    from olingo.cli.main import main

    args = tiny_args(tmp_path, "role", str(assets.model_dir), "agent.function=olingo.gateway.examples:retry_arithmetic", "agent.result_role=tool")
    assert main(args) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("olingo:")]
    assert len(lines) == 1 and "set agent.result_role: user" in lines[0], lines
    assert not (tmp_path / "role").exists()  # stopped before anything is written


# ---- the host, the function --------------------------------------------------------------------
def test_a_remote_host_is_refused_unless_allowed_and_then_warned_of(tok, caplog):  # noqa: F811
    from olingo.config import ConfigError, load_config, packaged_config
    from olingo.recipes.grpo import GRPOConfig

    base, agent = packaged_config("grpo_tiny.yaml"), "agent.function=olingo.gateway.examples:calculator"
    with pytest.raises(ConfigError, match=r"agent.host=0.0.0.0 is not a loopback address: .*set agent.allow_remote: true"):
        load_config(GRPOConfig, base, [agent, "agent.host=0.0.0.0"])
    assert load_config(GRPOConfig, base, [agent, "agent.host=0.0.0.0", "agent.allow_remote=true"]).agent.allow_remote
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        assert AgentSection(host=host).host == host
    engine = ScriptEngine(tok, lambda text: words(tok, "ok"))
    with pytest.raises(AgentSpecError, match="agent.host=10.1.2.3 is not a loopback address"):
        GatewaySource(engine, tok, hanging_once, GatewayLimits(host="10.1.2.3"))
    caplog.set_level(logging.WARNING, logger=LOG)
    GatewaySource(engine, tok, hanging_once, GatewayLimits(host="0.0.0.0", allow_remote=True))
    assert any("agent.host=0.0.0.0 (agent.allow_remote): the gateway endpoint is open to other machines" in w for w in warnings_of(caplog))


def test_the_cli_check_refuses_a_remote_host_and_a_function_the_module_lacks(capsys):
    from olingo.cli.main import main

    for override, said in (("agent.host=0.0.0.0", "agent.allow_remote: true"),
                            ("agent.function=olingo.gateway.examples:retry_arithmetc", "module 'olingo.gateway.examples' has no attribute "
                             "'retry_arithmetc', so it is not a function (did you mean 'retry_arithmetic'?)")):
        agent = "agent.function=olingo.gateway.examples:calculator"
        assert main(["grpo", "--check", agent, override]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
        assert sum(said in line for line in err.splitlines()) == 1


# ---- the agent's own failures ------------------------------------------------------------------
def test_each_kind_of_failure_is_logged_once_with_its_count_row_class_and_message(tok, caplog):  # noqa: F811
    async def failing(task, client):
        await client.chat.completions.create(model="m", messages=task["messages"])
        kind = task["gt_answer"]
        if kind == "key":
            raise KeyError("answer")
        if kind == "value":
            raise ValueError("no  number\nin the reply")
        return "great" if kind == "str" else 1.0

    caplog.set_level(logging.WARNING, logger=LOG)
    kinds = ("ok", "key", "key", "value", "str", "str")
    sampled, _, _ = sample(tok, failing, lambda text: words(tok, "x"), questions=kinds, answers=kinds, max_failure_rate=1.0, lockstep=False)
    assert sampled.dropped.tolist() == [False] + [True] * 5
    warned = [w for w in warnings_of(caplog) if w.startswith("agent tests.test_gateway_robust:")]
    name = "agent tests.test_gateway_robust:test_each_kind_of_failure_is_logged_once_with_its_count_row_class_and_message.<locals>.failing"
    assert len(warned) == 3, warned  # one per kind: KeyError, ValueError, a str returned
    assert warned[0].startswith(f"{name}: failed with KeyError in 2 of 6 episodes (dropped with their groups, counted in rollout/agent_errors); "
                                "the first, prompt 1 of the batch, episode 1: KeyError: 'answer' (at test_gateway_robust.py:")
    assert "failed with ValueError in 1 of 6 episodes" in warned[1] and "episode 3: ValueError: no number in the reply (at " in warned[1]
    assert warned[2].startswith(f"{name}: returned str instead of a reward in 2 of 6 episodes (dropped with their groups, counted in "
                                "rollout/agent_bad_returns); the first, prompt 4 of the batch, episode 4: expected a finite number")
