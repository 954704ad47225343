"""DPOTrainer, ORPOTrainer, KTOTrainer in process: the loss record, invariance to accumulation,
precomputed against live reference, LoRA's adapters-disabled reference, hooks and checkpoints,
and one test per ColossalChat defect of docs/coming-from-colossalchat.md."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from olingo.config import ConfigError, load_config
from olingo.models import load_causal_lm
from olingo.models.lora import adapters_disabled, apply_lora
from olingo.recipes.common import packaged_config
from olingo.recipes.dpo import DPOConfig, KTOConfig, ORPOConfig, run_dpo, run_kto, run_orpo
from olingo.rl.logprobs import sequence_log_probs
from olingo.rl.preference import DPOLoss, SequenceLogps
from olingo.trainer.callbacks import Callback
from olingo.trainer.reference_cache import ReferencePrecompute, item_key
from tests.conftest import read_jsonl

RECIPES = {"dpo": (DPOConfig, run_dpo), "orpo": (ORPOConfig, run_orpo), "kto": (KTOConfig, run_kto)}


def run(kind: str, tmp: Path, data: Path, name: str, *overrides: str, callbacks=()) -> dict:
    config, fn = RECIPES[kind]
    base = [
        f"run.output_dir={tmp}", f"run.name={name}", f"data.train=[{data}]", "data.eval=[]", "logging.progress=false",
        "train.epochs=1", "train.lr=1e-4", "train.warmup_ratio=0",
    ]
    if kind != "orpo":
        base.append(f"{kind}.precompute_ref_log_probs=false")
    return fn(load_config(config, packaged_config(f"{kind}_tiny.yaml"), [*base, *overrides]), callbacks=callbacks)


@pytest.fixture(scope="module")
def pairs32(small_pref_file, tmp_path_factory) -> Path:
    """32 pairs: KTO splits them into 64 rows."""
    path = tmp_path_factory.mktemp("pairs") / "pairs32.jsonl"
    path.write_text("\n".join(small_pref_file.read_text().splitlines()[:32]) + "\n")
    return path


def final_weights(run_dir: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(run_dir) / "checkpoints" / "final" / "model" / "model.safetensors"))


def assert_same_weights(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=0, msg=key)


def train_rows(run_dir: str | Path) -> list[dict]:
    return [r for r in read_jsonl(Path(run_dir) / "metrics.jsonl") if r["split"] == "train"]


def logps(sums: list[float], counts: list[float]) -> SequenceLogps:
    return SequenceLogps(torch.tensor(sums), torch.tensor(counts))


# ---- the maths -------------------------------------------------------------------------------
def test_sequence_log_probs_counts_the_masked_next_tokens():
    """Token t is scored by the logits at t-1; only masked tokens from position 1 count."""
    logits = torch.zeros(1, 4, 3)
    logits[0, 0, 2] = math.log(2.0)  # p(token 2 at position 1) = 2/4
    logits[0, 2, 1] = math.log(3.0)  # p(token 1 at position 3) = 3/5
    ids = torch.tensor([[0, 2, 0, 1]])
    mask = torch.tensor([[1, 1, 0, 1]])  # position 0 has no predecessor, position 2 is masked out
    sums, counts = sequence_log_probs(logits, ids, mask)
    assert counts.tolist() == [2.0]
    assert sums.item() == pytest.approx(math.log(0.5) + math.log(0.6), abs=1e-6)


def test_dpo_loss_record_by_hand():
    """Summed log-probs for sigmoid, token means for IPO and SimPO and with length_normalization."""
    pc, pr = logps([-4.0], [2.0]), logps([-9.0], [3.0])
    rc, rr = logps([-5.0], [2.0]), logps([-8.0], [3.0])
    loss, cr, rj = DPOLoss("sigmoid", beta=0.5)(pc, pr, rc, rr)
    h = (-4 + 5) - (-9 + 8)  # 2
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-0.5 * h))), abs=1e-6)
    assert (cr.item(), rj.item()) == pytest.approx((0.5, -0.5))
    loss, *_ = DPOLoss("sigmoid", beta=0.5, gamma=0.3, length_normalization=True)(pc, pr, rc, rr)
    h_mean = (-2 + 2.5) - (-3 + 8 / 3)
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-(0.5 * h_mean - 0.3)))), abs=1e-6)
    loss, *_ = DPOLoss("ipo", beta=0.25)(pc, pr, rc, rr)
    assert loss.item() == pytest.approx((h_mean - 2.0) ** 2, abs=1e-6)
    loss, cr, rj = DPOLoss("simpo", beta=2.0, gamma=0.5)(pc, pr, None, None)
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-(2 * (-2 + 3) - 0.5)))), abs=1e-6)
    assert (cr.item(), rj.item()) == pytest.approx((-4.0, -6.0))
    e = 0.1
    loss, *_ = DPOLoss("cdpo", beta=0.5, label_smoothing=e)(pc, pr, rc, rr)
    sig = 1 / (1 + math.exp(-1.0))
    assert loss.item() == pytest.approx(-(1 - e) * math.log(sig) - e * math.log(1 - sig), abs=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    ({"loss_type": "cdpo"}, "label_smoothing in"), ({"label_smoothing": 0.1}, "set loss_type=cdpo"),
    ({"loss_type": "ipo", "gamma": 1.0}, "no margin"), ({"beta": 0.0}, "beta must be"), ({"loss_type": "kto"}, "unknown DPO loss_type"),
])
def test_dpo_loss_rejects_inconsistent_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DPOLoss(**kwargs)


def test_reference_free_loss_refuses_a_reference(tmp_path, small_pref_file):
    with pytest.raises(ConfigError, match="uses no reference"):
        run("dpo", tmp_path, small_pref_file, "x", "dpo.loss_type=simpo", "model.reference=builtin:tiny-llama")


# ---- the step ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["dpo", "orpo", "kto"])
def test_batch_8_equals_batch_2_times_accumulation_4(kind, tmp_path, pairs32):
    """The loss is the mean over the step's rows whatever the micro-batching (ColossalChat did not
    divide by the accumulation steps); KTO's reference point is the step's, not a micro-batch's."""
    a = run(kind, tmp_path, pairs32, "b8", "train.batch_size=8", "train.accumulation_steps=1")
    b = run(kind, tmp_path, pairs32, "b2a4", "train.batch_size=2", "train.accumulation_steps=4")
    assert a["steps"] == b["steps"] == (8 if kind == "kto" else 4)
    assert_same_weights(final_weights(a["run_dir"]), final_weights(b["run_dir"]))
    rows_a, rows_b = train_rows(a["run_dir"]), train_rows(b["run_dir"])
    for ra, rb in zip(rows_a, rows_b, strict=True):
        assert ra.keys() == rb.keys()
        for key in ra:
            if key.startswith("train/") and key != "train/grad_norm":
                assert ra[key] == pytest.approx(rb[key], abs=2e-5), key


