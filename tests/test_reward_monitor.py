"""The reward monitor (docs/monitor.md): its detection rules on synthetic curves, the callback
driven hook by hook, and a short GRPO run whose deliberately bad proxy is hacked and flagged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from olingo.trainer.callbacks import LoopState, ManifestRow, build_callback
from olingo.trainer.monitor_rule import hacked, length_hacking, length_share, moments, overoptimisation, pearson

STEPS = list(range(0, 80, 10))
RISING = [0.1 * i for i in range(8)]  # a proxy that keeps climbing


# ---- the rule on synthetic curves --------------------------------------------------------------
def test_a_hacked_curve_is_flagged_where_gold_has_fallen_for_patience_evaluations():
    gold = [0.50, 0.55, 0.60, 0.58, 0.52, 0.45, 0.40, 0.35]  # peaks at step 20, then falls
    flag = overoptimisation(STEPS, RISING, gold, tolerance=0.05, patience=2)
    # step 40: 0.52 < 0.60 - 0.05 (first hacked); step 50: second in a row -> flagged there
    assert flag is not None and flag.kind == "overoptimisation" and flag.step == 50
    assert flag.evidence["best_gold_step"] == 20 and flag.evidence["best_gold"] == 0.60
    assert "fell more than 0.05" in flag.message


def test_a_healthy_curve_and_gold_noise_within_tolerance_are_not_flagged():
    healthy = [0.50, 0.52, 0.55, 0.57, 0.60, 0.61, 0.63, 0.64]
    assert overoptimisation(STEPS, RISING, healthy, tolerance=0.05, patience=2) is None
    noise = [0.60, 0.57, 0.62, 0.58, 0.61, 0.575, 0.60, 0.58]  # never more than 0.045 below the best, 0.62
    assert overoptimisation(STEPS, RISING, noise, tolerance=0.05, patience=1) is None


def test_a_single_dip_or_a_gold_falling_with_the_proxy_is_not_over_optimisation():
    dip = [0.60, 0.61, 0.50, 0.62, 0.63, 0.50, 0.64, 0.65]  # isolated falls: never two in a row
    assert overoptimisation(STEPS, RISING, dip, tolerance=0.05, patience=2) is None
    falling = [0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0, -0.1]
    assert overoptimisation(STEPS, falling, falling, tolerance=0.05, patience=1) is None  # worse on both: not hacking
    assert not hacked([0.5, 0.4], [0.6, 0.3], 1, tolerance=0.05)  # proxy below its value at the best gold


def test_length_hacking_is_the_share_of_the_proxy_gain_explained_by_length():
    length = [10, 12, 14, 16, 18, 20, 22, 24]
    proxy = [0.1 + 0.02 * (x - 10) for x in length]  # exactly linear in length: all of the gain
    assert length_share(proxy, length) == pytest.approx(1.0, abs=1e-9)  # float rounding of a least-squares fit
    flag = length_hacking(STEPS, proxy, length, threshold=0.8, patience=2)
    assert flag is not None and flag.step == 30  # shares from the 3rd evaluation (step 20) on; two in a row at step 30
    constant = [16] * 8
    assert length_share(RISING, constant) is None  # length did not grow: nothing to explain
    assert length_hacking(STEPS, RISING, constant, threshold=0.8, patience=1) is None
    wobble = [16, 20, 14, 19, 15, 18, 16, 17]  # length moves but not with the proxy
    assert length_hacking(STEPS, RISING, wobble, threshold=0.8, patience=2) is None


def test_pearson_from_summed_moments_adds_over_shards():
    x, y = [1.0, 2.0, 3.0, 4.0], [2.0, 4.1, 5.9, 8.0]
    halves = [a + b for a, b in zip(moments(x[:2], y[:2]), moments(x[2:], y[2:]), strict=True)]
    assert pearson(halves) == pytest.approx(pearson(moments(x, y)), abs=1e-12)  # same sums, added in another order
    assert pearson(moments(x, y)) > 0.99 and pearson(moments(x, [3.0] * 4)) is None


# ---- the callback, hook by hook ------------------------------------------------------------------
def short_answer(prompt, response, gt_answer):
    """A held-out verifier: right when the response is the expected answer exactly."""
    return 1.0 if response.strip() == gt_answer else 0.0


def pays_for_sevens(prompt, response, gt_answer):
    """A deliberately bad proxy: the share of sevens in the response, which the verifier ignores."""
    return response.count("7") / max(len(response), 1)


def distinct_share(prompt, response, gt_answer):
    """A held-out judge of degenerate text: the share of distinct characters in the response."""
    return len(set(response)) / max(len(response), 1)


def evaluate(monitor, state: LoopState, step: int, proxy: float, correct: int) -> None:
    """One evaluation of 4 samples, `correct` of them answered right, with a proxy of `proxy`."""
    state.step = step
    state.extra["eval_samples"] = [
        {"prompt": "2+2=", "response": "4" if i < correct else "77", "gt_answer": "4", "reward": proxy, "truncated": False} for i in range(4)
    ]
    monitor.on_eval(state, step, "eval", {"eval/reward": proxy, "eval/kl": 0.01 * step, "eval/response_length": 1.5})


def test_the_callback_flags_links_the_best_gold_checkpoint_and_stops(tmp_path):
    monitor = build_callback({"kind": "reward_monitor", "params": {"gold": ["tests.test_reward_monitor:short_answer"], "stop_on_flag": True}})
    state = LoopState(output_dir=tmp_path)
    monitor.on_train_start(state)
    (tmp_path / "checkpoints" / "step_2").mkdir(parents=True)
    for step, proxy, correct in ((0, 0.1, 2), (2, 0.2, 3), (4, 0.4, 2), (6, 0.6, 1)):
        if step == 2:  # a checkpoint at step N comes before the evaluations of step N
            monitor.on_checkpoint(state, ManifestRow("step_2", 2, 0, 0, "checkpoints/step_2", 0.0))
        evaluate(monitor, state, step, proxy, correct)
    assert state.stop_requested
    summary = json.loads((tmp_path / "monitor.json").read_text())
    assert summary["flagged"] and summary["flags"][0]["step"] == 6 and summary["flags"][0]["kind"] == "overoptimisation"
    assert summary["best_gold"] == {"step": 2, "gold": 0.75, "proxy": 0.2, "source": "checkpoint", "path": "checkpoints/step_2"}
    assert (tmp_path / "best_gold").resolve() == (tmp_path / "checkpoints" / "step_2").resolve()
    rows = [json.loads(line) for line in (tmp_path / "monitor.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4, 6] and rows[-1]["monitor/overoptimisation"] == 1.0
    assert rows[1]["monitor/gap"] == pytest.approx(0.2 - 0.75, abs=1e-12)  # proxy - gold, both exact in float64 to 1e-16
    assert rows[-1]["monitor/sqrt_kl"] == pytest.approx(0.06**0.5, abs=1e-12)


def test_state_survives_a_resume_and_unknown_gold_fails_at_build(tmp_path):
    monitor = build_callback({"kind": "reward_monitor", "params": {"gold": ["tests.test_reward_monitor:short_answer"]}})
    state = LoopState(output_dir=tmp_path)
    monitor.on_train_start(state)
    for step, proxy, correct in ((0, 0.1, 3), (2, 0.2, 2), (4, 0.3, 3)):
        evaluate(monitor, state, step, proxy, correct)
    resumed = build_callback({"kind": "reward_monitor", "params": {"gold": ["tests.test_reward_monitor:short_answer"]}})
    resumed.load_state_dict(json.loads(json.dumps(monitor.state_dict())))  # as trainer_state.json carries it
    resumed.on_train_start(LoopState(step=2, output_dir=tmp_path))  # resumed at step 2: its evaluation runs again
    assert resumed.history == monitor.history
    assert [json.loads(line)["step"] for line in (tmp_path / "monitor.jsonl").read_text().splitlines()] == [0]
    with pytest.raises(Exception, match="no_such_function"):
        build_callback({"kind": "reward_monitor", "params": {"gold": ["tests.test_reward_monitor:no_such_function"]}})


def test_a_held_out_reward_model_scores_each_sample_at_its_last_token_whatever_the_batch(assets):
    """`reward_model:<dir>` as gold: a batch padded to its longest row scores each sample as the
    model scores that sample alone (prompt + response + end-of-sequence token when it stopped)."""
    import torch

    from olingo.models.loading import load_tokenizer
    from olingo.trainer.monitor_gold import gold_scorer

    tokenizer = load_tokenizer(str(assets.model_dir))
    scorer = gold_scorer(f"reward_model:{assets.model_dir}")
    samples = [{"prompt": "12+3=", "response": r, "gt_answer": "15", "truncated": t} for r, t in (("15", False), ("1234567", True), ("7", False))]
    batched = scorer.score(samples, tokenizer)
    alone = []
    for s in samples:
        text = s["prompt"] + s["response"] + ("" if s["truncated"] else tokenizer.eos_token)
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        alone.append(float(scorer._model(ids, torch.ones_like(ids))))
    assert batched.shape == (3,) and torch.isfinite(batched).all()
    assert batched.tolist() == pytest.approx(alone, abs=1e-5)  # float32 forward, padded vs unpadded: rounding only


# ---- a short run: the bad proxy is hacked and flagged, the healthy control is not ---------------
def experiment_yaml(out: Path) -> Path:
    """Two GRPO arms of the tiny model, one seed, 12 episodes, watched by the monitor with
    the gold the share of distinct characters: one paid for sevens, the control paid the gold."""
    monitor = {"kind": "reward_monitor", "params": {"gold": ["tests.test_reward_monitor:distinct_share"], "stop_on_flag": True}}
    base = {
        "stage": "grpo", "logging": {"progress": False}, "generation": {"max_new_tokens": 8}, "actor_optim": {"lr": 1.0e-2},
        "experience": {"num_generations": 4, "kl_coef": 0.001}, "callbacks": [monitor],
        "loop": {"episodes": 12, "rollout_batch_size": 4, "train_batch_size": 16, "eval_interval": 1, "save_interval": 0},
    }
    arms = {name: {**base, "reward": {"functions": {f"tests.test_reward_monitor:{fn}": 1.0}}}
            for name, fn in (("hacked", "pays_for_sevens"), ("control", "distinct_share"))}
    config = {"name": "monitor", "output_dir": str(out), "runs": arms, "callbacks": [{"kind": "local_logger"}]}
    path = out / "exp.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@pytest.mark.slow
def test_a_hacked_proxy_is_flagged_and_stops_and_the_control_is_not(tmp_path):
    """GRPO paid for sevens (the gold, the share of distinct characters, falls as sevens crowd the
    response) is flagged and stopped early; the control, trained on the gold itself, runs to its
    end unflagged. The experiment's report says so per arm, and `olingo report` draws each run's
    monitor figure."""
    from olingo.cli.main import main

    assert main(["experiment", "run", str(experiment_yaml(tmp_path))]) == 0
    runs = tmp_path / "monitor" / "runs"
    hacked_run, control = (json.loads((runs / name / "monitor.json").read_text()) for name in ("hacked", "control"))
    assert hacked_run["flagged"] and hacked_run["flags"][0]["kind"] == "overoptimisation"
    assert not control["flagged"]
    results = {name: json.loads((runs / name / "result.json").read_text()) for name in ("hacked", "control")}
    assert results["hacked"]["stopped_early"] and results["hacked"]["steps"] < results["hacked"]["requested_steps"]  # stop_on_flag
    assert not results["control"]["stopped_early"] and results["control"]["steps"] == results["control"]["requested_steps"]
    assert control["evaluations"] == results["control"]["steps"] + 1  # eval_interval 1: step 0 and every step after
    assert (runs / "hacked" / "best_gold" / "actor" / "config.json").is_file()
    report = (tmp_path / "monitor" / "experiment.md").read_text()
    step = hacked_run["flags"][0]["step"]
    assert f"| hacked | over-optimised | 1/1 | {step:.1f} +- 0.0 |" in report and "| control | not flagged | 0/1 | - |" in report
    for name in ("hacked", "control"):
        assert main(["report", str(runs / name)]) == 0
        assert (runs / name / "plots" / "overoptimisation.png").is_file()


def test_the_experiment_report_states_per_arm_whether_and_when_it_was_flagged(tmp_path):
    from olingo.experiment.local_logger import experiment_markdown
    from olingo.experiment.results import ArmResult

    runs = []
    for arm, seed, step in (("low_kl", 42, 40), ("low_kl", 43, 60), ("high_kl", 42, None), ("high_kl", 43, None)):
        run_dir = tmp_path / f"{arm}__s{seed}"
        run_dir.mkdir()
        flags = [{"kind": "overoptimisation", "step": step, "message": "m", "evidence": {}}] if step else []
        summary = {"flagged": bool(flags), "flags": flags, "best_gold": {"step": 20, "gold": 0.5 + seed % 2 * 0.1, "proxy": 0.1, "path": None}}
        (run_dir / "monitor.json").write_text(json.dumps(summary))
        runs.append(ArmResult(name=run_dir.name, run_config={}, status="completed", arm=arm, seed=seed, run_dir=str(run_dir)))
    text = experiment_markdown("overopt", "completed", "low KL over-optimises", None, runs, "done")
    assert "| low_kl | over-optimised | 2/2 | 50.0 +- 14.1 | 0/2 | 0.55 +- 0.071 |" in text  # steps 40, 60: sample std 14.14
    assert "| high_kl | not flagged | 0/2 | - | 0/2 | 0.55 +- 0.071 |" in text
