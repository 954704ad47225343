"""What `olingo eval` resolves before sampling: each MODEL argument to a model directory, and
`eval.answer` to the function that extracts the answer maj@k votes on."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from olingo.config import ConfigError
from olingo.models.sources import BUILTIN_PREFIX, resolve_model_path
from olingo.rewards.registry import RewardError, resolve_reward

logger = logging.getLogger("olingo.eval")

FINAL_MODELS = ("actor", "model")  # what a checkpoint holds: an RL run's policy, a supervised run's model
ANSWER_BY_ACCURACY = {"arithmetic_exact": "integer", "math_answer": "math", "math_verify": "math"}


@dataclass(frozen=True)
class EvalModel:
    """One evaluated model: its label (the MODEL argument, made unique) and the directory it loads from."""

    label: str
    spec: str
    path: str


def resolve_models(specs: list[str], gguf_file: str | None = None) -> list[EvalModel]:
    """Each MODEL as a loadable directory (`model_dir`); a repeated MODEL gets a label of its own
    ('name#2'), so a model can be compared with itself."""
    if not specs:
        raise ConfigError("olingo eval needs at least one MODEL: olingo eval MODEL [MODEL ...] [KEY=VALUE ...] (or models: in --config)")
    models, seen = [], {}
    for spec in specs:
        seen[spec] = seen.get(spec, 0) + 1
        label = spec if seen[spec] == 1 else f"{spec}#{seen[spec]}"
        models.append(EvalModel(label, spec, model_dir(spec, gguf_file)))
    return models


def model_dir(spec: str, gguf_file: str | None = None) -> str:
    """The directory a MODEL names: a run directory's final model (else its last complete
    checkpoint's), a checkpoint directory's model, a `builtin:` name or GGUF file converted, or
    an HF directory or hub id as it is. A local path that is none of these is a `ConfigError`."""
    if spec.startswith(BUILTIN_PREFIX) or spec.endswith(".gguf"):
        return resolve_model_path(spec, gguf_file)
    path = Path(spec).expanduser()
    if not path.exists():
        if spec.startswith((".", "/", "~")) or spec.count("/") != 1:
            raise ConfigError(f"model {spec}: no such file or directory (a MODEL is an HF directory, hub id, GGUF file, run or checkpoint directory)")
        return spec  # a hub id
    if (path / "config.json").is_file():
        return str(path)
    for checkpoint in _checkpoints_of(path):
        for name in FINAL_MODELS:
            if (checkpoint / name / "config.json").is_file():
                return str(checkpoint / name)
    converted = resolve_model_path(str(path), gguf_file)  # a directory holding a GGUF file
    if converted != str(path):
        return converted
    raise ConfigError(
        f"model {spec}: not a model directory (no config.json), run directory (no checkpoints/final) or checkpoint directory "
        f"(no {' or '.join(FINAL_MODELS)}/ inside)"
    )


def _checkpoints_of(path: Path) -> list[Path]:
    """The checkpoint directories `path` may be: itself, or a run directory's final checkpoint,
    else its last complete one (the manifest's last row; a warning says so)."""
    if (path / "trainer_state.json").is_file():
        return [path]
    final = path / "checkpoints" / "final"
    if final.is_dir():
        return [final]
    from olingo.trainer.checkpoint import MANIFEST, CheckpointManager

    row = CheckpointManager(path).last() if (path / MANIFEST).is_file() else None
    if row is None:
        return []
    logger.warning("%s has no final model yet: evaluating its last complete checkpoint, %s", path, row.path)
    return [path / row.path]


def answer_extractor(spec: str, accuracy_function: str | None) -> Callable[[str], str | None]:
    """The function `eval.answer` names (response text -> answer or None), see `EvalSection.answer`."""
    name = ANSWER_BY_ACCURACY.get(accuracy_function or "", "text") if spec == "auto" else spec
    if name == "integer":
        from olingo.tasks.arithmetic import extract_answer

        return extract_answer
    if name == "math":
        from olingo.rewards.verifiers import extract_answer as math_extract

        return math_extract
    if name == "text":
        return lambda response: response.strip() or None
    if ":" not in name:
        raise ConfigError(f"eval.answer={spec}: expected auto, integer, math, text or package.module:function")
    try:
        return resolve_reward(name)  # the same import-path rules as a reward function's
    except RewardError as err:
        raise ConfigError(f"eval.answer: {err}") from None
