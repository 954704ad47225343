"""Environment libraries used as they ship (olingo/rollout/reasoning_gym.py, olingo/rollout/textarena.py):
scripted policies get the library's own scores and replies, prompts files round-trip through
olingo's prompt loader, and a short MultiTurnSource run on the tiny model plays each. Skipped
without the libraries (requirements-agents.txt; `make test` installs them)."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.engines import GenerationSettings, HFEngine
from olingo.models import load_causal_lm, load_tokenizer
from olingo.rollout import EpisodeLimits, MultiTurnSource, PromptBatch, resolve_environment

reasoning_gym = pytest.importorskip("reasoning_gym")
textarena = pytest.importorskip("textarena")

from olingo.rollout import reasoning_gym as rg_env  # noqa: E402 - after the skips
from olingo.rollout import textarena as ta_env  # noqa: E402

ARITHMETIC = {"min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+", "-"], "allow_parentheses": False}


def env_row(row: dict) -> dict:
    """What `reset` gets for a prompts row: its gt_answer and other fields, not the prompt."""
    return {"gt_answer": row.get("gt_answer"), **{k: v for k, v in row.items() if k not in ("prompt", "gt_answer")}}


def arithmetic_row(index: int = 0) -> dict:
    return rg_env.prompt_rows("basic_arithmetic", 4, 1, None, **ARITHMETIC)[index]


# ---- reasoning-gym -------------------------------------------------------------------------------
def test_reasoning_gym_scores_with_the_tasks_own_score_answer():
    row = arithmetic_row()
    answer = row["gt_answer"]
    assert row["prompt"] == [{"role": "user", "content": reasoning_gym.create_dataset("basic_arithmetic", size=4, seed=1, **ARITHMETIC)[0]["question"]}]
    env = resolve_environment("reasoning_gym")()
    env.reset(env_row(row))
    step = env.step(f"thinking... <answer>{answer}</answer>")
    assert (step.reward, step.done, step.messages) == (1.0, True, [])
    env.reset(env_row(row))
    step = env.step(f"<answer>x{answer}</answer>")  # the task's partial credit: len(oracle) / len(answer)
    assert step.done and step.reward == pytest.approx(len(answer) / (len(answer) + 1))  # tolerance: float division
    env.reset(env_row(row))
    assert env.step(answer).reward == 0.0  # no <answer> tag: no answer


def test_reasoning_gym_retries_then_discounts_the_final_attempt():
    row = arithmetic_row()
    env = rg_env.ReasoningGymEnvironment(max_attempts=3, discount=0.5)
    env.reset(env_row(row))
    first, second = env.step("<answer>99</answer>"), env.step("no tag")
    assert first.messages == [{"role": "user", "content": "Your answer is wrong. Try again."}] and not first.done and first.reward == 0
    assert second.messages == [{"role": "user", "content": "Put your answer between <answer> and </answer>. Try again."}]
    third = env.step(f"<answer>{row['gt_answer']}</answer>")
    assert third.done and third.reward == 0.25  # 1 x 0.5 ** 2, exact in binary floats
    assert env.metrics() == {"reasoning_gym_attempts": 3.0, "reasoning_gym_solved": 1.0, "reasoning_gym_no_answer": 1.0}
    env.reset(env_row(row))
    assert [env.step("<answer>99</answer>").done for _ in range(3)] == [False, False, True]  # the last attempt ends it, scored 0


def test_reasoning_gym_rebuilds_entries_that_json_would_break(tmp_path):
    """arc_agi's grids are tuples: a JSON copy of its entry scores the right answer 0.05."""
    path = tmp_path / "arc.jsonl"
    assert rg_env.write_prompts(path, "arc_agi", 2, 3) == 2
    row = json.loads(path.read_text().splitlines()[1])
    env = rg_env.ReasoningGymEnvironment()
    env.reset(env_row(row))
    assert env.step(f"<answer>{row['gt_answer']}</answer>").reward == 1.0
    assert env.data.score_answer(row["gt_answer"], json.loads(json.dumps(env.entry))) < 1.0  # what storing the entry would give
    with pytest.raises(ValueError, match="another reasoning-gym version"):
        env.reset(env_row(row) | {"gt_answer": "not the answer"})
    with pytest.raises(ValueError, match="row field 'reasoning_gym'"):
        env.reset({"gt_answer": "1"})


def test_reasoning_gym_cli_writes_rows_olingo_loads(tmp_path, tok):
    path = tmp_path / "rg.jsonl"
    rg_env.main(["basic_arithmetic", str(path), "--size", "3", "--seed", "1", "--system-prompt", "none",
                 *(f"--set={k}={json.dumps(v)}" for k, v in ARITHMETIC.items())])
    dataset = build_prompt_dataset([str(path)], tok, 64)
    assert len(dataset) == 3 and dataset[0]["row_fields"]["reasoning_gym"]["config"] == {**ARITHMETIC, "size": 3, "seed": 1}
    assert dataset[0]["gt_answer"] == arithmetic_row()["gt_answer"]


