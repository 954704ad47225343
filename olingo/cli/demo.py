"""`olingo demo`: SFT -> reward model -> PPO, and SFT -> GRPO, on the embedded arithmetic task;
`olingo demo --pipeline dpo`: SFT -> DPO on the same task's preference pairs.

Each stage is an ordinary run of its packaged config (sft_tiny, rm_tiny, ppo_tiny, grpo_tiny)
under one output directory. The reward model starts from the SFT model (InstructGPT's recipe);
PPO starts its actor and reference from the SFT model and its critic from the reward model, and
is rewarded by the reward model alone: there the arithmetic checker only *measures* accuracy.
GRPO starts from the same SFT model and is rewarded by the checker alone (verifiable reward).
The before/after table compares the SFT model, the PPO actor and the GRPO actor on held-out
prompts, sampling at the rollout temperature with the same random draws for all (paired).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from olingo.config import load_config
from olingo.dataset import PreferenceCollator, build_preference_dataset
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.experience_maker import PPOExperienceMaker
from olingo.models import RewardModel, load_causal_lm, load_tokenizer, stop_token_ids
from olingo.recipes.common import packaged_config, resolve_path
from olingo.recipes.dpo import DPOConfig, run_dpo
from olingo.recipes.grpo import GRPOConfig, run_grpo
from olingo.recipes.ppo import PPOConfig, run_ppo
from olingo.recipes.rm import RMConfig, run_rm
from olingo.recipes.sft import SFTConfig, run_sft
from olingo.rewards.functions import CompositeReward
from olingo.tasks.arithmetic import arithmetic_exact
from olingo.tasks.evaluate import greedy_accuracy
from olingo.trainer.dpo import halves, pair_inputs
from olingo.trainer.online_eval import evaluate_policy
from olingo.trainer.preference import response_logps


@dataclass
class DemoResult:
    run_dirs: dict[str, str]
    base_greedy: float
    sft_greedy: float
    rm_pair_accuracy: float
    before: dict[str, float]  # SFT model on held-out prompts at the rollout temperature
    after: dict[str, float]  # PPO actor, same prompts, same random draws
    ppo_greedy: float
    grpo: dict[str, float]  # GRPO actor, same prompts, same random draws
    grpo_greedy: float
    temperature: float
    plots: list[str]

    @classmethod
    def load(cls, output_dir: str | Path) -> DemoResult:
        """The result a finished `olingo demo --output-dir output_dir` wrote (`demo.json`)."""
        return cls(**json.loads((Path(output_dir) / DEMO_JSON).read_text()))


DEMO_JSON = "demo.json"  # the table's numbers and the run directories, beside the runs


def run_demo(
    output_dir: str = "runs",
    *,
    sft_overrides: Sequence[str] = (),
    rm_overrides: Sequence[str] = (),
    ppo_overrides: Sequence[str] = (),
    grpo_overrides: Sequence[str] = (),
    print_table: bool = True,
    seed: int | None = None,
) -> DemoResult:
    """Run the four stages, evaluate before/after, write plots; overrides shorten it for tests.
    `seed` (None: each packaged config's run.seed) seeds every stage and the paired evaluation."""
    from olingo.cli.report import write_report

    common = [f"run.output_dir={output_dir}", "run.overwrite=true", *seed_overrides(seed)]
    sft = run_sft(load_config(SFTConfig, packaged_config("sft_tiny.yaml"), [*common, "run.name=demo-sft", *sft_overrides]))
    rm = run_rm(load_config(RMConfig, packaged_config("rm_tiny.yaml"), [*common, "run.name=demo-rm", f"model.path={sft['final_model']}", *rm_overrides]))
    rm_model = str(Path(rm["final_model"]))
    ppo_cfg = load_config(PPOConfig, packaged_config("ppo_tiny.yaml"), [
        *common, "run.name=demo-ppo", f"model.actor={sft['final_model']}", f"model.critic={rm_model}",
        f"reward.model={rm_model}", "reward.functions={}", *ppo_overrides,
    ])
    ppo = run_ppo(ppo_cfg)
    grpo = run_grpo(load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), [
        *common, "run.name=demo-grpo", f"model.actor={sft['final_model']}", *grpo_overrides,
    ]))

    before, after, grpo_after = compare_policies(sft["final_model"], [ppo["final_model"], grpo["final_model"]], rm_model, ppo_cfg)
    plots = [str(p) for run in (sft, rm, ppo, grpo) for p in write_report(run["run_dir"])]
    result = DemoResult(
        run_dirs={"sft": sft["run_dir"], "rm": rm["run_dir"], "ppo": ppo["run_dir"], "grpo": grpo["run_dir"]},
        base_greedy=greedy_accuracy(resolve_path("builtin:tiny-llama")),
        sft_greedy=greedy_accuracy(sft["final_model"]),
        rm_pair_accuracy=rm["eval"]["eval/acc"],
        before=before,
        after=after,
        ppo_greedy=greedy_accuracy(ppo["final_model"]),
        grpo=grpo_after,
        grpo_greedy=greedy_accuracy(grpo["final_model"]),
        temperature=ppo_cfg.generation.temperature,
        plots=plots,
    )
    (Path(output_dir) / DEMO_JSON).write_text(json.dumps(asdict(result), indent=1) + "\n")
    if print_table:
        print_demo_table(result)
    return result


