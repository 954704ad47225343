"""The built-in environment `reasoning_gym` (docs/agents.md, "Environment libraries"): any
procedural task of reasoning-gym (https://github.com/open-thought/reasoning-gym, pinned in
requirements-agents.txt), scored by the task's own `score_answer`, in one attempt or several.

A prompts row names its entry; `write_prompts` (or `python -m olingo.rollout.reasoning_gym`)
writes such rows from a task:

    {"prompt": [{"role": "system", ...}, {"role": "user", "content": question}], "gt_answer": answer,
     "reasoning_gym": {"task": "basic_arithmetic", "config": {"seed": 1, "size": 100, ...}, "index": 7}}

`reset` rebuilds the entry, `create_dataset(task, **config)[index]` (deterministic given the
config's seed), instead of reading it from the row: some tasks' metadata (the tuple grids of
arc_agi) does not survive JSON, and a right answer would then score wrong.

The answer is read from the assistant text with reasoning-gym's own `extract_answer` (the last
`<answer>...</answer>`); with `answer_tag=None` the whole stripped text is the answer.
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path
from typing import Any

import yaml

from olingo.rollout.environment import EnvStep
from olingo.tasks.assets import write_jsonl_atomic

FIELD = "reasoning_gym"  # the row field naming the entry
_INSTALL = "reasoning-gym is not installed: run `make agents` or `pip install -r requirements-agents.txt`"
_DATASETS: dict[tuple[str, str], Any] = {}  # (task, config as JSON) -> dataset, shared by episodes
_DATASETS_LOCK = threading.Lock()


def _library() -> Any:
    """The `reasoning_gym` package, or an ImportError saying how to install it."""
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError(_INSTALL) from err
    return reasoning_gym


def dataset(task: str, config: dict[str, Any]) -> Any:
    """The task's dataset for `config`, built once per process (some tasks load word lists)."""
    key = (task, json.dumps(config, sort_keys=True))
    with _DATASETS_LOCK:
        if key not in _DATASETS:
            _DATASETS[key] = _library().create_dataset(task, **config)
        return _DATASETS[key]


def entry_of(row: dict) -> tuple[Any, dict[str, Any]]:
    """(dataset, entry) that a row's `reasoning_gym` field names; ValueError naming the field."""
    spec = row.get(FIELD)
    if not (isinstance(spec, dict) and isinstance(spec.get("task"), str) and isinstance(spec.get("config"), dict)
            and isinstance(spec.get("index"), int) and not isinstance(spec.get("index"), bool)):
        raise ValueError(f"row field '{FIELD}': expected {{'task': str, 'config': dict, 'index': int}} as write_prompts writes it, got {spec!r:.120}")
    data = dataset(spec["task"], spec["config"])
    entry = data[spec["index"]]
    expected = row.get("gt_answer")
    if expected is not None and str(entry["answer"]) != str(expected):
        raise ValueError(
            f"row field '{FIELD}': the rebuilt entry's answer {entry['answer']!r:.60} is not the row's gt_answer {expected!r:.60}; "
            "was the file written by another reasoning-gym version?"
        )
    return data, entry