@pytest.mark.parametrize("kind", ["dpo", "kto"])
def test_precomputed_reference_trains_like_the_live_one_and_is_reused(kind, tmp_path, pairs32, caplog):
    live = run(kind, tmp_path, pairs32, "live", "train.batch_size=8")
    pre = run(kind, tmp_path, pairs32, "pre", "train.batch_size=8", f"{kind}.precompute_ref_log_probs=true")
    assert_same_weights(final_weights(live["run_dir"]), final_weights(pre["run_dir"]))
    for rl, rp in zip(train_rows(live["run_dir"]), train_rows(pre["run_dir"]), strict=True):
        assert rl["train/loss"] == pytest.approx(rp["train/loss"], abs=1e-5)
    assert len(list((Path(pre["run_dir"]) / "cache").glob("reference_logps-*.pt"))) == 1
    caplog.set_level("INFO", logger="olingo.trainer")
    run(kind, tmp_path, pairs32, "pre", "train.batch_size=8", f"{kind}.precompute_ref_log_probs=true", "run.resume=last", "train.epochs=2")
    rows = 64 if kind == "kto" else 32
    assert f"reference log-probs of {rows} rows: {rows} read from" in caplog.text and "0 computed" in caplog.text


def test_reference_cache_computes_only_new_rows_and_is_per_reference(tmp_path):
    calls: list[int] = []

    def columns(batch):
        calls.append(batch["x"].shape[0])
        return torch.stack([batch["x"].sum(-1).float(), -batch["x"].sum(-1).float()], dim=1)

    def collate(items):
        return {"x": torch.tensor([item["x"] for item in items])}

    def precompute(name: str) -> ReferencePrecompute:
        return ReferencePrecompute(columns, ("ref_a", "ref_b"), 2, torch.device("cpu"), 0, 1, lambda t: t, lambda: None, tmp_path / name, progress=False)

    data = [{"x": [i, i + 1]} for i in range(5)]
    table = precompute("ref1.pt").table(data, collate)
    assert sum(calls) == 5 and table[item_key(data[3])] == (7.0, -7.0)
    calls.clear()
    changed = [*data[:4], {"x": [9, 9]}]
    table = precompute("ref1.pt").table(changed, collate)
    assert sum(calls) == 1 and table[item_key(changed[4])] == (18.0, -18.0)
    calls.clear()
    precompute("ref2.pt").table(data, collate)  # another reference: another file, all computed
    assert sum(calls) == 5


