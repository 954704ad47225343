"""`olingo ppo` with `ray.enabled=true`: on a Ray instance it starts itself, and joining a
cluster started with `ray start --head` through RAY_ADDRESS. Runs after tests/test_ray.py has
shut its own instance down; each test checks that no Ray process outlives it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import olingo_cmd, read_jsonl

pytestmark = pytest.mark.slow  # the CLI and Ray in subprocesses

pytest.importorskip("ray")
RAY = str(Path(os.sys.executable).parent / "ray")


def ray_pids() -> set[int]:
    """Processes of any Ray instance on this machine (raylet, GCS server, workers)."""
    out = subprocess.run(["pgrep", "-f", "raylet|gcs_server|ray::|default_worker.py"], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


def wait_gone(pids: set[int], seconds: float = 30) -> set[int]:
    deadline = time.time() + seconds
    while time.time() < deadline and pids & ray_pids():
        time.sleep(0.5)
    return pids & ray_pids()


def ray_args(tmp_path: Path, assets, name: str, *extra: str) -> list[str]:
    return [
        "ppo", f"run.output_dir={tmp_path}", f"run.name={name}", "logging.progress=false", f"model.actor={assets.model_dir}",
        "ray.enabled=true", "ray.num_cpus=2", "loop.episodes=3", "loop.rollout_batch_size=16", "loop.train_batch_size=8",
        "loop.update_steps=2", "generation.max_new_tokens=4", "loop.eval_batch_size=64", "loop.accuracy_function=arithmetic_exact",
        "ray.call_timeout_s=120", "ray.experience_timeout_s=120", *extra,
    ]


def check_run(run_dir: Path, steps: int) -> dict:
    summary = json.loads((run_dir / "ray_summary.json").read_text())
    assert summary["steps"] == steps
    rows = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(1, steps + 1))
    assert all(r["perf/weight_sync_gbps"] > 0 and "ray/staleness" in r for r in train)
    assert [r["step"] for r in rows if r["split"] == "eval"] == [0, steps]
    # The starting policy's evaluation is written when it is computed, before any training row,
    # so a run killed during training keeps it.
    assert rows[0]["split"] == "eval" and rows[0]["step"] == 0 and "eval/accuracy" in rows[0]
    assert (run_dir / "checkpoints" / "final" / "actor" / "config.json").exists()
    return summary


def test_ray_cli_on_a_local_instance_it_starts_and_stops(tmp_path, assets):
    before = ray_pids()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(olingo_cmd(*ray_args(tmp_path, assets, "local")), capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    summary = check_run(tmp_path / "local", steps=3 * 2 * 2)  # 3 episodes x 2 batches x 2 passes
    assert "held-out eval/accuracy" in out.stdout
    assert summary["ray"]["buffer"]["sampled"] == 3 * 2 * 8
    assert not wait_gone(ray_pids() - before), "the CLI must shut down the Ray instance it started"
    report = subprocess.run(olingo_cmd("report", str(tmp_path / "local")), capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr


def test_ray_cli_joins_the_cluster_named_by_ray_address(tmp_path, assets):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = ray_pids()
    # `ray start` clusters authenticate with a token (Ray >= 2.59); clients must say so
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token"}
    start = subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
                           capture_output=True, text=True, timeout=120, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert start.returncode == 0, start.stderr[-3000:]
    try:
        out = subprocess.run(olingo_cmd(*ray_args(tmp_path, assets, "joined")), capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-4000:]
        assert f"joined the Ray cluster at 127.0.0.1:{port}" in out.stderr
        check_run(tmp_path / "joined", steps=12)
        assert ray_pids() - before, "the cluster started with `ray start` keeps running after the job"
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)
    assert not wait_gone(ray_pids() - before)