def test_reasoning_gym_rejects_bad_params():
    with pytest.raises(ValueError, match="max_attempts"):
        rg_env.ReasoningGymEnvironment(max_attempts=0)
    with pytest.raises(ValueError, match="unknown reasoning-gym task 'basic_arithmatic'"):
        rg_env.prompt_rows("basic_arithmatic", 1, 0)


# ---- TextArena -----------------------------------------------------------------------------------
def bisect(low: int, high: int, reply: str) -> tuple[int, int]:
    """Narrow [low, high] by the game's hint about the last guess (its midpoint)."""
    guess = (low + high) // 2
    return (guess + 1, high) if "higher" in reply else (low, guess - 1)


def test_textarena_plays_guess_the_number_to_the_games_reward():
    state = random.getstate()
    row = ta_env.prompt_rows("GuessTheNumber-v0", [3])[0]
    assert row["prompt"].startswith("You are Player 0. You are playing Guess The Number.")
    env = resolve_environment("textarena")()
    env.reset(env_row(row))
    low, high, replies = 1, 20, []
    for _ in range(6):  # bisection finds a number in 1..20 in at most 5 guesses
        step = env.step(str((low + high) // 2))  # a bare move: the action wrapper brackets it
        if step.done:
            break
        replies.append(step.messages[0]["content"])
        assert re.fullmatch(r"The target number is (higher|lower)\.", replies[-1])
        low, high = bisect(low, high, replies[-1])
    assert step.done and step.reward == 1.0 and env.metrics() == {"textarena_moves": len(replies) + 1.0, "textarena_finished": 1.0}
    again = ta_env.TextArenaEnvironment()
    again.reset(env_row(row))  # the same seed: the same number, whatever ran in between
    assert again.step(str(10)).messages[0]["content"] == replies[0]
    assert random.getstate() == state  # the games' seeding left the process's random stream alone


def test_textarena_rejects_games_it_cannot_play():
    with pytest.raises(ValueError, match="does not start with one player"):
        ta_env.prompt_rows("Golf-v0", [0])
    with pytest.raises(ValueError, match="unknown TextArena game 'GuessTheNumbr-v0'"):
        ta_env.prompt_rows("GuessTheNumbr-v0", [0])


# ---- a short run on the tiny model ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tok(assets):
    return load_tokenizer(str(assets.model_dir), padding_side="left")


def run_episodes(tok, assets, path, factory, max_turns: int):
    """Two rows of `path`, two episodes each, on the tiny model; turns stop at their first
    printable character, so an episode takes several short turns."""
    torch.manual_seed(0)
    items = [build_prompt_dataset([str(path)], tok, 1024)[i] for i in range(2)]
    batch = PromptBatch.from_collated(PromptCollator(tok.pad_token_id)(items))
    engine = HFEngine(load_causal_lm(str(assets.model_dir)), tok)
    settings = GenerationSettings(max_new_tokens=4, stop_token_ids=[tok.eos_token_id, *range(8, 104)])
    limits = EpisodeLimits(max_turns=max_turns, max_new_tokens=4, max_episode_tokens=512)
    return MultiTurnSource(engine, tok, factory, limits, tok.pad_token_id).sample(batch, settings, n=2), batch.repeated(2)


def sampled_turns(tok, sampled, row: int) -> list[str]:
    """The episode's sampled turns as the environment got them (decoded without special tokens)."""
    width, mask = sampled.rollout.num_prompt_tokens, sampled.rollout.action_mask[row].tolist()
    ids = sampled.rollout.sequences[row, width:].tolist()
    turns, current = [], []
    for token, on in zip(ids, mask + [False], strict=False):
        if on:
            current.append(token)
        elif current:
            turns.append(tok.decode(current, skip_special_tokens=True))
            current = []
    return turns + ([tok.decode(current, skip_special_tokens=True)] if current else [])


def replayed_reward(env, row: dict, turns: list[str]) -> float:
    env.reset(row)
    return sum(env.step(text).reward for text in turns)


def test_a_multi_turn_run_on_the_tiny_model_with_each_library(tok, assets, tmp_path):
    rg_path, ta_path = tmp_path / "rg.jsonl", tmp_path / "ta.jsonl"
    rg_env.write_prompts(rg_path, "basic_arithmetic", 2, 1, None, **ARITHMETIC)
    ta_env.write_prompts(ta_path, "GuessTheNumber-v0", [0, 1])
    runs = [
        (rg_path, lambda: rg_env.ReasoningGymEnvironment(max_attempts=3, answer_tag=None), 3),
        (ta_path, ta_env.TextArenaEnvironment, 3),
    ]
    for path, factory, max_turns in runs:
        sampled, rows = run_episodes(tok, assets, path, factory, max_turns)
        assert sampled.info["env_errors"] == 0 and sampled.info["turns_per_episode"] > 1
        for r in range(4):  # the episode's reward is what its environment gives the turns it sampled
            row = {"gt_answer": rows.gt_answers[r], **{k: v[r] for k, v in rows.row_fields.items()}}
            turns = sampled_turns(tok, sampled, r)
            assert 1 <= len(turns) <= max_turns
            assert float(sampled.env_rewards[r]) == pytest.approx(replayed_reward(factory(), row, turns))  # tolerance: float32 storage