def test_lora_reference_is_the_base_with_adapters_disabled(assets):
    base = load_causal_lm(str(assets.model_dir)).eval()
    lora = apply_lora(load_causal_lm(str(assets.model_dir)), r=4, alpha=8).eval()
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ids = torch.randint(3, 20, (2, 12))
    with torch.no_grad():
        want = base(input_ids=ids).logits
        assert not torch.allclose(lora(input_ids=ids).logits, want, atol=1e-4)
        flags = {n: p.requires_grad for n, p in lora.named_parameters()}
        with adapters_disabled(lora):
            torch.testing.assert_close(lora(input_ids=ids).logits, want)
        assert flags == {n: p.requires_grad for n, p in lora.named_parameters()}
        assert not torch.allclose(lora(input_ids=ids).logits, want, atol=1e-4)


def test_lora_dpo_loads_one_model_and_trains_only_adapters(tmp_path, small_pref_file, monkeypatch, assets):
    import olingo.recipes.dpo as recipe

    loads: list[str] = []
    real = recipe.load_causal_lm
    monkeypatch.setattr(recipe, "load_causal_lm", lambda path, **kw: loads.append(path) or real(path, **kw))
    out = run("dpo", tmp_path, small_pref_file, "lora", "model.lora.r=4", "train.batch_size=16", "dpo.precompute_ref_log_probs=true", "train.lr=1e-2")
    assert len(loads) == 1  # the reference is the policy's own base: no second copy
    trained, base = final_weights(out["run_dir"]), load_file(str(assets.model_dir / "model.safetensors"))
    assert any(not torch.equal(trained[k], base[k]) for k in base)  # the merged export carries the adapters
    assert (Path(out["run_dir"]) / "checkpoints" / "final" / "model" / "lora" / "trainable.safetensors").is_file()


# ---- hooks, checkpoints, ColossalChat's defects (docs/coming-from-colossalchat.md) --------------
class Recorder(Callback):
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.anomaly: list[bool] = []
        self.metrics: list[dict] = []

    def on_step_end(self, state, step_idx, batch, metrics):
        self.calls.append(("step_end", step_idx))
        self.anomaly.append(torch.is_anomaly_enabled())
        self.metrics.append(dict(metrics))

    def on_checkpoint(self, state, row):
        self.calls.append(("checkpoint", row.name))

    def on_eval(self, state, step_idx, eval_name, metrics):
        self.calls.append(("eval", step_idx))
        self.metrics.append(dict(metrics))


