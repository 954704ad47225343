"""Atomic checkpoints and the append-only manifest `checkpoints.jsonl`.

A checkpoint is written into `checkpoints/.tmp-<name>/`, renamed to `checkpoints/<name>/` once
every rank has finished writing, and only then recorded in the manifest. A process killed at any
moment therefore leaves the last manifest row pointing at a complete checkpoint. Every rank writes
into the temporary directory (distributed checkpoint shards), so on several machines it must be
on a shared filesystem.

Each trained model is stored as `<name>/`, a Hugging Face directory (the export users load), and
its optimizer as `<stem>.pt`; a plugin that shards (FSDP2) adds `<name>.dcp/` and writes
`<stem>.dcp/` instead: DCP shards, which resume under any world size and are preferred on load.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from olingo.booster import Booster, OptimizerWrapper
from olingo.cluster import DistCoordinator
from olingo.errors import RunIOError
from olingo.trainer.callbacks.state import ManifestRow

logger = logging.getLogger("olingo.checkpoint")
MANIFEST = "checkpoints.jsonl"


def save_trained(booster: Booster, directory: Path, name: str, model: Any, optimizer: OptimizerWrapper, optimizer_stem: str) -> None:
    """The model as `<name>/` (+ `<name>.dcp/` when sharded) and its optimizer; all ranks call."""
    booster.save_model(model, directory / name)
    if booster.plugin.sharded_checkpoints:
        booster.save_model(model, directory / f"{name}.dcp", shard=True)
        booster.save_optimizer(optimizer, directory / f"{optimizer_stem}.dcp", shard=True)
    else:
        booster.save_optimizer(optimizer, directory / f"{optimizer_stem}.pt")


def load_trained(booster: Booster, directory: Path, name: str, model: Any, optimizer: OptimizerWrapper, optimizer_stem: str) -> None:
    """Load what `save_trained` wrote, whichever plugin and world size wrote it: shards when
    present (exact, and never gathered on one rank), else the Hugging Face directory."""
    shards = directory / f"{name}.dcp"
    booster.load_model(model, shards if shards.is_dir() else directory / name)
    optimizer_shards = directory / f"{optimizer_stem}.dcp"
    booster.load_optimizer(optimizer, optimizer_shards if optimizer_shards.is_dir() else directory / f"{optimizer_stem}.pt")


def _is_write_failure(err: RuntimeError) -> bool:
    """torch.save reports a full disk as RuntimeError("... PytorchStreamWriter failed writing ...")."""
    return "failed writing" in str(err) or "write failed" in str(err)


def describe_os_error(err: BaseException, path: Path) -> str:
    """'No space left on device (errno 28)' for an OSError; for the RuntimeError torch.save
    raises instead, its first line and the free space left where `path` lives."""
    if isinstance(err, OSError):
        return f"{err.strerror or err} (errno {err.errno})"
    try:
        free = f"; {shutil.disk_usage(path).free / 2**20:.0f} MiB free there"
    except OSError:
        free = ""
    return f"{str(err).splitlines()[0] if str(err) else type(err).__name__}{free}"


class CheckpointManager:
    """Writes checkpoints under `<run_dir>/checkpoints/` and keeps the manifest."""

    def __init__(self, run_dir: str | Path, coordinator: DistCoordinator | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / "checkpoints"
        self.manifest_path = self.run_dir / MANIFEST
        self.coordinator = coordinator or DistCoordinator()

    def rows(self) -> list[ManifestRow]:
        """Manifest rows whose directory exists; a torn last line (killed mid-append) is ignored."""
        if not self.manifest_path.exists():
            return []
        rows = []
        for line in self.manifest_path.read_text().splitlines():
            try:
                row = ManifestRow(**json.loads(line))
            except (json.JSONDecodeError, TypeError):
                continue
            if (self.run_dir / row.path).is_dir():
                rows.append(row)
        return rows

    def last(self) -> ManifestRow | None:
        rows = self.rows()
        return rows[-1] if rows else None

    def save(self, name: str, step: int, epoch: int, batch: int, write: Callable[[Path], None]) -> ManifestRow:
        """Run `write(tmp_dir)` on every rank, then publish the checkpoint atomically."""
        coord = self.coordinator
        tmp = self.root / f".tmp-{name}"
        final = self.root / name
        row = ManifestRow(name=name, step=step, epoch=epoch, batch=batch, path=str(final.relative_to(self.run_dir)), time=0.0)
        try:
            if coord.is_master:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            coord.barrier()
            write(tmp)
            coord.barrier()
            if coord.is_master:
                if final.exists():  # an orphan of a killed run, never listed in the manifest
                    shutil.rmtree(final)
                os.replace(tmp, final)
            row.time = time.time()
            if coord.is_master:
                with self.manifest_path.open("a") as f:
                    f.write(json.dumps(row.to_json()) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
        except (OSError, RuntimeError) as err:
            if isinstance(err, RuntimeError) and not _is_write_failure(err):
                raise
            raise self._write_error(name, tmp, err) from None
        coord.barrier()
        return row

    def _write_error(self, name: str, tmp: Path, err: BaseException) -> RunIOError:
        """A checkpoint that could not be written: free its partial files, keep the manifest
        (its last row is still a complete checkpoint) and say how to go on."""
        if self.coordinator.is_master:
            shutil.rmtree(tmp, ignore_errors=True)
        last = self.last()
        kept = f"the last complete checkpoint {self.run_dir / last.path} is kept" if last else "no earlier checkpoint exists"
        return RunIOError(
            f"could not write checkpoint '{name}' into {tmp.parent}: {describe_os_error(err, self.run_dir)}; {kept}: "
            "free space or fix permissions, then resume with run.resume=last"
        )

    def remove_stale_temporaries(self) -> None:
        """Delete `.tmp-*` directories a killed run left behind."""
        if self.coordinator.is_master and self.root.is_dir():
            for tmp in self.root.glob(".tmp-*"):
                logger.info("removing incomplete checkpoint %s", tmp)
                shutil.rmtree(tmp, ignore_errors=True)
