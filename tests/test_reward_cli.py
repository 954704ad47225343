"""Reward functions of one's own from the CLI: `package.module:function` specs beside registered
names, each term logged as `rollout/reward/<name>`; a function that raises, returns NaN or the
wrong number of values stops the run with a message naming it and the row."""

from __future__ import annotations

import math
import textwrap

import pytest

from olingo.cli.main import main
from tests.conftest import read_jsonl, user_package

pytestmark = pytest.mark.slow

REWARDS = '''
from olingo.rewards import batched
from olingo.tasks.arithmetic import is_correct


@batched
def exact(prompts, responses, gt_answers, **row_fields):
    return [1.0 if is_correct(r, g) else 0.0 for r, g in zip(responses, gt_answers)]


def raises(prompt, response, gt_answer):
    raise KeyError("no verifier for this prompt")


def nan(prompt, response, gt_answer):
    return float("nan")


@batched
def short(prompts, responses, gt_answers):
    return [0.0]
'''


@pytest.fixture()
def my_pkg(tmp_path, monkeypatch):
    return user_package(tmp_path, "my_pkg", "rewards", textwrap.dedent(REWARDS), monkeypatch)


def ppo_args(out, functions: str) -> list[str]:
    return [
        "ppo", f"run.output_dir={out}", "run.name=rewards", "loop.episodes=2", "loop.rollout_batch_size=8",
        "loop.train_batch_size=8", "loop.eval_interval=0", "loop.save_interval=0", "generation.max_new_tokens=3",
        "data.eval_prompts=[]", "logging.progress=false", f"reward.functions={functions}",
    ]


def test_module_function_and_registered_name_sum_and_log_each_term(my_pkg, tmp_path):
    assert main(ppo_args(tmp_path, "{my_pkg.rewards:exact: 1.0, arithmetic_format: 0.1}")) == 0
    # rollout metrics sit on the row of each rollout's first optimizer step (docs/runs.md)
    rows = [r for r in read_jsonl(tmp_path / "rewards" / "metrics.jsonl") if r["split"] == "train" and "rollout/reward_mean" in r]
    assert rows
    for row in rows:
        exact, fmt = row["rollout/reward/my_pkg.rewards:exact"], row["rollout/reward/arithmetic_format"]
        assert 0.0 <= exact <= 1.0 and 0.0 <= fmt <= 1.0
        assert math.isclose(row["rollout/reward_mean"], exact + 0.1 * fmt, rel_tol=1e-5, abs_tol=1e-6)


@pytest.mark.parametrize(
    "spec, fragments",
    [
        ("my_pkg.rewards:raises", ["reward function 'my_pkg.rewards:raises' raised on row 0 (prompt '", "KeyError", "no verifier"]),
        ("my_pkg.rewards:nan", ["reward function 'my_pkg.rewards:nan' returned nan for row 0 (prompt '", "rewards must be finite"]),
        ("my_pkg.rewards:short", ["reward function 'my_pkg.rewards:short' returned 1 values for 8 rows"]),
        ("my_pkg.rewards:exat", ["'my_pkg.rewards' has no attribute 'exat' (did you mean 'exact'?)"]),
    ],
)
def test_a_broken_reward_function_is_one_line_naming_it(my_pkg, tmp_path, capsys, spec, fragments):
    assert main(ppo_args(tmp_path, f"{{{spec}: 1.0}}")) == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("olingo: "))
    for fragment in fragments:
        assert fragment in err, err[-2000:]
    assert "Traceback (most recent call last)" not in err and line
