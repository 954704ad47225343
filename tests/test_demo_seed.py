"""`olingo demo --seed N`: one seed for every stage of the tiny demos (docs/demo.md runs several)."""

from __future__ import annotations

import pytest

import olingo.cli.demo as demo
from olingo.cli.main import main


@pytest.mark.parametrize("argv, pipeline, seed", [
    (["demo", "--seed", "7"], "run_demo", 7),
    (["demo", "--pipeline", "dpo", "--seed", "3"], "run_dpo_demo", 3),
    (["demo"], "run_demo", None),  # no flag: the packaged configs' own seed
])
def test_the_seed_flag_reaches_the_demo(argv, pipeline, seed, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(demo, pipeline, lambda output_dir, **kw: calls.append((output_dir, kw)))
    assert main([*argv, "--output-dir", str(tmp_path)]) == 0
    assert calls == [(str(tmp_path), {"seed": seed})]


def test_a_seed_overrides_every_stage_s_run_seed(monkeypatch, tmp_path):
    seen = {}

    def stage(name):
        def run(cfg):  # record the seed, hand on a stand-in model directory
            seen[name] = cfg.run.seed
            return {"final_model": str(tmp_path), "run_dir": str(tmp_path)}
        return run

    def evaluation(sft_model, trained, reward_model, cfg):
        seen["before/after sampling"] = cfg.run.seed
        raise StopIteration  # the seeds are all this test needs

    for name in ("sft", "rm", "ppo", "grpo"):
        monkeypatch.setattr(demo, f"run_{name}", stage(name))
    monkeypatch.setattr(demo, "compare_policies", evaluation)
    with pytest.raises(StopIteration):
        demo.run_demo(str(tmp_path), seed=5)
    assert seen == {"sft": 5, "rm": 5, "ppo": 5, "grpo": 5, "before/after sampling": 5}
    assert demo.seed_overrides(None) == []  # no seed: each packaged config's own
