"""Built-in callbacks driven hook by hook with a LoopState in tmp_path (no trainer needed)."""

from __future__ import annotations

import csv
import io
import json
import logging
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from olingo.trainer.callbacks import (
    Callback,
    LoopArtifacts,
    LoopState,
    ManifestRow,
    build_callback,
    register_callback,
    registered_callbacks,
)
from olingo.trainer.callbacks.builtin import (
    CsvMetrics,
    EarlyStopping,
    JsonlMetrics,
    PrintMetrics,
    ProgressBar,
    TensorBoardLogger,
    WandbLogger,
    read_metrics,
)


def make_state(tmp_path: Path, step: int = 0, num_steps: int = 5, **kw) -> LoopState:
    return LoopState(step=step, num_steps=num_steps, output_dir=tmp_path, **kw)


def artifacts(state: LoopState, error: BaseException | None = None) -> LoopArtifacts:
    return LoopArtifacts(
        run_dir=state.output_dir, manifest_path=None, checkpoints=[],
        requested_steps=state.num_steps, completed_steps=state.step, train_seconds=0.0, error=error,
    )


def train_metrics(step: int, offset: float = 0.0) -> dict[str, float]:
    return {"train/loss": 1.0 / step + offset, "train/acc": 0.1 * step, "train/lr": 1e-4}


def drive(cb: Callback, state: LoopState, steps: range, offset: float = 0.0, eval_every: int = 2) -> None:
    """Fire the hooks the way the loop does: step end, checkpoint, evals, then train end.
    A resumed loop first re-runs the evaluations due at the resumed step."""
    cb.on_train_start(state)
    if state.step and state.step % eval_every == 0:
        cb.on_eval(state, state.step, "val", {"eval/loss": 2.0 / state.step + offset})
    for step in steps:
        state.step = step
        cb.on_step_end(state, step, None, train_metrics(step, offset))
        if step % eval_every == 0:
            row = ManifestRow(f"step_{step}", step, 0, step, f"checkpoints/step_{step}", 0.0)
            cb.on_checkpoint(state, row)
            cb.on_eval(state, step, "val", {"eval/loss": 2.0 / step + offset})
    cb.on_train_end(state, artifacts(state))


# ---- jsonl_metrics ----------------------------------------------------------------------------
def test_jsonl_rows_written_and_read_back(tmp_path):
    state = make_state(tmp_path)
    drive(JsonlMetrics(), state, range(1, 5))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    train = [r for r in rows if r["split"] == "train"]
    evals = [r for r in rows if r["split"] == "eval"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert train[1]["train/loss"] == 0.5 and train[1]["train/lr"] == 1e-4
    assert isinstance(train[0]["time"], float)
    assert [(r["step"], r["eval_name"], r["eval/loss"]) for r in evals] == [(2, "val", 1.0), (4, "val", 0.5)]
    assert list(train[0])[:3] == ["step", "split", "time"]


def test_jsonl_rows_are_flushed_before_close(tmp_path):
    cb, state = JsonlMetrics(), make_state(tmp_path)
    cb.on_train_start(state)
    cb.on_step_end(state, 1, None, train_metrics(1))
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["step"] == 1  # readable while still open
    cb.on_train_end(state, artifacts(state))


def test_jsonl_resume_keeps_rows_up_to_resumed_step(tmp_path):
    drive(JsonlMetrics(), make_state(tmp_path), range(1, 7))  # the killed process got to 6
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 7, "split": "tr')  # torn last line
    drive(JsonlMetrics(), make_state(tmp_path, step=4, num_steps=8), range(5, 9), offset=10.0)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 9))
    assert train[3]["train/loss"] == 0.25 and train[4]["train/loss"] == 0.2 + 10.0
    assert [r["step"] for r in rows if r["split"] == "eval"] == [2, 4, 6, 8]
    assert not list(tmp_path.glob(".metrics.jsonl.*"))  # no temp file left behind


def test_jsonl_fresh_start_truncates(tmp_path):
    drive(JsonlMetrics(), make_state(tmp_path), range(1, 4))
    drive(JsonlMetrics(), make_state(tmp_path), range(1, 2))
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]


def test_jsonl_non_master_and_absolute_path(tmp_path):
    drive(JsonlMetrics(), make_state(tmp_path, is_master=False), range(1, 3))
    assert not (tmp_path / "metrics.jsonl").exists()
    target = tmp_path / "elsewhere" / "m.jsonl"
    drive(JsonlMetrics(path=str(target)), make_state(tmp_path / "run"), range(1, 3))
    assert len(read_metrics(target)) == 3


