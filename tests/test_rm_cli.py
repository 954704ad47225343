"""`olingo rm` as a user runs it: kill-and-resume equality, 2-process DDP, bad input, loggers."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import olingo_cmd, read_jsonl

pytestmark = pytest.mark.slow


def base_args(out: Path, data: Path, name: str) -> list[str]:
    return [
        "rm", f"run.output_dir={out}", f"run.name={name}", f"data.train=[{data}]", "data.eval=[]",
        "logging.progress=false", "train.epochs=2", "train.batch_size=4", "train.lr=3e-3",
    ]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / "final" / "model" / "model.safetensors"))


def without_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in ("time", "perf/tokens_per_s")} for row in rows]  # wall-clock values


def run(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(olingo_cmd(*args), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_kill_and_resume_equals_an_uninterrupted_run(tmp_path, small_pref_file):
    """SIGKILL at a random step, resume from the last checkpoint, compare weights and metric rows."""
    run(base_args(tmp_path, small_pref_file, "straight") + ["train.save_interval=3"])
    straight = tmp_path / "straight"
    total = len(read_jsonl(straight / "metrics.jsonl"))
    assert total == 32  # 64 pairs / 4 per batch x 2 epochs

    kill_at = random.Random(os.getpid()).randint(4, 26)
    killed = tmp_path / "killed"
    command = olingo_cmd(*base_args(tmp_path, small_pref_file, "killed"), "train.save_interval=3")
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= kill_at:
            break
        time.sleep(0.005)
    assert proc.poll() is None, f"run ended before the kill at step {kill_at}: {proc.stderr.read()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    last = read_jsonl(killed / "checkpoints.jsonl")[-1]
    assert last["name"].startswith("step_") and last["step"] <= kill_at

    run(base_args(tmp_path, small_pref_file, "killed") + ["train.save_interval=3", "run.resume=last"])
    for key, value in weights(straight).items():
        assert torch.equal(value, weights(killed)[key]), key
    assert without_time(read_jsonl(killed / "metrics.jsonl")) == without_time(read_jsonl(straight / "metrics.jsonl"))
    assert [r["name"] for r in read_jsonl(killed / "checkpoints.jsonl")][-1] == "final"


def test_two_process_ddp_equals_one_process(tmp_path, small_pref_file):
    """torchrun with 2 gloo ranks x batch 4 == 1 process x batch 8 (1e-5), 8 optimizer steps."""
    common = [f"data.train=[{small_pref_file}]", "train.epochs=1", "train.lr=1e-4"]
    run(base_args(tmp_path, small_pref_file, "single") + common + ["train.batch_size=8"])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "olingo.cli.main",
           *base_args(tmp_path, small_pref_file, "ddp"), *common, "train.batch_size=4", "plugin.name=ddp"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    single, ddp = weights(tmp_path / "single"), weights(tmp_path / "ddp")
    for key in single:
        torch.testing.assert_close(ddp[key], single[key], atol=1e-5, rtol=0, msg=key)
    rows_single = read_jsonl(tmp_path / "single" / "metrics.jsonl")
    rows_ddp = read_jsonl(tmp_path / "ddp" / "metrics.jsonl")
    assert len(rows_single) == len(rows_ddp) == 8
    for a, b in zip(rows_single, rows_ddp, strict=True):
        assert abs(a["train/loss"] - b["train/loss"]) < 1e-5 and abs(a["train/acc"] - b["train/acc"]) < 1e-6


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"prompt": "1+1=", "chosen": "2", "rejected": "3"', "row 3: invalid JSON"),
        ('{"prompt": "1+1=", "chosen": "2"}', "row 3, field 'rejected': missing"),
        ('{"prompt": "1+1=", "chosen": 2, "rejected": "3"}', "row 3, field 'chosen': expected a string or a list of messages, got int"),
        ('{"prompt": "1+1=", "chosen": "  ", "rejected": "3"}', "row 3, field 'chosen': empty response"),
        ('{"prompt": "1+1=", "chosen": "' + "9" * 200 + '", "rejected": "3"}', "row 3, field 'chosen': the response alone is"),
    ],
)
def test_bad_input_fails_before_training_naming_file_row_field(tmp_path, line, expected):
    data = tmp_path / "pref.jsonl"
    good = '{"prompt": "1+1=", "chosen": "2", "rejected": "3"}'
    data.write_text("\n".join([good, good, line, good]) + "\n")
    result = subprocess.run(olingo_cmd(*base_args(tmp_path, data, "bad")), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"{data}, {expected}" in result.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()


def test_skip_invalid_rows_trains_and_logs_the_count(tmp_path, small_pref_file):
    data = tmp_path / "pref.jsonl"
    data.write_text(small_pref_file.read_text() + '{"prompt": "1+1=", "chosen": ""}\nnot json\n')
    result = run(base_args(tmp_path, data, "skip") + ["data.skip_invalid=true", "train.epochs=1"])
    assert "skipped 2 invalid rows, kept 64" in result.stderr


def test_loggers_write_tensorboard_and_wandb_offline(tmp_path, small_pref_file):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(base_args(tmp_path, small_pref_file, "logged") + ["train.epochs=1", "logging.wandb=true", f"data.eval=[{small_pref_file}]"])
    run_dir = tmp_path / "logged"
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == list(range(1, 17))
    assert [e.step for e in events.Scalars("eval/acc")] == [16]
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert (run_dir / "wandb_id.txt").exists()