def seed_overrides(seed: int | None) -> list[str]:
    """`run.seed=N` for every stage of a demo, or nothing (the packaged configs' seed, 42). A
    seed fixes the digits only on the same CPU kind and kernels; docs/demo.md has the spread."""
    return [] if seed is None else [f"run.seed={seed}"]


def compare_policies(sft_model: str, trained: Sequence[str], reward_model: str, cfg: PPOConfig, samples_per_prompt: int = 8) -> list[dict[str, float]]:
    """Held-out metrics of the SFT model and of each trained actor, with identical sampling
    noise (KL to the SFT model, reward-model score, checked accuracy); `samples_per_prompt`
    responses per prompt keep the sampling error of the accuracy small."""
    tokenizer = load_tokenizer(sft_model, padding_side="left")
    reward = RewardModel.from_pretrained(reward_model, pad_token_id=tokenizer.pad_token_id).eval()
    return sampled_metrics(sft_model, trained, reward, cfg, samples_per_prompt)


def sampled_metrics(sft_model: str, trained: Sequence[str], reward: Any, cfg: PPOConfig, samples_per_prompt: int = 8) -> list[dict[str, float]]:
    """`compare_policies` with any reward (a reward model, or `CompositeReward` of checkers);
    prompts, generation settings and seed come from `cfg` (the PPO stage's)."""
    tokenizer = load_tokenizer(sft_model, padding_side="left")
    reference = load_causal_lm(sft_model).eval()
    prompts = build_prompt_dataset([resolve_path(s) for s in cfg.data.eval_prompts], tokenizer, cfg.data.max_prompt_length)
    prompts.items = prompts.items * samples_per_prompt
    loader = DataLoader(prompts, batch_size=256, shuffle=False, collate_fn=PromptCollator(tokenizer.pad_token_id))
    settings = cfg.generation.settings(stop_token_ids(tokenizer, sft_model))
    results = []
    for actor_dir in (sft_model, *trained):
        actor = reference if actor_dir == sft_model else load_causal_lm(actor_dir).eval()
        maker = PPOExperienceMaker(actor, None, reward, reference, tokenizer, generation=settings)
        metrics, _ = evaluate_policy(maker, loader, settings, accuracy_fn=arithmetic_exact, seed=cfg.run.seed)
        results.append(metrics)
    return results


def print_demo_table(r: DemoResult) -> None:
    print("\n== olingo demo: the embedded arithmetic task (held-out prompts never seen in training) ==")
    print(f"{'stage':<14}{'metric':<48}{'value':>8}")
    print(f"{'base model':<14}{'greedy answer accuracy':<48}{r.base_greedy:>8.3f}")
    print(f"{'SFT':<14}{'greedy answer accuracy':<48}{r.sft_greedy:>8.3f}")
    print(f"{'reward model':<14}{'pairwise accuracy (correct > wrong answer)':<48}{r.rm_pair_accuracy:>8.3f}")
    print(f"\nBefore/after: held-out prompts x 8 samples each, sampling at the rollout temperature {r.temperature:g}")
    print("(PPO rewarded by the reward model, GRPO by the answer checker; both start from the SFT model):")
    print(f"{'metric':<48}{'SFT':>9}{'PPO':>9}{'GRPO':>9}")
    rows = [
        ("answer accuracy (checked by program)", "accuracy"),
        ("mean reward (reward-model score)", "reward"),
        ("KL to the SFT model (nats per response)", "kl"),
        ("response length (tokens)", "response_length"),
    ]
    for label, key in rows:
        print(f"{label:<48}{r.before[key]:>9.3f}{r.after[key]:>9.3f}{r.grpo[key]:>9.3f}")
    print(f"{'greedy answer accuracy':<48}{r.sft_greedy:>9.3f}{r.ppo_greedy:>9.3f}{r.grpo_greedy:>9.3f}")
    print(f"\nrun directories: {', '.join(r.run_dirs.values())}")
    print(f"plots: {Path(r.plots[0]).parent if r.plots else '-'} (and plots/ of each run; `olingo report RUN_DIR` redraws them)")