def test_read_metrics_rejects_malformed_middle_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    damaged = '{"step": 1}\nnot json\n{"step": 2}\n{"step": 3}\n'
    path.write_text(damaged)
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_metrics(path)
    assert read_metrics(path, strict=False) == [{"step": 1}, {"step": 2}, {"step": 3}]
    # Resuming over a damaged log keeps a copy of it and carries on with the readable rows.
    cb, state = JsonlMetrics(), make_state(tmp_path, step=2)
    cb.on_train_start(state)
    cb.on_step_end(state, 3, None, {"train/loss": 0.1})
    cb.on_train_end(state, artifacts(state))
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    assert (tmp_path / "metrics.jsonl.corrupt").read_text() == damaged


# ---- csv_metrics ------------------------------------------------------------------------------
def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def test_csv_header_widens_when_a_new_key_appears(tmp_path):
    cb, state = CsvMetrics(), make_state(tmp_path)
    cb.on_train_start(state)
    cb.on_step_end(state, 1, None, {"train/loss": 1.0})
    cb.on_step_end(state, 2, None, {"train/loss": 0.5, "train/kl": 0.01})
    cb.on_eval(state, 2, "val", {"eval/loss": 0.7})
    cb.on_step_end(state, 3, None, {"train/loss": 0.25})
    cb.on_train_end(state, artifacts(state))
    header, rows = read_csv(tmp_path / "metrics.csv")
    assert header == ["step", "time", "train/loss", "train/kl"]
    assert [(r["step"], r["train/loss"], r["train/kl"]) for r in rows] == [
        ("1", "1.0", ""), ("2", "0.5", "0.01"), ("3", "0.25", "")
    ]
    header, rows = read_csv(tmp_path / "metrics_eval.csv")
    assert header == ["step", "time", "eval_name", "eval/loss"]
    assert [(r["step"], r["eval_name"], r["eval/loss"]) for r in rows] == [("2", "val", "0.7")]


def test_csv_resume_truncates_and_fresh_start_restarts(tmp_path):
    drive(CsvMetrics(), make_state(tmp_path), range(1, 7))
    drive(CsvMetrics(), make_state(tmp_path, step=3, num_steps=6), range(4, 7), offset=10.0)
    _, rows = read_csv(tmp_path / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    assert float(rows[3]["train/loss"]) == pytest.approx(10.25)
    _, rows = read_csv(tmp_path / "metrics_eval.csv")
    assert [int(r["step"]) for r in rows] == [2, 4, 6]
    drive(CsvMetrics(), make_state(tmp_path), range(1, 2))
    assert len(read_csv(tmp_path / "metrics.csv")[1]) == 1
    assert not (tmp_path / "metrics_eval.csv").exists()


# ---- tensorboard ------------------------------------------------------------------------------
def tb_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_scalars_read_back_and_purged_on_resume(tmp_path):
    state = make_state(tmp_path, config={"lr": 1e-4, "model": {"name": "tiny"}})
    drive(TensorBoardLogger(), state, range(1, 7))
    assert tb_scalars(tmp_path / "tb", "train/loss") == [(s, pytest.approx(1.0 / s)) for s in range(1, 7)]
    assert tb_scalars(tmp_path / "tb", "eval/loss") == [(s, pytest.approx(2.0 / s)) for s in (2, 4, 6)]

    # Event files are read in name order and named by the second they were opened (then a
    # per-process counter): a resumed process starts in a later second, so make this one too.
    time.sleep(1.0 - time.time() % 1.0 + 0.01)
    drive(TensorBoardLogger(), make_state(tmp_path, step=3, num_steps=6), range(4, 7), offset=10.0)
    expected = [(s, pytest.approx(1.0 / s + (10.0 if s > 3 else 0.0))) for s in range(1, 7)]
    assert tb_scalars(tmp_path / "tb", "train/loss") == expected
    assert [s for s, _ in tb_scalars(tmp_path / "tb", "eval/loss")] == [2, 4, 6]


# ---- wandb ------------------------------------------------------------------------------------
@pytest.fixture
def offline_wandb_env(tmp_path, monkeypatch):
    """W&B confined to tmp_path: offline, silent, no home config, an unreachable server."""
    home = tmp_path / "home"
    home.mkdir()
    for var in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)
    env = {
        "HOME": home, "XDG_CONFIG_HOME": home / ".config", "XDG_CACHE_HOME": home / ".cache",
        "WANDB_MODE": "offline", "WANDB_DIR": tmp_path / "wandb_dir", "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": home / "wandb_config", "WANDB_CACHE_DIR": home / "wandb_cache",
        "WANDB_DATA_DIR": home / "wandb_data", "WANDB_ARTIFACT_DIR": home / "wandb_artifacts",
        "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true", "WANDB_ERROR_REPORTING": "false",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    return home


def inspect_wandb_log(path: Path) -> list[dict]:
    """The records of a .wandb transaction log, decoded by wandb's own reader (`wandb leet inspect`)."""
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.slow
def test_wandb_offline_run_logs_metrics(tmp_path, offline_wandb_env):
    wandb = pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    state = make_state(run_dir, config={"lr": 1e-4})
    logger = WandbLogger(project="olingo-test", tags=["unit"])
    try:
        drive(logger, state, range(1, 5))
    finally:
        wandb.teardown()
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    (log_file,) = run_dir.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    records = inspect_wandb_log(log_file)
    history = {r["history"]["step"]["num"]: r["history"]["item"] for r in records if r["type"] == "history"}
    assert sorted(history) == [1, 2, 3, 4]
    assert history[3]["train/loss"] == pytest.approx(1 / 3) and history[3]["train/lr"] == 1e-4
    assert history[4]["eval/loss"] == pytest.approx(0.5) and history[4]["train/acc"] == pytest.approx(0.4)
    (run_record,) = [r["run"] for r in records if r["type"] == "run"]
    assert run_record["project"] == "olingo-test" and run_record["config"]["update"]["lr"] == 1e-4
    assert not list(offline_wandb_env.glob(".netrc"))  # no login was attempted


class FakeRun:
    def __init__(self, **kwargs):
        self.init_kwargs, self.logged, self.exit_code = kwargs, [], None

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self, exit_code=0):
        self.exit_code = exit_code