@pytest.mark.parametrize("interval, want", [(3, ["step_3", "step_6", "final"]), (0, ["final"])])
def test_checkpoints_every_save_interval_steps_and_none_between_with_0(interval, want, tmp_path, pairs32):
    """ColossalChat saved at (step + 1) % interval (off by one) and divided by zero at 0."""
    rec = Recorder()
    run("orpo", tmp_path, pairs32, "ck", "train.batch_size=4", f"train.save_interval={interval}", callbacks=[rec])
    assert [name for kind, name in rec.calls if kind == "checkpoint"] == want
    assert [s for kind, s in rec.calls if kind == "step_end"] == list(range(1, 9))


@pytest.mark.parametrize("kind", ["orpo", "kto"])
def test_optimizer_steps_after_every_accumulation_steps_micro_batches(kind, tmp_path, pairs32, monkeypatch):
    """ColossalChat's ORPO and KTO stepped the optimizer at the wrong micro-batches."""
    import importlib

    module = importlib.import_module(f"olingo.trainer.{kind}")
    forwards = [0]
    seen: list[int] = []
    real_forward, real_step = module.response_logps, torch.optim.AdamW.step

    def counting_forward(*args, **kwargs):
        forwards[0] += torch.is_grad_enabled()  # the micro-batch forwards that backpropagate
        return real_forward(*args, **kwargs)

    def recording_step(self, *args, **kwargs):
        seen.append(forwards[0])
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(module, "response_logps", counting_forward)
    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    run(kind, tmp_path, pairs32, "acc", "train.batch_size=4", "train.accumulation_steps=2")
    assert seen == list(range(2, forwards[0] + 1, 2)) and len(seen) == (8 if kind == "kto" else 4)


def test_orpo_never_turns_on_anomaly_detection_and_its_nll_covers_only_the_response(tmp_path, assets):
    """The first step's nll_loss, over all 8 pairs, equals the mean over rows of minus the
    token-mean log-prob of the chosen response (prompt tokens excluded) under the start model."""
    from olingo.dataset.chat_tokens import encode_chat
    from olingo.models import load_tokenizer

    rows = [json.loads(line) for line in assets.preference_train.read_text().splitlines()[:8]]
    data = tmp_path / "pairs8.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rec = Recorder()
    run("orpo", tmp_path, data, "nll", "train.batch_size=8", callbacks=[rec])
    assert rec.anomaly == [False] and not torch.is_anomaly_enabled()
    tokenizer, model = load_tokenizer(str(assets.model_dir)), load_causal_lm(str(assets.model_dir)).eval()
    nlls = []
    for r in rows:
        prompt = [{"role": "user", "content": r["prompt"]}]
        start = len(encode_chat(tokenizer, prompt, add_generation_prompt=True))
        ids = torch.tensor([encode_chat(tokenizer, [*prompt, {"role": "assistant", "content": r["chosen"]}])])
        with torch.no_grad():
            token_logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
        nlls.append(-token_logps[start - 1 :].mean().item())
    assert rec.metrics[0]["train/nll_loss"] == pytest.approx(sum(nlls) / len(nlls), abs=1e-5)


