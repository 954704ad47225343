"""The loop section of online RL (`loop:` of `olingo ppo` and `olingo grpo`) and the one rule for
how many optimizer steps an episode takes."""

from __future__ import annotations

import math

from pydantic import Field

from olingo.config import StrictModel


def steps_per_episode(
    rollouts_per_collect: int, num_collect_steps: int, num_update_steps: int, train_batch_size: int, accumulation_steps: int,
    *, buffer_limit: int = 0, sample_buffer: bool = False,
) -> int:
    """Optimizer steps of one full episode (per process), the unit schedules are sized in.

    Each of the `num_update_steps` passes walks the episode's rollouts (`rollouts_per_collect`
    per collect step: prompts x responses per prompt; at most `buffer_limit`) in minibatches of
    `train_batch_size`, stepping after every `accumulation_steps` of them and after the pass's
    last; with `sample_buffer` each update step is one optimizer step on randomly sampled
    minibatches. DAPO's dynamic sampling can make an episode shorter (fewer groups kept), never
    longer."""
    if sample_buffer:
        return num_update_steps
    rollouts = num_collect_steps * rollouts_per_collect
    if buffer_limit:
        rollouts = min(rollouts, buffer_limit)
    return num_update_steps * math.ceil(math.ceil(rollouts / train_batch_size) / accumulation_steps)


class OnlineLoopConfig(StrictModel):
    """The online RL loop: how much to collect, how to walk it, when to checkpoint and evaluate."""

    episodes: int = Field(10, ge=1, description="collect-then-learn rounds")
    collect_steps: int = Field(1, ge=1, description="prompt batches collected per episode")
    update_steps: int = Field(1, ge=1, description="passes (PPO epochs, mu) over each episode's experience")
    rollout_batch_size: int = Field(16, ge=1, description="prompts per collect step per process")
    train_batch_size: int = Field(8, ge=1, description="rollouts per minibatch per process")
    accumulation_steps: int = Field(1, ge=1, description="minibatches per optimizer step")
    buffer_limit: int = Field(0, ge=0, description="keep at most this many rollouts (0: all of the episode)")
    buffer_cpu_offload: bool = Field(True, description="keep the episode's experience on the CPU until its minibatch trains")
    sample_buffer: bool = Field(False, description="train on randomly sampled minibatches instead of full passes")
    pin_memory: bool = Field(True, description="pin minibatches in page-locked memory before moving them to the GPU (CUDA only)")
    offload_inference_models: bool = Field(True, description="keep reference and reward models on CPU while learning")
    save_interval: int = Field(0, ge=0, description="checkpoint at the end of the episode reaching every N optimizer steps (0: final only)")
    eval_interval: int = Field(0, ge=0, description="evaluate on eval_prompts at the end of the episode reaching every N optimizer steps")
    eval_before_training: bool = Field(
        True,
        description="evaluate the starting policy on eval_prompts before the first step (eval/* at step 0, the baseline for the gain; "
        "a resumed run does not repeat it)",
    )
    eval_batch_size: int = Field(64, ge=1, description="prompts per evaluation batch")
    eval_temperature: float | None = Field(None, gt=0, description="sampling temperature for evaluation (default: the rollout temperature)")
    accuracy_function: str | None = Field(
        None,
        description="reward function counted as accuracy in evaluation (e.g. arithmetic_exact, math_answer); called like reward.functions, "
        "row fields included, and checked on one data row at start-up",
    )

    def steps_per_episode(self, num_generations: int = 1) -> int:
        """Optimizer steps of one episode when each prompt is answered `num_generations` times."""
        return steps_per_episode(
            self.rollout_batch_size * num_generations, self.collect_steps, self.update_steps, self.train_batch_size,
            self.accumulation_steps, buffer_limit=self.buffer_limit, sample_buffer=self.sample_buffer,
        )

    def total_steps(self, num_generations: int = 1) -> int:
        """Optimizer steps of the whole run, the unit learning-rate schedules are sized in."""
        return self.episodes * self.steps_per_episode(num_generations)
