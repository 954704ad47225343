"""The `environment:` section (olingo/recipes/online_config.py): the built-in `tools`
environment named from a YAML config and checked when the config loads, and environments
chosen per prompt row by its `environment` field."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from olingo.cli.main import main
from olingo.config import load_config
from olingo.engines import GenerationSettings
from olingo.recipes.grpo import GRPOConfig
from olingo.recipes.online import environment_source
from olingo.recipes.online_config import EnvironmentConfig
from olingo.rollout.environment import EnvironmentSpecError, EnvStep
from tests.test_engines import tok  # noqa: F401 - the module's tokenizer fixture
from tests.test_multi_turn import EpisodeEngine, batch_of, ids_of

BUILT: list[tuple[str, str | None]] = []  # (class, gt_answer) of each environment reset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


class Plain:
    """Ends every episode at its first step; records its resets in BUILT."""

    def reset(self, row: dict) -> None:
        BUILT.append((type(self).__name__, row["gt_answer"]))

    def step(self, assistant: str) -> EnvStep:
        return EnvStep(done=True)


class Other(Plain):
    """A second environment, told apart by its class name."""


def write_yaml(tmp_path, environment: dict) -> str:
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps({"environment": environment}))  # JSON is YAML
    return str(path)


TOOLS = "tests.test_agent_config:add"


# ---- tools named in the config -------------------------------------------------------------
def test_a_yaml_config_names_tools_a_reward_and_the_tool_options(tmp_path):
    params = {"tools": [TOOLS], "reward": "exact_match", "call_timeout_s": 5, "max_calls_per_turn": 2, "result_role": "user"}
    cfg = load_config(GRPOConfig, write_yaml(tmp_path, {"name": "tools", "params": params}))
    env = cfg.environment.catalog().factory()()
    assert (env.call_timeout_s, env.max_calls_per_turn, env.max_invalid_calls, list(env.tools)) == (5, 2, 2, ["add"])
    env.reset({"gt_answer": "5"})
    called = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
    assert called.messages == [{"role": "user", "content": "5", "name": "add"}] and not called.done
    assert env.step(" 5 ") == EnvStep([], reward=1.0, done=True)  # exact_match, as reward.functions call it
    assert env.step("6").reward == 0.0


@pytest.mark.parametrize(("params", "message"), [
    ({"tools": [TOOLS], "max_calls": 2}, "environment.params.max_calls: the tools environment takes no parameter 'max_calls'"),
    ({"tools": ["tests.test_agent_config:ad"]}, "environment.params.tools[0]: 'tests.test_agent_config' has no function 'ad' (did you mean 'add'?)"),
    ({"tools": [TOOLS], "reward": "exact_mach"}, "environment.params.reward: unknown reward function 'exact_mach' (did you mean 'exact_match'?)"),
    ({"tools": [TOOLS], "call_timeout_s": 0}, "environment.params.call_timeout_s: Input should be greater than 0, got 0"),
    ({"tools": ["json:dumps"]}, "environment.params.tools: tool 'dumps' has no usable schema"),
])
def test_a_wrong_tools_param_is_a_one_line_error_when_the_config_loads(tmp_path, capsys, params, message):
    """Through the CLI: exit status 2 before any model or data loads, the field named."""
    assert main(["grpo", "--config", write_yaml(tmp_path, {"name": "tools", "params": params})]) == 2
    problems = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  ")]
    assert len(problems) == 1 and message in problems[0]


def test_other_environments_params_are_checked_against_their_constructor():
    with pytest.raises(ValueError, match=r"environment.params.level: RetryArithmetic takes no parameter 'level'"):
        EnvironmentConfig(name="arithmetic_retry", params={"level": 2})
    with pytest.raises(ValueError, match=r"environment.choices.calc.params.tools: Field required"):
        EnvironmentConfig(name="arithmetic_retry", choices={"calc": {"name": "tools"}})


def test_the_docs_config_example_loads_and_its_tools_run(tmp_path, monkeypatch):
    """docs/agents.md's YAML and its my_tools.py, as written there."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "agents.md").read_text()
    section = page.split("### Tools and per-row environments in a config file", 1)[1]
    yaml_text = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    tools_code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "my_tools.py").write_text(tools_code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_tools", raising=False)
    (tmp_path / "agent.yaml").write_text(yaml_text)
    catalog = load_config(GRPOConfig, tmp_path / "agent.yaml").environment.catalog()
    assert type(catalog.factory()()).__name__ == "RetryArithmetic"
    calc = catalog.factory("calc")()
    assert list(calc.tools) == ["add", "multiply"] and calc.result_role == "user"
    calc.reset({"gt_answer": "391"})
    assert calc.step('<tool_call>{"name": "multiply", "arguments": {"a": 17, "b": 23}}</tool_call>').messages[0]["content"] == "391"
    assert calc.step("391").reward == 1.0


# ---- environments chosen per row ----------------------------------------------------------
def test_each_row_gets_the_environment_its_field_names(tok):  # noqa: F811 - the imported fixture
    cfg = EnvironmentConfig(name="tests.test_agent_config:Plain", choices={"other": {"name": "tests.test_agent_config:Other"}})
    batch = batch_of(tok, ["p0", "p1", "p2"], {"environment": [None, "other", "tests.test_agent_config:Plain"]})
    prompts = [batch.input_ids[i][batch.attention_mask[i].bool()].tolist() for i in range(3) for _ in range(2)]
    engine = EpisodeEngine(tok, prompts, [[ids_of(tok, c)] for c in "abcdef"])
    BUILT.clear()
    sampled = cfg.source(engine, tok).sample(batch, GenerationSettings(max_new_tokens=8), n=2)
    assert sampled.info["done_episodes"] == 6
    assert sorted(BUILT) == [("Other", "answer 1")] * 2 + [("Plain", "answer 0")] * 2 + [("Plain", "answer 2")] * 2


def test_a_row_naming_an_unknown_environment_is_a_one_line_error_naming_it(tmp_path, tok):  # noqa: F811
    data = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "1+1", "gt_answer": "2"}, {"prompt": "2+2", "gt_answer": "4", "environment": "arithmetic_rety"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(GRPOConfig, None, ["environment.name=arithmetic_retry", f"data.prompts=[{data}]", "data.eval_prompts=[]"])
    with pytest.raises(EnvironmentSpecError) as raised:
        environment_source(cfg, EpisodeEngine(tok, [], []), None, tok)  # before any training
    assert str(raised.value).startswith(f"{data}, row 2: field 'environment': unknown environment 'arithmetic_rety' (did you mean 'arithmetic_retry'?)")
    assert "\n" not in str(raised.value)
    # Rows that reach a source some other way are checked when their episodes start.
    batch = batch_of(tok, ["p0", "p1"], {"environment": [None, "arithmetic_rety"]})
    with pytest.raises(EnvironmentSpecError, match=r"^prompt row 1 of the batch, field 'environment': unknown environment 'arithmetic_rety' \(did you mean"):
        cfg.environment.source(EpisodeEngine(tok, [], []), tok).sample(batch, GenerationSettings(max_new_tokens=8))
