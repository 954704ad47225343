"""Masked tensors that can hold inf, and token counts in low precision (issue: two maths defects).

* k3 KL: a padding log-ratio that overflows exp() must not turn the KL, the rollout metrics or
  the adaptive KL coefficient into NaN (masks are selects, never products: inf * 0 is NaN).
* token counts: bf16 cannot count 887 tokens (it reads 888); the ptx/SFT losses count in float32.
"""

from __future__ import annotations

import math

import torch

from olingo.experience_maker import Experience
from olingo.experience_maker.experience import experience_info
from olingo.experience_maker.kl_controller import AdaptiveKLController
from olingo.rl.kl import kl_estimate
from olingo.rl.logprobs import GPTLMLoss, token_nll


def _overflowing_log_probs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two rows; the second has one padding position whose log-ratio is 200 (exp -> inf in fp32)."""
    log_probs = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.1, -300.0]])
    ref_log_probs = torch.tensor([[-1.2, -1.0, -0.7], [-1.0, -0.3, -100.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return log_probs, ref_log_probs, mask


def test_k3_with_an_overflowing_padding_entry_is_finite_and_exact():
    log_probs, ref_log_probs, mask = _overflowing_log_probs()
    assert torch.isinf(torch.expm1(ref_log_probs - log_probs)).any()  # the trap is real
    assert torch.isnan(kl_estimate(log_probs, ref_log_probs, "k3") * mask).any()  # what a product gives
    kl = kl_estimate(log_probs, ref_log_probs, "k3", mask)
    assert torch.isfinite(kl).all()
    assert kl[1, 2] == 0.0
    # Hand value of one entry: log r = -1.0 - (-2.0) = 1, k3 = (e - 1) - 1.
    assert math.isclose(float(kl[0, 1]), math.e - 2.0, rel_tol=1e-6)


def _experience(kl: torch.Tensor, mask: torch.Tensor) -> Experience:
    batch, actions = kl.shape
    seq = torch.ones(batch, actions + 2, dtype=torch.long)
    zeros = torch.zeros(batch, actions)
    return Experience(
        sequences=seq, attention_mask=torch.ones_like(seq), action_mask=mask,
        action_log_probs=zeros, base_action_log_probs=zeros, values=zeros, kl=kl, rewards=zeros,
        advantages=zeros, returns=zeros, score=torch.zeros(batch), raw_score=torch.zeros(batch),
        truncated=torch.zeros(batch, dtype=torch.bool),
    )


def test_rollout_kl_and_adaptive_coefficient_ignore_inf_on_padding():
    log_probs, ref_log_probs, mask = _overflowing_log_probs()
    kl = kl_estimate(log_probs, ref_log_probs, "k3")  # unmasked on purpose: inf at the padding entry
    info = experience_info(_experience(kl, mask))
    expected = float(kl_estimate(log_probs, ref_log_probs, "k3", mask).sum(-1).mean())
    assert math.isfinite(info["kl"]) and math.isclose(info["kl"], expected, rel_tol=1e-6)
    controller = AdaptiveKLController(0.1, target=6.0, horizon=100)
    controller.update(info["kl"], 2)
    assert math.isfinite(controller.value) and controller.value > 0


def test_token_counts_are_exact_in_bf16():
    torch.manual_seed(0)
    batch, length, vocab = 4, 300, 11
    logits = torch.randn(batch, length, vocab).to(torch.bfloat16)
    input_ids = torch.randint(0, vocab, (batch, length))
    trained = torch.zeros(batch * (length - 1), dtype=torch.long)
    trained[:887] = 1  # 887 trained tokens over the 4 rows (position 0 is never a target)
    loss_mask = torch.zeros(batch, length, dtype=torch.long)
    loss_mask[:, 1:] = trained.view(batch, length - 1)
    assert float(torch.tensor(887.0, dtype=torch.bfloat16)) == 888.0  # why bf16 must not count
    total, count = token_nll(logits, input_ids, loss_mask)
    assert count.dtype == torch.float32 and float(count) == 887.0
    reference, _ = token_nll(logits.float(), input_ids, loss_mask)
    assert torch.allclose(total, reference)
    loss = GPTLMLoss()(logits, input_ids, loss_mask)
    assert math.isclose(float(loss), float(reference) / 887.0, rel_tol=1e-5)


def test_token_nll_ignores_inf_logits_on_masked_positions():
    logits = torch.zeros(1, 4, 5)
    logits[0, 2] = float("-inf")  # a masked position with a degenerate distribution
    input_ids = torch.tensor([[1, 2, 3, 4]])
    loss_mask = torch.tensor([[0, 1, 1, 0]])  # position 2 predicts token 3: masked out
    total, count = token_nll(logits, input_ids, loss_mask)
    assert float(count) == 2.0 and math.isclose(float(total), 2 * math.log(5), rel_tol=1e-6)
