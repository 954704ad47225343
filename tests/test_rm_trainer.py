"""RewardModelTrainer in process: accumulation invariance, hook order, callbacks that raise or
stop, a crash still closing the loop, checkpoints and their manifest."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from olingo.booster import Booster, SingleProcessPlugin
from olingo.config import load_config
from olingo.dataset import PreferenceCollator, build_preference_dataset
from olingo.models import RewardModel, load_tokenizer
from olingo.recipes.common import build_optimizer, build_scheduler, resolve_path
from olingo.recipes.rm import RMConfig, run_rm
from olingo.trainer.callbacks import Callback
from olingo.trainer.rm import RewardModelTrainer
from olingo.trainer.utils import seed_everything
from tests.conftest import read_jsonl

PACKAGED = Path(__file__).resolve().parents[1] / "olingo" / "configs" / "rm_tiny.yaml"


def rm_config(tmp: Path, data: Path, name: str, *overrides: str) -> RMConfig:
    base = [
        f"run.output_dir={tmp}", f"run.name={name}", f"data.train=[{data}]", "data.eval=[]",
        "logging.progress=false", "train.epochs=1",
    ]
    return load_config(RMConfig, PACKAGED, base + list(overrides))


def final_weights(run_dir: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(run_dir) / "checkpoints" / "final" / "model" / "model.safetensors"))


def test_accumulation_invariance(tmp_path, small_pref_file):
    """Batch 8 x accumulation 1 == batch 2 x accumulation 4 after 8 optimizer steps (1e-5).

    Summation order differs (one batch of 8 vs four of 2), so gradients differ by ~1e-7; Adam
    divides each gradient by its own running scale, which turns that noise on near-zero gradients
    into steps of up to ~lr. lr=1e-4 keeps that far below the 1e-5 tolerance.
    """
    lr = "train.lr=1e-4"
    a = run_rm(rm_config(tmp_path, small_pref_file, "b8", "train.batch_size=8", "train.accumulation_steps=1", lr))
    b = run_rm(rm_config(tmp_path, small_pref_file, "b2a4", "train.batch_size=2", "train.accumulation_steps=4", lr))
    assert a["steps"] == b["steps"] == 8
    wa, wb = final_weights(a["run_dir"]), final_weights(b["run_dir"])
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=1e-5, rtol=0, msg=key)
    rows_a = [r for r in read_jsonl(Path(a["run_dir"]) / "metrics.jsonl") if r["split"] == "train"]
    rows_b = [r for r in read_jsonl(Path(b["run_dir"]) / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b] == list(range(1, 9))
    for ra, rb in zip(rows_a, rows_b, strict=True):
        assert abs(ra["train/loss"] - rb["train/loss"]) < 1e-5 and ra["train/lr"] == rb["train/lr"]


class Recorder(Callback):
    """Records every loop hook as (name, step-ish argument)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_train_start(self, state):
        self.calls.append(("train_start", state.step))

    def on_step_end(self, state, step_idx, batch, metrics):
        self.calls.append(("step_end", step_idx))

    def on_checkpoint(self, state, row):
        self.calls.append(("checkpoint", row.name))

    def on_eval(self, state, step_idx, eval_name, metrics):
        self.calls.append(("eval", step_idx))

    def on_train_end(self, state, artifacts):
        self.calls.append(("train_end", artifacts.completed_steps, artifacts.error is not None))


def make_trainer(tmp_path, data_file, *, epochs=2, batch_size=16, accumulation=2, save_interval=2,
                 callbacks=(), loss_fn=None, eval_pairs=16):
    """ColossalChat's `RewardModelTrainer` usage, with olingo imports: 64 pairs, 2 optimizer steps per epoch."""
    seed_everything(0)
    model_dir = resolve_path("builtin:tiny-llama")
    tokenizer = load_tokenizer(model_dir)
    model = RewardModel.from_pretrained(model_dir, pad_token_id=tokenizer.pad_token_id)
    plugin = SingleProcessPlugin(max_norm=1.0)
    booster = Booster(plugin=plugin)
    train_set = build_preference_dataset(str(data_file), tokenizer, 64)
    eval_set = torch.utils.data.Subset(train_set, range(eval_pairs))
    collate = PreferenceCollator(tokenizer.pad_token_id)
    train_loader = plugin.prepare_dataloader(train_set, batch_size, seed=0, collate_fn=collate)
    eval_loader = plugin.prepare_dataloader(eval_set, 8, shuffle=False, collate_fn=collate, even=False)
    optimizer = build_optimizer(model, 1e-3, 0.0, (0.9, 0.95))
    scheduler = build_scheduler(optimizer, epochs * 2, 0.0, 0.1)
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    trainer = RewardModelTrainer(
        model=model, booster=booster, optimizer=optimizer, plugin=plugin, lr_scheduler=scheduler,
        tokenizer=tokenizer, loss_fn=loss_fn, max_epochs=epochs, accumulation_steps=accumulation,
        save_interval=save_interval, save_dir=str(tmp_path), callbacks=list(callbacks),
    )
    trainer.show_progress = False
    return trainer, train_loader, eval_loader


