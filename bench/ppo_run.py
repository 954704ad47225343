"""One PPO run, timed update by update and phase by phase: `--impl olingo|minimal|bare_generate`.

    python bench/ppo_run.py --spec SPEC.json --out RESULT.json

An update is one PPO iteration: generate `batch_size` responses of exactly `response_length`
tokens (sampling at `temperature`, no early stop), score them (actor and reference log-probs,
critic values, reward at the last token), per-token KL-penalised rewards, GAE, whitened
advantages, then `ppo_epochs` passes over minibatches of `mini_batch_size`, each one actor
step (clipped policy loss) and one critic step (clipped value loss), with gradient clipping
and AdamW. `bare_generate` times only `generate` on the same batch, for tokens/s.
Phases come from `bench.phases.PhaseClock`, installed the same way for every implementation.
`update_times_s` is wall time from the start to the end of each update, `cpu_times_s` the process
CPU time (user + system, all threads) over the same interval.
"""

from __future__ import annotations

import math
import tempfile
import time

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GenerationConfig,
)

from bench.common import peak_rss_mb, runner_main
from bench.phases import PhaseClock
from bench.workload import read_jsonl


def prompt_batches(spec: dict) -> list[torch.Tensor]:
    """(batch_size, P) prompt tensors, one per update, cycling over the prompt file."""
    rows = [row["input_ids"] for row in read_jsonl(spec["prompts"])]
    count = spec["warmup_updates"] + spec["updates"]
    B = spec["batch_size"]
    return [torch.tensor([rows[(u * B + i) % len(rows)] for i in range(B)]) for u in range(count)]


def optimizer_steps(spec: dict) -> int:
    per_update = spec["ppo_epochs"] * math.ceil(spec["batch_size"] / spec["mini_batch_size"])
    return (spec["warmup_updates"] + spec["updates"]) * per_update


# ---- olingo ---------------------------------------------------------------------------------
def run_olingo(spec: dict, clock: PhaseClock | None) -> dict:
    from olingo.booster import Booster, SingleProcessPlugin
    from olingo.dataset.prompts import PromptCollator
    from olingo.experience_maker import ExperienceConfig, RewardShaping
    from olingo.models.critic import Critic
    from olingo.models.loading import load_causal_lm
    from olingo.models.reward_model import RewardModel
    from olingo.recipes.common import OptimizerConfig, optimizer_and_schedule
    from olingo.trainer import PPOTrainer
    from olingo.trainer.callbacks import Callback

    actor, initial = load_causal_lm(spec["policy_dir"]), load_causal_lm(spec["policy_dir"])
    critic, reward = Critic.from_pretrained(spec["value_dir"]), RewardModel.from_pretrained(spec["reward_dir"])
    tokenizer = AutoTokenizer.from_pretrained(spec["policy_dir"], padding_side="left")
    if clock is not None:
        clock.install({"actor": actor, "ref": initial, "critic": critic, "reward": reward})
    initial.eval().requires_grad_(False)
    reward.eval().requires_grad_(False)
    cfg = OptimizerConfig(lr=spec["lr"], weight_decay=0.0, warmup_ratio=0.0, max_grad_norm=1.0)
    boosted = []
    for model in (actor, critic):
        booster = Booster(plugin=SingleProcessPlugin(max_norm=1.0))
        optimizer, scheduler = optimizer_and_schedule(model, cfg, optimizer_steps(spec))
        model, optimizer, *_ = booster.boost(model, optimizer)
        boosted.append((booster, model, optimizer, scheduler))
    (actor_booster, actor, actor_optim, actor_sched), (critic_booster, critic, critic_optim, critic_sched) = boosted

    marks, cpu, phases = [], [], []

    class UpdateClock(Callback):
        def on_episode_start(self, episode: int) -> None:
            marks.append(time.perf_counter())
            cpu.append(time.process_time())
            if clock is not None:
                clock.take()

        def on_episode_end(self, episode: int) -> None:
            marks[-1] = time.perf_counter() - marks[-1]
            cpu[-1] = time.process_time() - cpu[-1]
            phases.append(clock.take() if clock is not None else {})

    trainer = PPOTrainer(
        actor_booster, critic_booster, actor, critic, reward, initial, actor_optim, critic_optim, actor_sched, critic_sched, tokenizer,
        kl_coef=spec["kl_coef"], ptx_coef=0.0, train_batch_size=spec["mini_batch_size"], eps_clip=spec["cliprange"], vf_coef=spec["vf_coef"],
        value_clip=spec["cliprange_value"], offload_inference_models=False, buffer_cpu_offload=False, callbacks=[UpdateClock()],
        experience_config=ExperienceConfig(gamma=spec["gamma"], lam=spec["lam"], **spec.get("olingo_experience", {})),
        reward_shaping=RewardShaping(clip=None),
        max_new_tokens=spec["response_length"], do_sample=True, temperature=spec["temperature"], stop_token_ids=[],
    )
    batches = prompt_batches(spec)
    rows = [{"input_ids": b.tolist(), "gt_answer": None} for batch in batches for b in batch]
    loader = actor_booster.plugin.prepare_dataloader(rows, spec["batch_size"], shuffle=False, collate_fn=PromptCollator(tokenizer.pad_token_id), drop_last=True)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer.fit(num_episodes=len(batches), num_collect_steps=1, num_update_steps=spec["ppo_epochs"], prompt_dataloader=loader, log_dir=run_dir)
    return {"update_times_s": marks, "cpu_times_s": cpu, "phase_s": phases}


