"""Write the embedded task's model, tokenizer and data files to disk, once.

`prepare_assets(root)` lays out::

    root/assets.json             the arguments the files were made from
    root/tiny-llama/             model + tokenizer, a Hugging Face directory
    root/sft_{train,eval}.jsonl          {"prompt", "completion"}
    root/preference_{train,eval}.jsonl   {"prompt", "chosen", "rejected"}
    root/prompts_{train,eval}.jsonl      {"prompt", "gt_answer"}

Every file and the model directory are written under a temporary name and renamed into
place, so a reader never sees a half-written file and two processes preparing the same
root at once both end with the same complete set.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from olingo.tasks.arithmetic import ArithmeticTask
from olingo.tasks.tiny_model import build_tiny_llama, save_pretrained_pair
from olingo.tasks.tokenizer import build_char_tokenizer

MODEL_DIR = "tiny-llama"
MANIFEST = "assets.json"


@dataclass(frozen=True)
class TaskAssets:
    """Paths of everything `prepare_assets` writes under `root`."""

    root: Path
    model_dir: Path
    sft_train: Path
    sft_eval: Path
    preference_train: Path
    preference_eval: Path
    prompts_train: Path
    prompts_eval: Path

    @classmethod
    def under(cls, root: Path) -> TaskAssets:
        """The fixed layout below `root`; nothing is read or written."""
        return cls(
            root=root,
            model_dir=root / MODEL_DIR,
            sft_train=root / "sft_train.jsonl",
            sft_eval=root / "sft_eval.jsonl",
            preference_train=root / "preference_train.jsonl",
            preference_eval=root / "preference_eval.jsonl",
            prompts_train=root / "prompts_train.jsonl",
            prompts_eval=root / "prompts_eval.jsonl",
        )


def prepare_assets(
    root: str | Path,
    *,
    seed: int = 0,
    task: ArithmeticTask | None = None,
    n_pref_train: int = 4000,
    n_pref_eval: int = 400,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
) -> TaskAssets:
    """Write the tiny model and the task's data under `root`, skipping what is already there.

    `task` defaults to `ArithmeticTask(seed=seed)`; `seed` also seeds the model's init.
    The arguments are recorded in `root/assets.json`, and a later call with different
    ones raises instead of silently returning files made from the old ones.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    task = ArithmeticTask(seed=seed) if task is None else task
    manifest = {
        "seed": seed,
        "task": dataclasses.asdict(task),
        "n_pref_train": n_pref_train,
        "n_pref_eval": n_pref_eval,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
    }
    _check_or_write_manifest(root / MANIFEST, manifest)
    assets = TaskAssets.under(root)

    rows: dict[Path, Callable[[], list[dict[str, str]]]] = {
        assets.sft_train: lambda: task.sft_rows("train"),
        assets.sft_eval: lambda: task.sft_rows("eval"),
        assets.preference_train: lambda: task.preference_rows("train", n_pref_train),
        assets.preference_eval: lambda: task.preference_rows("eval", n_pref_eval),
        assets.prompts_train: lambda: task.prompt_rows("train"),
        assets.prompts_eval: lambda: task.prompt_rows("eval"),
    }
    for path, make_rows in rows.items():
        if not path.exists():
            write_jsonl_atomic(path, make_rows())
    if not assets.model_dir.exists():
        _write_model_atomic(
            assets.model_dir, seed=seed, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads
        )
    return assets


def _check_or_write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Record the arguments on first use; refuse a root that was made from other ones."""
    # The JSON round trip turns tuples into lists so the comparison is like for like.
    expected = json.loads(json.dumps(manifest))
    if path.exists():
        found = json.loads(path.read_text())
        if found != expected:
            raise ValueError(
                f"{path.parent} holds assets made with {found}, not {expected}; "
                "use another root or delete this one"
            )
        return
    _write_text_atomic(path, json.dumps(expected, indent=2, sort_keys=True) + "\n")


def write_jsonl_atomic(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write one JSON object per line, atomically (a reader never sees a half-written file)."""
    _write_text_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))


def _write_text_atomic(path: Path, text: str) -> None:
    """Write to a unique temporary sibling, then rename it over `path` in one step."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write_model_atomic(model_dir: Path, *, seed: int, hidden_size: int, num_layers: int, num_heads: int) -> None:
    """Build and save the tokenizer and model in a temporary directory, then rename it.

    A directory cannot be renamed over a non-empty one, so when a concurrent writer got
    there first the rename fails and this copy, identical by construction, is dropped.
    """
    tmp = model_dir.with_name(f".{model_dir.name}.{os.getpid()}-{uuid.uuid4().hex}.tmp")
    try:
        tokenizer = build_char_tokenizer()
        model = build_tiny_llama(
            tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, seed=seed
        )
        save_pretrained_pair(model, tokenizer, tmp)
        try:
            os.rename(tmp, model_dir)
        except OSError:
            if not model_dir.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
