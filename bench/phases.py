"""Where an RL update's time goes, measured from outside the implementation under test.

`PhaseClock.install(models)` instruments one process (olingo, the minimal loop or TRL alike):
- `GenerationMixin.generate` is wrapped: its wall time is `generation`, and forwards inside it
  are not counted again;
- each named top-level model gets forward pre/post hooks: a forward run without gradients is
  `<name>_fwd` (the experience phase: actor, reference, critic, reward); a forward with
  gradients is `learn_fwd`;
- `torch.autograd.backward` is wrapped (`learn_bwd`) and a global optimizer step hook pair
  times `learn_optim` (clipping is not included: it is counted as time outside the models).
Nested calls (a wrapper module calling its inner model) are counted once, by the outermost.
`take()` returns and resets the sums. Only wall time is read (perf_counter); on CPU all work
is synchronous, on CUDA the clock synchronises first.
`PhaseClock(scoring=True)` also times `scoring`: from the end of the last `generate` to the start
of the next forward with gradients, less the no-gradient model forwards in between (for GRPO
without old/reference log-probs: decoding, the reward function, advantages and batching).
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict

import torch
from torch import nn
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from transformers.generation.utils import GenerationMixin


def _now() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


class PhaseClock:
    def __init__(self, scoring: bool = False) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.depth = 0  # > 0 while inside a timed region; inner regions are not counted
        self._start: list[float] = []
        self.scoring = scoring
        self._rollout_end: float | None = None  # end of the last generate, until learning starts
        self._inference_at_rollout_end = 0.0

    def _inference_time(self) -> float:
        return sum(v for k, v in self.sums.items() if k.endswith("_fwd") and k != "learn_fwd")

    def _forward_start(self, module: nn.Module, args) -> None:
        if self.scoring and self.depth == 0 and self._rollout_end is not None and torch.is_grad_enabled():
            now = _now()
            self.sums["scoring"] += now - self._rollout_end - (self._inference_time() - self._inference_at_rollout_end)
            self._rollout_end = None
        self._enter()

    def _enter(self) -> None:
        if self.depth == 0:
            self._start.append(_now())
        self.depth += 1

    def _exit(self, phase: str) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.sums[phase] += _now() - self._start.pop()

    def install(self, models: dict[str, nn.Module]) -> PhaseClock:
        for name, model in models.items():
            model.register_forward_pre_hook(self._forward_start)
            model.register_forward_hook(functools.partial(self._forward_done, name))
        clock = self
        original_generate = GenerationMixin.generate
        original_backward = torch.autograd.backward

        @functools.wraps(original_generate)
        def generate(model, *args, **kwargs):
            clock._enter()
            try:
                return original_generate(model, *args, **kwargs)
            finally:
                clock._exit("generation")
                if clock.scoring and clock.depth == 0:
                    clock._rollout_end, clock._inference_at_rollout_end = _now(), clock._inference_time()

        @functools.wraps(original_backward)
        def backward(*args, **kwargs):
            clock._enter()
            try:
                return original_backward(*args, **kwargs)
            finally:
                clock._exit("learn_bwd")

        GenerationMixin.generate = generate
        torch.autograd.backward = backward
        register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: self._enter())
        register_optimizer_step_post_hook(lambda optimizer, args, kwargs: self._exit("learn_optim"))
        return self

    def wrap(self, fn, phase: str):
        """`fn` timed into `phase` (a plain function the models do not call, e.g. a reward function)."""

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sums[phase] += time.perf_counter() - start

        return timed

    def _forward_done(self, name: str, module: nn.Module, args, output) -> None:
        self._exit("learn_fwd" if torch.is_grad_enabled() else f"{name}_fwd")

    def take(self) -> dict[str, float]:
        sums, self.sums = dict(self.sums), defaultdict(float)
        self._inference_at_rollout_end = 0.0  # the no-gradient forward sums restart at 0 too
        return sums


PHASES = ("generation", "actor_fwd", "ref_fwd", "critic_fwd", "reward_fwd", "learn_fwd", "learn_bwd", "learn_optim")
