"""Where olingo's GRPO step spends the time the minimal loop does not.

    python bench/grpo_profile.py [--steps 8] [--response-length 8] [--reps 30]

1. Spans: the functions a step is made of, each wrapped from outside with a timer (no profiler
   overhead on everything else), in olingo's `GRPOTrainer` and in the minimal loop, run as
   `grpo_run.py` runs them (the base configuration of `suite.py`, phases not timed). Per step, after
   2 warm-up steps: the median inclusive ms of each span and the exclusive ms (less the spans
   inside it); `(rest of step)` is the step less every top-level span.
2. The learn step's pieces timed side by side (interleaved, `--reps` rounds, medians): the minimal
   loop's forward + loss + backward against olingo's (`policy_logits` with attention mask and
   position ids, `log_probs_from_logits`, `GroupPolicyLoss`, backward, then the entropy statistic
   `entropy_from_logits`), and olingo's with one piece at a time replaced by the minimal loop's way.
3. The scoring and batching pieces alone: olingo's `GroupExperienceMaker.sample` after generation
   (per-row decode, reward, records), the experience buffer round trip (`split_experience_batch` +
   `make_experience_batch`), against a `batch_decode` and the checker.
Nothing in olingo is changed; the replacements are written here.

`--threads 1 --cpu-time` times with the calling thread's CPU time (`time.thread_time`) and one
intra-op thread: less sensitive to other processes, though CPU time also grows when another process
shares the core's caches, so compare rows of one run only.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from bench import grpo_run, suite, workload  # noqa: E402


class Spans:
    """Inclusive and exclusive time of wrapped functions, per step."""

    def __init__(self) -> None:
        self.stack: list[list] = []  # [label, start, time in child spans]
        self.step: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.steps: list[dict[str, list[float]]] = []
        self.step_start = None
        self.top = 0.0  # time in spans not inside another span, this step

    def wrap(self, owner, attr: str, label: str) -> None:
        original = getattr(owner, attr)
        spans = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            spans.stack.append([label, CLOCK(), 0.0])
            try:
                return original(*args, **kwargs)
            finally:
                name, start, children = spans.stack.pop()
                took = CLOCK() - start
                spans.step[name][0] += took
                spans.step[name][1] += took - children
                if spans.stack:
                    spans.stack[-1][2] += took
                else:
                    spans.top += took

        setattr(owner, attr, timed)

    def end_step(self) -> None:
        now = CLOCK()
        if self.step_start is not None:
            took = now - self.step_start
            self.steps.append({"(step)": [took, took], **self.step, "(outside every span)": [took - self.top] * 2})
        self.step, self.step_start, self.top = defaultdict(lambda: [0.0, 0.0]), now, 0.0

    def report(self, title: str, warmup: int) -> None:
        steps = self.steps[warmup:]
        labels = list(dict.fromkeys(k for s in steps for k in s))
        print(f"\n## {title}: spans, median ms per step over {len(steps)} steps\n")
        print("| span | inclusive | exclusive |\n|---|---|---|")
        for label in labels:
            inc = statistics.median([s.get(label, [0.0, 0.0])[0] for s in steps])
            exc = statistics.median([s.get(label, [0.0, 0.0])[1] for s in steps])
            print(f"| {label} | {1000 * inc:.2f} | {1000 * exc:.2f} |")


def wrap_common(spans: Spans) -> None:
    from transformers.generation.utils import GenerationMixin

    spans.wrap(GenerationMixin, "generate", "generate (transformers)")
    spans.wrap(torch.autograd, "backward", "backward")
    spans.wrap(torch.nn.utils, "clip_grad_norm_", "clip_grad_norm_")
    spans.wrap(torch.optim.AdamW, "step", "AdamW.step")


def spans_olingo(spec: dict) -> None:
    from olingo.booster.plugin import base as plugin_base
    from olingo.engines import hf
    from olingo.experience_buffer import NaiveExperienceBuffer
    from olingo.experience_maker import group
    from olingo.rl.policy_loss import GroupPolicyLoss
    from olingo.trainer import grpo as grpo_module
    from olingo.trainer import grpo_learner, online
    from olingo.trainer.callbacks import Callback

    spans = Spans()
    wrap_common(spans)
    for owner, attr, label in [
        (grpo_module.GRPOTrainer, "_make_experience", "_make_experience (collect step)"),
        (hf.HFEngine, "generate", "HFEngine.generate"),
        (hf, "build_generation_config", "build_generation_config"),
        (hf, "rollout_from_responses", "rollout_from_responses"),
        (group, "score_rollout", "score_rollout (decode, reward)"),
        (group.GroupExperienceMaker, "finish", "finish (advantages)"),
        (grpo_module.GRPOTrainer, "_learn", "_learn (minibatches to optimizer step)"),
        (NaiveExperienceBuffer, "append", "buffer.append (split into rows)"),
        (NaiveExperienceBuffer, "collate_fn", "collate (make_experience_batch)"),
        (grpo_learner.GRPOLearner, "training_step", "training_step"),
        (grpo_learner, "policy_logits", "policy_logits (model forward)"),
        (grpo_learner, "log_probs_from_logits", "log_probs_from_logits"),
        (GroupPolicyLoss, "forward", "GroupPolicyLoss"),
        (grpo_learner, "entropy_from_logits", "entropy_from_logits"),
        (grpo_learner.GRPOLearner, "optimizer_step", "optimizer_step"),
        (plugin_base, "clip_gradients", "clip_gradients"),
        (grpo_module.GRPOTrainer, "_rollout_metrics", "_rollout_metrics"),
        (online.OLTrainer, "_after_step", "_after_step (logging, callbacks)"),
    ]:
        spans.wrap(owner, attr, label)
    original_fit = grpo_module.GRPOTrainer.fit

    class StepEnd(Callback):
        def on_episode_start(self, episode: int) -> None:
            if spans.step_start is None:
                spans.end_step()

        def on_episode_end(self, episode: int) -> None:
            spans.end_step()

    def fit(self, *args, **kwargs):
        self.callbacks.append(StepEnd())
        return original_fit(self, *args, **kwargs)

    grpo_module.GRPOTrainer.fit = fit
    grpo_run.run_olingo(spec, None)
    spans.report("olingo", spec["warmup_updates"])


def spans_minimal(spec: dict) -> None:
    spans = Spans()
    wrap_common(spans)
    from transformers import PreTrainedTokenizerBase

    spans.wrap(PreTrainedTokenizerBase, "batch_decode", "batch_decode")
    spans.wrap(grpo_run, "arithmetic_rewards", "arithmetic_rewards")
    spans.wrap(grpo_run, "token_log_probs", "token_log_probs (model forward)")

    class Marker(grpo_run.PhaseClock):
        """The minimal loop calls clock.take() before its first step and after each: only a step marker."""

        def install(self, models):
            return self

        def wrap(self, fn, phase):
            return fn

        def take(self):
            spans.end_step()
            return {}

    grpo_run.run_minimal(spec, Marker())
    spans.report("minimal", spec["warmup_updates"])


CLOCK = time.perf_counter


def time_side_by_side(variants: dict, reps: int, before=None) -> None:
    times = {k: [] for k in variants}
    for rep in range(reps + 2):
        for name, fn in variants.items():
            if before is not None:
                before()
            start = CLOCK()
            fn()
            if rep >= 2:
                times[name].append(CLOCK() - start)
    print("| variant | median ms | min ms |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {1000 * statistics.median(values):.2f} | {1000 * min(values):.2f} |")


def learn_pieces(spec: dict, reps: int) -> None:
    from olingo.experience_maker.scoring import policy_logits
    from olingo.rl.logprobs import entropy_from_logits, log_probs_from_logits
    from olingo.rl.masked import masked_mean
    from olingo.rl.policy_loss import GroupPolicyLoss

    model = AutoModelForCausalLM.from_pretrained(spec["policy_dir"]).train()
    B, A = spec["batch_size"] * spec["num_generations"], spec["response_length"]
    rows = workload.read_jsonl(spec["prompts"])[: spec["batch_size"]]
    prompts = torch.tensor([row["input_ids"] for row in rows]).repeat_interleave(spec["num_generations"], 0)
    seq = torch.cat([prompts, torch.randint(8, 104, (B, A))], dim=1)
    mask, action_mask = torch.ones_like(seq), torch.ones(B, A, dtype=torch.bool)
    advantages = torch.randn(B, 1).expand(B, A).contiguous()
    loss_fn, units = GroupPolicyLoss(0.2, 0.2, None, "token_mean"), torch.tensor(float(B * A))

    def minimal() -> None:
        logp = grpo_run.token_log_probs(model, seq, A, 1.0)
        ratio = (logp - logp.detach()).exp()
        (-torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).mean()).backward()

    def olingo(position_ids: bool = True, rowwise_logp: bool = True, entropy: str = "rows") -> None:
        if position_ids:
            logits = policy_logits(model, seq, mask, A, 1.0)
        else:
            logits = model(input_ids=seq, use_cache=False).logits[:, -A - 1 : -1]
        if rowwise_logp:
            logp = log_probs_from_logits(logits, seq[:, -A:])
        else:
            logp = torch.gather(logits.log_softmax(-1), -1, seq[:, -A:, None]).squeeze(-1)
        loss, _ = loss_fn(logp, None, advantages, action_mask, units)
        loss.backward()
        if entropy == "rows":
            masked_mean(entropy_from_logits(logits.detach()), action_mask)
        elif entropy == "batched":
            log_p = logits.detach().float().log_softmax(-1)
            masked_mean(-(log_p.exp() * log_p).sum(-1), action_mask)

    print(f"\n## learn step pieces: forward + loss + backward on {B} x {seq.shape[1]} tokens ({B} x {A} response tokens)\n")
    time_side_by_side({
        "minimal loop": minimal,
        "olingo as is (`training_step`'s maths)": olingo,
        "olingo, entropy statistic batched instead of per row": lambda: olingo(entropy="batched"),
        "olingo, no entropy statistic": lambda: olingo(entropy="none"),
        "olingo, no entropy, log-probs batched": lambda: olingo(rowwise_logp=False, entropy="none"),
        "olingo, no entropy, log-probs batched, no mask/position ids": lambda: olingo(position_ids=False, rowwise_logp=False, entropy="none"),
        "`entropy_from_logits` alone": lambda: entropy_from_logits(torch.randn(B, A, model.config.vocab_size)),
        "`log_probs_from_logits` alone (no grad)": lambda: log_probs_from_logits(torch.randn(B, A, model.config.vocab_size), seq[:, -A:]),
    }, reps, before=lambda: model.zero_grad(set_to_none=True))


def scoring_pieces(spec: dict, reps: int) -> None:
    from olingo.engines.hf import rollout_from_responses
    from olingo.engines.settings import GenerationSettings
    from olingo.experience_maker.experience import make_experience_batch, split_experience_batch
    from olingo.experience_maker.group import GroupExperienceMaker
    from olingo.models.loading import load_causal_lm
    from olingo.rewards.functions import CompositeReward

    tokenizer = AutoTokenizer.from_pretrained(spec["policy_dir"], padding_side="left")
    actor = load_causal_lm(spec["policy_dir"])
    G, A = spec["num_generations"], spec["response_length"]
    rows = workload.read_jsonl(spec["prompts"])[: spec["batch_size"]]
    prompts = torch.tensor([r["input_ids"] for r in rows])
    ones = torch.ones_like(prompts)
    answers = [r["gt_answer"] for r in rows]
    settings = GenerationSettings.from_kwargs(max_new_tokens=A, do_sample=True, temperature=1.0, stop_token_ids=[])
    maker = GroupExperienceMaker(actor, CompositeReward({"arithmetic_exact": 1.0}), None, tokenizer, generation=settings, needs_old_log_probs=False)
    rollout = maker.engine.generate(prompts, ones, settings, n=G)
    maker.engine.generate = lambda *args, **kwargs: rollout  # from here on no model runs: only what follows generate
    experience = maker.sample(prompts, ones, answers)
    repeated, responses = prompts.repeat_interleave(G, 0), rollout.sequences[:, -A:]

    def minimal_scoring() -> None:
        r = grpo_run.arithmetic_rewards(tokenizer.batch_decode(responses, skip_special_tokens=True), [a for a in answers for _ in range(G)]).view(-1, G)
        (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-6)

    print(f"\n## scoring and batching pieces ({rollout.sequences.shape[0]} rollouts of {A} tokens)\n")
    time_side_by_side({
        "minimal: batch_decode + checker + advantages": minimal_scoring,
        "olingo `rollout_from_responses` (masks from the generated ids)":
            lambda: rollout_from_responses(repeated, torch.ones_like(repeated), responses, tokenizer, settings, None),
        "olingo `GroupExperienceMaker.sample` less generate (decode, score, info, samples)": lambda: maker.sample(prompts, ones, answers),
        "olingo `finish` (advantages)": lambda: maker.finish(experience),
        "olingo buffer round trip: `split_experience_batch` + `make_experience_batch`": lambda: make_experience_batch(split_experience_batch(experience)),
    }, reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--response-length", type=int, default=8)
    parser.add_argument("--reps", type=int, default=30, help="rounds of the side-by-side timings")
    parser.add_argument("--only", choices=["spans", "learn", "scoring"])
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--cpu-time", action="store_true", help="time with the calling thread's CPU time (use with --threads 1)")
    args = parser.parse_args()
    global CLOCK
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cpu_time:
        CLOCK = time.thread_time
    suite.WORK.mkdir(parents=True, exist_ok=True)
    config = {**suite.GRPO_CONFIGS[0], "response_length": args.response_length}
    spec = suite.grpo_spec(config, args.steps, 2)
    torch.manual_seed(0)
    print(f"torch threads {torch.get_num_threads()}; clock {CLOCK.__name__}; config {config}")
    if args.only in (None, "spans"):
        spans_olingo(spec)
        spans_minimal(spec)
    if args.only in (None, "learn"):
        learn_pieces(spec, args.reps)
    if args.only in (None, "scoring"):
        scoring_pieces(spec, args.reps)


if __name__ == "__main__":
    main()
