"""A callback's configuration is checked with the config, before any model loads: an unknown
kind, a misspelt or out-of-range parameter or a missing path is one problem line and exit
status 2, with no run directory written (docs/callbacks.md, docs/errors.md)."""

from __future__ import annotations

import subprocess
from typing import Annotated

import pytest
from pydantic import Field

from olingo.cli.main import main
from olingo.errors import OlingoError
from olingo.trainer.callbacks import Callback, CallbackError, build_callback, check_callback_spec
from olingo.trainer.callbacks import registry as registry_module
from olingo.trainer.callbacks.builtin import EarlyStopping, RewardMonitor
from tests.conftest import olingo_cmd

TRACEBACK = "Traceback (most recent call last)"
MISSING_RM = "/nonexistent/olingo-test/no_such_rm"


def grpo_args(out, *extra: str) -> list[str]:
    return ["grpo", "--config", "grpo_tiny.yaml", f"run.output_dir={out}", "run.name=watched", "logging.progress=false", *extra]


def monitor(params: str) -> str:
    return f"callbacks=[{{kind: reward_monitor, params: {params}}}]"


# (override, fragments of the one problem line)
CLI_CASES = {
    "gold-reward-model-missing": (monitor(f"{{gold: ['reward_model:{MISSING_RM}']}}"), ["parameter 'gold'", f"reward model '{MISSING_RM}' does not exist"]),
    "misspelt-parameter": (monitor("{tolerence: 0.1}"), ["has no parameter 'tolerence' (did you mean 'tolerance'?)"]),
    "out-of-range": (monitor("{tolerance: -1}"), ["parameter 'tolerance'", "greater than or equal to 0", "(got -1)"]),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_a_bad_callback_stops_the_cli_before_any_model_loads(case, tmp_path, capsys, monkeypatch):
    from olingo.recipes import grpo as recipe

    monkeypatch.setattr(recipe, "load_models", lambda *a, **k: pytest.fail("a model was loaded before the callbacks were checked"))
    override, fragments = CLI_CASES[case]
    assert main(grpo_args(tmp_path, override)) == 2
    err = capsys.readouterr().err
    assert TRACEBACK not in err
    problems = [line for line in err.splitlines() if line.startswith("  callbacks.0: ")]
    assert len(problems) == 1 and err.count("olingo: ") == 1, err
    for fragment in fragments:
        assert fragment in problems[0], problems[0]
    assert not (tmp_path / "watched").exists()  # nothing written


@pytest.mark.slow
def test_a_missing_gold_reward_model_exits_2_through_the_command(tmp_path):
    """The user's case, as typed: `olingo grpo` with a monitor whose held-out reward model does
    not exist exits 2 with the problem named, no traceback and no run directory."""
    run = subprocess.run(olingo_cmd(*grpo_args(tmp_path, monitor(f"{{gold: ['reward_model:{MISSING_RM}']}}"))),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert TRACEBACK not in run.stderr and f"reward model '{MISSING_RM}' does not exist" in run.stderr
    assert not (tmp_path / "watched").exists()


# ---- every built-in with parameters: the same check, without building anything ----------------
@pytest.mark.parametrize(
    "kind, params, fragment",
    [
        ("early_stopping", {"metric": "eval/loss", "patience": 0}, "parameter 'patience': Input should be greater than or equal to 1"),
        ("early_stopping", {"metric": "eval/loss", "min_delta": -0.1}, "parameter 'min_delta'"),
        ("print_progress", {"every": 0}, "parameter 'every'"),
        ("progress", {"mininterval": -1}, "parameter 'mininterval'"),
        ("rollout_samples", {"num_samples": -1}, "parameter 'num_samples'"),
        ("performance", {"ignore_episodes": -2}, "parameter 'ignore_episodes'"),
        ("debug_logger", {"level": "loud"}, "parameter 'level': unknown logging level 'loud'"),
        ("reward_monitor", {"min_evals": 2}, "parameter 'min_evals'"),
        ("reward_monitor", {"length_threshold": 0}, "parameter 'length_threshold'"),
        ("reward_monitor", {"patience": 0}, "parameter 'patience'"),
        ("reward_monitor", {"gold": ["arithmetic_exct"]}, "unknown reward function 'arithmetic_exct'"),
        ("reward_monitor", {"gold": ["reward_model:"]}, "names no reward-model directory"),
        ("jsonl_metrics", {"pth": "x.jsonl"}, "has no parameter 'pth' (did you mean 'path'?)"),
        ("reward_monitr", {}, "unknown callback kind 'reward_monitr' (did you mean 'reward_monitor'?)"),
    ],
)
def test_every_builtin_refuses_bad_parameters_in_one_line(kind, params, fragment):
    with pytest.raises(CallbackError) as info:
        check_callback_spec({"kind": kind, "params": params})
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, OlingoError)  # the CLI prints it as one line, exit status 2


def test_a_gold_reward_model_that_exists_passes(tmp_path):
    rm = tmp_path / "rm"
    rm.mkdir()
    _, params = check_callback_spec({"kind": "reward_monitor", "params": {"gold": [f"reward_model:{rm}"], "tolerance": 0.1}})
    assert params == {"gold": [f"reward_model:{rm}"], "tolerance": 0.1}


def test_built_in_constructors_apply_the_same_checks_in_python():
    with pytest.raises(CallbackError, match="EarlyStopping: parameter 'patience'"):
        EarlyStopping("eval/loss", patience=0)
    with pytest.raises(CallbackError, match=f"RewardMonitor: parameter 'gold': reward model '{MISSING_RM}' does not exist"):
        RewardMonitor(gold=[f"reward_model:{MISSING_RM}"])
    assert EarlyStopping("eval/acc", patience=2, mode="max").patience == 2


# ---- a user's own callback ------------------------------------------------------------------------
class Strict(Callback):
    built = 0

    def __init__(self, every: Annotated[int, Field(ge=1)] = 1, name: str = "x") -> None:
        Strict.built += 1
        if name == "bad":
            raise ValueError("name must not be 'bad'")
        if name == "typed":
            raise TypeError("name 'typed' is not allowed")
        if name == "bug":
            raise RuntimeError("a bug in the callback")
        self.every, self.name = every, name


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    registry_module.register_callback("strict_test")(Strict)
    Strict.built = 0
    return Strict


def test_a_user_callback_annotations_are_checked_without_building_it(strict):
    with pytest.raises(CallbackError, match=r"callback 'strict_test': parameter 'every': .*greater than or equal to 1 \(got 0\)"):
        check_callback_spec({"kind": "strict_test", "params": {"every": 0}})
    assert strict.built == 0


@pytest.mark.parametrize("name, raised", [("bad", "name must not be 'bad'"), ("typed", "name 'typed' is not allowed")])
def test_a_user_constructor_refusing_its_parameters_is_a_one_line_user_error(strict, name, raised):
    with pytest.raises(CallbackError) as info:
        build_callback({"kind": "strict_test", "params": {"name": name}})
    message = str(info.value)
    assert message == f"callback 'strict_test' ({__name__}.Strict) refused its parameters: {raised}"
    assert isinstance(info.value.__cause__, ValueError | TypeError)  # --debug shows where it raised


def test_any_other_constructor_error_stays_a_bug_with_its_traceback(strict):
    with pytest.raises(RuntimeError, match="a bug in the callback"):
        build_callback({"kind": "strict_test", "params": {"name": "bug"}})
