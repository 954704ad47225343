"""The built-in environment `textarena` (docs/agents.md, "Environment libraries"): the
single-player games of TextArena (https://github.com/LeonGuertler/TextArena, pinned in
requirements-agents.txt), played in process, each turn one move.

A prompts row names the game and its seed; its prompt is the game's first observation (the
rules), as `write_prompts` (or `python -m olingo.rollout.textarena`) writes it:

    {"prompt": "You are Player 0. You are playing Guess The Number. ...", "textarena": {"env_id": "GuessTheNumber-v0", "seed": 3}}

The episode's first context is that prompt, so `reset` starts the same game with the same seed
and drops its first observation; each assistant turn is a move (textarena's own
ActionFormattingWrapper puts a bare move in the brackets the games parse, `5` -> `[5]`), and
the game's next observations come back as one user message. When the game ends, the reward is
the game's own reward for the player; an episode that olingo's `max_turns` ends before the game
does earns 0.

TextArena seeds and draws from the process-wide `random` module. Every call into a game runs
under one lock with the game's own random state swapped in, and the process's state put back
after: concurrent episodes stay reproducible and the trainer's random stream is untouched.
"""

from __future__ import annotations

import argparse
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from olingo.rewards.registry import one_line
from olingo.rollout.environment import EnvStep
from olingo.tasks.assets import write_jsonl_atomic

FIELD = "textarena"  # the row field naming the game
_INSTALL = "textarena is not installed: run `make agents` or `pip install -r requirements-agents.txt`"
_RANDOM_LOCK = threading.Lock()


def _library() -> Any:
    """The `textarena` package, or an ImportError saying how to install it."""
    try:
        import textarena
    except ImportError as err:
        raise ImportError(_INSTALL) from err
    return textarena


class Game:
    """One TextArena game for one player, its random state kept apart from the process's."""

    def __init__(self, env_id: str, seed: int) -> None:
        textarena = _library()
        if f"{env_id}-raw" not in textarena.envs.registration.ENV_REGISTRY:
            raise ValueError(f"row field '{FIELD}': unknown TextArena game {env_id!r} (e.g. GuessTheNumber-v0, TowerOfHanoi-v0)")
        self.env = textarena.wrappers.ActionFormattingWrapper(textarena.make(f"{env_id}-raw"))
        self.random_state: Any = None
        try:
            with self.own_random():
                self.env.reset(num_players=1, seed=seed)
        except (ValueError, AssertionError) as err:  # how TextArena's multi-player games refuse one player
            reason = f"TextArena game {env_id!r} does not start with one player ({one_line(err)})"
            raise ValueError(f"row field '{FIELD}': {reason}; olingo plays single-player games") from err

    @contextmanager
    def own_random(self) -> Iterator[None]:
        """Run a game call with the game's random state in `random`, and the process's after."""
        with _RANDOM_LOCK:
            process = random.getstate()
            if self.random_state is not None:
                random.setstate(self.random_state)
            try:
                yield
            finally:
                self.random_state = random.getstate()
                random.setstate(process)

    def observation(self) -> str:
        """What the game told the player since the last call, without the player's own moves."""
        with self.own_random():
            player, messages = self.env.get_observation()
        return "\n".join(text for sender, text, _ in messages if sender != player)

    def move(self, action: str) -> tuple[bool, float]:
        """Play `action`: (done, the player's reward, 0 until done)."""
        with self.own_random():
            done, _ = self.env.step(action)
            if not done:
                return False, 0.0
            rewards, _ = self.env.close()
        return True, float(rewards[0])


def game_of(row: dict) -> Game:
    """The game a row's `textarena` field names; ValueError naming the field."""
    spec = row.get(FIELD)
    if not (isinstance(spec, dict) and isinstance(spec.get("env_id"), str) and isinstance(spec.get("seed"), int) and not isinstance(spec["seed"], bool)):
        raise ValueError(f"row field '{FIELD}': expected {{'env_id': str, 'seed': int}} as write_prompts writes it, got {spec!r:.120}")
    return Game(spec["env_id"], spec["seed"])


class TextArenaEnvironment:
    """A single-player TextArena game (see the module docstring): each turn one move, the game's
    reward at its end. `empty_reply` stands in for a turn after which the game says nothing."""

    def __init__(self, empty_reply: str = "Your move.") -> None:
        _library()  # fail at construction, before any episode, when the library is absent
        self.empty_reply, self.moves, self.finished = empty_reply, 0, False

    def reset(self, row: dict) -> None:
        self.game, self.moves, self.finished = game_of(row), 0, False
        self.game.observation()  # the rules: the row's prompt already holds them

    def step(self, assistant: str) -> EnvStep:
        self.moves += 1
        done, reward = self.game.move(assistant)
        if done:
            self.finished = True
            return EnvStep(reward=reward, done=True)
        return EnvStep([{"role": "user", "content": self.game.observation() or self.empty_reply}])

    def metrics(self) -> dict[str, float]:
        """Counters summed over a batch: moves played, games that reached their end."""
        return {"textarena_moves": float(self.moves), "textarena_finished": float(self.finished)}


# ---- prompts files ------------------------------------------------------------------------------
def prompt_rows(env_id: str, seeds: list[int]) -> list[dict[str, Any]]:
    """One prompts row per seed: the game's first observation as the prompt, and the game named."""
    rows = []
    for seed in seeds:
        spec = {"env_id": env_id, "seed": seed}
        rows.append({"prompt": game_of({FIELD: spec}).observation(), FIELD: spec})
    return rows


def write_prompts(path: str | Path, env_id: str, seeds: list[int]) -> int:
    """Write `prompt_rows(env_id, seeds)` to `path` as JSONL (data.prompts reads it); returns the row count."""
    rows = prompt_rows(env_id, seeds)
    write_jsonl_atomic(Path(path), rows)
    return len(rows)


def main(argv: list[str] | None = None) -> None:
    """`python -m olingo.rollout.textarena ENV_ID OUT.jsonl --games N --seed S`"""
    parser = argparse.ArgumentParser(prog="python -m olingo.rollout.textarena", description="Write a prompts JSONL file of TextArena games.")
    parser.add_argument("env_id", help="a single-player TextArena game, e.g. GuessTheNumber-v0")
    parser.add_argument("out", help="the JSONL file to write")
    parser.add_argument("--games", type=int, default=500, help="rows to write, one game each")
    parser.add_argument("--seed", type=int, default=0, help="the first game's seed; the others follow it")
    args = parser.parse_args(argv)
    count = write_prompts(args.out, args.env_id, list(range(args.seed, args.seed + args.games)))
    print(f"wrote {count} {args.env_id} prompts to {args.out}")


if __name__ == "__main__":
    main()