class ReasoningGymEnvironment:
    """One reasoning-gym question, answered in up to `max_attempts` turns.

    A right answer (score 1) or the last attempt ends the episode; a wrong earlier attempt is
    told `retry_message` (or, without an answer tag, where to put the answer) and may try again. The episode's reward is the final attempt's score
    times `discount ** (attempts - 1)`: with the defaults a right first answer earns 1, a right
    second one 0.5. With max_attempts=1 (the default) it is the task's score of the one answer.
    """

    def __init__(
        self, max_attempts: int = 1, discount: float = 0.5, answer_tag: str | None = "answer",
        retry_message: str = "Your answer is wrong. Try again.",
    ) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"reasoning_gym environment: max_attempts must be an int >= 1, got {max_attempts!r}")
        if isinstance(discount, bool) or not isinstance(discount, (int, float)) or not 0 <= discount <= 1:
            raise ValueError(f"reasoning_gym environment: discount must be a number in [0, 1], got {discount!r}")
        if answer_tag is not None and (not isinstance(answer_tag, str) or not answer_tag):
            raise ValueError(f"reasoning_gym environment: answer_tag must be a tag name or null, got {answer_tag!r}")
        _library()  # fail at construction, before any episode, when the library is absent
        self.max_attempts, self.discount, self.answer_tag, self.retry_message = max_attempts, float(discount), answer_tag, retry_message
        self.attempts, self.solved, self.no_answer = 0, False, 0

    def reset(self, row: dict) -> None:
        self.data, self.entry = entry_of(row)
        self.attempts, self.solved, self.no_answer = 0, False, 0

    def extract(self, text: str) -> str | None:
        """The answer in `text`: the last `<tag>...</tag>` (reasoning-gym's `extract_answer`), or
        the whole stripped text without a tag; None when the tag is missing."""
        if self.answer_tag is None:
            return text.strip()
        from reasoning_gym.utils import extract_answer

        return extract_answer(text, tag_name=self.answer_tag)

    def step(self, assistant: str) -> EnvStep:
        self.attempts += 1
        answer = self.extract(assistant)
        self.no_answer += answer is None
        score = float(self.data.score_answer(answer, self.entry) or 0.0)
        self.solved = score >= 1.0
        if self.solved or self.attempts >= self.max_attempts:
            return EnvStep(reward=score * self.discount ** (self.attempts - 1), done=True)
        missing = f"Put your answer between <{self.answer_tag}> and </{self.answer_tag}>. Try again."
        return EnvStep([{"role": "user", "content": missing if answer is None else self.retry_message}])

    def metrics(self) -> dict[str, float]:
        """Counters summed over a batch: attempts made, episodes solved, turns without an answer."""
        return {"reasoning_gym_attempts": float(self.attempts), "reasoning_gym_solved": float(self.solved),
                "reasoning_gym_no_answer": float(self.no_answer)}


# ---- prompts files ------------------------------------------------------------------------------
def prompt_rows(task: str, size: int, seed: int, system_prompt: str | None = "default", **config: Any) -> list[dict[str, Any]]:
    """`size` prompts rows of `task` (see the module docstring), its config `config` plus size and
    seed. `system_prompt` names one of reasoning-gym's `SYSTEM_PROMPTS` ("default" asks for
    `<answer>` tags), or None for the question alone."""
    library = _library()
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if system_prompt is not None and system_prompt not in SYSTEM_PROMPTS:
        raise ValueError(f"system_prompt {system_prompt!r}: expected one of {sorted(SYSTEM_PROMPTS)} or None")
    if task not in library.factory.DATASETS:
        raise ValueError(f"unknown reasoning-gym task {task!r}; tasks: {', '.join(sorted(library.factory.DATASETS))}")
    # Built from the JSON form the rows store, so the environment rebuilds exactly these entries.
    config = json.loads(json.dumps({**config, "size": size, "seed": seed}))
    system = [{"role": "system", "content": SYSTEM_PROMPTS[system_prompt]}] if system_prompt is not None else []
    rows = []
    for index, entry in enumerate(dataset(task, config)):
        row: dict[str, Any] = {"prompt": [*system, {"role": "user", "content": entry["question"]}]}
        if entry["answer"] is not None:
            row["gt_answer"] = str(entry["answer"])
        rows.append(row | {FIELD: {"task": task, "config": config, "index": index}})
    return rows


def write_prompts(path: str | Path, task: str, size: int, seed: int, system_prompt: str | None = "default", **config: Any) -> int:
    """Write `prompt_rows(...)` to `path` as JSONL (data.prompts reads it); returns the row count."""
    rows = prompt_rows(task, size, seed, system_prompt, **config)
    write_jsonl_atomic(Path(path), rows)
    return len(rows)


def main(argv: list[str] | None = None) -> None:
    """`python -m olingo.rollout.reasoning_gym TASK OUT.jsonl --size N --seed S --set key=value ...`"""
    parser = argparse.ArgumentParser(prog="python -m olingo.rollout.reasoning_gym", description="Write a prompts JSONL file from a reasoning-gym task.")
    parser.add_argument("task", help="a reasoning-gym dataset name, e.g. basic_arithmetic")
    parser.add_argument("out", help="the JSONL file to write")
    parser.add_argument("--size", type=int, default=500, help="rows to write")
    parser.add_argument("--seed", type=int, default=0, help="the task's seed")
    parser.add_argument("--system-prompt", default="default", help="a reasoning_gym.utils.SYSTEM_PROMPTS name, or 'none'")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a task config field (value read as YAML)")
    args = parser.parse_args(argv)
    config = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: expected KEY=VALUE")
        config[key] = yaml.safe_load(value)
    system = None if args.system_prompt == "none" else args.system_prompt
    count = write_prompts(args.out, args.task, args.size, args.seed, system, **config)
    print(f"wrote {count} {args.task} prompts to {args.out}")


if __name__ == "__main__":
    main()
