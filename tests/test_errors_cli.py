"""Every failure of docs/errors.md through the CLI: one line on stderr, no traceback, the
documented exit status, and a finished run in the same output directory left untouched.

Most cases call `olingo.cli.main.main` in this process (fast); the signal cases start a real
subprocess and send it SIGINT/SIGTERM.
"""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from olingo.cli.main import main
from tests.conftest import olingo_cmd, read_jsonl

TRACEBACK = "Traceback (most recent call last)"


def rm_args(out: Path, data: Path, name: str, *extra: str) -> list[str]:
    return [
        "rm", f"run.output_dir={out}", f"run.name={name}", f"data.train=[{data}]", "data.eval=[]",
        "logging.progress=false", "train.epochs=1", "train.batch_size=4", "train.lr=3e-3", *extra,
    ]


def snapshot(run_dir: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under `run_dir`: any write or deletion changes it."""
    return {str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, small_pref_file) -> tuple[Path, Path]:
    """A completed `olingo rm` run ("done") in an output directory the cases share."""
    out = tmp_path_factory.mktemp("errors")
    assert main(rm_args(out, small_pref_file, "done", "train.save_interval=8")) == 0
    return out, out / "done"


def non_utf8_file(tmp: Path) -> Path:
    path = tmp / "latin1.jsonl"
    good = b'{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n'
    path.write_bytes(good + b'{"prompt": "caf\xe9 1+1=", "chosen": "2", "rejected": "3"}\n' + good * 4)
    return path


def not_a_model_dir(tmp: Path) -> Path:
    path = tmp / "not-a-model"
    path.mkdir(exist_ok=True)
    (path / "notes.txt").write_text("hello")
    return path


# (case id, args builder, expected fragments of the one stderr line)
CASES = {
    "overwrite-then-missing-data": (
        lambda out, data, tmp: rm_args(out, tmp / "missing.jsonl", "done", "run.overwrite=true"),
        ["missing.jsonl", "no such file"],
    ),
    "not-utf8": (
        lambda out, data, tmp: rm_args(out, non_utf8_file(tmp), "fresh"),
        ["latin1.jsonl, row 2: not valid UTF-8: byte 0xe9 at byte offset 66"],
    ),
    "model-path-missing": (
        lambda out, data, tmp: rm_args(out, data, "fresh", f"model.path={tmp / 'no-such-model'}"),
        ["model.path", "no-such-model", "does not exist"],
    ),
    "model-path-not-a-model": (
        lambda out, data, tmp: rm_args(out, data, "fresh", f"model.path={not_a_model_dir(tmp)}"),
        ["not-a-model", "a directory holding notes.txt; no config.json"],
    ),
    "resume-dir-missing": (
        lambda out, data, tmp: rm_args(out, data, "done", f"run.resume={out / 'done' / 'checkpoints' / 'step_99'}", "train.lr=0.5"),
        ["step_99 does not exist", "complete checkpoints of", "step_8", "final"],
    ),
    "resume-dir-without-checkpoint": (
        lambda out, data, tmp: rm_args(out, data, "done", f"run.resume={tmp}"),
        ["holds no complete checkpoint", "step_8, step_16, final"],
    ),
    "batch-larger-than-data": (
        lambda out, data, tmp: rm_args(out, data, "fresh", "train.batch_size=100"),
        ["train.batch_size=100 is larger than the 64 rows of data.train"],
    ),
    "max-length-without-room": (
        lambda out, data, tmp: rm_args(out, data, "fresh", "data.max_length=3"),
        ["data.max_length=3 leaves no room for text: the chat template alone takes"],
    ),
    "run-dir-exists": (
        lambda out, data, tmp: rm_args(out, data, "done"),
        ["already exists", "run.resume=last", "run.overwrite=true"],
    ),
    "bad-range": (
        lambda out, data, tmp: rm_args(out, data, "fresh", "train.lr=0"),
        ["train.lr"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_failure_is_one_line_exit_2_and_loses_nothing(case, finished, small_pref_file, tmp_path, capsys):
    out, done = finished
    build, fragments = CASES[case]
    before = snapshot(done)
    code = main(build(out, small_pref_file, tmp_path))
    err = capsys.readouterr().err
    assert code == 2, err
    assert sum(line.startswith("olingo: ") for line in err.splitlines()) == 1, err
    message = err[err.index("olingo: "):]  # one line; a config error lists one problem a line
    for fragment in fragments:
        assert fragment in message, message
    assert TRACEBACK not in err
    assert snapshot(done) == before  # the finished run: not one byte changed
    assert not (out / "fresh").exists()  # a failed start writes nothing


def test_debug_shows_the_traceback(finished, small_pref_file, tmp_path, capsys):
    out, _ = finished
    assert main(["--debug", *rm_args(out, tmp_path / "missing.jsonl", "fresh")]) == 2
    assert TRACEBACK in capsys.readouterr().err


def test_missing_optional_package_names_the_extra(finished, small_pref_file, monkeypatch, capsys):
    out, _ = finished
    monkeypatch.setitem(sys.modules, "peft", None)  # importing it now raises ImportError
    assert main(rm_args(out, small_pref_file, "fresh", "model.lora.r=4")) == 2
    err = capsys.readouterr().err
    assert "pip install 'olingo[peft]'" in err and TRACEBACK not in err
    assert not (out / "fresh").exists()


def test_disk_full_while_checkpointing_keeps_the_last_checkpoint(finished, small_pref_file, monkeypatch, capsys):
    out, _ = finished
    real_save = torch.save

    def save(obj, path, *args, **kwargs):  # torch.save's signature
        if "optimizer" in str(path) and "step_8" in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    assert main(rm_args(out, small_pref_file, "full", "train.save_interval=4")) == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("olingo: "))
    assert "could not write checkpoint 'step_8'" in line and "No space left on device (errno 28)" in line
    assert "step_4" in line and "run.resume=last" in line and TRACEBACK not in err
    run_dir = out / "full"
    assert [row["name"] for row in read_jsonl(run_dir / "checkpoints.jsonl")] == ["step_4"]
    assert not (run_dir / "checkpoints" / ".tmp-step_8").exists()  # the partial files are freed
    monkeypatch.setattr(torch, "save", real_save)
    assert main(rm_args(out, small_pref_file, "full", "train.save_interval=4", "run.resume=last")) == 0
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl")] == list(range(1, 17))


def test_metrics_that_cannot_be_written_stop_the_run(finished, small_pref_file, capsys):
    out, _ = finished
    run_dir = out / "devfull"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").symlink_to("/dev/full")  # every write fails with ENOSPC
    assert main(rm_args(out, small_pref_file, "devfull", "run.resume=last")) == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("olingo: "))
    assert "could not write metrics to" in line and "errno 28" in line and TRACEBACK not in err


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_after_a_step_with_a_checkpoint_and_resumes(sig, small_pref_file, tmp_path):
    args = rm_args(tmp_path, small_pref_file, "sig", "train.epochs=3")
    proc = subprocess.Popen(olingo_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "sig" / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.01)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert TRACEBACK not in err and "KeyboardInterrupt" not in err
    line = next(line for line in err.splitlines() if line.startswith("olingo: "))
    rows = read_jsonl(tmp_path / "sig" / "checkpoints.jsonl")
    step = rows[-1]["step"]
    assert rows[-1]["name"] == f"step_{step}" and step == len(read_jsonl(metrics))
    assert f"stopped by {sig.name} after optimizer step {step}" in line
    assert line.endswith(shlex.join([*olingo_cmd(*args), "run.resume=last"]))  # the run's own command line
    resume = olingo_cmd("rm", "--config", str(tmp_path / "sig" / "config.yaml"), "run.resume=last")
    resumed = subprocess.run(resume, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [row["step"] for row in read_jsonl(metrics)] == list(range(1, 3 * 16 + 1))


def test_a_rejected_resume_keeps_config_yaml(finished, small_pref_file, tmp_path, capsys):
    out, done = finished
    config = (done / "config.yaml").read_text()
    copy = tmp_path / "copy"
    shutil.copytree(done, copy)
    assert main(rm_args(tmp_path, small_pref_file, "copy", "run.resume=" + str(copy / "checkpoints" / "nope"), "train.lr=0.5")) == 2
    assert (copy / "config.yaml").read_text() == config
    capsys.readouterr()
