"""The typed config of `olingo eval` (docs/eval.md): which models, which prompts or environment,
how to sample (the online recipes' own `generation:` and `environment:` sections, so settings
mean what they mean in training), the reward, and the estimators (`eval:`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from olingo.config import HomePath, StrictModel
from olingo.recipes.online_config import EnvironmentConfig, GenerationSection
from olingo.recipes.rewards import RewardSource
from olingo.threads import ThreadCount


class EvalRunSection(StrictModel):
    """Where the evaluation's directory lives, and its seed."""

    name: str = Field("eval", description="the eval directory is <output_dir>/<name> (or --output); rerun the same command to continue it")
    output_dir: HomePath = Field("runs", description="parent directory of eval directories")
    seed: int = Field(42, ge=0, description="the seed every prompt batch's sampling seed is derived from (with the batch's first prompt index)")
    overwrite: bool = Field(False, description="delete an existing eval directory and start over instead of continuing it")
    threads: ThreadCount = Field("auto", description="torch's CPU threads (auto: one per physical core; OMP_NUM_THREADS wins)")
    omp_wait: Literal["auto", "active", "passive"] = Field(
        "auto", description="how torch's idle OpenMP workers wait: auto (spin briefly, then sleep), active or passive",
    )


class EvalModelSection(StrictModel):
    """How every evaluated model loads (the models themselves are the command's MODEL arguments)."""

    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")
    trust_remote_code: bool = Field(False, description="allow model code from the hub")
    gguf_file: str | None = Field(None, description="the GGUF file to load when a MODEL is a directory holding several")


class EvalDataSection(StrictModel):
    """The prompts: any prompt format olingo reads ({prompt, gt_answer?} or {messages, gt_answer?}; docs/data.md)."""

    prompts: list[str] = Field(default_factory=lambda: ["builtin:prompts_eval"], description="prompt files, saved datasets or hub ids")
    limit: int = Field(0, ge=0, description="evaluate the first N prompts only (0: all)")
    max_prompt_length: int = Field(512, gt=0, description="prompt tokens at most, chat template and generation prompt included")
    overlong: Literal["error", "truncate"] = Field(
        "error", description="a longer prompt: error (naming file, row and length) or truncate (keep its end); no prompt is ever skipped, "
        "so prompt i is the same row for every model",
    )


class EvalSection(StrictModel):
    """Samples per prompt and the estimators (docs/eval.md)."""

    samples_per_prompt: int = Field(8, ge=1, description="n: samples drawn per prompt and model")
    k: list[int] = Field(default_factory=lambda: [1, 2, 4, 8], description="the k of pass@k and maj@k, each in 1..samples_per_prompt")
    accuracy_function: str | None = Field(
        "arithmetic_exact",
        description="reward function counted as accuracy (> 0 is correct), called like reward.functions on rows with a gt_answer; "
        "null: a sample is correct when its reward is > 0 (an environment's success)",
    )
    answer: str = Field(
        "auto",
        description="how maj@k extracts an answer to vote on: integer (the first integer, as arithmetic_exact reads), math (the last "
        "\\boxed{} or number, as math_answer reads), text (the stripped response), or package.module:function (response -> str or None); "
        "auto: integer for arithmetic_exact, math for math_answer/math_verify, else text",
    )
    batch_size: int = Field(16, ge=1, description="prompts per batch: one engine call of batch_size x samples_per_prompt, one resume unit")
    bootstrap_resamples: int = Field(1000, ge=10, description="bootstrap resamples of the prompts per interval")
    confidence: float = Field(0.95, gt=0, lt=1, description="coverage of the percentile bootstrap intervals")
    maj_subsets: int = Field(1000, ge=1, description="maj@k averages the vote over every k-subset of the n samples, or this many drawn when there are more")

    @field_validator("k")
    @classmethod
    def _k_sorted(cls, k: list[int]) -> list[int]:
        return sorted(set(k))

    @model_validator(mode="after")
    def _k_fits(self) -> EvalSection:
        if not self.k or not all(1 <= k <= self.samples_per_prompt for k in self.k):
            raise ValueError(f"eval.k must list values in 1..eval.samples_per_prompt={self.samples_per_prompt}, got {self.k}")
        return self


class EvalLoggingSection(StrictModel):
    """What the command shows while it runs."""

    progress: bool = Field(True, description="show a progress bar over prompt batches")


class EvalConfig(StrictModel):
    """`olingo eval`: models on prompts or an environment, with pass@k, maj@k and paired comparisons."""

    models: list[str] = Field(
        default_factory=list,
        description="the models, the first the baseline of the comparisons: HF directories, hub ids, GGUF files, builtin: names, run "
        "directories (their final model) or checkpoint directories; the command's MODEL arguments replace this list",
    )
    run: EvalRunSection = Field(default_factory=EvalRunSection, description="eval directory and seed")
    model: EvalModelSection = Field(default_factory=EvalModelSection, description="how the models load")
    data: EvalDataSection = Field(default_factory=EvalDataSection, description="prompts")
    generation: GenerationSection = Field(default_factory=GenerationSection, description="sampling and engine, as in olingo ppo/grpo")
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig, description="multi-turn episodes, as in olingo grpo (docs/agents.md)")
    reward: RewardSource = Field(
        default_factory=lambda: RewardSource(functions={"arithmetic_exact": 1.0}), description="the reward of each sample, as in olingo grpo",
    )
    eval: EvalSection = Field(default_factory=EvalSection, description="samples per prompt, k, accuracy, answer extraction, intervals")
    logging: EvalLoggingSection = Field(default_factory=EvalLoggingSection, description="progress display")

    @model_validator(mode="after")
    def _some_reward(self) -> EvalConfig:
        self.reward.check_present(self.environment.name)
        return self

    def sampling_key(self) -> dict[str, Any]:
        """What fixes the samples of a model: a continued eval must have the same (the estimators,
        the models list and the display may change between runs; their samples stay valid)."""
        data = self.model_dump(mode="json", include={"run", "model", "data", "generation", "environment", "reward", "eval"})
        data["run"] = {"seed": self.run.seed}
        data["eval"] = {key: data["eval"][key] for key in ("samples_per_prompt", "accuracy_function", "answer", "batch_size")}
        return data
