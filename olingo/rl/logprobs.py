"""Log-probabilities and entropy from logits, and the causal-LM negative log-likelihood.

logits are (B, L, V) from a causal LM, in any float dtype; results are float32. Large
vocabularies are handled a chunk of rows at a time (`CHUNK_ELEMENTS`) to bound memory.
`head_token_stats` never holds the logits whole: from the hidden states before the output head it
computes log-probs and entropy a chunk of tokens at a time, in forward and in backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from olingo.rl.masked import masked_sum

# Rows of (B, L, V) logits handled at once: as many as keep a float32 copy under this many
# elements (64 MiB), at least one. Small models go in one piece (no Python loop per row); a
# large vocabulary goes a row at a time, as before.
CHUNK_ELEMENTS = 1 << 24
# A forward whose logits would exceed CHUNK_ELEMENTS takes them through the output head a chunk of
# tokens at a time (`head_token_stats`), each chunk holding CHUNK_ELEMENTS / HEAD_CHUNK_SHARE
# logits: a chunk's forward and backward temporaries (its logits, their softmax, their gradient)
# then stay below the whole logits they replace.
HEAD_CHUNK_SHARE = 4
# On a GPU, CHUNK_ELEMENTS / HEAD_CHUNK_SHARE logits are a few dozen tokens of a large vocabulary
# (27 of Qwen's 152k): thousands of such small steps a batch dominated a 0.5B model's SFT step on
# an H200 (with these chunks, and padding skipped, it ran 3.5x faster: bench/results/gpu.md). A GPU takes
# chunks of GPU_HEAD_CHUNK_ELEMENTS logits instead (256 MiB in float32: 441 tokens of 152k).
GPU_HEAD_CHUNK_ELEMENTS = 1 << 26


def head_chunk_elements(device: torch.device, threshold: int = CHUNK_ELEMENTS) -> int:
    """Logits per chunk of `head_token_stats` on `device`: `threshold / HEAD_CHUNK_SHARE` (the
    threshold above which logits are chunked at all), or GPU_HEAD_CHUNK_ELEMENTS on a GPU."""
    return GPU_HEAD_CHUNK_ELEMENTS if device.type == "cuda" else threshold // HEAD_CHUNK_SHARE


def _row_chunks(logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if logits.shape[0] == 0:
        return (logits,)
    return logits.split(max(1, CHUNK_ELEMENTS // max(1, logits[0].numel())))


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] per position, in float32.

    logits: (B, L, V), any float dtype; labels: (B, L) long, valid token ids. Returns (B, L)
    float32. log p(y) = logit_y - logsumexp(logits), a chunk of rows at a time (`CHUNK_ELEMENTS`):
    a float32 copy of a whole (B, L, V) bf16 tensor is the largest allocation of a PPO step.
    """
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
    normaliser = torch.cat([torch.logsumexp(rows.float(), dim=-1) for rows in _row_chunks(logits)])
    return picked - normaliser


