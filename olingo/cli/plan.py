"""`olingo plan`: will a stage's config fit on one device? Memory per device, before the run.

Per trained model (SFT's model, the reward model, PPO's actor and critic):

    weights         P x bytes(param dtype); fsdp: / world size
    gradients       T x bytes(param dtype)                  T = trainable parameters (LoRA: adapters + heads)
    optimizer       AdamW m and v: 2 x T x bytes(param dtype) (torch keeps them in the parameter's dtype);
                    under fsdp mixed precision the sharded parameters are the fp32 master copy
    optimizer step  AdamW's temporaries: none fused (the default), T x bytes with foreach, 2 x the largest tensor per tensor
    activations     tokens x per-token bytes (below), one micro-batch; never divided by world size

Backward frees each layer's activations as it makes that layer's gradients, so learning holds the
weights and AdamW state plus the larger of (activations + the gradients made first: the output
head's, a causal LM's tied embedding) and (all gradients + what outlives backward: the optimizer
step's temporaries, GRPO's logits kept for the entropy).

Frozen models (the reference, the reward model) count their weights only, replicated on every
rank; PPO and GRPO also count the KV cache of generation, layers x 2 x kv_heads x head_dim x
(prompt + response) x sequences x bytes, and the scoring forward of the rollouts (logits, one
layer). They generate, score and learn at different times: the peak is the trained models'
weights and optimizer states plus the larger of (frozen weights + the larger of KV cache and
scoring) and (learning, + frozen weights unless parked on the CPU, which frees device memory only
when the device is a GPU).

Activations follow the counting method of Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", section 4.1: the bytes of every tensor autograd keeps
for backward. Their 34sbh + 5as^2b is for GPT (4h GELU MLP, dropout, LayerNorm); for the Llama-family
decoder layer as transformers runs it (RMSNorm, SwiGLU, SDPA attention, no dropout) the same
count, taken with `torch.autograd.graph.saved_tensors_hooks`, is per token and layer:

    (8h + 4i + 2kv + r n) x act_bytes + (heads + 2) x 4
    h hidden, i MLP width, kv = kv_heads x head_dim, n LoRA-adapted linear layers of rank r

plus, once per token, 3h x act_bytes (final norm) and 4V (the fp32 logits the log-softmax keeps;
reward models and critics have no vocabulary head). Log-probs go through the head a chunk of
logits at a time when the whole would exceed CHUNK_ELEMENTS (not under FSDP): then no 4V per
token, one chunk's logits instead (`chunk_bytes`), in learning and in scoring. Gradient checkpointing keeps only each
layer's input (h) and recomputes one layer at a time during backward. docs/plan.md compares these
numbers with measured peaks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

from olingo.config import ConfigError, load_config
from olingo.models.loading import resolve_dtype
from olingo.models.reward_model import RewardModel
from olingo.recipes.common import packaged_config, resolve_model_path
from olingo.recipes.dpo import DPOConfig, KTOConfig, ORPOConfig
from olingo.recipes.grpo_config import GRPOConfig
from olingo.recipes.ppo import PPOConfig
from olingo.recipes.rm import RMConfig
from olingo.recipes.sft import SFTConfig
from olingo.rl.logprobs import CHUNK_ELEMENTS, head_chunk_elements

STAGE_CONFIGS = {"sft": SFTConfig, "rm": RMConfig, "ppo": PPOConfig, "grpo": GRPOConfig, "dpo": DPOConfig, "orpo": ORPOConfig, "kto": KTOConfig}

GIB = 1024**3


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about one model, read from its config on the meta device."""

    params: int  # every parameter (tied ones once)
    trainable: int  # parameters the optimizer updates
    hidden: int
    layers: int
    heads: int
    kv_dim: int  # kv_heads x head_dim
    intermediate: int
    vocab: int
    lora_width: int  # r x LoRA-adapted linear layers per decoder layer (0 without LoRA)
    head: int = 0  # trainable parameters of the output layer, whose gradients backward makes first (a tied LM head: the embedding)
    largest: int = 0  # elements of the largest trainable tensor


