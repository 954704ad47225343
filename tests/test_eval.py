"""`olingo eval` (docs/eval.md): the estimators against hand values, paired comparisons of the
tiny model with itself and with a briefly SFT-trained copy, exact resume, and the command."""

from __future__ import annotations

import json
import math
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest

from olingo.config import ConfigError, load_config, packaged_config
from olingo.eval.metrics import Interval, bootstrap_interval, maj_at_k, majority_vote, paired_bootstrap, pass_at_k, verdict
from olingo.eval.results import per_prompt, summarize
from tests.conftest import kill_when_logged, olingo_cmd, read_jsonl

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY = "builtin:tiny-llama"
SMALL = ["data.limit=6", "eval.samples_per_prompt=4", "eval.k=[1,2,4]", "eval.batch_size=2", "eval.bootstrap_resamples=200", "logging.progress=false"]


# ---- the estimators ------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "c"), [(5, 2), (5, 0), (5, 5), (10, 3), (1, 1)])
def test_pass_at_k_is_the_closed_form(n, c):
    for k in range(1, n + 1):
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)


def test_pass_at_k_by_hand_and_for_large_n():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 2, 4) == 1.0  # n - c < k: every 4 of 5 hold a correct one
    big = pass_at_k(1000, 7, 100)  # C(1000, 100) overflows a float: the product does not
    assert big == pytest.approx(float(1 - Fraction(math.comb(993, 100), math.comb(1000, 100))), rel=1e-9)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_majority_vote_ties_go_to_the_answer_seen_first():
    assert majority_vote(["3", "4", "4", "3"]) == 0  # 2-2: "3" came first
    assert majority_vote(["4", "3", "3", "4"]) == 0
    assert majority_vote([None, "5", "6", "6"]) == 2  # an unanswered sample does not vote
    assert majority_vote([None, None]) is None


def test_maj_at_k_by_hand():
    answers, correct = ["1", "2", "1"], [True, False, True]
    assert maj_at_k(answers, correct, 3) == 1.0  # "1" wins 2-1
    # k=2: {0,1} tie -> "1" (first) right, {0,2} "1" right, {1,2} tie -> "2" (first) wrong
    assert maj_at_k(answers, correct, 2) == pytest.approx(2 / 3)
    assert maj_at_k(answers, correct, 1) == pytest.approx(2 / 3)
    assert maj_at_k([None, "7"], [False, True], 1) == 0.5  # no answer: a wrong vote
    drawn = maj_at_k(["1", "2"] * 10, [True, False] * 10, 10, max_subsets=50, seed=3)  # C(20,10) > 50: drawn subsets
    assert drawn == maj_at_k(["1", "2"] * 10, [True, False] * 10, 10, max_subsets=50, seed=3) and 0 < drawn < 1


def test_bootstrap_degenerate_and_hand_cases():
    assert bootstrap_interval([1.0] * 7) == Interval(1.0, 1.0, 1.0, 7)  # all correct: [1, 1]
    # two prompts: a resample's mean is 0, 0.5 or 1 with chance 1/4, 1/2, 1/4, so the 2.5% and
    # 97.5% quantiles of 1000 resamples are 0 and 1
    assert bootstrap_interval([0.0, 1.0]) == Interval(0.5, 0.0, 1.0, 2)
    assert bootstrap_interval([0.0, 1.0, math.nan]).prompts == 2  # a prompt the metric skips
    assert math.isnan(bootstrap_interval([]).value)


def test_bootstrap_is_seeded_and_brackets_the_mean():
    values = [0.0, 0.25, 1.0, 0.5, 0.75, 1.0, 0.0, 0.5]
    first = bootstrap_interval(values, seed=7)
    assert first == bootstrap_interval(values, seed=7)
    assert first.value == pytest.approx(0.5) and first.low < first.value < first.high
    assert bootstrap_interval(values, seed=8) != first
    assert bootstrap_interval(values, confidence=0.5, seed=7).high < first.high  # a narrower interval


def test_paired_bootstrap_and_verdicts():
    same = paired_bootstrap([0.2, 0.4, 0.9], [0.2, 0.4, 0.9])
    assert same == Interval(0.0, 0.0, 0.0, 3) and verdict(same, 1) == "within noise"
    up = paired_bootstrap([0.1] * 10, [0.6] * 10)
    assert up.value == pytest.approx(0.5) and verdict(up, 1) == "better" and verdict(up, -1) == "worse" and verdict(up, 0) == "higher"
    mixed = Interval(0.01, -0.02, 0.05, 10)
    assert verdict(mixed, 1) == "within noise"