@dataclass
class DPODemoResult:
    run_dirs: dict[str, str]
    sampled: list[dict[str, float]]  # SFT model, DPO model: held-out prompts x 8 samples, same draws
    greedy: list[float]
    pair_accuracy: list[float]  # held-out pairs with log pi(chosen) > log pi(rejected)
    implicit_accuracy: float  # held-out pairs with a higher implicit reward for chosen (DPO model)
    temperature: float
    plots: list[str]


def run_dpo_demo(
    output_dir: str = "runs", *, sft_overrides: Sequence[str] = (), dpo_overrides: Sequence[str] = (), print_table: bool = True, seed: int | None = None,
) -> DPODemoResult:
    """SFT, then DPO from the SFT model (its reference too) on the embedded preference pairs;
    the SFT and DPO models compared on held-out prompts and pairs. Overrides shorten it for tests;
    `seed` as in `run_demo`."""
    from olingo.cli.report import write_report

    common = [f"run.output_dir={output_dir}", "run.overwrite=true", *seed_overrides(seed)]
    sft = run_sft(load_config(SFTConfig, packaged_config("sft_tiny.yaml"), [*common, "run.name=demo-sft", *sft_overrides]))
    dpo_cfg = load_config(DPOConfig, packaged_config("dpo_tiny.yaml"), [*common, "run.name=demo-dpo", f"model.path={sft['final_model']}", *dpo_overrides])
    dpo = run_dpo(dpo_cfg)
    models = [sft["final_model"], dpo["final_model"]]
    eval_cfg = load_config(PPOConfig, packaged_config("ppo_tiny.yaml"), seed_overrides(seed))  # held-out prompts and rollout sampling
    sampled = sampled_metrics(models[0], models[1:], CompositeReward({"arithmetic_exact": 1.0}), eval_cfg)
    pairs = [resolve_path(s) for s in dpo_cfg.data.eval]
    result = DPODemoResult(
        run_dirs={"sft": sft["run_dir"], "dpo": dpo["run_dir"]},
        sampled=sampled,
        greedy=[greedy_accuracy(m) for m in models],
        pair_accuracy=[pair_accuracy(m, pairs, dpo_cfg.data.max_length) for m in models],
        implicit_accuracy=dpo["eval"]["eval/rewards/accuracies"],
        temperature=eval_cfg.generation.temperature,
        plots=[str(p) for run in (sft, dpo) for p in write_report(run["run_dir"])],
    )
    if print_table:
        print_dpo_demo_table(result)
    return result


@torch.no_grad()
def pair_accuracy(model_dir: str, pairs: str, max_length: int = 64, batch_size: int = 128) -> float:
    """Share of preference pairs in the file `pairs` whose chosen response the model finds more
    likely than the rejected one (summed log-probs of the response tokens)."""
    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir).eval()
    dataset = build_preference_dataset(pairs, tokenizer, max_length)
    collate = PreferenceCollator(tokenizer.pad_token_id, padding_side="right")
    right = 0
    for start in range(0, len(dataset), batch_size):
        batch = collate([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
        chosen, rejected = halves(response_logps(model, *pair_inputs(batch, lambda b, side: b[f"{side}loss_mask"])))
        right += int((chosen.sums > rejected.sums).sum())
    return right / len(dataset)


def print_dpo_demo_table(r: DPODemoResult) -> None:
    print("\n== olingo demo --pipeline dpo: SFT -> DPO on the embedded arithmetic task (held-out prompts and pairs) ==")
    print(f"{'metric':<62}{'SFT':>9}{'DPO':>9}")
    rows: list[tuple[str, Any, Any]] = [
        (f"answer accuracy, sampled at temperature {r.temperature:g} (x 8 per prompt)", r.sampled[0]["accuracy"], r.sampled[1]["accuracy"]),
        ("greedy answer accuracy", r.greedy[0], r.greedy[1]),
        ("pairs with log pi(chosen) > log pi(rejected)", r.pair_accuracy[0], r.pair_accuracy[1]),
        ("pairs with implicit reward chosen > rejected (vs the SFT model)", None, r.implicit_accuracy),
        ("KL to the SFT model (nats per sampled response)", r.sampled[0]["kl"], r.sampled[1]["kl"]),
        ("response length (tokens)", r.sampled[0]["response_length"], r.sampled[1]["response_length"]),
    ]
    for label, before, after in rows:
        shown = "-" if before is None else f"{before:.3f}"
        print(f"{label:<62}{shown:>9}{after:>9.3f}")
    print("(the SFT model is DPO's reference, so its implicit rewards are all 0: no 'before' value)")
    print(f"\nrun directories: {', '.join(r.run_dirs.values())}")
    print(f"plots: {Path(r.plots[-1]).parent if r.plots else '-'} (and plots/ of the SFT run; `olingo report RUN_DIR` redraws them)")