def sequence_log_probs(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probability of each row's masked tokens, and how many there are.

    logits: (B, L, V) from a causal LM; input_ids, mask: (B, L). Position t predicts token t+1,
    so token t counts when mask[t] is nonzero, for t = 1..L-1. Returns (sums (B,), counts (B,)),
    both float32: log pi(y|x) of the DPO family (Rafailov et al. 2023) is `sums`, the
    length-normalised one (SimPO, IPO, ORPO) `sums / counts`.
    """
    token_logps = log_probs_from_logits(logits[:, :-1], input_ids[:, 1:])
    keep = mask[:, 1:]
    return masked_sum(token_logps, keep, dim=-1), keep.bool().sum(-1).to(torch.float32)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: H = -sum_v p_v log p_v, in float32.

    logits: (B, L, V); returns (B, L) float32, in chunks of rows to bound memory (`CHUNK_ELEMENTS`).
    Vocabulary entries with p = 0 (e.g. -inf logits) contribute 0 rather than 0 * -inf = NaN.
    """

    def rows_entropy(rows: torch.Tensor) -> torch.Tensor:
        log_p = F.log_softmax(rows.float(), dim=-1)
        p = log_p.exp()
        return -(p * torch.where(p > 0, log_p, torch.zeros_like(log_p))).sum(dim=-1)

    return torch.cat([rows_entropy(rows) for rows in _row_chunks(logits)])


def head_token_stats(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, *, temperature: float = 1.0, chunk: int = 1024,
    entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax((h W^T + b) / T) at each label, and the entropy there, `chunk` tokens at a time.

    hidden: (N, H), the output head's input (after the final norm); weight: (V, H) and bias: (V,)
    or None, the head's; labels: (N,) long. Returns (log_probs (N,), entropy (N,)), float32, equal
    to `log_probs_from_logits` and `entropy_from_logits` of `F.linear(hidden, weight, bias) / T`
    up to float rounding. At most one chunk's (chunk, V) logits exist at once, forward or backward
    (`HeadLogProbs`). The entropy is a statistic: it carries no gradient (None when `entropy` is false).
    """
    log_probs, entropies = HeadLogProbs.apply(hidden, weight, bias, labels, float(temperature), max(1, int(chunk)), bool(entropy))
    return log_probs, entropies if entropy else None


class HeadLogProbs(torch.autograd.Function):
    """`head_token_stats` chunk by chunk. Forward computes each chunk's logits, keeps its log-probs
    (and entropies) and drops the logits, saving only the inputs. Backward recomputes each chunk's
    logits, turns the upstream gradient g into d/d logits = g (onehot(y) - softmax) / T and adds
    that chunk's share of the head's weight gradient into one (V, H) float32 buffer: one weight
    gradient in all, as with whole logits (per-chunk activation checkpointing would make a whole
    (V, H) weight gradient per chunk). The approach of Liger-Kernel's fused linear cross-entropy,
    without its fused kernel."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, chunk, entropy):  # autograd.Function: untyped, as torch declares it
        n = labels.shape[0]
        log_probs = hidden.new_empty(n, dtype=torch.float32)
        entropies = hidden.new_zeros(n if entropy else 0, dtype=torch.float32)
        for start in range(0, n, chunk):
            logits = _chunk_logits(hidden[start : start + chunk], weight, bias, temperature)
            normaliser = torch.logsumexp(logits, dim=-1, keepdim=True)
            log_p = logits.sub_(normaliser)  # in place: the logits are not needed again
            log_probs[start : start + chunk] = log_p.gather(-1, labels[start : start + chunk, None]).squeeze(-1)
            if entropy:  # -sum p log p; p = 0 where log p = -inf, whose product 0 x -inf is NaN: taken as 0
                entropies[start : start + chunk] = -log_p.exp().mul_(log_p).nan_to_num_(nan=0.0).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, labels)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(entropies)
        return log_probs, entropies

    @staticmethod
    def backward(ctx, grad_log_probs, _grad_entropies):  # autograd.Function: untyped, as torch declares it
        hidden, weight, bias, labels = ctx.saved_tensors
        wants_hidden, wants_weight, wants_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if wants_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if wants_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if wants_bias else None
        for start in range(0, labels.shape[0], ctx.chunk):
            h, g = hidden[start : start + ctx.chunk], grad_log_probs[start : start + ctx.chunk, None]
            grad_logits = torch.softmax(_chunk_logits(h, weight, bias, ctx.temperature), dim=-1).mul_(-g)
            grad_logits.scatter_add_(-1, labels[start : start + ctx.chunk, None], g)
            if ctx.temperature != 1.0:
                grad_logits.div_(ctx.temperature)
            if wants_hidden:
                grad_hidden[start : start + ctx.chunk] = grad_logits.to(weight.dtype) @ weight
            if wants_weight:
                grad_weight.addmm_(grad_logits.t(), h.float())
            if wants_bias:
                grad_bias += grad_logits.sum(0)
        grad_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
        grad_bias = grad_bias.to(bias.dtype) if grad_bias is not None else None
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """(c, V) float32 logits of one chunk at the temperature (divided in the compute dtype, as
    `policy_logits` divides whole logits)."""
    logits = F.linear(hidden, weight, bias)
    return (logits / temperature if temperature != 1.0 else logits).float()


def token_nll(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token negative log-likelihood over masked positions, and their count.

    logits: (B, L, V) from a causal LM; input_ids, loss_mask: (B, L). Position t predicts token
    t+1, so the loss covers tokens 1..L-1 whose mask is 1. Returning the sum and the count (not
    the mean) lets a trainer normalise by the tokens of a whole optimizer step, so accumulation
    and data parallelism give the same gradient as one big batch.

    Both are float32 whatever the logits' dtype: a bf16 count is wrong above 256 tokens
    (887 would read 888). The NLL is summed with a select, never a product with the mask.
    """
    targets = input_ids[:, 1:]
    mask = loss_mask[:, 1:].bool()
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), reduction="none")
    return masked_sum(nll.view(mask.shape), mask), mask.sum().to(torch.float32)


class GPTLMLoss(nn.Module):
    """Token-mean causal LM loss over masked positions (SFT and PPO's ptx term).

    logits: (B, L, V); input_ids, loss_mask: (B, L) (loss_mask defaults to all ones).
    """

    def forward(self, logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor | None = None) -> torch.Tensor:
        if loss_mask is None:
            loss_mask = torch.ones_like(input_ids)
        total, count = token_nll(logits, input_ids, loss_mask)
        return total / count.clamp(min=1)
