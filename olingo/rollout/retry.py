"""A built-in environment, `arithmetic_retry` (docs/agents.md): two attempts at an exact answer,
for multi-turn runs on the embedded arithmetic task (or any rows with a `gt_answer`)."""

from __future__ import annotations

from olingo.rollout.environment import EnvStep


class RetryArithmetic:
    """Two attempts at a sum: a wrong first answer is told so and may be corrected."""

    def reset(self, row: dict) -> None:
        self.answer, self.turn = str(row["gt_answer"]).strip(), 0

    def step(self, assistant: str) -> EnvStep:
        self.turn += 1
        if assistant.strip() == self.answer:
            return EnvStep(reward=1.0 if self.turn == 1 else 0.5, done=True)
        return EnvStep([{"role": "user", "content": "Wrong. Try again."}], done=self.turn >= 2)