def test_per_prompt_and_summary_by_hand():
    rows = [
        {"prompt_index": p, "sample_index": s, "reward": float(ok), "correct": ok, "answer": ans, "response_length": 2, "truncated": False}
        for p, samples in enumerate([[(True, "4"), (False, "5")], [(False, "1"), (False, None)]]) for s, (ok, ans) in enumerate(samples)
    ]
    values = per_prompt(rows, prompts=2, samples=2, ks=[1, 2])
    assert values["accuracy"].tolist() == [0.5, 0.0]
    assert values["pass@2"].tolist() == [1.0, 0.0]
    assert values["maj@2"].tolist() == [1.0, 0.0]  # prompt 0: "4" vs "5" tie -> "4" (first), correct
    summary = summarize({"a": values, "b": values})
    assert summary["metrics"]["a"]["pass@2"]["value"] == 0.5
    assert summary["comparisons"]["b"]["accuracy"]["verdict"] == "within noise"


# ---- the runner on the tiny model ------------------------------------------------------------------
def eval_config(models, *overrides):
    from olingo.eval.config import EvalConfig

    cfg = load_config(EvalConfig, packaged_config("eval_tiny.yaml"), [*SMALL, *overrides])
    cfg.models = list(models)
    return cfg


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory, olingo_home) -> str:
    """The tiny model after 20 epochs of sft_tiny.yaml (about 10 s): clearly better than the base."""
    from olingo.recipes.sft import SFTConfig, run_sft

    out = tmp_path_factory.mktemp("sft")
    result = run_sft(load_config(SFTConfig, packaged_config("sft_tiny.yaml"), [f"run.output_dir={out}", "train.epochs=20", "logging.progress=false"]))
    return str(Path(result["run_dir"]))


@pytest.mark.slow
def test_a_model_against_itself_is_within_noise_with_identical_samples(tmp_path):
    from olingo.eval.runner import run_eval

    result = run_eval(eval_config([TINY, TINY]), tmp_path / "e").result
    assert [m["label"] for m in result["models"]] == [TINY, f"{TINY}#2"]
    for metric, compared in result["comparisons"][f"{TINY}#2"].items():
        assert compared["verdict"] == "within noise" and compared["low"] <= 0 <= compared["high"], metric
        assert compared["value"] == 0  # same prompts, same seeds: the very same samples
    rows = read_jsonl(tmp_path / "e" / "samples.jsonl")
    assert len(rows) == 2 * 6 * 4
    first, second = ([r["response"] for r in rows if r["model"] == label] for label in (TINY, f"{TINY}#2"))
    assert first == second and len(set(first)) > 1  # sampled, not greedy
    assert set(rows[0]) >= {"prompt_index", "sample_index", "model", "response", "reward", "correct", "answer", "response_length", "truncated"}


@pytest.mark.slow
def test_the_sft_model_is_better_on_accuracy_than_the_base(tmp_path, sft_model):
    from olingo.eval.runner import run_eval

    cfg = eval_config([TINY, sft_model], "data.limit=0", "eval.samples_per_prompt=4", "eval.batch_size=32")
    result = run_eval(cfg, tmp_path / "e").result
    compared = result["comparisons"][sft_model]
    assert compared["accuracy"]["verdict"] == "better", compared["accuracy"]
    assert compared["truncated"]["verdict"] == "better"  # the base model rambles to the length limit
    assert result["models"][1]["path"].endswith("checkpoints/final/model")  # a run directory means its final model


class Killed(Exception):
    pass


@pytest.mark.slow
def test_a_killed_eval_resumed_gives_the_uninterrupted_numbers(tmp_path):
    from olingo.eval.runner import run_eval

    whole = run_eval(eval_config([TINY, TINY]), tmp_path / "whole").result

    def kill_after_four(label, batch, seen=[]):  # noqa: B006 - counts batches across calls
        seen.append(batch)
        if len(seen) == 4:  # the first model's 3 batches and one of the second's
            raise Killed

    with pytest.raises(Killed):
        run_eval(eval_config([TINY, TINY]), tmp_path / "cut", after_batch=kill_after_four)
    samples = tmp_path / "cut" / "samples.jsonl"
    assert len(read_jsonl(samples)) == 4 * 2 * 4
    with samples.open("a") as handle:
        handle.write('{"model": "torn')  # a write the kill cut short
    resumed = []
    again = run_eval(eval_config([TINY, TINY]), tmp_path / "cut", after_batch=lambda label, batch: resumed.append(batch)).result
    assert resumed == [1, 2]  # only the missing batches were sampled
    assert again["metrics"] == whole["metrics"] and again["comparisons"] == whole["comparisons"]
    assert read_jsonl(samples) == read_jsonl(tmp_path / "whole" / "samples.jsonl")


