"""Data-parallel correctness without a process group: global statistics through a simulated
all-reduce, the data position across world sizes, gradient checkpointing, plugin options."""

from __future__ import annotations

import threading

import pytest
import torch
import transformers.modeling_utils

from olingo.booster.plugin import mixed_precision_policy, offload_policy, transformer_blocks
from olingo.config import ConfigError, load_config
from olingo.dataset.sampler import ResumableSampler
from olingo.models import RewardModel, load_causal_lm
from olingo.recipes.common import PluginConfig, enable_gradient_checkpointing
from olingo.recipes.sft import SFTConfig
from olingo.rl.masked import masked_whiten
from olingo.rl.moments import RunningMoments


def on_ranks(fn, inputs: list[tuple]) -> list:
    """Run `fn(*inputs[r], all_reduce_sum)` for every rank r in its own thread; the all-reduce
    sums a tensor over the threads, as torch.distributed's SUM all-reduce over ranks does."""
    world = len(inputs)
    barrier, slots = threading.Barrier(world), [None] * world
    results: list = [None] * world

    def all_reduce_sum(rank: int, value: torch.Tensor) -> torch.Tensor:
        slots[rank] = value
        barrier.wait()
        total = sum(slots[1:], slots[0].clone())
        barrier.wait()  # nobody overwrites a slot before every rank has summed
        return total

    def work(rank: int) -> None:
        results[rank] = fn(*inputs[rank], lambda v: all_reduce_sum(rank, v))

    threads = [threading.Thread(target=work, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def test_global_whitening_on_two_ranks_equals_one_process_on_the_concatenated_batch():
    torch.manual_seed(0)
    x = torch.randn(6, 5) * 3 + 1
    mask = torch.rand(6, 5) > 0.3
    mask[4:] &= torch.tensor([True, True, False, False, False])  # rank 1 holds fewer tokens
    whole = masked_whiten(x, mask)
    parts = on_ranks(masked_whiten_global, [(x[:4], mask[:4]), (x[4:], mask[4:])])
    torch.testing.assert_close(torch.cat(parts), whole, atol=1e-6, rtol=0)
    per_rank = torch.cat([masked_whiten(x[:4], mask[:4]), masked_whiten(x[4:], mask[4:])])
    assert not torch.allclose(per_rank, whole, atol=1e-3), "per-rank whitening should differ here"


def masked_whiten_global(x: torch.Tensor, mask: torch.Tensor, all_reduce_sum) -> torch.Tensor:
    return masked_whiten(x, mask, all_reduce_sum=all_reduce_sum)


def test_running_moments_with_all_reduce_agree_on_ranks_and_equal_one_process():
    scores = torch.tensor([0.5, -1.0, 2.0, 3.5, 0.0, 1.0])

    def update(part: torch.Tensor, all_reduce_sum) -> dict:
        moments = RunningMoments()
        moments.update(part, all_reduce_sum)
        moments.update(part * 2, all_reduce_sum)
        return moments.state_dict()

    one = RunningMoments()
    one.update(scores)
    one.update(scores * 2)
    states = on_ranks(update, [(scores[:3],), (scores[3:],)])
    for state in states:
        assert state["count"] == 12
        assert state["mean"] == pytest.approx(one.mean, abs=1e-12) and state["var"] == pytest.approx(one.var, abs=1e-12)


def order_of(world: int, batch: int, start: int, epoch_size: int = 20) -> list[list[int]]:
    """What each rank reads from sample `start` on, per rank."""
    samplers = [ResumableSampler(epoch_size, num_replicas=world, rank=r, seed=3) for r in range(world)]
    for s in samplers:
        s.set_epoch(1, start=start)
    return [list(s) for s in samplers]


def test_same_world_size_resumes_exactly_where_it_stopped():
    full = order_of(2, 2, 0)
    resumed = order_of(2, 2, 3 * 2 * 2)  # 3 batches of 2 on each of 2 ranks were consumed
    assert resumed == [rank[3 * 2:] for rank in full]


def test_other_world_size_resumes_at_the_same_global_sample():
    """2 ranks x 3 batches of 2 = 12 samples; 1 process (batch 4) then reads the rest of the
    permutation: no sample seen twice, none skipped."""
    two = order_of(2, 2, 0)
    seen = [i for b in range(3) for rank in two for i in rank[b * 2:(b + 1) * 2]]
    [rest] = order_of(1, 4, len(seen))
    [whole] = order_of(1, 4, 0)
    assert sorted(seen + rest) == list(range(20))
    assert rest == whole[12:] and sorted(seen) == sorted(whole[:12])


def grads_of(model: torch.nn.Module, loss_fn) -> tuple[float, dict[str, torch.Tensor]]:
    model.train()
    model.zero_grad()
    loss = loss_fn(model)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["causal_lm", "reward_model"])
def test_gradient_checkpointing_is_applied_and_changes_no_gradient(assets, kind, monkeypatch):
    ids = torch.randint(3, 100, (3, 10))
    mask = torch.ones_like(ids)
    if kind == "causal_lm":
        load = lambda: load_causal_lm(str(assets.model_dir))  # noqa: E731
        loss_fn = lambda m: m(input_ids=ids, attention_mask=mask, labels=ids).loss  # noqa: E731
    else:
        load = lambda: RewardModel.from_pretrained(str(assets.model_dir), pad_token_id=0)  # noqa: E731
        loss_fn = lambda m: m(ids, mask).pow(2).mean()  # noqa: E731
    torch.manual_seed(0)
    plain = load()
    torch.manual_seed(0)
    checkpointed = load()
    calls = []  # transformers binds torch's checkpoint when checkpointing is enabled: count its calls
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(transformers.modeling_utils, "checkpoint", lambda *a, **k: calls.append(k) or real(*a, **k))
    enable_gradient_checkpointing(checkpointed)
    loss_a, grads_a = grads_of(plain, loss_fn)
    loss_b, grads_b = grads_of(checkpointed, loss_fn)
    assert len(calls) == 2 and all(k["use_reentrant"] is False for k in calls)  # one per decoder layer
    assert loss_a == loss_b and grads_a.keys() == grads_b.keys() and grads_a  # exact: checkpointing runs the same forward ops
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, atol=1e-6, rtol=0, msg=name)


def test_fsdp_units_are_the_decoder_layers(assets):
    model = RewardModel.from_pretrained(str(assets.model_dir), pad_token_id=0)
    blocks = transformer_blocks(model)
    assert [type(b).__name__ for b in blocks] == ["LlamaDecoderLayer"] * 2


def test_mixed_precision_and_offload_fall_back_to_fp32_on_cpu():
    cpu = torch.device("cpu")
    assert mixed_precision_policy("bf16", cpu).param_dtype is None
    assert type(offload_policy(True, cpu)).__name__ == "OffloadPolicy"


def test_plugin_config_fsdp_options_need_fsdp():
    assert PluginConfig(name="fsdp", mixed_precision="bf16", cpu_offload=True).cpu_offload
    with pytest.raises(ConfigError, match="need plugin.name=fsdp"):
        load_config(SFTConfig, None, ["plugin.name=ddp", "plugin.cpu_offload=true"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_policy_on_cuda_computes_in_bf16_and_reduces_in_fp32():
    policy = mixed_precision_policy("bf16", torch.device("cuda", 0))
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
    assert type(offload_policy(True, torch.device("cuda", 0))).__name__ == "CPUOffloadPolicy"
