"""`olingo.cli.report` and its `report_series`, `report_figures` modules: PNG curves and summaries from synthetic `metrics.jsonl` files."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.image import imread

from olingo.cli.report import write_report
from olingo.cli.report_figures import kl_figure, loss_figure, namespace_grid, reward_figure, window_for
from olingo.cli.report_series import (
    Series,
    band_swamps_mean,
    format_summary,
    is_constant,
    load_series,
    moving_average,
    off_reason,
    smoothing_window,
    summarize,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_log(run_dir: Path, rows: list[dict]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(row) for row in rows]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def train_row(step: int, **metrics: float) -> dict:
    return {"step": step, "split": "train", "time": 1000.0 + step, **metrics}


def eval_row(step: int, eval_name: str = "eval", **metrics: float) -> dict:
    return {"step": step, "split": "eval", "time": 1000.5 + step, "eval_name": eval_name, **metrics}


def ns(**metrics: float) -> dict:
    """`ns(train__loss=1)` -> {"train/loss": 1}: keyword-friendly metric names."""
    return {key.replace("__", "/"): value for key, value in metrics.items()}


def sft_run(run_dir: Path, steps: int = 60) -> Path:
    rows = []
    for step in range(1, steps + 1):
        rows.append(
            train_row(
                step,
                **ns(
                    train__loss=2.0 / step,
                    train__lr=1e-4,
                    train__grad_norm=1.0,
                    perf__tokens_per_s=500.0,
                    time__step_s=0.1,
                ),
            )
        )
        if step % 20 == 0:
            rows.append(eval_row(step, **ns(eval__loss=2.5 / step)))
    return write_log(run_dir, rows)


def rm_run(run_dir: Path) -> Path:
    rows = [
        train_row(
            step,
            **ns(
                train__loss=0.7 - 0.01 * step,
                train__acc=0.5 + 0.01 * step,
                train__reward_chosen=0.1 * step,
                train__reward_rejected=-0.1 * step,
            ),
        )
        for step in range(1, 21)
    ]
    rows += [eval_row(step, **ns(eval__loss=0.6, eval__acc=0.7)) for step in (10, 20)]
    return write_log(run_dir, rows)


def ppo_run(run_dir: Path, steps: int = 80) -> Path:
    rng = np.random.default_rng(0)
    rows = []
    for step in range(1, steps + 1):
        noise = float(rng.normal())
        rollout = ns(
            rollout__reward_mean=0.02 * step + 0.1 * noise,
            rollout__reward_std=0.5,
            rollout__kl=0.001 * step,
            rollout__kl_coef=0.1 / (1 + step // 10),
            rollout__response_length=12.0,
            rollout__truncated=0.0,
        )
        train = ns(
            train__policy_loss=-0.01 * noise,
            train__value_loss=1.0 / step,
            train__ptx_loss=2.0,
            train__clipfrac=0.1,
            train__approx_kl=0.002,
            train__entropy=1.5,
            train__explained_variance=0.3,
            train__actor_lr=1e-6,
        )
        extra = ns(perf__samples_per_s=64.0, time__rollout_s=0.5)
        rows.append(train_row(step, **rollout, **train, **extra))
        if step % 20 == 0:
            rows.append(eval_row(step, **ns(eval__reward=0.02 * step, eval__kl=0.001 * step)))
    return write_log(run_dir, rows)


def assert_pngs(paths: list[Path]) -> None:
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC, path
        assert len(data) > 5000, path
        height, width = imread(path).shape[:2]
        assert height > 200 and width > 200, path


def names(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


# ---------------------------------------------------------------------------------------------
# Which files each kind of run produces


def test_sft_run_writes_loss_and_namespace_grids_only(tmp_path):
    run_dir = sft_run(tmp_path / "sft")
    paths = write_report(run_dir)
    assert names(paths) == ["loss.png", "train.png", "eval.png", "perf.png", "time.png"]
    assert all(p.parent == run_dir / "plots" for p in paths)
    assert_pngs(paths)
    for absent in ("reward.png", "kl.png", "rollout.png"):
        assert not (run_dir / "plots" / absent).exists()


def test_reward_model_run_plots_chosen_and_rejected_rewards(tmp_path):
    paths = write_report(rm_run(tmp_path / "rm"), smooth=5)
    assert names(paths) == ["reward.png", "loss.png", "train.png", "eval.png"]
    assert_pngs(paths)


@pytest.mark.slow
def test_ppo_run_writes_every_figure_in_a_stable_order(tmp_path):
    run_dir = ppo_run(tmp_path / "ppo")
    paths = write_report(run_dir)
    expected = ["reward.png", "kl.png", "loss.png", "train.png", "rollout.png", "eval.png"]
    assert names(paths) == expected + ["perf.png", "time.png"]
    assert_pngs(paths)


def test_ppo_reward_figure_has_std_band_eval_points_and_run_name(tmp_path):
    run_dir = ppo_run(tmp_path / "my-ppo-run")
    series = load_series(run_dir)
    fig = reward_figure(series, "my-ppo-run", None)
    (ax,) = fig.axes
    assert "my-ppo-run" in ax.get_title()
    labels = [line.get_label() for line in ax.get_lines()]
    assert "eval/reward" in labels
    assert any(label.startswith("rollout/reward_mean") for label in labels)
    assert not any("reward_std" in label for label in labels if not label.startswith("±"))
    assert any(isinstance(c, PolyCollection) for c in ax.collections)


def test_kl_figure_puts_an_adaptive_coefficient_on_a_labelled_twin_axis(tmp_path):
    series = load_series(ppo_run(tmp_path / "ppo"))
    fig = kl_figure(series, "ppo", None)
    kl_ax, coef_ax = fig.axes
    assert {line.get_label() for line in kl_ax.get_lines()} >= {"eval/kl"}
    assert [line.get_label() for line in coef_ax.get_lines()] == ["rollout/kl_coef (adaptive)"]
    assert "adaptive" in coef_ax.get_ylabel()


def series_of(**columns: list[float]) -> dict[str, Series]:
    """`series_of(train__policy_loss=[...])`: metrics logged at steps 1..n, keyed by name."""
    out = {}
    for key, values in columns.items():
        name = key.replace("__", "/")
        out[name] = Series(name, name, list(range(1, len(values) + 1)), [float(v) for v in values])
    return out


def test_fixed_kl_coefficient_goes_in_the_title_not_on_a_twin_axis():
    series = series_of(rollout__kl=[0.0, 0.1, 0.2, 0.15], rollout__kl_coef=[0.05] * 4)
    fig = kl_figure(series, "ppo", None)
    (ax,) = fig.axes  # no second y axis whose flat line would read like a KL threshold
    assert "kl_coef fixed at 0.05" in ax.get_title()
    assert [line.get_label() for line in ax.get_lines()] == ["rollout/kl"]


def test_kl_figure_is_left_out_when_the_kl_term_is_off():
    # kl_coef 0 skips the reference forward: the logged KL is 0 by construction, not measured
    series = series_of(rollout__kl=[0.0] * 5, rollout__kl_coef=[0.0] * 5)
    assert kl_figure(series, "ppo", None) is None


def loss_panels(fig) -> dict[str, object]:
    return {ax.get_title(): ax for ax in fig.axes}


def test_each_loss_gets_its_own_axes_and_off_terms_are_not_drawn():
    rng = np.random.default_rng(0)
    steps = 60
    value = [0.5] * steps
    value[30] = 100.0  # a value-loss spike
    series = series_of(
        train__policy_loss=(0.01 * rng.normal(size=steps)).tolist(),
        train__value_loss=value,
        train__ptx_loss=[0.0] * steps,  # no pretrain data: logged as exactly 0
        train__aux_loss=[1.0] * steps,  # its coefficient is logged as 0: not in the loss
        train__aux_coef=[0.0] * steps,
    )
    series["eval/policy_loss"] = Series("eval/policy_loss", "eval/policy_loss", [20, 40, 60], [0.01, 0.0, -0.01])
    fig = loss_figure(series, "ppo", None)
    panels = loss_panels(fig)
    assert list(panels) == ["policy_loss", "value_loss"]
    low, high = panels["policy_loss"].get_ylim()
    assert high - low < 1.0  # the spike did not set the policy loss's scale
    assert {line.get_label() for line in panels["policy_loss"].get_lines()} >= {"eval/policy_loss"}
    note = fig.get_supxlabel()
    assert "train/ptx_loss = 0 throughout" in note and "train/aux_loss (train/aux_coef = 0)" in note


def test_off_terms_and_constants_in_the_namespace_grid(tmp_path):
    rows = [
        train_row(s, **ns(train__policy_loss=0.1 * s, train__ptx_loss=0.0, train__skip_ratio=0.0))
        for s in range(1, 6)
    ]
    fig = namespace_grid(load_series(write_log(tmp_path, rows)), "train", "ppo", None)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["train/policy_loss", "train/skip_ratio = 0, constant"]
    assert "not drawn (off): train/ptx_loss = 0 throughout" in fig.get_supxlabel()


def test_off_reason_and_is_constant_by_hand():
    series = series_of(train__ptx_loss=[0, 0], train__value_loss=[0, 1], rollout__kl_coef=[0, 0])
    assert off_reason(series["train/ptx_loss"], series) == "train/ptx_loss = 0 throughout"
    assert off_reason(series["train/value_loss"], series) is None
    assert off_reason(series["rollout/kl_coef"], series) is None  # a setting, not a term
    assert is_constant(series["train/ptx_loss"]) and not is_constant(series["train/value_loss"])
    assert not is_constant(Series("eval/loss", "eval/loss", [5], [1.0]))  # one point: no trend


def test_band_swamps_mean_by_hand():
    assert band_swamps_mean([0.0, 0.05, 0.02], [0.12, 0.12, 0.2])  # median 0.12 > range 0.05
    assert not band_swamps_mean([0.0, 1.0, 2.0], [0.5, 0.5, 0.5])
    assert band_swamps_mean([0.3, 0.3], [0.1, 0.1])  # a flat mean gets no band


def test_reward_band_that_swamps_the_mean_is_omitted_and_said_so():
    # A 0/1 reward with rare successes: the std (0.12) dwarfs the mean's movement (0..0.05).
    means = [0.0, 0.016, 0.0, 0.031, 0.047, 0.016] * 10
    series = series_of(rollout__reward_mean=means, rollout__reward_std=[0.12] * len(means))
    fig = reward_figure(series, "ppo", None)
    (ax,) = fig.axes
    assert not any(isinstance(c, PolyCollection) for c in ax.collections)
    low, high = ax.get_ylim()
    assert high - low < 0.1  # the mean sets the axis
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("± rollout/reward_std not drawn: its median 0.12 > 0.013, half the range of the mean") for t in legend), legend


def test_eval_labels_name_the_evaluator_only_for_shared_metrics(tmp_path):
    # An experiment's run: the stage's own eval and an in-loop benchmark log different metrics.
    rows = [train_row(1, **ns(train__loss=1.0)), eval_row(1, "eval", **ns(eval__loss=0.5))]
    rows += [eval_row(1, "arithmetic", **ns(arithmetic__accuracy=0.25))]
    assert list(load_series(write_log(tmp_path, rows))) == ["train/loss", "eval/loss", "arithmetic/accuracy"]


# ---------------------------------------------------------------------------------------------
# Errors and messy logs


def test_missing_log_names_the_path_and_its_writer(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl") as err:
        write_report(tmp_path / "nowhere")
    assert "jsonl_metrics" in str(err.value)
    assert str(tmp_path / "nowhere") in str(err.value)
    with pytest.raises(FileNotFoundError):
        summarize(tmp_path / "nowhere")


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_empty_log_says_there_are_no_rows_yet(tmp_path, text):
    (tmp_path / "metrics.jsonl").write_text(text)
    with pytest.raises(ValueError, match="no rows yet"):
        write_report(tmp_path)
    with pytest.raises(ValueError, match="no rows yet"):
        summarize(tmp_path)
    assert not (tmp_path / "plots").exists()


def test_negative_smoothing_window_is_refused(tmp_path):
    with pytest.raises(ValueError, match="smooth"):
        write_report(sft_run(tmp_path / "sft"), smooth=-3)


def messy_rows() -> list[dict]:
    return [
        train_row(1, **ns(train__loss=2.0)),
        train_row(2, **ns(train__loss=1.0, train__acc=0.5)),
        train_row(3, **ns(train__loss="oops", train__acc=0.75, train__note=None)),
        {"split": "train", "train/loss": 99.0},  # no step: cannot be placed
        train_row(4, **ns(train__loss=1.5, train__flag=True)),
        eval_row(2, **ns(eval__loss=1.2)),
        eval_row(4, **ns(eval__loss=0.9)),
    ]


def test_summary_values_by_hand_tolerating_missing_and_non_numeric_values(tmp_path):
    summary = summarize(write_log(tmp_path, messy_rows()))
    assert list(summary) == ["train/acc", "train/loss", "eval/loss"]
    assert summary["train/loss"] == {"first": 2.0, "last": 1.5, "min": 1.0, "max": 2.0, "n": 3}
    assert summary["train/acc"] == {"first": 0.5, "last": 0.75, "min": 0.5, "max": 0.75, "n": 2}
    assert summary["eval/loss"] == {"first": 1.2, "last": 0.9, "min": 0.9, "max": 1.2, "n": 2}
    assert load_series(tmp_path)["train/loss"].steps == [1, 2, 4]


def test_messy_log_still_plots(tmp_path):
    paths = write_report(write_log(tmp_path, messy_rows()))
    assert names(paths) == ["loss.png", "train.png", "eval.png"]
    assert_pngs(paths)


def test_nan_values_and_a_torn_last_line_are_skipped(tmp_path):
    write_log(
        tmp_path, [train_row(1, **ns(train__loss=1.0)), train_row(2, **ns(train__loss=math.nan))]
    )
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "split": "train", "train/lo')
    assert summarize(tmp_path)["train/loss"]["n"] == 1


def test_several_evaluators_get_separate_series(tmp_path):
    rows = [train_row(1, **ns(train__loss=1.0))]
    rows += [eval_row(1, "heldout", **ns(eval__loss=0.5)), eval_row(1, "ood", **ns(eval__loss=0.8))]
    summary = summarize(write_log(tmp_path, rows))
    assert summary["eval/loss [heldout]"]["last"] == 0.5
    assert summary["eval/loss [ood]"]["last"] == 0.8
    assert "loss.png" in names(write_report(tmp_path))


def test_format_summary_is_an_aligned_table(tmp_path):
    table = format_summary(summarize(write_log(tmp_path, messy_rows())))
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "n", "first", "last", "min", "max"]
    assert lines[2].split() == ["train/loss", "3", "2", "1.5", "1", "2"]
    assert len({len(line) for line in lines}) == 1


# ---------------------------------------------------------------------------------------------
# Smoothing


def test_moving_average_is_centred_and_shrinks_at_the_ends():
    np.testing.assert_allclose(moving_average([1, 2, 3, 4, 5], 3), [1.5, 2, 3, 4, 4.5])
    np.testing.assert_allclose(moving_average([1, 2, 3], 1), [1, 2, 3])
    np.testing.assert_allclose(moving_average([1, 3, 5, 7], 2), [2, 4, 6, 7])


def test_default_smoothing_window():
    assert smoothing_window(49, None) == 1
    assert smoothing_window(100, None) == 5
    assert smoothing_window(1000, None) == 50
    assert smoothing_window(10, 4) == 4
    assert smoothing_window(3, 10) == 3
    assert smoothing_window(100, 0) == 1


def test_schedules_and_constant_curves_are_never_smoothed():
    steps = list(range(100))
    noisy = [float(i % 7) for i in steps]
    assert window_for(Series("train/loss", "train/loss", steps, noisy), None) == 5
    assert window_for(Series("train/lr", "train/lr", steps, noisy), 10) == 1
    assert window_for(Series("rollout/kl_coef", "rollout/kl_coef", steps, noisy), 10) == 1
    assert window_for(Series("train/clipfrac", "train/clipfrac", steps, [0.1] * 100), 10) == 1


# ---------------------------------------------------------------------------------------------
# Backend safety


def test_reports_in_parallel_threads(tmp_path):
    run_dirs = [sft_run(tmp_path / f"run{i}", steps=20) for i in range(2)]
    results: dict[int, list[str]] = {}

    def report(i: int) -> None:
        results[i] = names(write_report(run_dirs[i]))

    threads = [threading.Thread(target=report, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = ["loss.png", "train.png", "eval.png", "perf.png", "time.png"]
    assert results == {0: expected, 1: expected}
    for run_dir in run_dirs:
        assert_pngs(sorted((run_dir / "plots").iterdir()))


@pytest.mark.slow
def test_no_pyplot_state_is_touched(tmp_path):
    run_dir = sft_run(tmp_path / "sft")
    code = (
        "import sys;"
        "from olingo.cli.report import write_report; write_report(sys.argv[1]);"
        "assert 'matplotlib.pyplot' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code, str(run_dir)], check=True)
