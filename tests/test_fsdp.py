"""FSDP2 and PPO under torchrun (2 gloo ranks on CPU) against one process on the same global
batch; distributed checkpoints saved by 2 ranks and resumed by 1 process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from olingo.config import load_config
from olingo.recipes.common import packaged_config
from olingo.recipes.ppo import PPOConfig, run_ppo
from olingo.recipes.rm import RMConfig, run_rm
from olingo.recipes.sft import SFTConfig, run_sft
from tests.conftest import read_jsonl

TIMEOUT = 300  # seconds per torchrun launch
# In-process runs read the packaged config, as the CLI does when given no --config.


def torchrun(*args: str) -> None:
    """`olingo ARGS` on 2 gloo ranks; the whole process group is killed however the run ends,
    so no rank outlives the test."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "olingo.cli.main", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        _, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 0, stderr[-4000:]


def final_weights(run_dir: Path, *names: str) -> dict[str, torch.Tensor]:
    final = run_dir / "checkpoints" / "final"
    return {f"{name}.{k}": v for name in names for k, v in load_file(str(final / name / "model.safetensors")).items()}


def assert_weights_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=atol, rtol=0, msg=key)


def train_rows(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] == "train"]


def assert_metrics_close(got: list[dict], want: list[dict], names: list[str], atol: float = 1e-5) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want, strict=True):
        for name in names:
            assert abs(a[name] - b[name]) < atol, (a["step"], name, a[name], b[name])


