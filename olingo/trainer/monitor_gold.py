"""Gold scorers of the reward monitor (docs/monitor.md): held-out judges of evaluation samples.

A spec is what `reward.functions` takes (a registered reward function such as `arithmetic_exact`
or `math_answer`, or a `package.module:function` path), called the way training calls reward
functions (`RewardFunction.values`), or `reward_model:<dir>`: a second reward model, trained apart
from the proxy, that scores `prompt + response` (+ the end-of-sequence token when the response
stopped) at its last token, as the experience maker scores rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from olingo.rewards.functions import RewardFunction, reward_function

REWARD_MODEL_PREFIX = "reward_model:"
RM_BATCH = 32  # rows per reward-model forward: bounds the activation memory of a gold pass


@dataclass
class GoldScorer:
    """One gold scorer: `name` (its spec) and either a reward function or a reward-model path."""

    name: str
    function: RewardFunction | None = None
    model_dir: str | None = None
    _model: Any = field(default=None, repr=False)

    def score(self, samples: list[dict[str, Any]], tokenizer: Any) -> torch.Tensor:
        """(B,) float64 scores of the samples (dicts with prompt, response, gt_answer, truncated)."""
        if self.function is not None:
            return self.function.values([s["prompt"] for s in samples], [s["response"] for s in samples], [s.get("gt_answer") for s in samples])
        return self._model_scores(samples, tokenizer)

    @torch.no_grad()
    def _model_scores(self, samples: list[dict[str, Any]], tokenizer: Any) -> torch.Tensor:
        if tokenizer is None:
            raise ValueError(f"reward_monitor: gold {self.name!r} needs the policy's tokenizer (state.tokenizer is None)")
        model = self._load(tokenizer)
        device = next(model.parameters()).device
        eos = tokenizer.eos_token or ""
        texts = [s["prompt"] + s["response"] + ("" if s.get("truncated") else eos) for s in samples]
        scores = []
        for start in range(0, len(texts), RM_BATCH):  # either padding side: the model reads the last attended token
            batch = tokenizer(texts[start:start + RM_BATCH], return_tensors="pt", padding=True, add_special_tokens=False)
            scores.append(model(batch["input_ids"].to(device), batch["attention_mask"].to(device)).double().cpu())
        return torch.cat(scores) if scores else torch.zeros(0, dtype=torch.float64)

    def _load(self, tokenizer: Any) -> Any:
        if self._model is None:
            from olingo.models.reward_model import RewardModel

            model = RewardModel.from_pretrained(self.model_dir, pad_token_id=tokenizer.pad_token_id).eval().requires_grad_(False)
            self._model = model.to("cuda" if torch.cuda.is_available() else "cpu")
        return self._model


def gold_scorer(spec: str) -> GoldScorer:
    """The scorer `spec` names; an unknown function name or import path, or a reward-model
    directory that does not exist, fails here (a `ValueError`), when the config is checked."""
    if spec.startswith(REWARD_MODEL_PREFIX):
        from olingo.config import expand_home
        from olingo.models.loading import check_model_path

        path = expand_home(spec.removeprefix(REWARD_MODEL_PREFIX).strip())
        if not path:
            raise ValueError(f"{spec!r} names no reward-model directory (reward_model:<dir>)")
        try:
            check_model_path(path, "reward model")
        except OSError as err:  # ModelLoadError: a ValueError here, so that config validation reports it with its key
            raise ValueError(str(err)) from None
        return GoldScorer(spec, model_dir=path)
    return GoldScorer(spec, function=reward_function(spec))


def check_gold_specs(specs: list[str] | None) -> list[str] | None:
    """`specs` unchanged when every one names a gold scorer (`gold_scorer`); the first that does
    not raises its `ValueError`. The `gold` parameter's validator."""
    for spec in specs or []:
        gold_scorer(spec)
    return specs