@dataclass(frozen=True)
class Row:
    component: str
    nbytes: float
    note: str = ""


@dataclass(frozen=True)
class Precision:
    """Bytes per element of stored weights (and their gradients and AdamW states) and of activations."""

    param: int
    act: int


def model_shape(path: str, *, reward: bool, lora=None, trust_remote_code: bool = False) -> ModelShape:  # lora: LoraSettings
    """Count a model's parameters on the meta device (no weights are read) from its config.json.

    `reward`: the model is a reward model or critic (sequence-classification head, no LM head).
    `lora`: LoraSettings; when enabled, trainable parameters are the adapters (+ head) peft injects.
    """
    try:
        config = AutoConfig.from_pretrained(resolve_model_path(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise ConfigError(f"plan: cannot read the model config of '{path}': {err}") from None
    with torch.device("meta"):
        if reward:
            config.num_labels = 1
            model = RewardModel(AutoModelForSequenceClassification.from_config(config, trust_remote_code=trust_remote_code))
        else:
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        if lora is not None:
            model = lora.apply(model)
    return _shape_of(model, config, lora)


def _shape_of(model: torch.nn.Module, config, lora) -> ModelShape:
    params = list(model.parameters())
    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    adapted = sum(1 for name, _ in model.named_parameters() if name.endswith("lora_A.default.weight"))
    output = getattr(model, "get_output_embeddings", lambda: None)()
    return ModelShape(
        params=sum(p.numel() for p in params),
        trainable=sum(p.numel() for p in params if p.requires_grad),
        hidden=config.hidden_size,
        layers=layers,
        heads=heads,
        kv_dim=(getattr(config, "num_key_value_heads", None) or heads) * head_dim,
        intermediate=getattr(config, "intermediate_size", 4 * config.hidden_size),
        vocab=config.vocab_size,
        lora_width=(lora.r * adapted // layers) if lora is not None and lora.enabled else 0,
        head=sum(p.numel() for p in output.parameters() if p.requires_grad) if output is not None else 0,
        largest=max((p.numel() for p in params if p.requires_grad), default=0),
    )


def activation_bytes(shape: ModelShape, tokens: int, act_bytes: int, *, lm_head: bool, checkpointing: bool) -> float:
    """Bytes autograd keeps for backward over `tokens` tokens of one micro-batch (see module doc)."""
    h = shape.hidden
    layer = (8 * h + 4 * shape.intermediate + 2 * shape.kv_dim + shape.lora_width) * act_bytes + (shape.heads + 2) * 4
    head = 3 * h * act_bytes + (4 * shape.vocab if lm_head else 0)
    if checkpointing:  # each layer's input stays; one layer is recomputed at a time in backward
        return tokens * (shape.layers * h * act_bytes + layer + head)
    return tokens * (shape.layers * layer + head)


def logits_bytes(shape: ModelShape, tokens: int, act_bytes: int) -> float:
    """The output head's logits over the vocabulary for `tokens` tokens."""
    return tokens * shape.vocab * act_bytes


def head_chunks(shape: ModelShape, rows: int, positions: int, plugin) -> bool:
    """Whether the log-probs of `rows` rows x `positions` positions go through the output head a
    chunk at a time (`olingo.experience_maker.chunked_head`): their logits would exceed
    CHUNK_ELEMENTS, and the head is whole outside the forward (not FSDP)."""
    return plugin.name != "fsdp" and rows * positions * shape.vocab > CHUNK_ELEMENTS


def chunk_bytes(act_bytes: int) -> float:
    """One chunk of logits (`head_chunk_elements` of them: CHUNK_ELEMENTS / HEAD_CHUNK_SHARE, more
    on a GPU) in the compute dtype, and three fp32 tensors of its size: the float copy, the exp of
    the log-sum-exp and, in backward, the gradient of the recomputed chunk."""
    return head_chunk_elements(torch.device("cuda" if torch.cuda.is_available() else "cpu")) * (act_bytes + 3 * 4)


def scoring_bytes(shape: ModelShape, rows: int, seq: int, actions: int, act_bytes: int, *, chunked: bool = False) -> float:
    """A forward without gradient that scores `rows` rollouts (old, reference log-probs): the
    logits of the positions that predict the `actions` response tokens (`logits_to_keep`; one
    chunk of them when `chunked`), and one decoder layer's working set at a time."""
    layer = (8 * shape.hidden + 4 * shape.intermediate + 2 * shape.kv_dim) * act_bytes
    logits = chunk_bytes(act_bytes) if chunked else logits_bytes(shape, rows * (actions + 1), act_bytes)
    return logits + rows * seq * layer


def entropy_bytes(shape: ModelShape, rows: int, actions: int) -> float:
    """GRPO and PPO log the policy's entropy from the kept logits, in fp32 chunks of at most
    CHUNK_ELEMENTS (log p, p and their product alive at once)."""
    return 3 * 4 * min(rows * actions * shape.vocab, CHUNK_ELEMENTS)


def optimizer_step_bytes(shape: ModelShape, prec: Precision, shards: int, offload: bool, kernel: str = "auto") -> float:
    """Temporaries of one AdamW step (`kernel`: the optimizer section's `implementation`): none
    with torch's fused kernel ("auto", the default, takes it: model weights are float tensors on
    the CPU or a CUDA device; one pass in registers); the foreach one (torch's default on CUDA)
    takes sqrt(v) of every trainable tensor at once; the per-tensor one (torch's default on CPU)
    two tensors of one parameter's size (sqrt(v) and its quotient), the largest's at the peak.
    None on the device under FSDP's CPU offload (the step runs on the CPU)."""
    if offload or kernel in ("auto", "fused"):
        return 0.0
    if kernel == "foreach" or (kernel == "torch" and torch.cuda.is_available()):
        return shape.trainable * prec.param / shards
    return 2 * shape.largest * prec.param / shards


def learning_bytes(shape: ModelShape, prec: Precision, shards: int, offload: bool, acts: float, after: float = 0.0, kernel: str = "auto") -> float:
    """Device bytes beside the weights and AdamW state while one model learns a micro-batch.

    Backward frees each layer's activations as it makes that layer's gradients, so all the
    activations meet only the gradients made first (the output head's: a causal LM's tied
    embedding), and all the gradients meet only what outlives backward: the optimizer step's
    temporaries, or `after` (GRPO's logits kept for the entropy)."""
    scale = 0.0 if offload else 1.0 / shards
    grads, first = shape.trainable * prec.param * scale, shape.head * prec.param * scale
    return max(acts + first, grads + max(optimizer_step_bytes(shape, prec, shards, offload, kernel), after))


def trained_rows(name: str, shape: ModelShape, prec: Precision, shards: int, offload: bool = False, kernel: str = "auto") -> list[Row]:
    """Weights, gradients and AdamW state of one trained model, per device (none of it on the
    device under FSDP's CPU offload)."""
    lora = " (LoRA: adapters and heads)" if shape.trainable < shape.params else ""
    where = f" / {shards} ranks" if shards > 1 else ""
    scale = 0.0 if offload else 1.0 / shards
    where += ", in CPU memory (plugin.cpu_offload)" if offload else ""
    return [
        Row(f"{name} weights", shape.params * prec.param * scale, f"{count(shape.params)} params x {prec.param} B{where}"),
        Row(f"{name} gradients", shape.trainable * prec.param * scale, f"{count(shape.trainable)} trainable{lora}"),
        Row(f"{name} optimizer", 2 * shape.trainable * prec.param * scale, "AdamW m and v"),
        Row(f"{name} optimizer step", optimizer_step_bytes(shape, prec, shards, offload, kernel), "AdamW's temporaries: " + step_note(offload, kernel)),
    ]


def step_note(offload: bool, kernel: str) -> str:
    """What `optimizer_step_bytes` counted, in words."""
    if offload:
        return "none on the device"
    if kernel == "torch":
        kernel = "foreach" if torch.cuda.is_available() else "for_loop"
    notes = {"foreach": "sqrt(v) of every trainable tensor (foreach)", "for_loop": "two of the largest trainable tensor (per tensor)"}
    return notes.get(kernel, "none (fused kernel)")


def precision(model_dtype: str, plugin) -> Precision:  # plugin: PluginConfig
    """Stored and activation bytes: fsdp mixed precision keeps fp32 masters and computes in 16 bits."""
    param = resolve_dtype(model_dtype).itemsize
    mixed = getattr(plugin, "mixed_precision", "fp32")
    if plugin.name == "fsdp" and mixed != "fp32":  # the config's intent; CPU runs compute in fp32 anyway
        return Precision(param=4, act=2)
    return Precision(param=param, act=param)


def shards_of(plugin, world_size: int) -> int:
    """FSDP shards weights, gradients and optimizer state over the ranks; DDP replicates them."""
    return world_size if plugin.name == "fsdp" else 1


# ---- one function per stage -------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    stage: str
    rows: list[Row]
    total: float  # peak bytes per device
    world_size: int


def plan_sft(cfg, world_size: int) -> Plan:  # cfg: SFTConfig
    """One causal LM trained on micro-batches of batch_size x max_length tokens."""
    m = cfg.model
    shape = model_shape(m.path, reward=False, lora=m.lora, trust_remote_code=m.trust_remote_code)
    prec, shards, offload = precision(m.dtype, cfg.plugin), shards_of(cfg.plugin, world_size), cpu_offload(cfg.plugin)
    tokens = cfg.train.batch_size * cfg.data.max_length
    trained = trained_rows("model", shape, prec, shards, offload, cfg.train.implementation)
    chunked = head_chunks(shape, cfg.train.batch_size, cfg.data.max_length, cfg.plugin)
    acts = activation_bytes(shape, tokens, prec.act, lm_head=not chunked, checkpointing=m.gradient_checkpointing) + (chunk_bytes(prec.act) if chunked else 0)
    activations = f"{cfg.train.batch_size} x {cfg.data.max_length} tokens" + (", checkpointed" if m.gradient_checkpointing else "")
    activations += ", logits one chunk at a time" if chunked else ""
    rows = [*trained, Row("activations", acts, activations)]
    return Plan("sft", rows, kept_bytes(trained) + learning_bytes(shape, prec, shards, offload, acts, kernel=cfg.train.implementation), world_size)


def plan_rm(cfg, world_size: int) -> Plan:  # cfg: RMConfig
    """A reward model; chosen and rejected rows go through one forward (2 x batch_size rows)."""
    m = cfg.model
    shape = model_shape(m.path, reward=True, lora=m.lora, trust_remote_code=m.trust_remote_code)
    prec, shards, offload = precision(m.dtype, cfg.plugin), shards_of(cfg.plugin, world_size), cpu_offload(cfg.plugin)
    tokens = 2 * cfg.train.batch_size * cfg.data.max_length
    trained = trained_rows("reward model", shape, prec, shards, offload, cfg.train.implementation)
    acts = activation_bytes(shape, tokens, prec.act, lm_head=False, checkpointing=m.gradient_checkpointing)
    rows = [*trained, Row("activations", acts, f"2 x {cfg.train.batch_size} x {cfg.data.max_length} tokens (chosen + rejected)")]
    return Plan("rm", rows, kept_bytes(trained) + learning_bytes(shape, prec, shards, offload, acts, kernel=cfg.train.implementation), world_size)


def plan_ppo(cfg, world_size: int) -> Plan:  # cfg: PPOConfig
    """Actor and critic trained in turn, reference and reward model frozen, plus generation's
    KV cache and the scoring forwards of the rollout batch."""
    m, algo = cfg.model, cfg.loop
    common = dict(lora=m.lora, trust_remote_code=m.trust_remote_code)
    actor = model_shape(m.actor, reward=False, **common)
    critic = model_shape(m.critic or cfg.reward.model or m.actor, reward=True, **common)
    prec, shards, offload = precision(m.dtype, cfg.plugin), shards_of(cfg.plugin, world_size), cpu_offload(cfg.plugin)
    seq = cfg.data.max_prompt_length + cfg.generation.max_new_tokens
    kernels = (cfg.actor_optim.implementation, cfg.critic_optim.implementation)
    trained = trained_rows("actor", actor, prec, shards, offload, kernels[0]) + trained_rows("critic", critic, prec, shards, offload, kernels[1])
    park = parks_on_cpu(algo.offload_inference_models)
    frozen = frozen_rows(cfg, park=park)
    kv = actor.layers * 2 * actor.kv_dim * seq * algo.rollout_batch_size * prec.act
    actions = cfg.generation.max_new_tokens
    scoring = scoring_bytes(actor, algo.rollout_batch_size, seq, actions, prec.act, chunked=head_chunks(actor, algo.rollout_batch_size, actions, cfg.plugin))
    tokens = algo.train_batch_size * seq
    chunked = head_chunks(actor, algo.train_batch_size, actions, cfg.plugin)
    acts = [activation_bytes(actor, tokens, prec.act, lm_head=not chunked, checkpointing=m.gradient_checkpointing) + (chunk_bytes(prec.act) if chunked else 0),
            activation_bytes(critic, tokens, prec.act, lm_head=False, checkpointing=m.gradient_checkpointing)]
    rows = [*trained, *frozen, Row("KV cache (generation)", kv, f"{algo.rollout_batch_size} rollouts x {seq} tokens"),
            Row("scoring forward", scoring, f"{algo.rollout_batch_size} rollouts x {seq} tokens, no gradient: response logits, one layer"),
            Row("activations (learning)", max(acts), f"{algo.train_batch_size} x {seq} tokens, actor and critic in turn")]
    frozen_bytes = sum(r.nbytes for r in frozen)
    # Generating and scoring need the frozen models on the device; learning too unless they are parked on the CPU.
    learning = max(learning_bytes(s, prec, shards, offload, a, kernel=k) for s, a, k in zip((actor, critic), acts, kernels, strict=True))
    learning += 0 if park else frozen_bytes
    return Plan("ppo", rows, kept_bytes(trained) + max(frozen_bytes + max(kv, scoring), learning), world_size)


def plan_grpo(cfg, world_size: int) -> Plan:  # cfg: GRPOConfig
    """The policy trained, no critic; the reference only with a KL term (none of its own with
    LoRA: the policy with adapters disabled); the KV cache of one generate call
    (rollout_batch_size x G sequences, or inference_batch_size), then the scoring forward of
    logits_forward_batch_size of them; while learning, the logits kept through backward for the
    entropy metric."""
    m, algo, exp = cfg.model, cfg.loop, cfg.experience
    actor = model_shape(m.actor, reward=False, lora=m.lora, trust_remote_code=m.trust_remote_code)
    prec, shards, offload = precision(m.dtype, cfg.plugin), shards_of(cfg.plugin, world_size), cpu_offload(cfg.plugin)
    seq = cfg.data.max_prompt_length + cfg.generation.max_new_tokens
    trained = trained_rows("actor", actor, prec, shards, offload, cfg.actor_optim.implementation)
    park = parks_on_cpu(algo.offload_inference_models)
    # With LoRA and no model.reference the reference is the actor with its adapters disabled.
    frozen = frozen_rows(cfg, park=park, reference=exp.kl_coef > 0 and (bool(m.reference) or not m.lora.enabled))
    rollouts = algo.rollout_batch_size * exp.num_generations
    per_call, scored = min(exp.inference_batch_size or rollouts, rollouts), min(exp.logits_forward_batch_size or rollouts, rollouts)
    kv = actor.layers * 2 * actor.kv_dim * seq * per_call * prec.act
    actions = cfg.generation.max_new_tokens
    scoring = scoring_bytes(actor, scored, seq, actions, prec.act, chunked=head_chunks(actor, scored, actions, cfg.plugin))
    tokens = algo.train_batch_size * seq
    chunked = head_chunks(actor, algo.train_batch_size, actions, cfg.plugin)
    acts = activation_bytes(actor, tokens, prec.act, lm_head=not chunked, checkpointing=m.gradient_checkpointing) + (chunk_bytes(prec.act) if chunked else 0)
    # In chunks, the entropy is taken with the log-probs and no logits outlive backward.
    after = 0.0 if chunked else logits_bytes(actor, tokens, prec.act) + entropy_bytes(actor, algo.train_batch_size, actions)
    rows = [*trained, *frozen, Row("KV cache (generation)", kv, f"{per_call} rollouts per generate call x {seq} tokens"),
            Row("scoring forward", scoring, f"{scored} rollouts per forward x {seq} tokens, no gradient: response logits, one layer"),
            Row("activations (learning)", acts, f"{algo.train_batch_size} x {seq} tokens" + (", checkpointed" if m.gradient_checkpointing else "")),
            Row("logits + entropy", after,
                "none kept: log-probs and entropy one chunk of logits at a time" if chunked else "kept after backward for the entropy metric")]
    frozen_bytes = sum(r.nbytes for r in frozen)
    learning = learning_bytes(actor, prec, shards, offload, acts, after, cfg.actor_optim.implementation) + (0 if park else frozen_bytes)
    return Plan("grpo", rows, kept_bytes(trained) + max(frozen_bytes + max(kv, scoring), learning), world_size)


def plan_offline(cfg, world_size: int) -> Plan:  # cfg: DPOConfig, ORPOConfig or KTOConfig
    """The policy trained on one forward of 2 x batch_size rows (chosen + rejected; KTO: its
    batch_size rows, the mismatched pairs run without gradient). A separate frozen reference
    (DPO and KTO without LoRA) is replicated on every rank; with precomputed log-probs it is
    freed before training, so the peak is the larger of the precompute pass and training."""
    m, kind = cfg.model, type(cfg).__name__.removesuffix("Config").lower()
    policy = model_shape(m.path, reward=False, lora=m.lora, trust_remote_code=m.trust_remote_code)
    prec, shards, offload = precision(m.dtype, cfg.plugin), shards_of(cfg.plugin, world_size), cpu_offload(cfg.plugin)
    rows_per_step = cfg.train.batch_size * (1 if kind == "kto" else 2)
    settings = getattr(cfg, kind)
    needs_reference = kind == "kto" or (kind == "dpo" and settings.loss_type != "simpo")
    separate = needs_reference and (m.reference or not m.lora.enabled)
    trained = trained_rows("policy", policy, prec, shards, offload, cfg.train.implementation)
    chunked = head_chunks(policy, rows_per_step, cfg.data.max_length, cfg.plugin)
    acts = activation_bytes(policy, rows_per_step * cfg.data.max_length, prec.act, lm_head=not chunked, checkpointing=m.gradient_checkpointing)
    acts += chunk_bytes(prec.act) if chunked else 0
    side = "" if kind == "kto" else " (chosen + rejected)"
    rows = [*trained, Row("activations", acts, f"{rows_per_step} x {cfg.data.max_length} tokens{side}" + (", logits one chunk at a time" if chunked else ""))]
    # A live reference (or the policy with adapters disabled) scores each batch before the policy's forward.
    live = needs_reference and not (separate and settings.precompute_ref_log_probs)
    # Every position may hold response tokens.
    scoring = scoring_bytes(policy, rows_per_step, cfg.data.max_length, cfg.data.max_length - 1, prec.act, chunked=chunked) if live else 0.0
    learning = max(learning_bytes(policy, prec, shards, offload, acts, kernel=cfg.train.implementation), scoring)
    reference = 0
    if separate:
        reference = model_shape(m.reference or m.path, reward=False, trust_remote_code=m.trust_remote_code).params * resolve_dtype(m.dtype).itemsize
        precompute = settings.precompute_ref_log_probs
        rows.append(Row("reference weights", reference, "frozen, replicated" + (", freed after the precompute pass" if precompute else "")))
    states = kept_bytes(trained)
    if separate and settings.precompute_ref_log_probs:
        return Plan(kind, rows, max(states + learning, states + reference), world_size)
    return Plan(kind, rows, states + learning + reference, world_size)


def kept_bytes(trained: list[Row]) -> float:
    """What stays on the device for the whole run: the trained models' weights and AdamW state
    (gradients exist only from backward to the optimizer step)."""
    return sum(r.nbytes for r in trained if not r.component.endswith(("gradients", "optimizer step")))


def frozen_rows(cfg, park: bool, reference: bool = True) -> list[Row]:  # cfg: PPOConfig or GRPOConfig
    """Weights of the reference (when there is one) and the reward model: replicated on every
    rank, never sharded."""
    m = cfg.model
    nbytes = resolve_dtype(m.dtype).itemsize
    note = "frozen, replicated" + (", on the CPU while learning" if park else "")
    paths = ([("reference", m.reference or m.actor, False)] if reference else []) + ([("reward model", cfg.reward.model, True)] if cfg.reward.model else [])
    return [
        Row(f"{name} weights", model_shape(path, reward=reward, trust_remote_code=m.trust_remote_code).params * nbytes, note)
        for name, path, reward in paths
    ]


def parks_on_cpu(offload_inference_models: bool) -> bool:
    """Whether parking the frozen models on the CPU while learning frees device memory: only
    when the device is a GPU (on a machine without one the CPU is the device)."""
    return offload_inference_models and torch.cuda.is_available()


def cpu_offload(plugin) -> bool:  # plugin: PluginConfig
    return plugin.name == "fsdp" and getattr(plugin, "cpu_offload", False)


PLANNERS = {"sft": plan_sft, "rm": plan_rm, "ppo": plan_ppo, "grpo": plan_grpo, "dpo": plan_offline, "orpo": plan_offline, "kto": plan_offline}


# ---- config, device, table ----------------------------------------------------------------------
def load_stage_config(path: str | None, overrides: Sequence[str], stage: str | None):  # returns a stage config
    """(stage, config): `stage` as given; else the one stage whose strict config accepts the file,
    and when several do (sft and rm share every section), the one the file's name names."""
    models = STAGE_CONFIGS
    if stage is not None:
        return stage, load_config(models[stage], path or packaged_config(f"{stage}_tiny.yaml"), list(overrides))
    if path is None:
        raise ConfigError("plan: pass --config FILE (or --stage for a packaged config)")
    fits, errors = {}, {}
    for name, model in models.items():
        try:
            fits[name] = load_config(model, path, list(overrides))
        except ConfigError as err:
            errors[name] = err
    named = [name for name in models if name in Path(path).stem.lower().replace("-", "_").split("_")]
    chosen = list(fits) if len(fits) == 1 else [n for n in named if n in fits]
    if len(chosen) == 1:
        return chosen[0], fits[chosen[0]]
    if not fits:
        raise errors[named[0]] if len(named) == 1 else ConfigError("\n".join(f"as {n}: {e}" for n, e in errors.items()))
    raise ConfigError(f"plan: {path} is a valid {' and '.join(sorted(fits))} config: pass --stage")


def device_memory() -> tuple[int, str]:
    """Memory of one device: the first CUDA GPU's, else this machine's RAM."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return props.total_memory, f"CUDA {props.name}"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "system RAM (no CUDA device)"


def count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def human(nbytes: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes:.0f} B"


def format_plan(plan: Plan, device_bytes: int, device_name: str) -> str:
    """The table `olingo plan` prints: one row per component, the peak total and the device."""
    lines = [f"stage {plan.stage}, world size {plan.world_size}: memory per device", f"{'component':<26}{'bytes':>14}  note"]
    lines += [f"{r.component:<26}{human(r.nbytes):>14}  {r.note}" for r in plan.rows]
    lines.append(f"{'total (peak)':<26}{human(plan.total):>14}")
    lines.append(f"{'device':<26}{human(device_bytes):>14}  {device_name}")
    return "\n".join(lines)


def run_plan(config: str | None, overrides: Sequence[str], *, stage: str | None = None, world_size: int = 1) -> tuple[Plan, str, bool]:
    """Estimate, format, and say whether the peak fits in one device's memory."""
    if world_size < 1:
        raise ConfigError("plan: --world-size must be at least 1")
    stage, cfg = load_stage_config(config, overrides, stage)
    plan = PLANNERS[stage](cfg, world_size)
    device_bytes, device_name = device_memory()
    return plan, format_plan(plan, device_bytes, device_name), plan.total <= device_bytes