@pytest.fixture(scope="module")
def sft_rows(assets, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fsdp") / "sft64.jsonl"
    path.write_text("".join(line + "\n" for line in assets.sft_train.read_text().splitlines()[:64]))
    return path


@pytest.mark.slow
def test_fsdp_sft_equals_one_process_and_resumes_in_one_process(tmp_path, sft_rows):
    """2 FSDP2 ranks x batch 4 (with gradient checkpointing) == 1 process x batch 8; the step-3
    checkpoint (DCP shards of 2 ranks) resumed by 1 process continues exactly like the
    uninterrupted run, and the exported model loads in transformers."""
    from transformers import AutoModelForCausalLM

    common = [f"run.output_dir={tmp_path}", f"data.train=[{sft_rows}]", "data.eval=[builtin:sft_eval]", "logging.progress=false",
              "train.epochs=1", "train.lr=1e-4", "train.save_interval=3"]
    torchrun("sft", *common, "run.name=fsdp", "train.batch_size=4", "plugin.name=fsdp", "model.gradient_checkpointing=true")
    single = run_sft(load_config(SFTConfig, packaged_config("sft_tiny.yaml"), [*common, "run.name=single", "train.batch_size=8"]))
    step3 = tmp_path / "fsdp" / "checkpoints" / "step_3"
    assert {p.name for p in step3.iterdir()} >= {"model", "model.dcp", "optimizer.dcp", "rng_rank0.pt", "rng_rank1.pt", "scheduler.pt"}
    assert len(list((step3 / "model.dcp").glob("*.distcp"))) == 2  # one shard file per rank
    resumed = [*common, "run.name=resumed", "train.batch_size=8", "plugin.name=fsdp", f"run.resume={step3}"]
    run_sft(load_config(SFTConfig, packaged_config("sft_tiny.yaml"), resumed))

    want = final_weights(tmp_path / "single", "model")
    assert_weights_close(final_weights(tmp_path / "fsdp", "model"), want)
    assert_weights_close(final_weights(tmp_path / "resumed", "model"), want)
    rows = train_rows(tmp_path / "single")
    assert len(rows) == 8
    assert_metrics_close(train_rows(tmp_path / "fsdp"), rows, ["train/loss", "train/grad_norm"])
    assert_metrics_close(train_rows(tmp_path / "resumed"), rows[3:], ["train/loss", "train/grad_norm", "train/lr"])
    fsdp_eval = [r for r in read_jsonl(tmp_path / "fsdp" / "metrics.jsonl") if r["split"] == "eval"]
    assert abs(fsdp_eval[-1]["eval/loss"] - single["eval"]["eval/loss"]) < 1e-5  # 67 rows: ranks hold 34 and 33
    AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp" / "checkpoints" / "final" / "model")


@pytest.mark.slow
def test_fsdp_reward_model_equals_one_process(tmp_path, small_pref_file):
    """2 FSDP2 ranks x batch 4 == 1 process x batch 8 for the reward model (value head kept
    whole in the root unit); the export loads as a sequence classifier."""
    from transformers import AutoModelForSequenceClassification

    common = [f"run.output_dir={tmp_path}", f"data.train=[{small_pref_file}]", "data.eval=[]", "logging.progress=false",
              "train.epochs=1", "train.lr=1e-4"]
    torchrun("rm", *common, "run.name=fsdp", "train.batch_size=4", "plugin.name=fsdp", "model.gradient_checkpointing=true")
    run_rm(load_config(RMConfig, packaged_config("rm_tiny.yaml"), [*common, "run.name=single", "train.batch_size=8"]))
    assert_weights_close(final_weights(tmp_path / "fsdp", "model"), final_weights(tmp_path / "single", "model"))
    assert_metrics_close(train_rows(tmp_path / "fsdp"), train_rows(tmp_path / "single"), ["train/loss", "train/acc", "train/grad_norm"])
    AutoModelForSequenceClassification.from_pretrained(tmp_path / "fsdp" / "checkpoints" / "final" / "model")


def ppo_args(tmp_path: Path, assets, name: str, per_process: int) -> list[str]:
    """Greedy rollouts, one minibatch per episode (the global batch: the same optimizer steps
    in one process and on 2 ranks), global whitening, adaptive KL and reward normalisation so
    every cross-rank statistic matters. lr 1e-4: Adam turns float noise into lr-sized steps."""
    return [
        f"run.output_dir={tmp_path}", f"run.name={name}", "logging.progress=false", f"model.actor={assets.model_dir}",
        "loop.episodes=3", "loop.update_steps=1", f"loop.rollout_batch_size={per_process}", f"loop.train_batch_size={per_process}", "loop.save_interval=1",
        "generation.max_new_tokens=4", "generation.do_sample=false", "actor_optim.lr=1e-4", "critic_optim.lr=1e-4",
        "experience.global_whitening=true", "experience.kl_target=0.01", "experience.kl_horizon=100", "reward.normalize=true",
        "data.eval_prompts=[builtin:prompts_eval]", "loop.eval_batch_size=16", "loop.accuracy_function=arithmetic_exact",
    ]


PPO_METRICS = ["train/policy_loss", "train/value_loss", "train/approx_kl", "rollout/reward_mean", "rollout/kl", "rollout/kl_coef"]


@pytest.mark.slow
@pytest.mark.parametrize("plugin", ["fsdp", "ddp"])
def test_ppo_under_torchrun_equals_one_process(tmp_path, assets, plugin):
    """PPO on 2 ranks x 4 prompts == 1 process x 8 prompts: actor and critic weights, train and
    rollout metrics, the KL coefficient and the held-out evaluation (ranks hold unequal numbers
    of eval prompts); then the 2-rank checkpoint resumes in one process."""
    torchrun("ppo", *ppo_args(tmp_path, assets, "dist", 4), f"plugin.name={plugin}", "model.gradient_checkpointing=true")
    single = run_ppo(load_config(PPOConfig, packaged_config("ppo_tiny.yaml"), ppo_args(tmp_path, assets, "single", 8)))
    want = final_weights(tmp_path / "single", "actor", "critic")
    assert_weights_close(final_weights(tmp_path / "dist", "actor", "critic"), want)
    assert_metrics_close(train_rows(tmp_path / "dist"), train_rows(tmp_path / "single"), PPO_METRICS)
    evals = [r for r in read_jsonl(tmp_path / "dist" / "metrics.jsonl") if r["split"] == "eval"]
    assert abs(evals[-1]["eval/reward"] - single["eval"]["eval/reward"]) < 1e-5
    state = json.loads((tmp_path / "dist" / "checkpoints" / "step_1" / "trainer_state.json").read_text())
    assert state["experience_maker"]["kl_ctl"]["value"] != 0.1  # the adaptive coefficient moved

    step1 = tmp_path / "dist" / "checkpoints" / "step_1"
    resumed = [*ppo_args(tmp_path, assets, "resumed", 8), f"run.resume={step1}", f"plugin.name={plugin}"]
    run_ppo(load_config(PPOConfig, packaged_config("ppo_tiny.yaml"), resumed))
    assert_weights_close(final_weights(tmp_path / "resumed", "actor", "critic"), want)
    assert_metrics_close(train_rows(tmp_path / "resumed"), train_rows(tmp_path / "single")[1:], PPO_METRICS)


def grpo_args(tmp_path: Path, assets, name: str, per_process: int) -> list[str]:
    """Greedy rollouts (every rank draws what one process draws), one optimizer step per episode;
    REINFORCE++ whitens over the global batch and token_mean divides by the tokens of every
    rank, so both cross-rank sums matter; the k3 KL term needs the reference; stop strings make
    response lengths differ between rows and ranks."""
    return [
        f"run.output_dir={tmp_path}", f"run.name={name}", "logging.progress=false", f"model.actor={assets.model_dir}",
        "loop.episodes=3", "loop.update_steps=1", f"loop.rollout_batch_size={per_process}", f"loop.train_batch_size={per_process * 2}",
        "loop.save_interval=1", "generation.max_new_tokens=4", "generation.do_sample=false", "generation.stop_strings=['1','2','3','a','e','o']",
        "actor_optim.lr=1e-4", "experience.num_generations=2", "experience.advantage=reinforce_pp", "experience.group_baseline=false",
        "experience.kl_coef=0.1", "loss.aggregation=token_mean", "reward.functions={tests.test_grpo:varied_reward: 1.0}",
        "data.eval_prompts=[builtin:prompts_eval]", "loop.eval_batch_size=16", "loop.accuracy_function=arithmetic_exact",
    ]


GRPO_METRICS = ["train/policy_loss", "train/kl_loss", "train/approx_kl", "train/entropy", "rollout/reward_mean", "rollout/response_length"]


@pytest.mark.slow
@pytest.mark.parametrize("plugin", ["fsdp", "ddp"])
def test_grpo_under_torchrun_equals_one_process(tmp_path, assets, plugin):
    """GRPO-family training on 2 ranks x 4 prompts == 1 process x 8 prompts (weights, metrics,
    held-out evaluation); the 2-rank checkpoint then resumes in one process."""
    from olingo.recipes.grpo import GRPOConfig, run_grpo

    torchrun("grpo", *grpo_args(tmp_path, assets, "dist", 4), f"plugin.name={plugin}")
    single = run_grpo(load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), grpo_args(tmp_path, assets, "single", 8)))
    want = final_weights(tmp_path / "single", "actor")
    assert_weights_close(final_weights(tmp_path / "dist", "actor"), want)
    assert_metrics_close(train_rows(tmp_path / "dist"), train_rows(tmp_path / "single"), GRPO_METRICS)
    assert train_rows(tmp_path / "single")[-1]["train/kl_loss"] > 0
    evals = [r for r in read_jsonl(tmp_path / "dist" / "metrics.jsonl") if r["split"] == "eval"]
    assert abs(evals[-1]["eval/reward"] - single["eval"]["eval/reward"]) < 1e-5
    assert not (tmp_path / "dist" / "checkpoints" / "final" / "critic").exists()

    step1 = tmp_path / "dist" / "checkpoints" / "step_1"
    resumed = [*grpo_args(tmp_path, assets, "resumed", 8), f"run.resume={step1}", f"plugin.name={plugin}"]
    run_grpo(load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), resumed))
    assert_weights_close(final_weights(tmp_path / "resumed", "actor"), want)
    assert_metrics_close(train_rows(tmp_path / "resumed"), train_rows(tmp_path / "single")[1:], GRPO_METRICS)
