"""`olingo dpo|orpo|kto` from the command line: bad input fails before training with file, row and
field; SIGKILL and resume equals the uninterrupted run; 2 gloo ranks (DDP, FSDP2) equal one
process; an SFT -> DPO experiment chain starts DPO (policy and reference) from the SFT weights."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from olingo.cli.main import main
from olingo.config import load_config
from olingo.experiment import Experiment, ExperimentConfig
from olingo.models import load_causal_lm
from olingo.trainer.callbacks import Callback
from tests.conftest import kill_when_logged, olingo_cmd, read_jsonl
from tests.test_fsdp import torchrun


def args(kind: str, out: Path, data: Path, name: str, *extra: str) -> list[str]:
    return [
        kind, f"run.output_dir={out}", f"run.name={name}", f"data.train=[{data}]", "data.eval=[]",
        "logging.progress=false", "train.batch_size=4", *extra,
    ]


@pytest.mark.parametrize("kind, rows, message", [
    ("dpo", [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}, {"prompt": "1+2=", "rejected": "4"}],
     "row 2, field 'chosen': missing (present keys: prompt, rejected)"),
    ("kto", [{"prompt": "1+1=", "completion": "2", "label": True}, {"prompt": "1+2=", "completion": "4"}],
     "row 2, field 'label': missing (present keys: completion, prompt)"),
    ("kto", [{"prompt": "1+1=", "completion": "2", "label": "yes"}],
     "row 1, field 'label': expected true or false (a JSON boolean), got string 'yes'"),
    ("orpo", [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}, {"prompt": "1+2=", "chosen": "  ", "rejected": "4"}],
     "row 2, field 'chosen': empty response (blank or whitespace only)"),
])
def test_bad_rows_fail_before_training_with_file_row_and_field(kind, rows, message, tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(args(kind, tmp_path / "out", data, "bad")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"olingo: {data}, {message}"]
    assert not (tmp_path / "out").exists()  # nothing was created


@pytest.mark.slow
def test_dpo_kill_and_resume_equals_an_uninterrupted_run(tmp_path, small_pref_file):
    """Killed at a random step after the reference pass; the resumed run reads the cached
    reference log-probs and ends with the same weights and metrics."""
    def cmd(name: str, *extra: str) -> list[str]:
        return olingo_cmd(*args("dpo", tmp_path, small_pref_file, name, "train.save_interval=1", "train.lr=1e-3", "dpo.precompute_ref_log_probs=true",
                                "train.epochs=2", *extra))

    env = {**os.environ, "PYTHONPATH": str(os.getcwd())}
    subprocess.run(cmd("straight"), check=True, capture_output=True, timeout=300, env=env)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert len(read_jsonl(straight / "metrics.jsonl")) == 32
    kill_at = random.Random(os.getpid()).randint(3, 28)
    kill_when_logged(cmd("killed"), killed / "metrics.jsonl", kill_at, env, timeout=240)
    resumed = subprocess.run(cmd("killed", "run.resume=last"), check=True, capture_output=True, text=True, timeout=300, env=env)
    assert "computed (0 distinct)" in resumed.stderr
    a = load_file(straight / "checkpoints/final/model/model.safetensors")
    b = load_file(killed / "checkpoints/final/model/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    def no_time(rows):
        return [{k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in rows]

    assert no_time(read_jsonl(killed / "metrics.jsonl")) == no_time(read_jsonl(straight / "metrics.jsonl"))


def final(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / "final" / "model" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("kind, plugin", [("dpo", "ddp"), ("kto", "fsdp")])
def test_two_ranks_equal_one_process(kind, plugin, tmp_path, small_pref_file, assets):
    """2 gloo ranks x batch 4 == 1 process x batch 8: weights, train metrics (reduced across
    ranks) and eval metrics; the precomputed reference is split over the ranks."""
    common = [
        f"run.output_dir={tmp_path}", f"data.train=[{small_pref_file}]", "data.eval=[builtin:preference_eval]",
        "logging.progress=false", "train.lr=1e-3", f"{kind}.precompute_ref_log_probs=true", "train.eval_batch_size=64",
    ]
    torchrun(kind, *common, "run.name=ranks", "train.batch_size=4", f"plugin.name={plugin}")
    assert main([kind, *common, "run.name=single", "train.batch_size=8"]) == 0
    a, b = final(tmp_path / "ranks"), final(tmp_path / "single")
    for key in b:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=0, msg=key)
    rows = {name: read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("ranks", "single")}
    assert len(rows["ranks"]) == len(rows["single"])
    for ra, rb in zip(rows["ranks"], rows["single"], strict=True):
        for key, value in rb.items():
            if key.startswith(("train/", "eval/")) and key != "train/grad_norm":
                assert ra[key] == pytest.approx(value, abs=1e-4), key


class WeightsAtStart(Callback):
    def __init__(self) -> None:
        self.weights: dict[str, dict[str, torch.Tensor]] = {}

    def on_train_start(self, state):
        self.weights[state.ctx.run_name] = {k: v.detach().clone() for k, v in state.policy.state_dict().items()}


@pytest.mark.slow
def test_sft_then_dpo_chain_starts_from_the_sft_weights(assets, tmp_path):
    train = tmp_path / "sft16.jsonl"
    train.write_text("\n".join(assets.sft_train.read_text().splitlines()[:16]) + "\n")
    pairs = tmp_path / "pairs16.jsonl"
    pairs.write_text("\n".join(assets.preference_train.read_text().splitlines()[:16]) + "\n")
    sft = (f"{{stage: sft, config: 'packaged:sft_tiny.yaml', logging: {{progress: false}}, data: {{train: ['{train}'], eval: []}}, "
           "train: {epochs: 1, batch_size: 8}}")
    dpo = (f"{{name: pref, stage: dpo, config: 'packaged:dpo_tiny.yaml', overrides: {{logging.progress: false, data.train: ['{pairs}'], "
           "data.eval: [], train.batch_size: 8, train.epochs: 1}}")
    weights = WeightsAtStart()
    exp = Experiment(load_config(ExperimentConfig, None, ["name=chain", f"output_dir={tmp_path}", f"run={sft}", f"continual=[{dpo}]"]), callbacks=[weights])
    result = exp.run()
    assert [(a.name, a.stage_label, a.status, a.steps) for a in result.arms] == [("chain", "sft", "completed", 2), ("chain__pref", "dpo:pref", "completed", 2)]
    sft_final = Path(result.arms[0].run_dir) / "checkpoints" / "final" / "model"
    assert result.arms[1].run_config["model"]["path"] == str(sft_final) and result.arms[1].run_config["model"]["reference"] is None
    saved = load_causal_lm(str(sft_final)).state_dict()
    assert all(torch.equal(weights.weights["chain__pref"][k], saved[k]) for k in saved)


@pytest.mark.slow
def test_shortened_dpo_demo_prints_its_table(tmp_path, capsys):
    from olingo.cli.demo import run_dpo_demo

    result = run_dpo_demo(str(tmp_path), sft_overrides=["train.epochs=20", "logging.progress=false"],
                          dpo_overrides=["train.epochs=1", "logging.progress=false"])
    table = capsys.readouterr().out
    assert "olingo demo --pipeline dpo" in table and "pairs with implicit reward chosen > rejected" in table
    # The SFT model against itself, through the same call: a tolerance, not == 0, in case the
    # policy's log-probs ever come from the sampling engine instead of a second identical forward.
    assert result.run_dirs["dpo"].endswith("demo-dpo") and len(result.sampled) == 2 and abs(result.sampled[0]["kl"]) < 1e-6
    assert result.implicit_accuracy > 0.5 and all(0 <= a <= 1 for a in (*result.greedy, *result.pair_accuracy))
    assert (tmp_path / "demo-dpo" / "plots" / "loss.png").exists()
