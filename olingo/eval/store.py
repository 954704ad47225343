"""The eval directory: `samples.jsonl`, appended one prompt batch at a time, and what makes a
rerun of the same command continue it exactly.

Layout (docs/eval.md):
    config.yaml     the resolved config of the last run
    sampling.json   what fixes the samples (`EvalConfig.sampling_key`); a rerun must match it
    samples.jsonl   one row per sample, written a whole prompt batch at a time
    eval.json       the metrics, intervals, comparisons and verdicts (written at the end)
    plots/eval.png  pass@k / maj@k curves and the differences (`olingo report DIR` redraws it)

A batch's rows go out in one write, flushed and fsynced, so a killed eval leaves whole batches
and at most one torn last line; `SampleStore.completed` keeps the batches that are whole and
rewrites the file without the rest, and the rerun samples only what is missing.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from olingo.config import ConfigError, dump_config
from olingo.errors import RunIOError

SAMPLES, SAMPLING, RESULT, CONFIG = "samples.jsonl", "sampling.json", "eval.json", "config.yaml"


def is_eval_dir(path: str | Path) -> bool:
    """Whether `path` is an eval directory (it holds sampling.json)."""
    return (Path(path) / SAMPLING).is_file()


def prepare_eval_dir(out_dir: Path, config: Any, overwrite: bool) -> None:
    """Create `out_dir`, or continue it when its samples were drawn the same way (a `ConfigError`
    naming the settings that differ otherwise), or delete it first with `overwrite`."""
    key = config.sampling_key()
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"eval directory {out_dir} exists and is not a directory: change run.name, run.output_dir or --output")
    if overwrite and out_dir.exists():
        shutil.rmtree(out_dir)
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not is_eval_dir(out_dir):
            raise ConfigError(f"{out_dir} exists and is not an eval directory (no {SAMPLING}): change run.name or --output, or pass run.overwrite=true")
        stored = json.loads((out_dir / SAMPLING).read_text())
        changed = sorted(_differences(stored, key))
        if changed:
            raise ConfigError(
                f"eval directory {out_dir} holds samples drawn with other settings ({', '.join(changed)}): rerun with the same ones to "
                "continue it, or pass run.overwrite=true to start over (or change run.name / --output)"
            )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / SAMPLING).write_text(json.dumps(key, indent=1, sort_keys=True) + "\n")
        (out_dir / CONFIG).write_text(dump_config(config))
    except OSError as err:
        raise RunIOError(f"cannot write the eval directory {out_dir}: {err.strerror or err}") from None


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in old.keys() | new.keys() for d in _differences(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [prefix.rstrip(".")]


class SampleStore:
    """`samples.jsonl` of an eval directory: rows keyed by (model label, batch index)."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / SAMPLES

    def completed(self, expected: Callable[[int], int]) -> dict[tuple[str, int], list[dict[str, Any]]]:
        """The whole batches in the file, {(model, batch): rows}: a batch is whole with
        `expected(batch)` rows. Others (a kill mid-batch, a torn last line) are dropped from the
        file, which is rewritten atomically when anything was dropped."""
        if not self.path.is_file():
            return {}
        groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
        lines = self.path.read_text().splitlines()
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # the torn last line of a killed write
            groups.setdefault((row["model"], row["batch"]), []).append(row)
        whole = {key: rows for key, rows in groups.items() if len(rows) == expected(key[1])}
        if sum(len(rows) for rows in whole.values()) != len(lines):
            temporary = self.path.with_suffix(".jsonl.tmp")
            temporary.write_text("".join(json.dumps(row) + "\n" for rows in whole.values() for row in rows))
            os.replace(temporary, self.path)
        return whole

    def append(self, rows: list[dict[str, Any]]) -> None:
        """One batch's rows, in one write, flushed to disk before returning."""
        with open(self.path, "a") as handle:
            handle.write("".join(json.dumps(row) + "\n" for row in rows))
            handle.flush()
            os.fsync(handle.fileno())


def read_result(out_dir: str | Path) -> dict[str, Any]:
    """The eval.json of a finished eval directory."""
    path = Path(out_dir) / RESULT
    if not path.is_file():
        raise FileNotFoundError(f"{out_dir} has no {RESULT} yet: the eval has not finished (rerun its command to continue it)")
    return json.loads(path.read_text())


def write_result(out_dir: Path, result: dict[str, Any]) -> Path:
    """eval.json, written atomically."""
    path = out_dir / RESULT
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(temporary, path)
    return path


def stored_config(out_dir: str | Path) -> dict[str, Any]:
    """The config.yaml of an eval directory, as a dict."""
    return yaml.safe_load((Path(out_dir) / CONFIG).read_text())
