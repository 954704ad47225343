"""Every `olingo` command line shown in README.md, docs/*.md and `--help`, run as a user types
it: the line is split with `shlex` as a shell splits it (quotes, comments, `VAR=value` before
the command, `torchrun ... -m olingo.cli.main`), in a scratch directory where the names it uses
exist (`my.yaml` is the packaged `<stage>_tiny.yaml`, data files are small files of the kind
the key takes, `source@split` a saved DatasetDict, model directories are the tiny model, `~` is
a scratch $HOME; a hub id is stood in for by a local directory of that name, so nothing needs
the network).

* every example goes through the real parser and config loader (`--check` for a stage; `plan`
  and `--help` run for real; `experiment run` loads and plans its arms; `report` and `demo`
  lines, which read an earlier run or take minutes, are parsed);
* the slow test then trains every stage example that can run offline, with tiny run lengths
  appended as overrides; what cannot (a hub id, Ray, vLLM, torchrun, the real SmolLM2) says why.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from olingo.cli.main import STAGE_SUMMARIES, main
from olingo.config import load_config, packaged_config

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
STAGES = set(STAGE_SUMMARIES)
HELP_ARGV = {stage: [stage] for stage in STAGES} | {"experiment run": ["experiment", "run"], "plan": ["plan"]}


@dataclass(frozen=True)
class Example:
    """One command line: where it is shown, as written, and as the shell hands it to olingo."""

    where: str
    line: str
    argv: tuple[str, ...]  # after `olingo` (or `-m olingo.cli.main`)
    env: dict[str, str] = field(default_factory=dict, hash=False)
    torchrun: bool = False

    @property
    def stage(self) -> str | None:
        return self.argv[0] if self.argv and self.argv[0] in STAGES else None

    def overrides(self) -> dict[str, str]:
        """KEY -> VALUE text of its dotted overrides."""
        return dict(a.split("=", 1) for a in self.argv[1:] if "=" in a and not a.startswith("-"))


def parse_line(where: str, line: str) -> Example | None:
    """The olingo command of a shell line, or None for another program (`ray start`)."""
    words = shlex.split(line, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    if words[:1] == ["olingo"]:
        return Example(where, line, tuple(words[1:]), env)
    if words[:1] == ["torchrun"] and "olingo.cli.main" in words:
        return Example(where, line, tuple(words[words.index("olingo.cli.main") + 1:]), env, torchrun=True)
    return None


def doc_examples() -> list[Example]:
    """The olingo lines of every ```bash block of the README and docs/ (continuations joined)."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for block in re.finditer(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S):
            start = text[: block.start()].count("\n") + 2
            lines = block.group(1).replace("\\\n", " ").splitlines()
            for offset, line in enumerate(lines):
                if line.strip() and (example := parse_line(f"{path.name}:{start + offset}", line)) is not None:
                    found.append(example)
    return found


def help_examples() -> list[Example]:
    """The example lines that `olingo <command> --help` prints."""
    found = []
    for command, argv in HELP_ARGV.items():
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            main([*argv, "--help"])
        for line in out.getvalue().splitlines():
            if line.startswith("  olingo "):
                found.append(parse_line(f"olingo {command} --help", line.strip()))
    return found


EXAMPLES = doc_examples() + help_examples()
# Modules whose `python -m` lines in the docs write a prompts file an example then trains on (-> the
# library each needs): the slow test runs those lines, so the example trains on the rows it shows.
WRITERS = {"olingo.rollout.reasoning_gym": "reasoning_gym"}


def written_files() -> dict[str, list[str]]:
    """Each file a WRITERS line of the docs' bash blocks writes -> that line's argv after `-m`."""
    found = {}
    for path in DOCS:
        for block in re.finditer(r"```(?:bash|sh|shell)\n(.*?)```", path.read_text(), flags=re.S):
            for line in block.group(1).replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words[:2] == ["python", "-m"] and len(words) > 4 and words[2] in WRITERS:
                    found[words[4]] = words[2:]
    return found


WRITTEN = written_files()


def write_with(argv: list[str], root: Path) -> None:
    """Run a WRITERS line in-process, its output file in `root` (skips without its library)."""
    import importlib

    module, *args = argv
    pytest.importorskip(WRITERS[module])
    args[1] = str(root / args[1])
    importlib.import_module(module).main(args)


def example_id(example: Example) -> str:
    return f"{example.where} {example.line[:70]}"


# ---- the scratch directory ----------------------------------------------------------------------
MODEL_KEYS = ("model.path", "model.actor", "model.reference", "model.critic", "model.tokenizer", "reward.model")
DATA_KINDS = {  # (stage, key) -> the rows the key takes
    **{(s, k): "sft" for s in ("sft",) for k in ("data.train", "data.eval")},
    **{(s, k): "pairs" for s in ("rm", "dpo", "orpo", "kto") for k in ("data.train", "data.eval")},
    **{(s, k): "prompts" for s in ("ppo", "grpo") for k in ("data.prompts", "data.eval_prompts")},
    ("ppo", "data.pretrain"): "sft",
}


def make_data(root: Path, item: str, kind: str, assets) -> None:
    """The data source `item` names, in `root`: a small file of `kind`, or for `source@split`
    a saved DatasetDict with that split (a hub dataset id is stood in for by a local one)."""
    import datasets

    base, _, split = item.rpartition("@") if "@" in item else (item, "", "")
    target = local(root, base)
    if not split:
        rows_file(target, kind, assets)
    elif not target.exists():
        rows = [yaml.safe_load(line) for line in source_rows(kind, assets)]
        datasets.DatasetDict({name: datasets.Dataset.from_list(rows) for name in {"train", "test", split}}).save_to_disk(str(target))


def items(value: str) -> list[str]:
    loaded = yaml.safe_load(value)
    return [str(v) for v in loaded] if isinstance(loaded, list) else [str(loaded)] if loaded is not None else []


def source_rows(kind: str, assets, rows: int = 8) -> list[str]:
    """The first `rows` JSONL lines of the embedded task's data of `kind` (sft, pairs, prompts)."""
    source = {"sft": assets.sft_train, "pairs": assets.preference_train, "prompts": assets.prompts_train}[kind]
    return source.read_text().splitlines()[:rows]


def rows_file(path: Path, kind: str, assets) -> None:
    """Small data of `kind` at `path`, as JSONL or Parquet."""
    lines = source_rows(kind, assets)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import datasets

        datasets.Dataset.from_list([yaml.safe_load(line) for line in lines]).to_parquet(str(path))
    else:
        path.write_text("\n".join(lines) + "\n")


def write_config(path: Path, stage: str) -> None:
    """`my.yaml`: the packaged tiny config of `stage`; RL configs leave room for 24 new tokens
    (an example's overlong buffer of 16 must fit, as in a real config)."""
    data = yaml.safe_load(packaged_config(f"{stage}_tiny.yaml" if stage != "experiment" else "experiment_sft_lr.yaml").read_text())
    if stage in ("ppo", "grpo"):
        data["generation"]["max_new_tokens"] = 24
    path.write_text(yaml.safe_dump(data))


def stage_of_config(example: Example) -> str:
    """The stage whose config the example's `--config` file holds."""
    if example.argv[0] == "plan":  # the stage is --stage, or a word of the file's name, as plan detects it
        if "--stage" in example.argv:
            return example.argv[example.argv.index("--stage") + 1]
        name = Path(example.argv[example.argv.index("--config") + 1]).stem
        return next((s for s in name.split("_") if s in STAGES), "ppo")  # PPO's sections are PPO's alone
    return "experiment" if example.argv[0] == "experiment" else example.stage


def prepare(example: Example, root: Path, assets, rm_dir: Path | None = None) -> None:
    """Create what `example` names: config files, data files, reward modules and, with
    `rm_dir`, the model directories and GGUF files (the slow test)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "home").mkdir(exist_ok=True)
    (root / "olingo").symlink_to(REPO / "olingo")  # olingo/configs/... as in a checkout
    argv = list(example.argv)
    configs = [argv[argv.index("--config") + 1]] if "--config" in argv else []
    configs += [argv[2]] if argv[:2] == ["experiment", "run"] else []
    for name in configs:
        if "/" not in name and ":" not in name and not (REPO / "olingo" / "configs" / name).exists():  # a user's file
            write_config(root / name, stage_of_config(example))
    if example.env.get("PYTHONPATH") == ".":
        (root / "my_pkg").mkdir()
        (root / "my_pkg" / "__init__.py").write_text("")
        (root / "my_pkg" / "rewards.py").write_text(
            "def exact(prompt, response, gt_answer):\n    return float(response.strip() == str(gt_answer).strip())\n"
        )
    overrides = example.overrides()
    for key, value in overrides.items():
        kind = DATA_KINDS.get((example.stage, key))
        for item in items(value) if kind else []:
            if rm_dir is not None and item in WRITTEN:
                write_with(WRITTEN[item], root)
            elif not item.startswith("builtin:"):
                make_data(root, item, kind, assets)
    if rm_dir is not None:
        for key in MODEL_KEYS:
            if key in overrides and overrides[key] != "null" and not overrides[key].startswith("builtin:"):
                make_model(local(root, overrides[key]), key, overrides.get("model.gguf_file"), assets, rm_dir)


def local(root: Path, path: str) -> Path:
    return root / "home" / path[2:] if path.startswith("~/") else root / path


def make_model(target: Path, key: str, gguf_file: str | None, assets, rm_dir: Path) -> None:
    """The model a key names: a tiny GGUF for a `.gguf` path or `model.gguf_file`, the tiny
    reward model for reward/critic keys, else the tiny model."""
    from tests.test_gguf import write_tiny_gguf

    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.suffix == ".gguf":
        write_tiny_gguf(target)
    elif gguf_file is not None:
        target.mkdir()
        write_tiny_gguf(target / gguf_file)
    else:
        target.symlink_to(rm_dir if key in ("reward.model", "model.critic") else assets.model_dir)


@pytest.fixture
def at_home(tmp_path, monkeypatch):
    """Run in tmp_path/ws with $HOME at tmp_path/ws/home; returns the directory."""
    root = tmp_path / "ws"
    monkeypatch.setenv("HOME", str(root / "home"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    yield root
    # An example's `PYTHONPATH=.` module (my_pkg) was imported in this process: forget it, so a
    # later test's own my_pkg is imported afresh instead of this one from the module cache.
    for name in [n for n in sys.modules if n == "my_pkg" or n.startswith("my_pkg.")]:
        del sys.modules[name]


def run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out + err


def test_examples_were_found_in_every_place():
    places = {e.where.split(":")[0] for e in EXAMPLES}
    assert {"README.md", "olingo grpo --help", "olingo plan --help"} <= places
    assert len([e for e in EXAMPLES if e.stage]) >= 40  # the README and docs/ show more than this


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_every_example_is_valid_as_the_shell_splits_it(example, at_home, assets, monkeypatch, capsys):
    prepare(example, at_home, assets)
    monkeypatch.chdir(at_home)
    if example.env.get("PYTHONPATH") == ".":
        monkeypatch.syspath_prepend(str(at_home))
    argv = list(example.argv)
    if "--help" in argv or argv[0] == "plan":
        code, text = run(argv, capsys)
        assert code == 0, text
    elif example.stage:
        code, text = run([*argv, "--check"], capsys)
        assert code == 0, f"{example.where}: {example.line}\n{text}"
    elif argv[:2] == ["experiment", "run"]:
        from olingo.experiment.config import ExperimentConfig, plan_runs

        path = Path(argv[2])
        plan_runs(load_config(ExperimentConfig, path, argv[3:]), path.parent, at_home / "runs")
    else:  # report and demo read an earlier run or take minutes: the line must parse
        from olingo.cli.main import build_parser

        assert argv[0] in ("report", "demo"), example.line
        assert build_parser().parse_args(argv).handler is not None


# ---- the slow test: train what can train offline -----------------------------------------------
TINY = {  # run lengths appended to an example; data keys only where the example sets none
    "sft": ["train.epochs=1", "train.batch_size=4", "train.eval_batch_size=8", "train.accumulation_steps=1"],
    "ppo": ["loop.episodes=1", "loop.collect_steps=1", "loop.update_steps=1", "loop.rollout_batch_size=4", "loop.train_batch_size=4", "loop.eval_batch_size=4"],
    "grpo": ["loop.episodes=1", "loop.collect_steps=1", "loop.update_steps=1", "loop.rollout_batch_size=2", "experience.num_generations=2",
             "loop.train_batch_size=4", "loop.eval_batch_size=4"],
}
TINY |= {stage: TINY["sft"] for stage in ("rm", "dpo", "orpo", "kto")}
TINY_DATA = {"sft": ("data.train", "data.eval"), "ppo": ("data.prompts", "data.eval_prompts"), "grpo": ("data.prompts", "data.eval_prompts")}
TINY_DATA |= {stage: TINY_DATA["sft"] for stage in ("rm", "dpo", "orpo", "kto")}


def offline_reason(example: Example) -> str | None:
    """Why `example` cannot train here, or None."""
    overrides = example.overrides()
    if not example.stage or "--help" in example.argv:
        return "not a training command (checked above)"
    if example.stage == "eval":
        return "an evaluation, not a training command (tests/test_eval.py runs olingo eval)"
    if example.torchrun or overrides.get("plugin.name") in ("ddp", "fsdp"):
        return "needs torchrun (tests/test_distributed.py, tests/test_fsdp.py)"
    if overrides.get("ray.enabled") == "true":
        return "Ray (tests/test_ray_cli.py)"
    if overrides.get("generation.engine") == "vllm":
        return "vLLM (tests/test_vllm_training.py)"
    config = Path(example.argv[example.argv.index("--config") + 1].removeprefix("packaged:")).name if "--config" in example.argv else ""
    if "builtin:smollm2" in overrides.values() or (packaged_config(config).is_file() and "tiny" not in config):
        return "a real model: SmolLM2 (tests/test_smollm2.py) or a hub model of a packaged config"
    return None


TRAINABLE = [e for e in EXAMPLES if offline_reason(e) is None]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory, assets) -> Path:
    from olingo.models import RewardModel

    directory = tmp_path_factory.mktemp("rm") / "model"
    RewardModel.from_pretrained(str(assets.model_dir), pad_token_id=0).save_pretrained(directory)
    return directory


def tiny_overrides(example: Example, root: Path, assets) -> list[str]:
    """TINY for the stage, and small data files for the data keys the example leaves alone."""
    extra = list(TINY[example.stage])
    kinds = {key: DATA_KINDS[(example.stage, key)] for key in TINY_DATA[example.stage]}
    for key, kind in kinds.items():
        if key not in example.overrides():
            rows_file(root / f"tiny-{kind}.jsonl", kind, assets)
            extra.append(f"{key}=[tiny-{kind}.jsonl]")
    return extra + ["logging.progress=false"]


@pytest.mark.slow
@pytest.mark.parametrize("example", TRAINABLE, ids=example_id)
def test_every_offline_stage_example_trains_with_tiny_lengths(example, at_home, assets, rm_dir, monkeypatch, capsys):
    prepare(example, at_home, assets, rm_dir)
    monkeypatch.chdir(at_home)
    if example.env.get("PYTHONPATH") == ".":
        monkeypatch.syspath_prepend(str(at_home))
    code, text = run([*example.argv, *tiny_overrides(example, at_home, assets)], capsys)
    assert code == 0, f"{example.where}: {example.line}\n{text}"
    assert "final" in text and "run directory:" in text
    if any(item in WRITTEN for key, value in example.overrides().items() if DATA_KINDS.get((example.stage, key)) for item in items(value)):
        run_dir = Path(re.search(r"run directory: *(\S+)", text).group(1))
        errors = [r["rollout/env_errors"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "rollout/env_errors" in r]
        assert errors and not any(errors)  # its environment read the rows written for it
