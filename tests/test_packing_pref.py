"""Padding-free training of the offline preference trainers (DPO, ORPO, KTO): packed equals padded.

Tolerances: packed and padded forwards run differently shaped matmuls (and the backward sums
gradients in another order), so float32 results differ by rounding only. A row's summed
log-prob (here down to -60) differed by up to 3.8e-6, one float32 ulp at that size: compared
within 1e-5 + 1e-6 x its size. Weights after three AdamW steps at lr 1e-4 differed by 5.5e-8
(the steps themselves move them 2e-4; rows that attend across each other in the packed row move
them 4e-4 from the padded run's): compared within 1e-5.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import olingo.models.packing as packing_module
from olingo.config import load_config
from olingo.dataset import PreferenceCollator, UnpairedCollator, build_preference_dataset, build_unpaired_dataset
from olingo.models import load_causal_lm, load_tokenizer
from olingo.recipes.common import packaged_config
from olingo.recipes.dpo import DPOConfig, KTOConfig, ORPOConfig, run_dpo, run_kto, run_orpo
from olingo.trainer.dpo import pair_inputs
from olingo.trainer.preference import ReferencePolicy, response_logps

RECIPES = {"dpo": (DPOConfig, run_dpo), "orpo": (ORPOConfig, run_orpo), "kto": (KTOConfig, run_kto)}


@pytest.fixture(scope="module")
def uneven_pairs(tmp_path_factory) -> Path:
    """12 pairs whose prompts (2-33 characters) and responses (1-13) differ widely in length."""
    rows = [
        {"prompt": "+".join(["1"] * (1 + i * 5 % 17)) + "=", "chosen": "7" * (1 + i * 3 % 9), "rejected": "8" * (1 + i * 7 % 13)}
        for i in range(12)
    ]
    path = tmp_path_factory.mktemp("uneven") / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def count_packs(monkeypatch) -> list[tuple[int, int]]:
    """Record (padded rows, packed rows) of every packed forward."""
    seen: list[tuple[int, int]] = []
    real = packing_module.pack_batch

    def recording(input_ids, *args, **kwargs):
        packed = real(input_ids, *args, **kwargs)
        seen.append((input_ids.shape[0], packed.input_ids.shape[0]))
        return packed

    monkeypatch.setattr(packing_module, "pack_batch", recording)
    return seen


@pytest.mark.parametrize("layout", ["pairs", "unpaired"])
def test_per_row_log_probs_packed_equal_padded(layout, assets, uneven_pairs, monkeypatch):
    """DPO/ORPO's concatenated (2B, L) chosen+rejected forward, and KTO's rows and mismatched KL
    rows: every padded row's summed log-prob and token count, policy and frozen reference."""
    tokenizer, model = load_tokenizer(str(assets.model_dir)), load_causal_lm(str(assets.model_dir)).eval()
    if layout == "pairs":
        items = list(build_preference_dataset([str(uneven_pairs)], tokenizer, 64))
        batch = PreferenceCollator(tokenizer.pad_token_id)(items)
        inputs = [pair_inputs(batch, lambda b, side: b[f"{side}loss_mask"])]
    else:
        items = list(build_unpaired_dataset([str(uneven_pairs)], tokenizer, 64))
        batch = UnpairedCollator(tokenizer.pad_token_id)(items)
        inputs = [(batch[f"{p}input_ids"], batch[f"{p}attention_mask"], batch[f"{p}loss_mask"]) for p in ("", "kl_")]
    reference = ReferencePolicy(model, model)
    packs = count_packs(monkeypatch)
    for ids, attention, mask in inputs:
        with torch.no_grad():
            padded, packed = (response_logps(model, ids, attention, mask, packing=p) for p in (False, True))
        torch.testing.assert_close(packed.sums, padded.sums, atol=1e-5, rtol=1e-6)
        assert torch.equal(packed.counts, padded.counts)
        ref = reference.logps(ids, attention, mask, packing=True)
        torch.testing.assert_close(ref, reference.logps(ids, attention, mask, packing=False), atol=1e-5, rtol=1e-6)
    assert packs and all(rows < padded_rows for padded_rows, rows in packs)  # uneven rows really share packed rows


def train(kind: str, tmp: Path, data: Path, name: str, packing: bool, *overrides: str) -> Path:
    """3 optimizer steps (12 pairs: DPO/ORPO 4 pairs a step, KTO 8 of its 24 rows); the run directory."""
    config, fn = RECIPES[kind]
    args = [
        f"run.output_dir={tmp}", f"run.name={name}", f"data.train=[{data}]", "data.eval=[]", "logging.progress=false",
        "train.epochs=1", "train.lr=1e-4", "train.warmup_ratio=0", f"train.batch_size={8 if kind == 'kto' else 4}",
        f"model.packing={str(packing).lower()}", *overrides,
    ]
    return Path(fn(load_config(config, packaged_config(f"{kind}_tiny.yaml"), args))["run_dir"])


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / "final" / "model" / "model.safetensors"))


@pytest.mark.parametrize("kind, overrides", [
    ("dpo", ["dpo.precompute_ref_log_probs=false"]),
    ("dpo", ["dpo.precompute_ref_log_probs=true"]),
    ("orpo", []),
    ("kto", ["kto.precompute_ref_log_probs=false"]),
])
def test_three_steps_packed_equal_padded(kind, overrides, tmp_path, uneven_pairs, monkeypatch):
    """`olingo dpo/orpo/kto` with model.packing true and false: the same weights after 3 steps;
    with the reference precomputed, the same cached reference log-probs too."""
    padded = train(kind, tmp_path, uneven_pairs, "padded", False, *overrides)
    packs = count_packs(monkeypatch)
    packed = train(kind, tmp_path, uneven_pairs, "packed", True, *overrides)
    assert packs and any(rows < padded_rows for padded_rows, rows in packs)
    a, b = weights(padded), weights(packed)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=0, msg=key)
    steps = [json.loads(line) for line in (packed / "metrics.jsonl").read_text().splitlines()]
    assert sum(row["split"] == "train" for row in steps) == 3
    if "dpo.precompute_ref_log_probs=true" in overrides:
        tables = [torch.load(next((d / "cache").glob("reference_logps-*.pt")), weights_only=True) for d in (padded, packed)]
        assert tables[0]["keys"] == tables[1]["keys"]
        torch.testing.assert_close(tables[1]["values"], tables[0]["values"], atol=1e-5, rtol=1e-6)
