"""`olingo demo --pipeline distill` (olingo/cli/demo_distill.py): SFT, the GRPO teacher, the student
distilled on-policy with no reward, and the table comparing them, shortened."""

from __future__ import annotations

import math

import pytest

from tests.conftest import read_jsonl

QUIET = ["logging.progress=false", "loop.eval_interval=0", "loop.save_interval=0"]


@pytest.mark.slow
def test_the_distill_demo_runs_its_stages_and_prints_its_table(tmp_path, assets, capsys):
    from olingo.cli.demo_distill import MODELS, run_distill_demo

    result = run_distill_demo(
        str(tmp_path), sft_overrides=["train.epochs=1", "logging.progress=false"], grpo_overrides=["loop.episodes=2", *QUIET],
        distill_overrides=["loop.episodes=2", *QUIET],
    )
    assert set(result.sampled) == set(result.greedy) == set(MODELS)
    assert abs(result.sampled["teacher"]["kl"]) < 1e-9  # the teacher against itself: one model, one forward path
    assert all(math.isfinite(result.sampled[m]["kl"]) and 0 <= result.sampled[m]["accuracy"] <= 1 for m in MODELS)
    rows = [r for r in read_jsonl(tmp_path / "demo-distill" / "metrics.jsonl") if r["split"] == "train"]
    rollouts = [r for r in rows if any(k.startswith("rollout/") for k in r)]  # each episode's first step (docs/runs.md)
    assert rollouts and all("rollout/teacher_kl" in r and "rollout/reward/arithmetic_exact" not in r for r in rollouts)  # the teacher alone
    printed = capsys.readouterr().out
    for label in ("answer accuracy, sampled", "greedy answer accuracy", "KL to the teacher", "student", "teacher"):
        assert label in printed
