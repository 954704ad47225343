"""Padding-free (packed) SFT and reward-model training: the same training as padded, an exact
mid-epoch resume, and the `perf/` metrics every supervised trainer logs.

Packed and padded runs compute the same per-row quantities with differently shaped matmuls, so
they agree up to float rounding (~1e-7 per step). Adam divides each gradient by its own running
scale, which can turn that noise on near-zero gradients into steps of up to ~lr; lr=1e-4 keeps the
weights of a 3-step run far inside the 1e-5 tolerance (as in tests/test_sft.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from olingo.config import load_config
from olingo.recipes.rm import RMConfig, run_rm
from olingo.recipes.sft import SFTConfig, run_sft
from olingo.rl.logprobs import head_token_stats as HEAD_TOKEN_STATS
from olingo.trainer.supervised import step_perf_metrics
from tests.conftest import read_jsonl

CONFIGS = Path(__file__).resolve().parents[1] / "olingo" / "configs"
COMMON = ["logging.progress=false", "train.epochs=1", "train.batch_size=3", "train.accumulation_steps=2", "train.lr=1e-4"]


def uneven_rows(source: Path, tmp: Path, name: str, pad: dict[str, str]) -> Path:
    """The first 18 rows (3 optimizer steps of 2 micro-batches of 3), each `pad` field lengthened
    by its word 0..9 times, so the rows of every micro-batch differ by up to ~30 tokens."""
    rows = [json.loads(line) for line in source.read_text().splitlines()[:18]]
    for i, row in enumerate(rows):
        for field, word in pad.items():
            row[field] += word * ((i * 7 + len(field)) % 10)
    path = tmp / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def final_weights(run: dict) -> dict[str, torch.Tensor]:
    return load_file(str(Path(run["final_model"]) / "model.safetensors"))


def train_rows(run: dict) -> list[dict]:
    return [r for r in read_jsonl(Path(run["run_dir"]) / "metrics.jsonl") if r["split"] == "train"]


def assert_same_training(a: dict, b: dict, stats: tuple[str, ...]) -> None:
    """Every weight within 1e-5, every step's `stats` within 1e-5 (see the module docstring)."""
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=1e-5, rtol=0, msg=key)
    rows_a, rows_b = train_rows(a), train_rows(b)
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b] == [1, 2, 3]
    for ra, rb in zip(rows_a, rows_b, strict=True):
        assert all(abs(ra[name] - rb[name]) < 1e-5 for name in stats), (ra, rb)


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory, assets) -> dict[str, dict]:
    """SFT packed (checkpointing every 2 steps, for the resume test) and padded, on uneven rows."""
    tmp = tmp_path_factory.mktemp("packing_sft")
    data = uneven_rows(assets.sft_train, tmp, "sft18.jsonl", {"completion": " ok"})
    def cfg(name: str, *extra: str) -> SFTConfig:
        args = [f"run.output_dir={tmp}", f"run.name={name}", f"data.train=[{data}]", f"data.eval=[{data}]", *COMMON, *extra]
        return load_config(SFTConfig, CONFIGS / "sft_tiny.yaml", args)

    packed = run_sft(cfg("packed", "model.packing=true", "train.save_interval=2"))
    padded = run_sft(cfg("padded", "model.packing=false"))
    resumed = run_sft(cfg("resumed", "model.packing=true", f"run.resume={Path(packed['run_dir']) / 'checkpoints' / 'step_2'}"))
    return {"packed": packed, "padded": padded, "resumed": resumed}


def test_sft_packed_trains_as_padded(sft_runs):
    assert_same_training(sft_runs["packed"], sft_runs["padded"], ("train/loss",))
    assert abs(sft_runs["packed"]["eval"]["eval/loss"] - sft_runs["padded"]["eval"]["eval/loss"]) < 1e-5


def test_sft_packed_resumes_mid_epoch_exactly(sft_runs):
    """Step 2 of 3 is mid-epoch; the resumed run repeats the same packed computation bit for bit."""
    straight, resumed = final_weights(sft_runs["packed"]), final_weights(sft_runs["resumed"])
    assert all(torch.equal(straight[key], resumed[key]) for key in straight)
    assert [r["train/loss"] for r in train_rows(sft_runs["resumed"])] == [r["train/loss"] for r in train_rows(sft_runs["packed"])][2:]


