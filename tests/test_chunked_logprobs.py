"""Log-probs and entropy through the output head a chunk of tokens at a time
(`olingo.rl.logprobs.head_token_stats`, `olingo.experience_maker.policy_token_stats`): equal to
the whole logits' up to float32 rounding, gradients included; models whose head is not the
forward's last step keep whole logits.

Tolerances: both paths compute the same float32 matmul and log-softmax, the chunked one over
fewer rows at a time, so they differ by the rounding of float32 sums over the vocabulary: 1e-6
of each quantity's largest magnitude (measured: 0 for log-probs, 9e-7 absolute for entropies
near 4.6, 7e-7 relative for gradients; each is ~1e-4 from a float64 reference alike)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

from olingo.experience_maker import lm_nll, policy_token_stats, scoring
from olingo.models.head import chunkable_head, head_bypassed
from olingo.rl.logprobs import entropy_from_logits, head_token_stats, log_probs_from_logits
from olingo.trainer.preference import response_logps
from tests.test_packing import CONFIG, uneven_batch


def close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-6) -> bool:
    a, b = a.detach(), b.detach()
    return bool((a - b).abs().max() <= rel * max(1.0, float(b.abs().max())))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_head_token_stats_equal_whole_logits_with_gradients(temperature: float) -> None:
    torch.manual_seed(0)
    hidden, weight, bias = torch.randn(37, 16, requires_grad=True), torch.randn(101, 16, requires_grad=True), torch.randn(101, requires_grad=True)
    labels = torch.randint(0, 101, (37,))
    chunked, entropy = head_token_stats(hidden, weight, bias, labels, temperature=temperature, chunk=8)  # 5 chunks, the last of 5 rows
    logits = F.linear(hidden, weight, bias) / temperature
    whole = log_probs_from_logits(logits[None], labels[None])[0]
    assert close(chunked, whole) and close(entropy, entropy_from_logits(logits.detach()[None])[0])
    assert not entropy.requires_grad  # a statistic
    weights = torch.arange(37.0)  # a loss that weighs every row differently
    grads = torch.autograd.grad((chunked * weights).sum(), (hidden, weight, bias))
    expected = torch.autograd.grad((whole * weights).sum(), (hidden, weight, bias))
    for got, want in zip(grads, expected, strict=True):
        assert close(got, want)


def test_head_token_stats_without_entropy_and_without_rows() -> None:
    weight = torch.randn(11, 4)
    log_probs, entropy = head_token_stats(torch.randn(3, 4), weight, None, torch.tensor([0, 5, 10]), entropy=False)
    assert entropy is None and log_probs.shape == (3,)
    empty, none_entropy = head_token_stats(torch.zeros(0, 4), weight, None, torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,) and none_entropy.shape == (0,)


@pytest.mark.parametrize("packing", [False, True])
def test_policy_token_stats_in_chunks_equal_whole_logits_for_a_causal_lm(packing: bool) -> None:
    """A tiny Llama, whole logits vs 3 tokens' logits at a time (16 response tokens: 6 chunks):
    log-probs, entropies and every weight's gradient, padded and packed."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    ids, mask = uneven_batch([9, 5, 6, 7], 10)
    mask[:, -4:] = 1  # every row ends in 4 response tokens
    runs = []
    for chunk_elements in (10**9, 12 * CONFIG["vocab_size"]):  # whole; then 3 tokens per chunk (a quarter of the threshold)
        model.zero_grad()
        log_probs, entropy = policy_token_stats(model, ids, mask, 4, 0.7, packing=packing, chunk_elements=chunk_elements)
        (log_probs * torch.arange(1.0, 5.0)).sum().backward()
        runs.append((log_probs.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (whole_lp, whole_ent, whole_grads), (chunk_lp, chunk_ent, chunk_grads) = runs
    assert close(chunk_lp, whole_lp) and close(chunk_ent, whole_ent)
    for name, grad in whole_grads.items():
        assert close(chunk_grads[name], grad), name


@pytest.mark.parametrize("packing", [False, True])
def test_sft_nll_and_dpo_sequence_log_probs_in_chunks_equal_whole_logits(packing: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """SFT's loss (`lm_nll`, also PPO/GRPO's ptx term) and the DPO family's log pi(y|x)
    (`response_logps`) when `CHUNK_ELEMENTS` is lowered to 12 tokens' logits (chunks of 3): the same sums, counts
    and gradients as whole logits, with a loss mask that starts mid-row."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    ids, mask = uneven_batch([9, 5, 6, 7], 10)
    loss_mask = mask.clone()
    loss_mask[:, :6] = 0  # context: only the last tokens are scored (left-padded rows keep more)
    runs = []
    for chunk_elements in (None, 12 * CONFIG["vocab_size"]):
        if chunk_elements:
            monkeypatch.setattr(scoring, "CHUNK_ELEMENTS", chunk_elements)
        model.zero_grad()
        total, count = lm_nll(model, ids, mask, loss_mask, packing=packing)
        logps = response_logps(model, ids, mask, loss_mask, packing=packing)
        (total + (logps.sums * torch.arange(1.0, 5.0)).sum()).backward()
        runs.append((total.detach(), count, logps.sums.detach(), logps.counts, {n: p.grad.clone() for n, p in model.named_parameters()}))
    whole, chunked = runs
    assert torch.equal(chunked[1], whole[1]) and torch.equal(chunked[3], whole[3])  # token counts: the same masks
    assert close(chunked[0], whole[0]) and close(chunked[2], whole[2])
    for name, grad in whole[4].items():
        assert close(chunked[4][name], grad), name


def test_the_head_runs_on_counted_positions_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Padding never goes through the chunked head: `policy_token_stats` applies it to attended
    labels (a row that stopped early leaves its tail out, read as 0), `lm_nll` to the loss mask's
    tokens; the values there equal whole logits'."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    ids, mask = uneven_batch([9, 5, 6, 7], 10)
    mask[:, -4:] = 1
    mask[1, -2:] = 0  # row 1 stopped two tokens early: right padding inside the response
    rows = []
    monkeypatch.setattr(scoring, "head_token_stats", lambda hidden, *a, **k: rows.append(hidden.shape[0]) or head_token_stats(hidden, *a, **k))
    whole, _ = policy_token_stats(model, ids, mask, 4, packing=True, chunk_elements=10**9)
    chunked, entropy = policy_token_stats(model, ids, mask, 4, packing=True, chunk_elements=12 * CONFIG["vocab_size"])
    attended = mask[:, -4:].bool()
    assert rows == [int(attended.sum())] == [14]
    assert close(chunked[attended], whole[attended])
    assert not chunked[~attended].any() and not entropy[~attended].any()
    loss_mask = mask.clone()
    loss_mask[:, :7] = 0
    monkeypatch.setattr(scoring, "CHUNK_ELEMENTS", 12 * CONFIG["vocab_size"])
    lm_nll(model, ids, mask, loss_mask, packing=False)
    assert rows[1] == int(loss_mask[:, 1:].sum()) == 10


def test_the_bypassed_head_returns_hidden_states_and_is_restored() -> None:
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    ids = torch.tensor([[1, 2, 3]])
    with head_bypassed(model) as head:
        hidden = model(input_ids=ids).logits
    assert hidden.shape == (1, 3, CONFIG["hidden_size"]) and head is model.lm_head
    assert model(input_ids=ids).logits.shape == (1, 3, CONFIG["vocab_size"])  # the head is back
    assert "forward" not in vars(model.lm_head)


def test_a_head_that_is_not_the_last_step_keeps_whole_logits() -> None:
    """Gemma 2 soft-caps its logits after the head (read from its config); any other transform that
    does not commute with the head is caught by the probe. A scale commutes, and passes: the head
    applied to the scaled hidden states gives the scaled logits."""
    gemma = Gemma2ForCausalLM(Gemma2Config(**CONFIG, head_dim=16, final_logit_softcapping=30.0))
    assert chunkable_head(gemma) is None

    class Squashed(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits.tanh() * 3
            return out

    class Scaled(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 0.5
            return out

    assert chunkable_head(Squashed(LlamaConfig(**CONFIG))) is None
    scaled = Scaled(LlamaConfig(**CONFIG))
    assert chunkable_head(scaled) is scaled.lm_head
    plain = LlamaForCausalLM(LlamaConfig(**CONFIG))
    assert chunkable_head(plain) is plain.lm_head
