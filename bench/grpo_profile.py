"""Where olingo's GRPO step spends the time the minimal loop does not.

    python bench/grpo_profile.py [--steps 6] [--response-length 8] [--reps 30]

1. cProfile of olingo's `GRPOTrainer` steps (after 2 warm-up steps; the base configuration of
   `suite.py`, phases not timed) and of the minimal loop's, reduced to the functions that make up a
   step: cumulative seconds per step of each.
2. The learn step's pieces timed side by side (interleaved, `--reps` rounds, medians): the minimal
   loop's forward + loss + backward against olingo's (`policy_logits` with attention mask and
   position ids, `log_probs_from_logits`, `GroupPolicyLoss`, backward, then the entropy statistic
   `entropy_from_logits`), and olingo's with one piece at a time replaced by the minimal loop's way.
3. The scoring and batching pieces alone: olingo's `score_rollout` (per-row decode, reward), the
   experience buffer round trip (`split_experience_batch` + `make_experience_batch`), against a
   `batch_decode` and the checker.
Nothing in olingo is changed; the replacements are written here.

On a busy machine, `--threads 1 --cpu-time` measures the work itself: one intra-op thread, and
CPU time of that thread (`time.thread_time`, and cProfile's timer) instead of wall time, so time
spent waiting for a core (or in an OpenMP barrier for a descheduled thread) is not counted.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from bench import grpo_run, suite, workload  # noqa: E402

STEP_FUNCTIONS = [  # (label, file suffix, function name): the pieces of one step
    ("episode (whole step)", "trainer/online.py", "_run_episode"),
    ("  make experience", "trainer/grpo.py", "_make_experience"),
    ("    generate (transformers)", "generation/utils.py", "generate"),
    ("    rollout_from_responses", "engines/settings.py", "rollout_from_responses"),
    ("    score_rollout", "experience_maker/naive.py", "score_rollout"),
    ("    experience_info", "experience_maker/experience.py", "experience_info"),
    ("    finish (advantages)", "experience_maker/group.py", "finish"),
    ("  buffer append (split)", "experience_buffer/__init__.py", "append"),
    ("  learn", "trainer/grpo.py", "_learn"),
    ("    collate (make_experience_batch)", "experience_maker/experience.py", "make_experience_batch"),
    ("    training_step", "trainer/grpo_learner.py", "training_step"),
    ("      policy_logits (forward)", "experience_maker/naive.py", "policy_logits"),
    ("      log_probs_from_logits", "models/functional.py", "log_probs_from_logits"),
    ("      GroupPolicyLoss", "models/loss.py", "forward"),
    ("      backward", "torch/_tensor.py", "backward"),
    ("      entropy_from_logits", "models/functional.py", "entropy_from_logits"),
    ("    optimizer_step (clip, AdamW, stats)", "trainer/grpo_learner.py", "optimizer_step"),
    ("      clip_gradients", "booster/plugin/base.py", "clip_gradients"),
    ("    _rollout_metrics", "trainer/grpo.py", "_rollout_metrics"),
    ("    _after_step (logging, callbacks)", "trainer/online.py", "_after_step"),
]


def cumulative(stats: pstats.Stats, suffix: str, name: str) -> float:
    """Cumulative seconds of every function `name` in a file ending with `suffix`."""
    return sum(v[3] for (file, _, func), v in stats.stats.items() if func == name and file.endswith(suffix))


def profile_olingo(spec: dict, steps: int) -> None:
    from olingo.trainer import grpo as grpo_module
    from olingo.trainer.callbacks import Callback

    profiler, seen = cProfile.Profile(CLOCK), []
    original_fit = grpo_module.GRPOTrainer.fit

    class StartAfterWarmup(Callback):
        def on_episode_end(self, episode: int) -> None:
            seen.append(episode)
            if len(seen) == spec["warmup_updates"]:
                profiler.enable()
            elif len(seen) == spec["warmup_updates"] + steps:
                profiler.disable()

    def fit(self, *args, **kwargs):
        self.callbacks.append(StartAfterWarmup())
        return original_fit(self, *args, **kwargs)

    grpo_module.GRPOTrainer.fit = fit
    try:
        out = grpo_run.run_olingo({**spec, "updates": steps}, None)
    finally:
        grpo_module.GRPOTrainer.fit = original_fit
    stats = pstats.Stats(profiler, stream=io.StringIO())
    print(f"\n## olingo: cProfile, cumulative ms per step (wall-clock median step {1000 * statistics.median(out['step_times_s']):.1f} ms)\n")
    print("| function | ms/step |\n|---|---|")
    for label, suffix, name in STEP_FUNCTIONS:
        print(f"| `{label}` | {1000 * cumulative(stats, suffix, name) / steps:.2f} |")


def profile_minimal(spec: dict, steps: int) -> None:
    profiler = cProfile.Profile(CLOCK)
    profiler.enable()
    out = grpo_run.run_minimal({**spec, "updates": steps, "warmup_updates": 0}, None)
    profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    print(f"\n## minimal: cProfile, cumulative ms per step over all {steps} steps (wall-clock median step {1000 * statistics.median(out['step_times_s']):.1f} ms)\n")
    print("| function | ms/step |\n|---|---|")
    for label, suffix, name in [("generate", "generation/utils.py", "generate"), ("batch_decode", "tokenization_utils_base.py", "batch_decode"),
                                ("arithmetic_rewards", "bench/grpo_run.py", "arithmetic_rewards"), ("token_log_probs (forward)", "bench/grpo_run.py", "token_log_probs"),
                                ("backward", "torch/_tensor.py", "backward"), ("clip_grad_norm_", "nn/utils/clip_grad.py", "clip_grad_norm_"),
                                ("AdamW step", "torch/optim/adam.py", "step")]:
        print(f"| `{label}` | {1000 * cumulative(stats, suffix, name) / steps:.2f} |")


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
    from olingo.experience_maker.naive import policy_logits
    from olingo.models.functional import entropy_from_logits, log_probs_from_logits, masked_mean
    from olingo.models.loss import GroupPolicyLoss

    model = AutoModelForCausalLM.from_pretrained(spec["policy_dir"]).train()
    B, A = spec["batch_size"] * spec["num_generations"], spec["response_length"]
    prompts = torch.tensor([row["input_ids"] for row in workload.read_jsonl(spec["prompts"])[: spec["batch_size"]]]).repeat_interleave(spec["num_generations"], 0)
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
    from olingo.models.rewards import CompositeReward

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
        "olingo `rollout_from_responses` (masks from the generated ids)": lambda: rollout_from_responses(repeated, torch.ones_like(repeated), responses, tokenizer, settings, None),
        "olingo `GroupExperienceMaker.sample` less generate (decode, score, info, samples)": lambda: maker.sample(prompts, ones, answers),
        "olingo `finish` (advantages)": lambda: maker.finish(experience),
        "olingo buffer round trip: `split_experience_batch` + `make_experience_batch`": lambda: make_experience_batch(split_experience_batch(experience)),
    }, reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="profiled steps (after 2 warm-up steps)")
    parser.add_argument("--response-length", type=int, default=8)
    parser.add_argument("--reps", type=int, default=30, help="rounds of the side-by-side timings")
    parser.add_argument("--only", choices=["cprofile", "learn", "scoring"])
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
    if args.only in (None, "cprofile"):
        profile_olingo(spec, args.steps)
        profile_minimal(spec, args.steps)
    if args.only in (None, "learn"):
        learn_pieces(spec, args.reps)
    if args.only in (None, "scoring"):
        scoring_pieces(spec, args.reps)


if __name__ == "__main__":
    main()