def test_hook_order_matches_the_documented_order(tmp_path, small_pref_file):
    recorder = Recorder()
    trainer, train_loader, eval_loader = make_trainer(tmp_path, small_pref_file, callbacks=[recorder])
    trainer.fit(train_loader, eval_loader, log_dir=str(tmp_path))
    assert recorder.calls == [
        ("train_start", 0),
        ("step_end", 1), ("step_end", 2), ("checkpoint", "step_2"), ("eval", 2),
        ("step_end", 3), ("step_end", 4), ("checkpoint", "step_4"), ("eval", 4),
        ("checkpoint", "final"),
        ("train_end", 4, False),
    ]
    manifest = read_jsonl(tmp_path / "checkpoints.jsonl")
    assert [row["name"] for row in manifest] == ["step_2", "step_4", "final"]
    assert all((tmp_path / row["path"] / "model" / "model.safetensors").exists() for row in manifest)
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    for epoch in (0, 1):
        record = json.loads((tmp_path / "eval" / f"epoch_{epoch}.json").read_text())
        assert record["metrics"]["eval/pairs"] == 16 and 0 <= record["metrics"]["eval/acc"] <= 1
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    keys = {"train/loss", "train/reward_chosen", "train/reward_rejected", "train/dist", "train/acc", "train/lr", "train/grad_norm"}
    assert all(keys <= set(r) for r in rows if r["split"] == "train")


class Raiser(Callback):
    def on_step_end(self, state, step_idx, batch, metrics):
        raise RuntimeError("this logger is broken")


def test_a_raising_callback_does_not_stop_training(tmp_path, small_pref_file, caplog):
    recorder = Recorder()
    trainer, train_loader, _ = make_trainer(tmp_path, small_pref_file, callbacks=[Raiser(), recorder])
    with caplog.at_level(logging.ERROR, logger="olingo.callbacks"):
        artifacts = trainer.fit(train_loader, None, log_dir=str(tmp_path))
    assert artifacts.completed_steps == 4 and artifacts.error is None
    assert [c for c in recorder.calls if c[0] == "step_end"] == [("step_end", s) for s in (1, 2, 3, 4)]
    assert sum("this logger is broken" in r.exc_text for r in caplog.records if r.exc_text) == 4


class StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, state, step_idx, batch, metrics):
        if step_idx == self.step:
            state.request_stop()


def test_request_stop_ends_after_the_step_with_a_final_checkpoint(tmp_path, small_pref_file):
    recorder = Recorder()
    trainer, train_loader, eval_loader = make_trainer(tmp_path, small_pref_file, callbacks=[StopAt(3), recorder])
    artifacts = trainer.fit(train_loader, eval_loader, log_dir=str(tmp_path))
    assert artifacts.stopped_early and artifacts.completed_steps == 3
    assert recorder.calls[-3:] == [("step_end", 3), ("checkpoint", "final"), ("train_end", 3, False)]
    final = read_jsonl(tmp_path / "checkpoints.jsonl")[-1]
    assert final["name"] == "final" and final["step"] == 3


def test_on_train_end_fires_when_training_raises(tmp_path, small_pref_file):
    calls = {"n": 0}

    def exploding_loss(chosen, rejected):
        calls["n"] += 1
        if calls["n"] == 3:
            raise FloatingPointError("boom")
        return -torch.nn.functional.logsigmoid(chosen - rejected).mean()

    recorder = Recorder()
    trainer, train_loader, _ = make_trainer(tmp_path, small_pref_file, callbacks=[recorder], loss_fn=exploding_loss)
    with pytest.raises(FloatingPointError):
        trainer.fit(train_loader, None, log_dir=str(tmp_path))
    assert recorder.calls[-1] == ("train_end", 1, True)


def test_default_loss_is_logsig_with_beta(tmp_path, small_pref_file):
    trainer, _, _ = make_trainer(tmp_path, small_pref_file)
    assert type(trainer.loss_fn).__name__ == "LogSigLoss" and trainer.loss_fn.beta == 0.1


def test_training_changes_every_parameter_and_artifacts_load_back(tmp_path, small_pref_file):
    from transformers import AutoModelForSequenceClassification

    result = run_rm(rm_config(tmp_path, small_pref_file, "smoke", "train.batch_size=8", "train.lr=1e-2"))
    trained = final_weights(result["run_dir"])
    base = load_file(str(Path(resolve_path("builtin:tiny-llama")) / "model.safetensors"))
    unchanged = [k for k in base if k.startswith("model.") and torch.equal(base[k], trained[k])]
    assert not unchanged, f"parameters that did not train: {unchanged}"
    final_dir = Path(result["final_model"])
    assert RewardModel.from_pretrained(str(final_dir)) is not None
    assert AutoModelForSequenceClassification.from_pretrained(str(final_dir)).config.num_labels == 1
    assert load_tokenizer(str(final_dir)).pad_token_id is not None
    run_dir = Path(result["run_dir"])
    assert (run_dir / "config.yaml").exists() and list((run_dir / "tb").glob("events.out.tfevents.*"))
