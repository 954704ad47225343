"""One GRPO run, timed optimizer step by optimizer step and phase by phase: `--impl olingo|minimal`.

    python bench/grpo_run.py --spec SPEC.json --out RESULT.json

One step is one GRPO iteration with one update per batch (mu = 1) and no KL term: take
`batch_size` arithmetic prompts, sample `num_generations` (G) responses to each of exactly
`response_length` tokens (temperature `temperature`, no early stop) in one `generate` call,
decode them and score each with the arithmetic checker (1.0 when the response's first integer
is the answer), group-normalised advantages (r - group mean) / (group std + eps), then one
AdamW step on the clipped surrogate averaged over every response token of the batch
(token_mean, DAPO's aggregation), with gradient clipping at 1.0 and a cosine schedule. Since pi_old
is the policy itself (one step per batch), no implementation computes old log-probs: the ratio
is exp(logp - logp.detach()) = 1 and the gradient is that of log pi.
- `olingo`: `GRPOTrainer` as a user builds it (Booster, the arithmetic_exact reward function,
  metrics.jsonl, TensorBoard and rollout samples written to a run directory).
- `minimal`: the same model calls in a bare loop (`run_minimal`).
Step times are end to end (end of one step to the end of the next: batch fetch, logging and
everything between steps included); `cpu_times_s` is the process CPU time (user + system, all
threads) over the same intervals. Phases come from `bench.phases.PhaseClock(scoring=True)`,
installed the same way in every implementation (and in TRL's, `trl/grpo_trl.py`).
"""

from __future__ import annotations

import math
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from bench.common import Marks, peak_rss_mb, runner_main
from bench.phases import PhaseClock
from bench.workload import read_jsonl
from olingo.tasks.arithmetic import is_correct


def prompt_batches(spec: dict) -> list[list[dict]]:
    """`batch_size` prompt rows per step, in file order, cycling over the file."""
    rows = read_jsonl(spec["prompts"])
    B, count = spec["batch_size"], spec["warmup_updates"] + spec["updates"]
    return [[rows[(u * B + i) % len(rows)] for i in range(B)] for u in range(count)]


def optimizer_steps(spec: dict) -> int:
    return spec["warmup_updates"] + spec["updates"]


# ---- olingo ---------------------------------------------------------------------------------
def run_olingo(spec: dict, clock: PhaseClock | None) -> dict:
    from olingo.booster import Booster, SingleProcessPlugin
    from olingo.dataset.prompts import PromptCollator
    from olingo.experience_maker.group import GroupExperienceConfig
    from olingo.models.loading import load_causal_lm
    from olingo.recipes.common import OptimizerConfig, optimizer_and_schedule
    from olingo.rewards.functions import CompositeReward
    from olingo.trainer.callbacks import Callback
    from olingo.trainer.grpo import GRPOTrainer
    from olingo.trainer.grpo_learner import GRPOLossConfig

    actor = load_causal_lm(spec["policy_dir"])
    tokenizer = AutoTokenizer.from_pretrained(spec["policy_dir"], padding_side="left")
    reward = CompositeReward({"arithmetic_exact": 1.0})  # what `reward.functions: {arithmetic_exact: 1.0}` builds
    if clock is not None:
        clock.install({"actor": actor})
        reward.score = clock.wrap(reward.score, "reward_fn")
    cfg = OptimizerConfig(lr=spec["lr"], weight_decay=0.0, warmup_ratio=0.0, max_grad_norm=1.0)
    booster = Booster(plugin=SingleProcessPlugin(max_norm=1.0))
    optimizer, scheduler = optimizer_and_schedule(actor, cfg, optimizer_steps(spec))
    actor, optimizer, *_ = booster.boost(actor, optimizer)
    G = spec["num_generations"]

    marks, phases, rewards = Marks(), [], []

    class StepClock(Callback):
        """End to end: each step ends at on_episode_end (one episode = one optimizer step here)."""

        def on_episode_start(self, episode: int) -> None:
            if not marks.wall:
                marks.mark()
                if clock is not None:
                    clock.take()

        def on_make_experience_end(self, experience) -> None:
            rewards.append(float(experience.raw_score.float().mean()))

        def on_episode_end(self, episode: int) -> None:
            marks.mark()
            phases.append(clock.take() if clock is not None else {})

    trainer = GRPOTrainer(
        booster, actor, reward, None, optimizer, scheduler, tokenizer,
        kl_coef=0.0, ptx_coef=0.0, train_batch_size=spec["batch_size"] * G, num_generation=G, callbacks=[StepClock()],
        experience_config=GroupExperienceConfig(advantage="grpo"),
        loss_config=GRPOLossConfig(aggregation="token_mean", eps_low=spec["eps_low"], eps_high=spec["eps_high"]),
        max_new_tokens=spec["response_length"], do_sample=True, temperature=spec["temperature"], stop_token_ids=[],
    )
    trainer.show_progress = False
    batches = prompt_batches(spec)
    rows = [{"input_ids": r["input_ids"], "gt_answer": r["gt_answer"]} for batch in batches for r in batch]
    loader = booster.plugin.prepare_dataloader(rows, spec["batch_size"], shuffle=False, collate_fn=PromptCollator(tokenizer.pad_token_id), drop_last=True)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer.fit(num_episodes=len(batches), num_collect_steps=1, num_update_steps=1, prompt_dataloader=loader, log_dir=run_dir)
    return {"marks": marks, "phase_s": phases, "mean_reward": rewards}