def test_wandb_mode_resume_id_and_exit_code(tmp_path, monkeypatch):
    runs: list[FakeRun] = []
    fake = types.ModuleType("wandb")
    fake.Settings = dict
    fake.init = lambda **kw: runs.append(FakeRun(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_SILENT"):
        monkeypatch.delenv(var, raising=False)

    drive(WandbLogger(), make_state(tmp_path), range(1, 3))
    first = runs[0].init_kwargs
    assert first["mode"] == "offline" and first["resume"] is None and first["dir"] == str(tmp_path)
    assert first["settings"] == {"silent": True}
    assert runs[0].logged[0] == (1, train_metrics(1)) and runs[0].exit_code == 0

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    logger, state = WandbLogger(mode=None), make_state(tmp_path, step=2)
    logger.on_train_start(state)
    logger.on_train_end(state, artifacts(state, error=RuntimeError("boom")))
    second = runs[1].init_kwargs
    assert second["id"] == first["id"] and second["resume"] == "allow" and second["mode"] is None
    assert runs[1].exit_code == 1

    WandbLogger().on_train_start(make_state(tmp_path / "other", is_master=False))
    assert len(runs) == 2


# ---- early_stopping ---------------------------------------------------------------------------
def run_evals(cb: EarlyStopping, values: list[float], eval_name: str = "val") -> int | None:
    """Feed one eval per step; return the step at which a stop was requested (or None)."""
    state = LoopState()
    for step, value in enumerate(values, start=1):
        cb.on_eval(state, step, eval_name, {"eval/loss": value, "eval/acc": value})
        if state.stop_requested:
            return step
    return None


@pytest.mark.parametrize(
    "mode, values, stop_at",
    [
        ("min", [1.0, 0.9, 0.95, 0.92, 0.91, 0.5], 5),  # best 0.9 at 2, then 3 bad
        ("min", [1.0, 0.9, 0.95, 0.8, 0.85, 0.84], None),  # improvement resets the count
        ("max", [0.1, 0.3, 0.2, 0.3, 0.25], 5),
        ("max", [0.1, 0.3, 0.2, 0.29, 0.4, 0.35], None),
    ],
)
def test_early_stopping_patience(mode, values, stop_at):
    assert run_evals(EarlyStopping("eval/loss", patience=3, mode=mode), values) == stop_at


def test_early_stopping_min_delta_eval_name_and_short_name():
    cb = EarlyStopping("loss", eval_name="val", patience=2, min_delta=0.1)
    assert run_evals(cb, [1.0, 0.95, 0.91]) == 3  # improvements smaller than min_delta
    other = EarlyStopping("eval/loss", eval_name="test", patience=1)
    assert run_evals(other, [1.0, 2.0, 3.0], eval_name="val") is None and other.best is None


def test_early_stopping_watches_train_steps_when_metric_is_a_train_key():
    cb, state = EarlyStopping("train/loss", patience=2), LoopState()
    for step, loss in enumerate([1.0, 0.8, 0.9, 0.85], start=1):
        cb.on_step_end(state, step, None, {"train/loss": loss})
        cb.on_eval(state, step, "val", {"eval/loss": 0.0, "train/loss": 0.0})  # ignored source
    assert state.stop_requested and cb.source == "train" and cb.best == 0.8 and cb.best_step == 2


def test_early_stopping_state_dict_round_trips_across_resume():
    cb = EarlyStopping("eval/acc", patience=3, mode="max")
    assert run_evals(cb, [0.5, 0.7, 0.6]) is None
    saved = json.loads(json.dumps(cb.state_dict()))
    resumed = EarlyStopping("eval/acc", patience=3, mode="max")
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == cb.state_dict()
    assert (resumed.best, resumed.best_step, resumed.bad_count) == (0.7, 2, 1)
    state = LoopState()
    resumed.on_eval(state, 4, "val", {"eval/acc": 0.65})
    assert not state.stop_requested
    resumed.on_eval(state, 5, "val", {"eval/acc": 0.7})  # equal is not better
    assert state.stop_requested


def test_early_stopping_rejects_bad_arguments():
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping("eval/loss", patience=0)


# ---- progress and print_metrics ---------------------------------------------------------------
def test_progress_bar_survives_non_tty(tmp_path, monkeypatch):
    err, out = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", out)
    bar = ProgressBar(mininterval=0.0)
    state = make_state(tmp_path, step=2, num_steps=6)
    drive(bar, state, range(3, 7))
    text = err.getvalue()
    assert "6/6" in text and "loss=0.1667" in text and "lr=1.00e-04" in text
    assert "[val @ step 4] eval/loss=0.5" in text
    assert bar._bar is None
    ProgressBar().on_train_start(make_state(tmp_path, is_master=False))


def test_print_metrics_every_n_steps(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="olingo.metrics")
    drive(PrintMetrics(every=2), make_state(tmp_path, num_steps=5), range(1, 6))
    lines = [r.getMessage() for r in caplog.records if r.name == "olingo.metrics"]
    steps = [line.split(" |")[0] for line in lines]
    assert steps == ["step 2/5", "eval val @ step 2", "step 4/5", "eval val @ step 4", "step 5/5"]
    assert lines[0].split(" | ")[1].split()[:4] == ["loss", "0.5", "acc", "0.2"]  # short names, the key metrics only
    assert lines[1] == "eval val @ step 2 | loss=1"


# ---- registry ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind, params, cls",
    [
        ("progress", {"keys": ["loss"], "leave": False}, ProgressBar),
        ("jsonl_metrics", {"path": "m.jsonl"}, JsonlMetrics),
        ("csv_metrics", {}, CsvMetrics),
        ("tensorboard", {"log_dir": "tensorboard"}, TensorBoardLogger),
        ("wandb", {"project": "p", "tags": ["a"], "mode": "offline"}, WandbLogger),
        ("early_stopping", {"metric": "eval/loss", "patience": 5, "mode": "max"}, EarlyStopping),
        ("print_metrics", {"every": 10}, PrintMetrics),
    ],
)
def test_build_callback_by_name(kind, params, cls):
    cb = build_callback({"kind": kind, "params": params})
    assert type(cb) is cls
    for key, value in params.items():
        assert getattr(cb, key) == value


def test_build_callback_rejects_unknown_and_mistyped_params():
    with pytest.raises(ValueError, match=r"no parameter 'pth'.*did you mean 'path'"):
        build_callback({"kind": "jsonl_metrics", "params": {"pth": "x.jsonl"}})
    with pytest.raises(ValueError, match="patience"):
        build_callback({"kind": "early_stopping", "params": {"metric": "eval/loss", "patience": "three"}})
    with pytest.raises(ValueError, match="mode"):
        build_callback({"kind": "early_stopping", "params": {"metric": "eval/loss", "mode": "lowest"}})
    with pytest.raises(ValueError, match="metric"):
        build_callback({"kind": "early_stopping", "params": {}})
    with pytest.raises(ValueError, match="did you mean 'tensorboard'"):
        build_callback({"kind": "tensorbord"})


def test_registering_another_class_under_a_taken_name_raises():
    assert registered_callbacks()["jsonl_metrics"] is JsonlMetrics

    class Impostor(Callback):
        pass

    with pytest.raises(ValueError, match="already registered"):
        register_callback("jsonl_metrics")(Impostor)
    assert registered_callbacks()["jsonl_metrics"] is JsonlMetrics


@pytest.mark.slow
def test_builtin_module_imports_without_wandb():
    # sys.modules['wandb'] = None makes any `import wandb` fail, as if it were not installed.
    code = "import sys; sys.modules['wandb'] = None; import olingo.trainer.callbacks.builtin as b; print(len(b.__all__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "13"