def test_kto_evaluates_on_the_eval_set_and_never_gives_nan(tmp_path, assets):
    """ColossalChat's KTO evaluated on the training data and averaged empty subsets to NaN.
    Here the eval set is desirable rows only: eval has rewards/chosen and no rewards/rejected;
    with batch size 1 every training step lacks one of the two subsets, and nothing is NaN."""
    pairs = [json.loads(line) for line in assets.preference_train.read_text().splitlines()[:8]]
    train, good = tmp_path / "train.jsonl", tmp_path / "good.jsonl"
    train.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    good.write_text("".join(json.dumps({"prompt": p["prompt"], "completion": p["chosen"], "label": True}) + "\n" for p in pairs))
    rec = Recorder()
    run("kto", tmp_path, train, "eval", "train.batch_size=1", f"data.eval=[{good}]", "train.eval_interval=8", callbacks=[rec])
    evals = [m for m in rec.metrics if any(k.startswith("eval/") for k in m)]
    assert evals and all("eval/rewards/chosen" in m and "eval/rewards/rejected" not in m for m in evals)
    steps = [m for m in rec.metrics if "train/loss" in m]
    assert len(steps) == 16 and {("train/rewards/chosen" in m) for m in steps} == {True, False}
    assert all(math.isfinite(v) for m in rec.metrics for v in m.values() if isinstance(v, float))


def test_response_logps_scores_only_the_response_and_matches_the_full_forward(assets):
    """With logits only from the first response position on, the sums equal those of the full
    forward's log-softmax; rows whose responses start at different positions included."""
    from olingo.trainer.preference import first_scored_position, response_logps

    model = load_causal_lm(str(assets.model_dir)).eval()
    ids = torch.randint(3, 20, (3, 10))
    attention = torch.ones_like(ids)
    attention[2, 8:] = 0  # right padding
    mask = torch.zeros_like(ids)
    mask[0, 5:], mask[1, 7:], mask[2, 6:8] = 1, 1, 1
    assert first_scored_position(mask) == 4
    got = response_logps(model, ids, attention, mask)
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits[:, :-1].float(), -1)
    token = full.gather(-1, ids[:, 1:, None])[..., 0]
    want = (token * mask[:, 1:]).sum(-1)
    torch.testing.assert_close(got.sums.detach(), want, atol=1e-5, rtol=0)
    assert got.counts.tolist() == [5.0, 3.0, 2.0]


def test_implicit_reward_metrics_by_hand():
    from olingo.trainer.dpo import preference_stats

    chosen, rejected = logps([-1.0, -2.0, -3.0], [1.0, 1.0, 1.0]), logps([-4.0, -1.0, -5.0], [1.0, 1.0, 1.0])
    stats = preference_stats(chosen, rejected, torch.tensor([0.3, -0.1, 0.0]), torch.tensor([0.1, 0.2, 0.0]))
    assert stats["rewards/accuracies"][0].tolist() == [1.0, 0.0, 0.0]  # a tie is not a win
    assert stats["rewards/margins"][0].tolist() == pytest.approx([0.2, -0.3, 0.0])
    assert stats["logps/chosen"][0].tolist() == [-1.0, -2.0, -3.0]


def test_dpo_trainer_needs_a_reference_for_reference_losses(assets):
    """ref_model=None: SimPO by default (ColossalChat's rule); an explicit reference loss without a
    reference (and without LoRA, whose base would serve) is an error, and so is a reference
    passed to the reference-free SimPO."""
    from olingo.booster import Booster, SingleProcessPlugin
    from olingo.trainer.dpo import DPOTrainer

    booster = Booster(plugin=SingleProcessPlugin(max_norm=1.0))
    actor = load_causal_lm(str(assets.model_dir))
    model, optim, *_ = booster.boost(actor, torch.optim.AdamW(actor.parameters()))
    args = dict(actor=model, booster=booster, actor_optim=optim, plugin=booster.plugin, actor_lr_scheduler=None, tokenizer=None)
    assert DPOTrainer(ref_model=None, **args).loss.loss_type == "simpo"
    with pytest.raises(ValueError, match="needs a reference"):
        DPOTrainer(ref_model=None, loss_type="sigmoid", **args)
    with pytest.raises(ValueError, match="reference-free"):
        DPOTrainer(ref_model=load_causal_lm(str(assets.model_dir)), loss_type="simpo", **args)