# ---- the minimal PPO iteration ----------------------------------------------------------------
def token_log_probs(model, sequences: torch.Tensor, num_actions: int, temperature: float) -> torch.Tensor:
    logits = model(input_ids=sequences, use_cache=False).logits[:, -num_actions - 1 : -1] / temperature
    return torch.gather(logits.log_softmax(-1), -1, sequences[:, -num_actions:, None]).squeeze(-1)


def token_values(critic, sequences: torch.Tensor, num_actions: int) -> torch.Tensor:
    hidden = critic.model(input_ids=sequences, use_cache=False).last_hidden_state
    return critic.score(hidden).squeeze(-1)[:, -num_actions - 1 : -1]


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    advantages, last = torch.zeros_like(rewards), torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(last)
        last = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * last
        advantages[:, t] = last
    return advantages, advantages + values


def run_minimal(spec: dict, clock: PhaseClock | None) -> dict:
    actor, ref = (AutoModelForCausalLM.from_pretrained(spec["policy_dir"]) for _ in range(2))
    critic = AutoModelForSequenceClassification.from_pretrained(spec["value_dir"], num_labels=1)
    reward = AutoModelForSequenceClassification.from_pretrained(spec["reward_dir"], num_labels=1)
    if clock is not None:
        # token_values calls the critic's body directly: time that (the head is one matmul)
        clock.install({"actor": actor, "ref": ref, "critic": critic.model, "reward": reward})
    ref.eval().requires_grad_(False)
    reward.eval().requires_grad_(False)
    total = optimizer_steps(spec)
    optims = [torch.optim.AdamW(m.parameters(), lr=spec["lr"], betas=(0.9, 0.95), weight_decay=0.0) for m in (actor, critic)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / total, 1.0)))) for o in optims]
    gen = GenerationConfig(max_new_tokens=spec["response_length"], do_sample=True, temperature=spec["temperature"], top_k=0, top_p=1.0,
                           eos_token_id=None, pad_token_id=0)
    R, eps, vclip = spec["response_length"], spec["cliprange"], spec["cliprange_value"]
    marks, cpu, phases = [], [], []
    for prompts in prompt_batches(spec):
        start, cpu_start = time.perf_counter(), time.process_time()
        if clock is not None:
            clock.take()
        with torch.no_grad():
            actor.eval()
            seq = actor.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=gen)
            old_logp = token_log_probs(actor, seq, R, spec["temperature"])
            ref_logp = token_log_probs(ref, seq, R, spec["temperature"])
            old_values = token_values(critic, seq, R)
            score = reward(input_ids=seq, use_cache=False).logits[:, 0]
            rewards = -spec["kl_coef"] * (old_logp - ref_logp)
            rewards[:, -1] += score
            advantages, returns = gae(rewards, old_values, spec["gamma"], spec["lam"])
            advantages = (advantages - advantages.mean()) * torch.rsqrt(advantages.var(unbiased=False) + 1e-8)
        actor.train()
        critic.train()
        for _ in range(spec["ppo_epochs"]):
            for idx in torch.randperm(seq.shape[0]).split(spec["mini_batch_size"]):
                ratio = (token_log_probs(actor, seq[idx], R, spec["temperature"]) - old_logp[idx]).exp()
                policy_loss = -torch.min(ratio * advantages[idx], ratio.clamp(1 - eps, 1 + eps) * advantages[idx]).mean()
                values = token_values(critic, seq[idx], R)
                clipped = old_values[idx] + (values - old_values[idx]).clamp(-vclip, vclip)
                value_loss = 0.5 * torch.max((values - returns[idx]) ** 2, (clipped - returns[idx]) ** 2).mean()
                policy_loss.backward()
                (spec["vf_coef"] * value_loss).backward()
                for model, optim, sched in zip((actor, critic), optims, scheds, strict=True):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optim.step()
                    optim.zero_grad(set_to_none=True)
                    sched.step()
        marks.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
        phases.append(clock.take() if clock is not None else {})
    return {"update_times_s": marks, "cpu_times_s": cpu, "phase_s": phases}


def run_bare_generate(spec: dict, clock: PhaseClock | None) -> dict:
    """`generate` alone on the same batches and settings: the ceiling for generation tokens/s."""
    actor = AutoModelForCausalLM.from_pretrained(spec["policy_dir"]).eval()
    gen = GenerationConfig(max_new_tokens=spec["response_length"], do_sample=True, temperature=spec["temperature"], top_k=0, top_p=1.0,
                           eos_token_id=None, pad_token_id=0)
    marks, cpu = [], []
    for prompts in prompt_batches(spec):
        start, cpu_start = time.perf_counter(), time.process_time()
        with torch.no_grad():
            actor.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=gen)
        marks.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    return {"update_times_s": marks, "cpu_times_s": cpu, "phase_s": [{"generation": m} for m in marks]}


def run(impl):
    """The runner for `impl`, timing phases unless the spec says `"phases": false`."""
    return lambda spec: impl(spec, PhaseClock() if spec.get("phases", True) else None)


def finish(spec: dict, output: dict) -> dict:
    warm = spec["warmup_updates"]
    return {"impl": spec["impl"], "update_times_s": output["update_times_s"][warm:], "cpu_times_s": output["cpu_times_s"][warm:],
            "phase_s": output["phase_s"][warm:], "peak_rss_mb": peak_rss_mb()}


if __name__ == "__main__":
    runner_main(__doc__, {"olingo": run(run_olingo), "minimal": run(run_minimal), "bare_generate": run(run_bare_generate)}, finish)
