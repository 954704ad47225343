"""LoRA through peft: only adapters (and value heads) train, the export is a merged plain model
that loads in transformers with the in-memory model's outputs, and a LoRA checkpoint resumes
exactly. SFT, reward model and PPO (actor and critic), each on the tiny model for a few steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from olingo.config import ConfigError, load_config
from olingo.models import RewardModel, load_causal_lm
from olingo.models.critic import Critic
from olingo.models.lora import (
    apply_lora,
    export_lora,
    has_lora,
    merged_copy,
    restore_lora,
    trainable_state,
)
from olingo.recipes.common import packaged_config
from olingo.recipes.ppo import PPOConfig, run_ppo
from olingo.recipes.rm import RMConfig, run_rm
from olingo.recipes.sft import SFTConfig, run_sft
from olingo.trainer.callbacks import Callback
from tests.conftest import read_jsonl

LORA = ["model.lora.r=4", "model.lora.alpha=8"]
IDS = torch.tensor([[5, 17, 30, 41, 12, 9], [7, 3, 22, 8, 40, 2]])
MASK = torch.ones_like(IDS)


class Snapshot(Callback):
    """Keeps the live model and a copy of its parameters from the start of training."""

    def on_train_start(self, state):
        self.model = state.policy
        self.before = {n: p.detach().clone() for n, p in state.policy.named_parameters()}


def assert_only_adapters_and_heads_changed(snap: Snapshot, heads: tuple[str, ...] = ()) -> None:
    """Every parameter that is neither an adapter nor a head is bitwise what it was; the rest moved."""
    after = dict(snap.model.named_parameters())
    trained = {n for n in after if "lora_" in n or n.endswith(heads)}
    assert trained == set(trainable_state(snap.model)) and trained
    assert all(torch.equal(after[n], snap.before[n]) for n in after if n not in trained)
    moved = [n for n in trained if "lora_A" not in n and not torch.equal(after[n], snap.before[n])]
    assert len(moved) == len([n for n in trained if "lora_A" not in n]), "every lora_B and head should move"


def assert_export_is_merged(export: Path, start: dict[str, torch.Tensor], scaling: float, prefix: str = "") -> None:
    """The export's every tensor is the start's, except targeted weights = W + scaling * B A and heads."""
    merged, adapters = load_file(str(export / "model.safetensors")), load_file(str(export / "lora" / "trainable.safetensors"))
    assert not [k for k in merged if "lora_" in k or "base_layer" in k]
    for key, value in merged.items():
        a = adapters.get(prefix + key.replace(".weight", ".lora_A.default.weight"))
        if a is not None:
            b = adapters[prefix + key.replace(".weight", ".lora_B.default.weight")]
            torch.testing.assert_close(value, start[key] + scaling * b @ a, atol=1e-6, rtol=0, msg=key)
        elif prefix + key in adapters:  # a value head: trained in full
            assert torch.equal(value, adapters[prefix + key]) and not torch.equal(value, start[key])
        else:
            assert torch.equal(value, start[key]), key


# ---- the pieces -----------------------------------------------------------------------------------
def test_lora_freezes_all_but_adapters_and_value_heads(assets):
    actor = apply_lora(load_causal_lm(str(assets.model_dir)), r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    assert set(trainable_state(actor)) == {f"model.layers.{i}.self_attn.{m}_proj.lora_{ab}.default.weight" for i in (0, 1) for m in "qv" for ab in "AB"}
    critic = apply_lora(Critic.from_pretrained(str(assets.model_dir), pad_token_id=0), r=4, alpha=8)
    names = set(trainable_state(critic))
    assert "model.score.weight" in names and not [n for n in names if "score" in n and "lora" in n]
    assert len(names) == 1 + 2 * 7 * 2  # head + A, B on every linear of both layers
    plain = merged_copy(critic)
    assert not has_lora(plain) and has_lora(critic)
    torch.testing.assert_close(plain(IDS, MASK), critic(IDS, MASK), atol=1e-6, rtol=0)


def test_a_lora_checkpoint_refuses_other_settings_and_plain_models(assets, tmp_path):
    model = apply_lora(load_causal_lm(str(assets.model_dir)), r=4, alpha=8)
    export_lora(model, tmp_path)
    other = apply_lora(load_causal_lm(str(assets.model_dir)), r=4, alpha=16)
    with pytest.raises(ValueError, match="differ"):
        restore_lora(other, tmp_path)
    assert not restore_lora(load_causal_lm(str(assets.model_dir)), tmp_path)  # plain: caller loads the export
    with pytest.raises(FileNotFoundError, match="not written by a LoRA run"):
        restore_lora(model, tmp_path / "elsewhere")


def test_lora_settings_are_strict():
    with pytest.raises(ConfigError, match="did you mean 'alpha'"):
        load_config(SFTConfig, packaged_config("sft_tiny.yaml"), ["model.lora.alpah=8"])
    assert load_config(SFTConfig, None, ["model.lora.target_modules=[q_proj]"]).model.lora.target_modules == ["q_proj"]


# ---- SFT: only adapters change, export = in-memory model, exact resume --------------------------------
def sft_config(tmp: Path, name: str, rows: Path, *overrides: str) -> SFTConfig:
    base = [f"run.output_dir={tmp}", f"run.name={name}", f"data.train=[{rows}]", "data.eval=[]", "logging.progress=false",
            "train.epochs=2", "train.batch_size=8", "train.lr=1e-2", "train.save_interval=6", *LORA]
    return load_config(SFTConfig, packaged_config("sft_tiny.yaml"), base + list(overrides))


@pytest.fixture(scope="module")
def rows(tmp_path_factory, assets) -> Path:
    path = tmp_path_factory.mktemp("lora") / "sft32.jsonl"
    path.write_text("\n".join(assets.sft_train.read_text().splitlines()[:32]) + "\n")
    return path


def test_lora_sft_trains_only_adapters_exports_a_merged_model_and_resumes_exactly(tmp_path, assets, rows):
    from transformers import AutoModelForCausalLM

    snap = Snapshot()
    straight = run_sft(sft_config(tmp_path, "straight", rows), callbacks=[snap])
    assert straight["steps"] == 8
    assert_only_adapters_and_heads_changed(snap)
    final = Path(straight["final_model"])
    assert_export_is_merged(final, load_file(str(assets.model_dir / "model.safetensors")), scaling=8 / 4)
    exported = AutoModelForCausalLM.from_pretrained(final).eval()
    with torch.no_grad():
        torch.testing.assert_close(exported(IDS).logits, snap.model.eval()(IDS).logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(exported(IDS).logits, merged_copy(snap.model)(IDS).logits, atol=1e-6, rtol=0)

    resumed = run_sft(sft_config(tmp_path, "resumed", rows, f"run.resume={Path(straight['run_dir']) / 'checkpoints' / 'step_6'}"))
    for name in ("model.safetensors", "lora/trainable.safetensors"):
        a, b = load_file(str(final / name)), load_file(str(Path(resumed["final_model"]) / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    losses = lambda run: [r["train/loss"] for r in read_jsonl(Path(run["run_dir"]) / "metrics.jsonl")]  # noqa: E731
    assert losses(resumed) == losses(straight)[6:]


# ---- reward model ----------------------------------------------------------------------------------
def test_lora_reward_model_trains_adapters_and_head_and_exports_for_both_loaders(tmp_path, assets, small_pref_file):
    from transformers import AutoModelForSequenceClassification

    cfg = load_config(RMConfig, packaged_config("rm_tiny.yaml"), [
        f"run.output_dir={tmp_path}", "run.name=rm", f"data.train=[{small_pref_file}]", "data.eval=[]",
        "logging.progress=false", "train.epochs=1", "train.batch_size=16", *LORA])
    snap = Snapshot()
    result = run_rm(cfg, callbacks=[snap])
    assert_only_adapters_and_heads_changed(snap, heads=("score.weight",))
    final = Path(result["final_model"])
    start = RewardModel.from_pretrained(str(assets.model_dir)).model.state_dict()  # the head is compared as trained
    assert_export_is_merged(final, start, scaling=8 / 4, prefix="model.")
    live = snap.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(RewardModel.from_pretrained(str(final)).eval()(IDS, MASK), live(IDS, MASK), atol=1e-5, rtol=0)
        hf = AutoModelForSequenceClassification.from_pretrained(final).eval()
        torch.testing.assert_close(hf(IDS, attention_mask=MASK).logits[:, 0], live(IDS, MASK), atol=1e-5, rtol=0)


# ---- PPO: actor and critic --------------------------------------------------------------------------
def ppo_config(tmp: Path, name: str, assets, *overrides: str) -> PPOConfig:
    return load_config(PPOConfig, packaged_config("ppo_tiny.yaml"), [
        f"run.output_dir={tmp}", f"run.name={name}", "logging.progress=false", f"model.actor={assets.model_dir}",
        "loop.episodes=3", "loop.rollout_batch_size=8", "loop.train_batch_size=4", "loop.update_steps=1", "loop.save_interval=2",
        "generation.max_new_tokens=4", "actor_optim.lr=1e-2", "critic_optim.lr=1e-2", "data.eval_prompts=[]", "loop.eval_interval=0",
        *LORA, *overrides])


def test_lora_ppo_trains_only_adapters_of_actor_and_critic_and_resumes_exactly(tmp_path, assets):
    snap = Snapshot()
    straight = run_ppo(ppo_config(tmp_path, "straight", assets), callbacks=[snap])
    assert straight["steps"] == 6
    assert_only_adapters_and_heads_changed(snap)  # the actor
    final = Path(straight["run_dir"]) / "checkpoints" / "final"
    base = load_file(str(assets.model_dir / "model.safetensors"))
    assert_export_is_merged(final / "actor", base, scaling=8 / 4)
    critic_start = {k: v for k, v in base.items() if k != "lm_head.weight"}
    critic_start["score.weight"] = torch.zeros(1, 64)  # new head: only "it moved" is checked
    assert_export_is_merged(final / "critic", critic_start, scaling=8 / 4, prefix="model.")
    exported = load_causal_lm(str(final / "actor")).eval()
    with torch.no_grad():
        torch.testing.assert_close(exported(IDS).logits, snap.model.eval()(IDS).logits, atol=1e-5, rtol=0)
    assert Critic.from_pretrained(str(final / "critic"))(IDS, MASK).shape == IDS.shape

    resumed = run_ppo(ppo_config(tmp_path, "resumed", assets, f"run.resume={Path(straight['run_dir']) / 'checkpoints' / 'step_2'}"))
    for part in ("actor", "critic"):
        a = load_file(str(final / part / "lora" / "trainable.safetensors"))
        b = load_file(str(Path(resumed["run_dir"]) / "checkpoints" / "final" / part / "lora" / "trainable.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part
    rows = lambda run: [{k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in read_jsonl(Path(run["run_dir"]) / "metrics.jsonl")]  # noqa: E731
    assert rows(resumed) == rows(straight)[2:]
    assert json.loads((final / "actor" / "lora" / "lora_config.json").read_text())["r"] == 4


# ---- GRPO: the policy alone; the reference is the base weights, never trained ----------------------
def grpo_config(tmp: Path, name: str, assets, *overrides: str):
    from olingo.recipes.grpo import GRPOConfig

    return load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), [
        f"run.output_dir={tmp}", f"run.name={name}", "logging.progress=false", f"model.actor={assets.model_dir}",
        "loop.episodes=3", "loop.rollout_batch_size=4", "loop.train_batch_size=8", "loop.update_steps=1", "loop.save_interval=2",
        "experience.num_generations=4", "experience.kl_coef=0.1", "generation.max_new_tokens=4", "actor_optim.lr=1e-2",
        "data.eval_prompts=[]", "loop.eval_interval=0", "reward.functions={tests.test_grpo:varied_reward: 1.0}", *LORA, *overrides])


def test_lora_grpo_trains_only_adapters_and_resumes_exactly(tmp_path, assets):
    from olingo.recipes.grpo import run_grpo

    snap = Snapshot()
    straight = run_grpo(grpo_config(tmp_path, "straight", assets), callbacks=[snap])
    assert straight["steps"] == 6
    assert_only_adapters_and_heads_changed(snap)
    final = Path(straight["run_dir"]) / "checkpoints" / "final"
    assert_export_is_merged(final / "actor", load_file(str(assets.model_dir / "model.safetensors")), scaling=8 / 4)
    assert sorted(p.name for p in final.iterdir() if p.is_dir()) == ["actor"]
    resumed = run_grpo(grpo_config(tmp_path, "resumed", assets, f"run.resume={Path(straight['run_dir']) / 'checkpoints' / 'step_2'}"))
    a = load_file(str(final / "actor" / "lora" / "trainable.safetensors"))
    b = load_file(str(Path(resumed["run_dir"]) / "checkpoints" / "final" / "actor" / "lora" / "trainable.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = lambda run: [{k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in read_jsonl(Path(run["run_dir"]) / "metrics.jsonl")]  # noqa: E731
    assert rows(resumed) == rows(straight)[2:]
