"""One multi-turn GRPO run of olingo, timed optimizer step by optimizer step: `--impl olingo`.

    python bench/agent_run.py --spec SPEC.json --out RESULT.json

One step = `batch_size` prompts x G episodes (`bench/agent_env.py`): every episode is `max_turns`
assistant turns of at most `max_new_tokens` sampled tokens each, a tool reply between two turns, then
group-normalised advantages, the token-mean clipped loss over the sampled tokens only and one AdamW
step (mu = 1, no KL term), as `bench/grpo_run.py`. The trainer is olingo's `GRPOTrainer` as a user
builds it (Booster, run directory with metrics.jsonl, TensorBoard and rollout samples), its rollouts
coming from a `MultiTurnSource` over a `ToolEnvironment` with one tool (the source the `environment:`
section of `olingo grpo` builds: `HFEngine` on the policy, `EpisodeLimits`). The source's own episode
metrics (turns, sampled and environment tokens per episode, seconds in the environments and in
generation) are recorded per step, so the result says how many tokens of each role every step ran.
"""

from __future__ import annotations

import tempfile

from bench.agent_env import TOOL_RESULT, load_agent_tokenizer
from bench.common import Marks, peak_rss_mb, runner_main
from bench.phases import PhaseClock
from bench.workload import read_jsonl


def lookup() -> str:
    """Look the value up.

    Returns:
        The value.
    """
    return TOOL_RESULT


def prompt_rows(spec: dict) -> list[dict]:
    """`batch_size` prompt rows per step, in file order, cycling over the file."""
    rows = read_jsonl(spec["prompts"])
    count = (spec["warmup_updates"] + spec["updates"]) * spec["batch_size"]
    return [{"input_ids": rows[i % len(rows)]["input_ids"], "gt_answer": rows[i % len(rows)]["gt_answer"]} for i in range(count)]


def build_source(actor, tokenizer, spec: dict, episodes: list[dict]):
    """The multi-turn source: `HFEngine` on the policy, a fresh one-tool `ToolEnvironment` per episode;
    each batch's episode metrics are appended to `episodes` (for the token counts by role)."""
    from olingo.engines import HFEngine
    from olingo.rollout.multi_turn import EpisodeLimits, MultiTurnSource
    from olingo.rollout.tools import ToolEnvironment

    limits = EpisodeLimits(max_turns=spec["max_turns"], max_new_tokens=spec["max_new_tokens"], max_episode_tokens=spec["max_episode_tokens"])
    source = MultiTurnSource(HFEngine(actor, tokenizer), tokenizer, lambda: ToolEnvironment([lookup], tokenizer=tokenizer), limits, tokenizer.pad_token_id)
    real_sample = source.sample

    def sample(*args, **kwargs):
        batch = real_sample(*args, **kwargs)
        episodes.append({**batch.info, "episodes": int(batch.rollout.sequences.shape[0])})
        return batch

    source.sample = sample
    return source


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
    tokenizer = load_agent_tokenizer(spec["policy_dir"])
    reward = CompositeReward({}, allow_empty=True)  # the environment's rewards are the only ones (as TRL's get_reward)
    if clock is not None:
        clock.install({"actor": actor})
    steps = spec["warmup_updates"] + spec["updates"]
    booster = Booster(plugin=SingleProcessPlugin(max_norm=1.0))
    optim = OptimizerConfig(lr=spec["lr"], weight_decay=0.0, warmup_ratio=0.0, max_grad_norm=1.0, implementation="fused")  # as TRL's default
    optimizer, scheduler = optimizer_and_schedule(actor, optim, steps)
    actor, optimizer, *_ = booster.boost(actor, optimizer)
    G = spec["num_generations"]
    marks, phases, episodes = Marks(), [], []

    class StepClock(Callback):
        """End to end: each step ends at on_episode_end (one episode = one optimizer step here)."""

        def on_episode_start(self, episode: int) -> None:
            if not marks.wall:
                marks.mark()
                if clock is not None:
                    clock.take()

        def on_episode_end(self, episode: int) -> None:
            marks.mark()
            phases.append(clock.take() if clock is not None else {})

    trainer = GRPOTrainer(
        booster, actor, reward, None, optimizer, scheduler, tokenizer,
        kl_coef=0.0, ptx_coef=0.0, train_batch_size=spec["batch_size"] * G, num_generation=G, callbacks=[StepClock()],
        experience_config=GroupExperienceConfig(advantage="grpo"),
        loss_config=GRPOLossConfig(aggregation="token_mean", eps_low=spec["eps_low"], eps_high=spec["eps_high"]),
        max_new_tokens=spec["max_new_tokens"], do_sample=True, temperature=spec["temperature"],
    )
    # GRPOTrainer builds its experience maker with a single-turn source; the `olingo grpo` recipe passes
    # `environment_source(...)` to GroupExperienceMaker instead, which is this same object.
    trainer.experience_maker.source = build_source(booster.unwrap(actor), tokenizer, spec, episodes)
    trainer.show_progress = False
    loader = booster.plugin.prepare_dataloader(prompt_rows(spec), spec["batch_size"], shuffle=False, collate_fn=PromptCollator(tokenizer.pad_token_id),
                                               drop_last=True)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer.fit(num_episodes=steps, num_collect_steps=1, num_update_steps=1, prompt_dataloader=loader, log_dir=run_dir)
    return {"marks": marks, "phase_s": phases, "episodes": episodes}


def finish(spec: dict, output: dict) -> dict:
    warm, marks = spec["warmup_updates"], output["marks"]
    tokens = [
        {"episodes": e["episodes"], "turns": e["turns_per_episode"] * e["episodes"], "sampled": round(e["sampled_tokens_per_episode"] * e["episodes"]),
         "env": round(e["env_tokens_per_episode"] * e["episodes"]), "env_seconds": e["env_seconds"], "generation_seconds": e["generation_seconds"],
         "tool_calls": e.get("tool_calls", 0.0), "tool_parse_errors": e.get("tool_parse_errors", 0.0)}
        for e in output["episodes"]
    ]
    return {"impl": spec["impl"], "step_times_s": marks.intervals(marks.wall)[warm:], "cpu_times_s": marks.intervals(marks.cpu)[warm:],
            "phase_s": output["phase_s"][warm:], "tokens": tokens[warm:], "peak_rss_mb": peak_rss_mb()}


if __name__ == "__main__":
    runner_main(__doc__, {"olingo": lambda spec: run_olingo(spec, PhaseClock(scoring=True) if spec.get("phases", True) else None)}, finish)