def test_continuing_with_other_sampling_settings_is_refused(tmp_path):
    from olingo.eval.store import prepare_eval_dir

    prepare_eval_dir(tmp_path / "e", eval_config([TINY]), overwrite=False)
    prepare_eval_dir(tmp_path / "e", eval_config([TINY], "eval.k=[1]", "eval.bootstrap_resamples=50"), overwrite=False)  # estimators only
    with pytest.raises(ConfigError, match=r"other settings \(generation.temperature\).*run.overwrite=true"):
        prepare_eval_dir(tmp_path / "e", eval_config([TINY], "generation.temperature=0.5"), overwrite=False)
    prepare_eval_dir(tmp_path / "e", eval_config([TINY], "generation.temperature=0.5"), overwrite=True)


def test_models_resolve_from_run_and_checkpoint_directories(tmp_path, assets):
    from olingo.eval.sources import model_dir, resolve_models

    final = tmp_path / "run" / "checkpoints" / "final" / "actor"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    assert model_dir(str(tmp_path / "run")) == str(final)
    with pytest.raises(ConfigError, match="not a model directory"):
        model_dir(str(final.parent))  # no trainer_state.json: not a complete checkpoint
    (final.parent / "trainer_state.json").write_text("{}")
    assert model_dir(str(final.parent)) == str(final)  # a checkpoint directory
    assert model_dir(str(assets.model_dir)) == str(assets.model_dir)
    with pytest.raises(ConfigError, match="no such file"):
        model_dir(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="at least one MODEL"):
        resolve_models([])


def test_eval_k_must_fit_the_samples():
    with pytest.raises(ConfigError, match="eval.k"):
        eval_config([TINY], "eval.k=[1,8]")


@pytest.mark.slow
def test_environment_episodes_count_turns(tmp_path):
    from olingo.eval.runner import run_eval

    cfg = eval_config([TINY], "environment.name=arithmetic_retry", "eval.accuracy_function=null", "reward.functions={}", "data.limit=2")
    result = run_eval(cfg, tmp_path / "e").result
    metrics = result["metrics"][TINY]
    assert {"turns", "tool_calls"} <= set(metrics) and 1 <= metrics["turns"]["value"] <= 2
    rows = read_jsonl(tmp_path / "e" / "samples.jsonl")
    assert all(r["correct"] == (r["reward"] > 0) for r in rows)  # no accuracy function: a reward > 0 is a success


# ---- the command ----------------------------------------------------------------------------------
def test_check_prints_the_models_and_loads_nothing(capsys):
    from olingo.cli.main import main

    assert main(["eval", "runs/a", "--check", "runs/b", "eval.samples_per_prompt=2", "eval.k=[1,2]"]) == 0
    out = capsys.readouterr().out
    assert "- runs/a\n- runs/b" in out and "samples_per_prompt: 2" in out


@pytest.mark.slow
def test_the_command_writes_the_table_files_and_plot_and_report_redraws_it(tmp_path):
    out = tmp_path / "e"
    cmd = olingo_cmd("eval", TINY, TINY, "--output", str(out), *SMALL)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "M2 - M1" in done.stdout and "within noise" in done.stdout and "pass@4" in done.stdout
    result = json.loads((out / "eval.json").read_text())
    assert result["config"]["eval"]["samples_per_prompt"] == 4 and (out / "plots" / "eval.png").stat().st_size > 0
    (out / "plots" / "eval.png").unlink()
    report = subprocess.run(olingo_cmd("report", str(out)), capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and (out / "plots" / "eval.png").is_file() and "maj@2" in report.stdout


@pytest.mark.slow
def test_a_sigkilled_command_rerun_continues_to_the_same_numbers(tmp_path):
    args = [TINY, TINY, *SMALL]
    subprocess.run(olingo_cmd("eval", *args, "--output", str(tmp_path / "whole")), check=True, capture_output=True, timeout=300)
    kill_when_logged(olingo_cmd("eval", *args, "--output", str(tmp_path / "cut")), tmp_path / "cut" / "samples.jsonl", rows=3 * 2 * 4)
    rerun = subprocess.run(olingo_cmd("eval", *args, "--output", str(tmp_path / "cut")), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    whole, cut = (json.loads((tmp_path / d / "eval.json").read_text()) for d in ("whole", "cut"))
    assert cut["metrics"] == whole["metrics"] and cut["comparisons"] == whole["comparisons"]