def test_perf_metrics_show_packing_computes_less_padding(sft_runs):
    packed, padded = train_rows(sft_runs["packed"]), train_rows(sft_runs["padded"])
    assert all(r["perf/tokens_per_s"] > 0 for r in packed + padded)
    # A micro-batch whose short rows do not fit beside its longest row packs no better than padded.
    fractions = [(p["perf/padding_fraction"], q["perf/padding_fraction"]) for p, q in zip(packed, padded, strict=True)]
    assert all(0 <= p <= q for p, q in fractions) and sum(p for p, _ in fractions) < sum(q for _, q in fractions)


def test_step_perf_metrics_counts_a_pair_as_one_forward():
    """Rows of 3 and 1 tokens (chosen) and 2 and 2 (rejected), width 3: padded 12 positions for 8
    tokens; packed as one forward of 4 rows, [3], [2, 1] and [2] fill 3 rows of 3 (9 positions)."""
    mask = lambda *rows: torch.tensor([[1] * n + [0] * (3 - n) for n in rows])  # noqa: E731
    batch = {"chosen_attention_mask": mask(3, 1), "rejected_attention_mask": mask(2, 2), "chosen_input_ids": mask(3, 1)}
    assert step_perf_metrics([batch], False, 2.0) == {"perf/tokens_per_s": 4.0, "perf/padding_fraction": 1 - 8 / 12}
    assert step_perf_metrics([batch], True, 2.0)["perf/padding_fraction"] == pytest.approx(1 - 8 / 9)


def test_rm_packed_trains_as_padded(tmp_path, assets):
    data = uneven_rows(assets.preference_train, tmp_path, "pref18.jsonl", {"chosen": " ok", "rejected": " no"})
    def cfg(name: str, packing: bool) -> RMConfig:
        args = [f"run.output_dir={tmp_path}", f"run.name={name}", f"data.train=[{data}]", "data.eval=[]", f"model.packing={packing}", *COMMON]
        return load_config(RMConfig, CONFIGS / "rm_tiny.yaml", args)

    packed, padded = run_rm(cfg("packed", True)), run_rm(cfg("padded", False))
    assert_same_training(packed, padded, ("train/loss", "train/reward_chosen", "train/reward_rejected"))
    assert train_rows(packed)[0]["perf/padding_fraction"] < train_rows(padded)[0]["perf/padding_fraction"]


def test_sft_with_chunked_logits_trains_as_with_whole_logits(tmp_path, assets, monkeypatch):
    """`CHUNK_ELEMENTS` lowered so that every micro-batch's logits go through the head in chunks
    (docs/packing.md, "Logits that never exist whole"): the same 3 optimizer steps as whole logits,
    weights and losses within 1e-5 (float rounding, as packed vs padded above)."""
    from olingo.experience_maker import scoring

    data = uneven_rows(assets.sft_train, tmp_path, "sft18.jsonl", {"completion": " ok"})
    def cfg(name: str) -> SFTConfig:
        args = [f"run.output_dir={tmp_path}", f"run.name={name}", f"data.train=[{data}]", "data.eval=[]", *COMMON]
        return load_config(SFTConfig, CONFIGS / "sft_tiny.yaml", args)

    whole = run_sft(cfg("whole"))
    calls = []
    vocab = 104  # the tiny model's: above 16 tokens a micro-batch's logits are taken 4 tokens at a time
    monkeypatch.setattr(scoring, "CHUNK_ELEMENTS", 16 * vocab)
    monkeypatch.setattr(scoring, "head_token_stats", lambda *a, **k: calls.append(k["chunk"]) or HEAD_TOKEN_STATS(*a, **k))
    chunked = run_sft(cfg("chunked"))
    assert len(calls) == 6 and set(calls) == {4}  # 3 steps x 2 micro-batches, every one chunked
    assert_same_training(whole, chunked, ("train/loss",))
