"""The CPU thread policy (olingo/threads.py): the decision by hand cases, the user's environment winning,
the wait variables set before torch loads, and `run.threads` applied by the command."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from olingo.threads import AUTO_SPIN_COUNT, decide, settings_from_argv

SPIN = {"GOMP_SPINCOUNT": str(AUTO_SPIN_COUNT)}  # what run.omp_wait=auto sets


def test_auto_keeps_torchs_own_count_whatever_the_load():
    """Never a count read from the load: it would change a seeded run's numbers with the machine's state."""
    choice = decide("auto", "auto", environ={})
    assert (choice.threads, choice.env) == (None, SPIN)
    assert choice.reason == "run.threads=auto: torch's default; run.omp_wait=auto"


@pytest.mark.parametrize(("wait", "env"), [("auto", SPIN), ("active", {"OMP_WAIT_POLICY": "ACTIVE"}), ("passive", {"OMP_WAIT_POLICY": "PASSIVE"})])
def test_a_configured_count_and_wait_policy_are_taken_as_given(wait, env):
    choice = decide(3, wait, environ={})
    assert (choice.threads, choice.env) == (3, env)
    assert f"run.threads=3; run.omp_wait={wait}" == choice.reason


@pytest.mark.parametrize("name", ["OMP_WAIT_POLICY", "GOMP_SPINCOUNT"])
def test_the_users_environment_wins_over_the_config(name):
    choice = decide(4, "active", environ={"OMP_NUM_THREADS": "2", name: "7"})
    assert choice.threads is None and choice.env == {}  # torch takes OMP_NUM_THREADS itself; libgomp the wait variable
    assert choice.reason == f"OMP_NUM_THREADS=2 from the environment; {name}=7 from the environment"


def test_the_command_line_is_read_without_torch(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("run: {threads: 3, omp_wait: passive}\n")
    assert settings_from_argv(["grpo", "--config", str(config)]) == (3, "passive")
    assert settings_from_argv(["grpo", f"--config={config}", "run.threads=1"]) == (1, "passive")  # an override beats the file
    assert settings_from_argv(["grpo", "run.threads=0", "run.omp_wait=spin"]) == ("auto", "auto")  # invalid: the config refuses it later
    assert settings_from_argv(["grpo", "--config", str(tmp_path / "missing.yaml")]) == ("auto", "auto")


@pytest.mark.slow
def test_the_cli_start_sets_the_wait_policy_before_torch_is_imported():
    code = ("import os, sys; from olingo.cli.main import main; from olingo.threads import prepare; "
            "c = prepare(['grpo', 'run.omp_wait=passive']); "
            "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["PASSIVE", "False"]


@pytest.mark.slow  # imports the GRPO recipe (torch, transformers): seconds in a fresh process
def test_run_threads_is_applied_by_the_command(monkeypatch, caplog, capsys):
    """The count is set before the handler runs, so `--check` (load the config, run nothing) shows it."""
    import torch

    from olingo.cli.main import main

    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)  # restored after the test, as is the thread count below
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="olingo.threads"):
            assert main(["grpo", "run.threads=1", "run.omp_wait=passive", "--check"]) == 0
        assert torch.get_num_threads() == 1
        assert "threads: 1" in capsys.readouterr().out  # the resolved config it printed
        assert "CPU threads: 1, OMP_WAIT_POLICY PASSIVE" in caplog.text and "(run.threads=1; run.omp_wait=passive)" in caplog.text
    finally:
        torch.set_num_threads(before)
