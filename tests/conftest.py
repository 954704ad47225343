"""Shared fixtures: an isolated OLINGO_HOME with the embedded task's assets, small data files."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def olingo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built-in assets go to a per-session directory, never to ~/.cache."""
    home = tmp_path_factory.mktemp("olingo_home")
    os.environ["OLINGO_HOME"] = str(home)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    return home


@pytest.fixture(scope="session")
def assets(olingo_home: Path):
    from olingo.recipes.common import assets_root
    from olingo.tasks import prepare_assets

    return prepare_assets(assets_root())


@pytest.fixture(scope="session")
def small_pref_file(assets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 64 training pairs of the embedded task."""
    rows = assets.preference_train.read_text().splitlines()[:64]
    path = tmp_path_factory.mktemp("data") / "pref64.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def olingo_cmd(*args: str) -> list[str]:
    """The CLI as a subprocess command line, with this interpreter."""
    return [sys.executable, "-m", "olingo.cli.main", *args]


def user_package(root: Path, package: str, module: str, source: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Write `<root>/pkgs/<package>/<module>.py` holding `source`, importable as a user's own reward
    module is (its directory on the path), with any copy of `package` another test imported in
    this process forgotten, so the import reads this one. Returns the package directory."""
    directory = root / "pkgs" / package
    directory.mkdir(parents=True)
    (directory / "__init__.py").write_text("")
    (directory / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(root / "pkgs"))
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    return directory


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kill_when_logged(cmd: list[str], metrics: Path, rows: int, env: dict[str, str] | None = None, timeout: float = 240) -> None:
    """Start `cmd` and SIGKILL it as soon as `metrics` holds `rows` lines (a kill mid-run, for
    the exact-resume tests); fails if the run ends first."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= rows:
            break
        time.sleep(0.002)
    assert proc.poll() is None, f"run ended before the kill at row {rows}: {proc.stderr.read()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny matmuls: on a busy 2-core machine a second intra-op thread makes them ~50x slower.
    A module uses it with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def continued(monkeypatch) -> list[bool]:
    """For each `HFEngine.generate` call that had a kept KV cache, whether it continued from it
    (`olingo.engines.prefixes.continue_from` returned a continuation)."""
    import olingo.engines.hf as hf

    seen, real = [], hf.continue_from
    monkeypatch.setattr(hf, "continue_from", lambda *args: (lambda c: seen.append(c is not None) or c)(real(*args)))
    return seen