# ---- the minimal GRPO step ----------------------------------------------------------------------
def token_log_probs(model, sequences: torch.Tensor, num_actions: int, temperature: float) -> torch.Tensor:
    logits = model(input_ids=sequences, use_cache=False).logits[:, -num_actions - 1 : -1] / temperature
    return torch.gather(logits.log_softmax(-1), -1, sequences[:, -num_actions:, None]).squeeze(-1)


def arithmetic_rewards(responses: list[str], answers: list[str]) -> torch.Tensor:
    return torch.tensor([1.0 if is_correct(r, a) else 0.0 for r, a in zip(responses, answers, strict=True)])


def run_minimal(spec: dict, clock: PhaseClock | None) -> dict:
    actor = AutoModelForCausalLM.from_pretrained(spec["policy_dir"])
    tokenizer = AutoTokenizer.from_pretrained(spec["policy_dir"])
    score = arithmetic_rewards
    if clock is not None:
        clock.install({"actor": actor})
        score = clock.wrap(arithmetic_rewards, "reward_fn")
    total, G, L, T = optimizer_steps(spec), spec["num_generations"], spec["response_length"], spec["temperature"]
    optim = torch.optim.AdamW(actor.parameters(), lr=spec["lr"], betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / total, 1.0))))
    gen = GenerationConfig(max_new_tokens=L, do_sample=True, temperature=T, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=0)
    lo, hi = 1 - spec["eps_low"], 1 + spec["eps_high"]
    marks, phases, rewards = Marks(), [], []
    marks.mark()
    if clock is not None:
        clock.take()
    for batch in prompt_batches(spec):
        prompts = torch.tensor([row["input_ids"] for row in batch]).repeat_interleave(G, dim=0)
        answers = [row["gt_answer"] for row in batch for _ in range(G)]
        with torch.no_grad():
            actor.eval()
            seq = actor.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=gen)
            r = score(tokenizer.batch_decode(seq[:, -L:], skip_special_tokens=True), answers).view(-1, G)
            advantages = ((r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-6)).view(-1, 1)
        actor.train()
        logp = token_log_probs(actor, seq, L, T)
        ratio = (logp - logp.detach()).exp()
        loss = -torch.min(ratio * advantages, ratio.clamp(lo, hi) * advantages).mean()  # every token counts once
        loss.backward()
        torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        sched.step()
        rewards.append(float(r.mean()))
        marks.mark()
        phases.append(clock.take() if clock is not None else {})
    return {"marks": marks, "phase_s": phases, "mean_reward": rewards}


def run(impl):
    """The runner for `impl`, timing phases unless the spec says `"phases": false`."""
    return lambda spec: impl(spec, PhaseClock(scoring=True) if spec.get("phases", True) else None)


def finish(spec: dict, output: dict) -> dict:
    warm, marks = spec["warmup_updates"], output["marks"]
    return {"impl": spec["impl"], "step_times_s": marks.intervals(marks.wall)[warm:], "cpu_times_s": marks.intervals(marks.cpu)[warm:],
            "phase_s": output["phase_s"][warm:],
            "mean_reward": output["mean_reward"], "peak_rss_mb": peak_rss_mb()}


if __name__ == "__main__":
    runner_main(__doc__, {"olingo": run(run_olingo), "minimal": run(run_minimal)}, finish)
